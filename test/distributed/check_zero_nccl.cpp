// test/distributed/check_zero_nccl: llmc/distributed/comm and llmc/distributed/zero on real GPUs with NCCL, without a model. Started as N ranks
// by a launcher (test/integration/test_multi_gpu.sh runs `scripts/run_local.sh 2 -- build/test/check_zero_nccl` and
// the same under mpirun). Every rank runs every check; the outcomes are gathered and rank 0 prints one
// "PASS: <check>" or "FAIL: <check>: [rank R] <why>" line per check. Exit code 0 when all passed on all ranks.
//
// Checks: the collectives (all-reduce sum / max, in-place reduce-scatter and all-gather, text gathers, averages), the
// check point (one rank's error reaches every rank, naming it), the amax reducer ordered on a compute stream, and the
// optimizer, for every optimizer state format: ZeroAdamW with ZeRO-1 and ZeRO-0 against llmc/optim/adamw's
// whole-buffer AdamW on the summed gradients (bit-identical bf16 weights with 2 ranks and clipping off; the same
// gradient norm), the reduction schedule driven by grad-ready hooks, the communication timings, and checkpoint
// snapshots written by every rank and loaded back into either stage and every state format.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include "llmc/distributed/comm.h"
#include "llmc/core/common.h"
#include "llmc/model/model_spec.h"
#include "llmc/optim/adamw.h"
#include "llmc/distributed/zero.h"
#include "llmc/io/optimizer_files.h"

using namespace llmc;
namespace fs = std::filesystem;

namespace {

int failures = 0;

// Runs f on every rank ("" = pass, else why), gathers the outcomes, rank 0 prints the verdict.
void check(Comm& comm, const std::string& name, const std::function<std::string()>& f) {
  std::string why;
  try {
    why = f();
  } catch (const std::exception& e) {
    why = std::string("exception: ") + e.what();
  }
  const std::vector<std::string> all = comm.all_gather_text(why, name.c_str());
  std::string report;
  for (size_t r = 0; r < all.size(); r++)
    if (!all[r].empty()) report += strformat(" [rank %zu] %s", r, all[r].c_str());
  if (!report.empty()) failures++;
  if (comm.is_root()) {
    std::printf("%s: %s%s%s\n", report.empty() ? "PASS" : "FAIL", name.c_str(), report.empty() ? "" : ":",
                report.c_str());
    std::fflush(stdout);
  }
}

template <typename T>
std::vector<T> download(const T* dev, size_t n) {
  std::vector<T> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// The gradients rank r contributes: normal(0, 0.01) inside the tensors, 0 in the alignment gaps (as backward leaves
// them), different per rank and per step.
std::vector<float> rank_grads(const ParamTable& table, int rank, int step) {
  std::vector<float> g(table.total_elements, 0.0f);
  std::mt19937 gen(1000u + 17u * static_cast<unsigned>(rank) + 7919u * static_cast<unsigned>(step));
  std::normal_distribution<float> nd(0.0f, 0.01f);
  for (const ParamInfo& p : table.params)
    for (size_t i = 0; i < p.numel; i++) g[p.offset + i] = nd(gen);
  return g;
}

struct Buffers {
  bf16* params = nullptr;
  float* grads = nullptr;
  size_t n = 0;
  explicit Buffers(size_t n_) : n(n_) {
    CUDA_CHECK(cudaMalloc(&params, n * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&grads, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(params, 0, n * sizeof(bf16)));
    CUDA_CHECK(cudaMemset(grads, 0, n * sizeof(float)));
  }
  ~Buffers() {
    cudaFree(params);
    cudaFree(grads);
  }
};

// One optimizer step of ZeroAdamW on this rank's gradients, with the hooks called as a model's backward would.
float zero_step(ZeroAdamW& opt, Buffers& buf, const std::vector<float>& grads, int blocks, float lr, int t,
                float clip, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpyAsync(buf.grads, grads.data(), grads.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  opt.begin_micro_step(true);
  for (int l = blocks - 1; l >= 0; l--) opt.grads_ready(l, s);
  opt.grads_ready(-1, s);
  opt.backward_done(s);
  opt.step(lr, t, clip, s);
  return opt.last_grad_norm(s);
}

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b, size_t* first_diff) {
  for (size_t i = 0; i < a.size(); i++)
    if (std::memcmp(&a[i], &b[i], sizeof(bf16)) != 0) {
      *first_diff = i;
      return false;
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const LaunchInfo launch = detect_launch();
    set_error_rank(launch.rank, launch.world_size);
    ParallelConfig pc;
    pc.timeout_s = 120;
    Comm comm(launch, pc);
    if (!comm.distributed()) {
      std::fprintf(stderr, "check_zero_nccl: start it as several ranks (scripts/run_local.sh 2 -- %s)\n", argv[0]);
      return 2;
    }
    const int N = comm.world_size(), rank = comm.rank();
    if (comm.is_root())
      std::printf("check_zero_nccl: %d ranks, init %s, launcher %s\n", N, comm.method().c_str(),
                  launch.launcher.c_str());
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));

    // ---- collectives
    check(comm, "all-reduce sum and max", [&]() -> std::string {
      const size_t n = 1000;
      std::vector<float> h(n);
      for (size_t i = 0; i < n; i++) h[i] = static_cast<float>(rank) + 0.5f * static_cast<float>(i);
      float* d = nullptr;
      CUDA_CHECK(cudaMalloc(&d, 2 * n * sizeof(float)));
      CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(d + n, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      comm.all_reduce(d, n, DType::F32, ReduceOp::Sum);
      comm.all_reduce(d + n, n, DType::F32, ReduceOp::Max);
      comm.wait(comm.stream(), "the all-reduce");
      const std::vector<float> out = download(d, 2 * n);
      cudaFree(d);
      for (size_t i = 0; i < n; i++) {
        const float sum = static_cast<float>(N * (N - 1) / 2) + N * 0.5f * static_cast<float>(i);
        const float max = static_cast<float>(N - 1) + 0.5f * static_cast<float>(i);
        if (out[i] != sum) return strformat("sum[%zu] = %g, expected %g", i, out[i], sum);
        if (out[n + i] != max) return strformat("max[%zu] = %g, expected %g", i, out[n + i], max);
      }
      return "";
    });
    check(comm, "in-place reduce-scatter (fp32) and all-gather (bf16)", [&]() -> std::string {
      const size_t c = 4099;  // per rank
      std::vector<float> h(N * c);
      for (size_t i = 0; i < h.size(); i++) h[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 1000 + 1);
      float* d = nullptr;
      CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(float)));
      CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
      comm.reduce_scatter(d, c, DType::F32);
      std::vector<bf16> hb(N * c, __float2bfloat16(0.0f));
      for (size_t i = 0; i < c; i++) hb[static_cast<size_t>(rank) * c + i] = __float2bfloat16(static_cast<float>(rank + 1));
      bf16* db = nullptr;
      CUDA_CHECK(cudaMalloc(&db, hb.size() * sizeof(bf16)));
      CUDA_CHECK(cudaMemcpy(db, hb.data(), hb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
      comm.all_gather(db, c, DType::BF16);
      comm.wait(comm.stream(), "reduce-scatter / all-gather");
      const std::vector<float> out = download(d, N * c);
      const std::vector<bf16> outb = download(db, N * c);
      cudaFree(d);
      cudaFree(db);
      const float ranks_sum = static_cast<float>(N * (N + 1) / 2);
      for (size_t i = 0; i < c; i++) {
        const size_t at = static_cast<size_t>(rank) * c + i;
        if (out[at] != ranks_sum * static_cast<float>(at % 1000 + 1))
          return strformat("reduce-scatter piece element %zu = %g", i, out[at]);
      }
      for (size_t i = 0; i < outb.size(); i++)
        if (__bfloat162float(outb[i]) != static_cast<float>(i / c + 1))
          return strformat("all-gather element %zu = %g", i, __bfloat162float(outb[i]));
      return "";
    });
    check(comm, "text gather, broadcast, average, barrier", [&]() -> std::string {
      const std::string mine = "rank " + std::to_string(rank) + ": " + std::string(static_cast<size_t>(rank) * 37, 'x');
      const std::vector<std::string> all = comm.all_gather_text(mine, "texts");
      for (int r = 0; r < N; r++)
        if (all[r] != "rank " + std::to_string(r) + ": " + std::string(static_cast<size_t>(r) * 37, 'x'))
          return "all_gather_text: rank " + std::to_string(r) + " gave '" + all[r] + "'";
      if (comm.broadcast_text(rank == 0 ? "from zero" : "ignored", "broadcast") != "from zero")
        return "broadcast_text";
      const double avg = comm.average(static_cast<double>(rank), "average");
      if (avg != (N - 1) / 2.0) return strformat("average %g", avg);
      comm.barrier("barrier");
      return "";
    });
    check(comm, "check_all_ok: one rank's error stops every rank, naming it", [&]() -> std::string {
      comm.check_all_ok("", "testing");  // nobody failed: returns
      const int bad = N - 1;
      try {
        comm.check_all_ok(rank == bad ? "boom" : "", "testing");
      } catch (const GroupError& e) {
        const std::string expect = strformat("rank %d failed while testing: boom", bad);
        if (rank == bad) return "the failed rank got a GroupError";
        return std::string(e.what()) == expect ? "" : "message '" + std::string(e.what()) + "'";
      } catch (const Error& e) {
        return rank == bad && std::string(e.what()) == "boom" ? "" : "message '" + std::string(e.what()) + "'";
      }
      return "no exception";
    });
    check(comm, "amax reducer ordered on a compute stream", [&]() -> std::string {
      float* d = nullptr;
      CUDA_CHECK(cudaMalloc(&d, 3 * sizeof(float)));
      const float mine[3] = {static_cast<float>(rank), -static_cast<float>(rank), 2.0f + rank * 0.25f};
      CUDA_CHECK(cudaMemcpyAsync(d, mine, sizeof(mine), cudaMemcpyHostToDevice, s));
      comm.all_reduce_max_after(d, 3, s);
      float out[3];
      CUDA_CHECK(cudaMemcpyAsync(out, d, sizeof(out), cudaMemcpyDeviceToHost, s));
      comm.wait(s, "the amax");
      cudaFree(d);
      if (out[0] != N - 1 || out[1] != 0.0f || out[2] != 2.0f + (N - 1) * 0.25f)
        return strformat("got %g %g %g", out[0], out[1], out[2]);
      return "";
    });

    // ---- the optimizer against the single-GPU AdamW on the summed gradients, for every optimizer state format
    ModelSpec spec;
    model_preset("gpt2-tiny", &spec);
    const ParamTable table = build_param_table(spec);
    int blocks = 0;
    for (const ParamInfo& p : table.params) blocks = std::max(blocks, p.layer + 1);
    const size_t n = table.total_elements;
    std::vector<float> init(n, 0.0f);
    init_parameters(table, 42, init.data());
    const float lr = 1e-3f;
    const std::string ckpt_root = comm.broadcast_text(
        rank == 0 ? (fs::temp_directory_path() / ("llm8_zero_nccl_" + std::to_string(::getpid()))).string() : "",
        "the checkpoint directory");
    for (const StateFormat& format : state_formats()) {
      OptimizerConfig oc;
      oc.state_format = format;
      // Reference: the whole-buffer AdamW of llmc/optim/adamw on sum over ranks (in rank order) of every rank's
      // gradients.
      Buffers ref(n);
      AdamW ref_opt(table, oc, {{{0, n}, true}});
      ref_opt.set_master(init.data(), ref.params, s);
      std::vector<float> ref_norms;
      const float clips[3] = {0.0f, 0.0f, 1e-3f};  // the last step clips (its norm is far above 1e-3)
      std::vector<std::vector<bf16>> ref_params;
      for (int t = 1; t <= 3; t++) {
        std::vector<float> sum(n, 0.0f);
        for (int r = 0; r < N; r++) {
          const std::vector<float> g = rank_grads(table, r, t);
          for (size_t i = 0; i < n; i++) sum[i] += g[i];
        }
        CUDA_CHECK(cudaMemcpy(ref.grads, sum.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        ref_opt.step(ref.params, ref.grads, lr, t, clips[t - 1], s);
        ref_norms.push_back(ref_opt.last_grad_norm(s));
        ref_params.push_back(download(ref.params, n));
      }
      std::vector<float> ref_master;
      StoredMoments ref_moments;
      ref_opt.download(&ref_master, &ref_moments);

      for (int stage : {1, 0}) {
        const std::string what = strformat("ZeRO-%d, %s moments", stage, format.name);
        Buffers buf(n);
        ZeroAdamW opt(comm, table, buf.params, buf.grads, oc, stage);
        opt.set_master(init.data(), s);
        std::vector<float> norms;
        std::vector<std::vector<bf16>> params;
        CommTimes times;
        check(comm, what + ": 3 steps against the single-GPU AdamW on the summed gradients", [&]() -> std::string {
          for (int t = 1; t <= 3; t++) {
            norms.push_back(zero_step(opt, buf, rank_grads(table, rank, t), blocks, lr, t, clips[t - 1], s));
            params.push_back(download(buf.params, n));
            if (t == 1) times = opt.last_comm_times();
          }
          for (int t = 0; t < 3; t++)
            if (std::fabs(norms[t] - ref_norms[t]) > 1e-5f * ref_norms[t])
              return strformat("step %d: gradient norm %.9g, reference %.9g", t + 1, norms[t], ref_norms[t]);
          // Clipping off: the same bits with 2 ranks (a + b is the same sum however NCCL orders it).
          for (int t = 0; t < 2; t++) {
            size_t at = 0;
            if (N == 2 && !same_bits(params[t], ref_params[t], &at))
              return strformat("step %d: bf16 weight %zu is %g, reference %g", t + 1, at,
                               __bfloat162float(params[t][at]), __bfloat162float(ref_params[t][at]));
          }
          // Clipping on: the norms differ in the last bits (summation order), so the weights may differ by a
          // rounding here and there; no more than 0.1% of them, by at most 1%.
          size_t differ = 0;
          for (size_t i = 0; i < n; i++) {
            const float a = __bfloat162float(params[2][i]), b = __bfloat162float(ref_params[2][i]);
            if (a != b) {
              differ++;
              if (std::fabs(a - b) > 0.01f * std::max(std::fabs(a), std::fabs(b)) + 1e-6f)
                return strformat("step 3: weight %zu is %g, reference %g", i, a, b);
            }
          }
          if (differ > n / 1000) return strformat("step 3: %zu of %zu weights differ", differ, n);
          return "";
        });
        check(comm, what + ": communication timings recorded", [&]() -> std::string {
          if (!times.valid || !(times.reduce_ms > 0) || times.exposed_reduce_ms < 0 || !(times.optimizer_ms > 0))
            return strformat("valid %d reduce %g exposed %g optimizer %g", times.valid, times.reduce_ms,
                             times.exposed_reduce_ms, times.optimizer_ms);
          return "";
        });
        // Checkpoint: every rank writes its files, then both stages load them back, in this format and in the other
        // ones (converted on load).
        const std::string dir = ckpt_root + "/" + format.name + "_stage" + std::to_string(stage);
        OptimizerSnapshot snap;
        check(comm, what + ": snapshot matches the reference state and loads back into both stages and every format",
              [&]() -> std::string {
                // Every rank runs every collective below whatever it finds (an early return on one rank would leave
                // the other waiting in a collective until parallel.timeout_s): the first difference is kept in why.
                std::string why;
                auto note = [&why](const std::string& what_differs) {
                  if (why.empty()) why = what_differs;
                };
                if (rank == 0) fs::create_directories(dir);
                comm.barrier("creating the checkpoint directory");
                snap = opt.snapshot(s);
                write_optimizer_snapshot(snap, dir);
                comm.barrier("writing the checkpoint");
                if (rank == 0) {
                  // The clipped step 3 scales the gradients by norms that differ in their last bits: the weights
                  // may differ by a rounding here and there (a grouped format can also round a moment code the other
                  // way); no more than 0.1% of them, by at most 1%, as for the bf16 weights above.
                  size_t differ = 0;
                  for (size_t i = 0; i < n && why.empty(); i++) {
                    const float a = snap.master_full[i], b = ref_master[i];
                    if (a == b || std::fabs(a - b) <= 1e-5f * std::fabs(b) + 1e-7f) continue;
                    differ++;
                    if (std::fabs(a - b) > 0.01f * std::max(std::fabs(a), std::fabs(b)) + 1e-6f)
                      note(strformat("master weight %zu: %g, reference %g", i, a, b));
                  }
                  if (differ > n / 1000)
                    note(strformat("%zu of %zu master weights differ from the reference", differ, n));
                }
                TrainerState state;
                state.world_size = N;
                // this rank's pieces of a moment in the snapshot's format, as their codes followed by their group
                // metadata (grouped formats): the sharded snapshot holds exactly these pieces in one storage block,
                // the full one (rank 0) the whole buffer's block (llmc/optim/state_format.h has the layout)
                const std::vector<ElementRange> pieces = opt.layout().owned(rank);
                auto piece_bytes = [&](const OptimizerSnapshot& x, std::vector<uint8_t> block,
                                       const MomentStorage& storage) {
                  std::vector<uint8_t> codes, groups;
                  auto add = [&](size_t block_elements, size_t offset, size_t len) {
                    const MomentView view = moment_view(storage, block.data(), block_elements, offset);
                    const uint8_t* c = static_cast<const uint8_t*>(view.codes);
                    codes.insert(codes.end(), c, c + len * storage.code_bytes());
                    if (view.groups) {
                      const uint8_t* g = reinterpret_cast<const uint8_t*>(view.groups);
                      groups.insert(groups.end(), g, g + storage.metadata_bytes(len));
                    }
                  };
                  if (x.kind == "sharded") {
                    size_t local = 0;
                    for (const ElementRange& p : pieces) local += p.second - p.first;
                    add(local, 0, local);
                  } else {
                    for (const ElementRange& p : pieces) add(n, p.first, p.second - p.first);
                  }
                  codes.insert(codes.end(), groups.begin(), groups.end());
                  return codes;
                };
                for (const StateFormat& into_format : state_formats())
                  for (int into : {0, 1}) {
                    const std::string where = strformat("loaded into ZeRO-%d, %s moments", into, into_format.name);
                    OptimizerConfig into_oc = oc;
                    into_oc.state_format = into_format;
                    Buffers b2(n);
                    ZeroAdamW again(comm, table, b2.params, b2.grads, into_oc, into);
                    const OptimizerStateFiles saved =
                        read_optimizer_state(dir, state, table, again.owned_ranges(), again.state_format());
                    if (saved.note.empty() != (into_format == format))
                      note(where + ": conversion note '" + saved.note + "'");
                    again.restore(saved.master_full.data(), saved.moments, s);
                    const OptimizerSnapshot back = again.snapshot(s);
                    if (rank == 0 && back.master_full != snap.master_full) note(where + ": the master weights differ");
                    size_t at = 0;
                    if (!same_bits(download(b2.params, n), download(buf.params, n), &at))
                      note(strformat("%s: the bf16 weights differ (first at %zu)", where.c_str(), at));
                    if (into_format != format) continue;  // converted moments: llmc/io's tests check the values
                    if ((snap.kind == "sharded" || rank == 0) && (back.kind == "sharded" || rank == 0)) {
                      const StateFormat& f = snap.moments.format;
                      if (piece_bytes(snap, snap.moments.m, f.m) != piece_bytes(back, back.moments.m, f.m) ||
                          piece_bytes(snap, snap.moments.v, f.v) != piece_bytes(back, back.moments.v, f.v))
                        note(where + ": the moments differ");
                    }
                  }
                return why;
              });
      }
    }
    comm.barrier("the end");
    if (rank == 0) fs::remove_all(ckpt_root);
    CUDA_CHECK(cudaStreamDestroy(s));
    if (comm.is_root()) std::printf("%s: %d check(s) failed\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%serror: %s\n", error_prefix().c_str(), e.what());
    return 1;
  }
}
