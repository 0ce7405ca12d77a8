// test/optim/test_adamw: the AdamW update kernel (llmc/optim/adamw_update.h) against its CPU reference
// (test/reference/optim_ref.h) for every moment storage (fp32, bf16), the skipped step, the clip scale, the one
// dispatch from a run-time StateFormat to its kernel, and the optimizer over owned ranges (llmc/optim/adamw.h): a
// full-range step against the reference per tensor, a state split into pieces (as ZeRO-1 ranks hold it) against the
// full-range state, and download / restore. Each run draws a fresh seed (printed; set LLM8_TEST_SEED to replay).
//
// The kernel does the reference's FP32 operations in the same order without FMA contraction, IEEE division and sqrt,
// and the same round-to-nearest-even encodings, so master, m, v and params are expected to match bit for bit.
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/core/param_table.h"
#include "llmc/optim/adamw.h"
#include "llmc/optim/adamw_update.h"
#include "llmc/optim/moment_storage.cuh"
#include "test/reference/optim_ref.h"
#include "test/support/gpu_test_util.cuh"

namespace {

using namespace gpu_test;
using llmc::bf16;

constexpr const char* kProgram = "test_adamw";

std::mt19937_64 rng_for_test() { return make_rng(kProgram); }

// Host codes of random values, as Storage stores them (the kernel and the reference read the same codes).
template <class Storage>
std::vector<typename Storage::Code> random_codes(size_t n, std::mt19937_64& rng, float lo, float hi) {
  const std::vector<float> x = random_floats(n, rng, lo, hi);
  std::vector<typename Storage::Code> codes(n);
  for (size_t i = 0; i < n; i++) codes[i] = Storage::encode(x[i]);
  return codes;
}

template <class Storage>
const llmc::StateFormat& format_of() {
  return Storage::kFormat == llmc::StateFormat::Id::FP32 ? llmc::StateFormat::fp32() : llmc::StateFormat::bf16();
}

template <class Storage>
class AdamWKernel : public ::testing::Test {};
using Storages = ::testing::Types<llmc::Fp32Moments, llmc::Bf16Moments>;
TYPED_TEST_SUITE(AdamWKernel, Storages);

struct KernelCase {
  size_t n;
  int t;
  bool misaligned;  // offset every pointer by one element: the scalar kernel
};

// The kernel (through the typed launcher, and through the StateFormat dispatch on a copy) against the reference.
TYPED_TEST(AdamWKernel, MatchesReference) {
  using Storage = TypeParam;
  using Code = typename Storage::Code;
  const KernelCase cases[] = {{1, 1, false},    {3, 2, false},    {4, 1, false},
                              {1001, 10, false}, {1001, 10, true}, {(size_t{1} << 20) + 3, 1000, false},
                              {(size_t{1} << 20) + 3, 3, true}};
  for (const KernelCase& p : cases) {
    SCOPED_TRACE(llmc::strformat("n %zu t %d misaligned %d", p.n, p.t, p.misaligned));
    auto rng = rng_for_test();
    const size_t n = p.n, off = p.misaligned ? 1 : 0;
    std::vector<float> master = random_floats(n, rng, -1, 1), grads = random_floats(n, rng, -0.1f, 0.1f);
    std::vector<Code> m = random_codes<Storage>(n, rng, -0.01f, 0.01f), v = random_codes<Storage>(n, rng, 0, 1e-4f);
    const float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.7f;

    // Two copies on the device: one for the typed launcher, one for the StateFormat dispatch.
    struct Run {
      DeviceBuffer<float> master, grads;
      DeviceBuffer<Code> m, v;
      DeviceBuffer<bf16> params;
      explicit Run(size_t count) : master(count), grads(count), m(count), v(count), params(count) {}
    };
    auto upload = [&](Run& r) {
      CUDA_CHECK(cudaMemcpy(r.master.ptr + off, master.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(r.grads.ptr + off, grads.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(r.m.ptr + off, m.data(), n * sizeof(Code), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(r.v.ptr + off, v.data(), n * sizeof(Code), cudaMemcpyHostToDevice));
      r.params.poison();
    };
    Run typed(n + off), dispatched(n + off);
    upload(typed);
    upload(dispatched);
    DeviceBuffer<float> d_scale(std::vector<float>{grad_scale});
    llmc::adamw_update(typed.master.ptr + off, typed.params.ptr + off, typed.grads.ptr + off, typed.m.ptr + off,
                       typed.v.ptr + off, n, lr, beta1, beta2, eps, wd, p.t, d_scale.ptr, 0);
    llmc::adamw_update(format_of<Storage>(), dispatched.master.ptr + off, dispatched.params.ptr + off,
                       dispatched.grads.ptr + off, llmc::MomentView{dispatched.m.ptr + off, nullptr},
                       llmc::MomentView{dispatched.v.ptr + off, nullptr}, n, lr, beta1,
                       beta2, eps, wd, p.t, d_scale.ptr, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    std::vector<float> ref_params(n);
    llmc::adamw_update_cpu<Storage>(master.data(), ref_params.data(), grads.data(), m.data(), v.data(), n, lr, beta1,
                                    beta2, eps, wd, p.t, grad_scale);
    for (Run* r : {&typed, &dispatched}) {
      const char* which = r == &typed ? "typed launcher" : "StateFormat dispatch";
      SCOPED_TRACE(which);
      auto tail = [&](const auto& all) { return std::vector<typename std::decay_t<decltype(all)>::value_type>(
                                             all.begin() + static_cast<long>(off), all.end()); };
      EXPECT_TRUE(bitwise_equal("master", tail(r->master.download()), master));
      EXPECT_TRUE(bitwise_equal("m", tail(r->m.download()), m));
      EXPECT_TRUE(bitwise_equal("v", tail(r->v.download()), v));
      EXPECT_TRUE(within("params = bf16_rn(master)", to_float(tail(r->params.download())), ref_params,
                         std::vector<double>(n, 0.0)));
    }
  }
}

// The divergence guard: with grad_scale = NaN (a non-finite gradient norm) AdamW changes nothing at all, in the
// kernel and in the reference.
TYPED_TEST(AdamWKernel, NonFiniteGradScaleLeavesEverythingUnchanged) {
  using Storage = TypeParam;
  using Code = typename Storage::Code;
  auto rng = rng_for_test();
  const size_t n = 4099;  // vectorised body and scalar tail
  const std::vector<float> master = random_floats(n, rng, -1, 1), grads = random_floats(n, rng, -1, 1);
  const std::vector<Code> m = random_codes<Storage>(n, rng, -1, 1), v = random_codes<Storage>(n, rng, 0, 1);
  for (float scale : {NAN, INFINITY}) {
    DeviceBuffer<float> d_master(master), d_grads(grads), d_scale(std::vector<float>{scale});
    DeviceBuffer<Code> d_m(m), d_v(v);
    DeviceBuffer<bf16> d_params(n);
    CUDA_CHECK(cudaMemset(d_params.ptr, 0x3c, n * sizeof(bf16)));
    const std::vector<bf16> params_before = d_params.download();
    llmc::adamw_update(d_master.ptr, d_params.ptr, d_grads.ptr, d_m.ptr, d_v.ptr, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                       3, d_scale.ptr, 0);
    EXPECT_TRUE(bitwise_equal("master", d_master.download(), master)) << scale;
    EXPECT_TRUE(bitwise_equal("m", d_m.download(), m)) << scale;
    EXPECT_TRUE(bitwise_equal("v", d_v.download(), v)) << scale;
    EXPECT_TRUE(bitwise_equal("params", d_params.download(), params_before)) << scale;

    std::vector<float> ref_master = master, ref_params(n, -7.0f);
    std::vector<Code> ref_m = m, ref_v = v;
    llmc::adamw_update_cpu<Storage>(ref_master.data(), ref_params.data(), grads.data(), ref_m.data(), ref_v.data(),
                                    n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, scale);
    EXPECT_TRUE(bitwise_equal("reference master", ref_master, master)) << scale;
    EXPECT_TRUE(bitwise_equal("reference m", ref_m, m)) << scale;
    EXPECT_TRUE(bitwise_equal("reference params", ref_params, std::vector<float>(n, -7.0f))) << scale;
  }
}

// BF16 moments are the FP32 update's moments rounded to nearest even: one step from the same (bf16-representable)
// state gives m_bf16 = bf16_rn(m_fp32) and v_bf16 = bf16_rn(v_fp32), and the same master (the update reads the same
// values), which a truncating or a non-rounding storage would fail.
TEST(AdamWBf16, MomentsAreTheRoundedFp32Moments) {
  auto rng = rng_for_test();
  const size_t n = 100003;
  const std::vector<float> master = random_floats(n, rng, -1, 1), grads = random_floats(n, rng, -0.1f, 0.1f);
  const std::vector<bf16> m16 = random_codes<llmc::Bf16Moments>(n, rng, -0.01f, 0.01f),
                          v16 = random_codes<llmc::Bf16Moments>(n, rng, 0, 1e-4f);
  DeviceBuffer<float> d_scale(std::vector<float>{1.0f}), a_master(master), b_master(master), d_grads(grads);
  DeviceBuffer<float> a_m(to_float(m16)), a_v(to_float(v16));
  DeviceBuffer<bf16> b_m(m16), b_v(v16), a_params(n), b_params(n);
  llmc::adamw_update(a_master.ptr, a_params.ptr, d_grads.ptr, a_m.ptr, a_v.ptr, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5,
                     d_scale.ptr, 0);
  llmc::adamw_update(b_master.ptr, b_params.ptr, d_grads.ptr, b_m.ptr, b_v.ptr, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5,
                     d_scale.ptr, 0);
  EXPECT_TRUE(bitwise_equal("master", b_master.download(), a_master.download()));
  EXPECT_TRUE(bitwise_equal("params", b_params.download(), a_params.download()));
  std::vector<float> rounded_m = a_m.download(), rounded_v = a_v.download();
  for (float& x : rounded_m) x = round_bf16(x);
  for (float& x : rounded_v) x = round_bf16(x);
  EXPECT_TRUE(bitwise_equal("m", to_float(b_m.download()), rounded_m));
  EXPECT_TRUE(bitwise_equal("v", to_float(b_v.download()), rounded_v));
}

TEST(ClipScale, FollowsTheDocumentedRule) {
  struct Case {
    float norm, clip, want;
  };
  const Case cases[] = {{2.0f, 1.0f, 0.5f}, {0.5f, 1.0f, 1.0f}, {1.0f, 1.0f, 1.0f}, {3.0f, 0.0f, 1.0f},
                        {3.0f, -1.0f, 1.0f}};
  for (const Case& c : cases) {
    DeviceBuffer<float> d_norm(std::vector<float>{c.norm}), d_scale(1);
    d_scale.poison();
    llmc::clip_scale_from_norm(d_scale.ptr, d_norm.ptr, c.clip, 0);
    EXPECT_EQ(d_scale.download()[0], c.want) << "norm " << c.norm << " clip " << c.clip;
  }
  // A non-finite norm marks the step as skipped (NaN), with or without clipping.
  for (float norm : {INFINITY, NAN})
    for (float clip : {1.0f, 0.0f}) {
      DeviceBuffer<float> d_norm(std::vector<float>{norm}), d_scale(std::vector<float>{1.0f});
      llmc::clip_scale_from_norm(d_scale.ptr, d_norm.ptr, clip, 0);
      EXPECT_TRUE(std::isnan(d_scale.download()[0])) << "norm " << norm << " clip " << clip;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The optimizer over owned ranges

// Three tensors with alignment gaps between them (as a ParamTable lays them out), the middle one without decay.
llmc::ParamTable small_table() {
  llmc::ParamTable t;
  auto add = [&](const char* name, size_t offset, size_t numel, bool decay) {
    llmc::ParamInfo p;
    p.name = name;
    p.shape = {static_cast<int64_t>(numel)};
    p.offset = offset;
    p.numel = numel;
    p.weight_decay = decay;
    t.params.push_back(p);
    t.num_parameters += numel;
  };
  add("a.weight", 0, 5000, true);
  add("a.bias", 5120, 77, false);
  add("b.weight", 5248, 3001, true);
  t.total_elements = 8320;
  return t;
}

llmc::OptimizerConfig config_for(const llmc::StateFormat& format) {
  llmc::OptimizerConfig c;
  c.weight_decay = 0.1;
  c.state_format = format;
  return c;
}

// Gradients inside the tensors, zeros in the gaps (as backward leaves them).
std::vector<float> table_grads(const llmc::ParamTable& table, std::mt19937_64& rng) {
  std::vector<float> g(table.total_elements, 0.0f);
  for (const llmc::ParamInfo& p : table.params) {
    const std::vector<float> x = random_floats(p.numel, rng, -0.05f, 0.05f);
    std::copy(x.begin(), x.end(), g.begin() + static_cast<long>(p.offset));
  }
  return g;
}

// Per test: the storage's format, the small table and initial master weights.
template <class Storage>
class AdamWState : public ::testing::Test {
 protected:
  const llmc::StateFormat& format = format_of<Storage>();
  std::mt19937_64 rng = rng_for_test();
  const llmc::ParamTable table = small_table();
  const size_t N = table.total_elements;
  const std::vector<float> init = random_floats(N, rng, -1, 1);
};
TYPED_TEST_SUITE(AdamWState, Storages);

// Two steps of the full-range optimizer (no clipping) against the reference run tensor by tensor with its weight
// decay; the gaps are never touched; the norm is the gradient norm.
TYPED_TEST(AdamWState, FullRangeStepsMatchTheReferencePerTensor) {
  using Storage = TypeParam;
  using Code = typename Storage::Code;
  llmc::AdamW opt(this->table, config_for(this->format), {{{0, this->N}, true}});
  EXPECT_EQ(opt.num_elements(), this->N);
  DeviceBuffer<bf16> params(this->N);
  params.poison();
  opt.set_master(this->init.data(), params.ptr, 0);

  std::vector<float> ref_master = this->init, ref_params(this->N);
  std::vector<Code> ref_m(this->N, Storage::encode(0.0f)), ref_v(this->N, Storage::encode(0.0f));
  for (size_t i = 0; i < this->N; i++) ref_params[i] = round_bf16(this->init[i]);
  const float lr = 1e-2f;
  for (int t = 1; t <= 2; t++) {
    const std::vector<float> g = table_grads(this->table, this->rng);
    DeviceBuffer<float> grads(g);
    opt.step(params.ptr, grads.ptr, lr, t, /*grad_clip=*/0.0f, 0);
    double sum_sq = 0;
    for (float x : g) sum_sq += static_cast<double>(x) * x;
    EXPECT_NEAR(opt.last_grad_norm(0), std::sqrt(sum_sq), 1e-5 * std::sqrt(sum_sq)) << "t " << t;
    for (const llmc::ParamInfo& p : this->table.params)
      llmc::adamw_update_cpu<Storage>(ref_master.data() + p.offset, ref_params.data() + p.offset, g.data() + p.offset,
                                      ref_m.data() + p.offset, ref_v.data() + p.offset, p.numel, lr, 0.9f, 0.95f,
                                      1e-8f, p.weight_decay ? 0.1f : 0.0f, t, 1.0f);
  }
  std::vector<float> master;
  llmc::StoredMoments moments;
  opt.download(&master, &moments);
  EXPECT_TRUE(moments.format == this->format);
  ASSERT_EQ(moments.m.size(), this->N * sizeof(Code));
  std::vector<Code> m(this->N), v(this->N);
  std::memcpy(m.data(), moments.m.data(), moments.m.size());
  std::memcpy(v.data(), moments.v.data(), moments.v.size());
  EXPECT_TRUE(bitwise_equal("master", master, ref_master));
  EXPECT_TRUE(bitwise_equal("m", m, ref_m));
  EXPECT_TRUE(bitwise_equal("v", v, ref_v));
  EXPECT_TRUE(bitwise_equal("params", to_float(params.download()), ref_params));
}

// The state split into pieces as two ZeRO-1 ranks hold it (rank 0: [0, 2048) and [6144, 8192); rank 1: [2048, 6144)
// and the replicated tail [8192, 8320), which rank 0 also holds but only rank 1 adds to the norm here), every rank's
// norm partials concatenated in rank order as the all-gather does: both ranks get the same norm bit for bit, close to
// the full-range norm, and (without clipping) the pieces' state equals the full-range state bit for bit.
TYPED_TEST(AdamWState, PiecesEqualTheFullRange) {
  const std::vector<std::vector<llmc::StateRange>> ranks = {
      {{{0, 2048}, true}, {{6144, 8192}, true}, {{8192, this->N}, false}},
      {{{2048, 6144}, true}, {{8192, this->N}, true}}};
  llmc::AdamW full(this->table, config_for(this->format), {{{0, this->N}, true}});
  DeviceBuffer<bf16> full_params(this->N);
  full.set_master(this->init.data(), full_params.ptr, 0);
  std::vector<std::unique_ptr<llmc::AdamW>> pieces;
  std::vector<std::unique_ptr<DeviceBuffer<bf16>>> piece_params;
  size_t all_count = 0;
  for (const auto& ranges : ranks) {
    pieces.push_back(std::make_unique<llmc::AdamW>(this->table, config_for(this->format), ranges));
    piece_params.push_back(std::make_unique<DeviceBuffer<bf16>>(this->N));
    piece_params.back()->poison();
    pieces.back()->set_master(this->init.data(), piece_params.back()->ptr, 0);
    all_count += pieces.back()->num_norm_partials();
  }
  DeviceBuffer<float> all_partials(all_count);
  for (int t = 1; t <= 3; t++) {
    const float clip = t == 3 ? 1e-3f : 0.0f;  // the last step clips
    DeviceBuffer<float> grads(table_grads(this->table, this->rng));
    full.step(full_params.ptr, grads.ptr, 1e-2f, t, clip, 0);
    size_t at = 0;
    for (auto& p : pieces) {
      const float* partials = p->norm_partials(grads.ptr, 0);
      CUDA_CHECK(cudaMemcpy(all_partials.ptr + at, partials, p->num_norm_partials() * sizeof(float),
                            cudaMemcpyDeviceToDevice));
      at += p->num_norm_partials();
    }
    float norms[2];
    for (size_t r = 0; r < pieces.size(); r++) {
      pieces[r]->clipped_update(piece_params[r]->ptr, grads.ptr, all_partials.ptr, all_count, 1e-2f, t, clip, 0);
      norms[r] = pieces[r]->last_grad_norm(0);
    }
    const float full_norm = full.last_grad_norm(0);
    EXPECT_EQ(std::memcmp(&norms[0], &norms[1], sizeof(float)), 0) << "t " << t;
    EXPECT_NEAR(norms[0], full_norm, 1e-5f * full_norm) << "t " << t;
    if (t == 2) {  // no clipping so far: the same bits everywhere
      std::vector<float> full_master;
      llmc::StoredMoments full_moments;
      full.download(&full_master, &full_moments);
      const std::vector<float> full_p = to_float(full_params.download());
      for (size_t r = 0; r < pieces.size(); r++) {
        std::vector<float> master;
        llmc::StoredMoments moments;
        pieces[r]->download(&master, &moments);
        const std::vector<float> params = to_float(piece_params[r]->download());
        size_t local = 0;
        for (const llmc::ElementRange& e : pieces[r]->ranges()) {
          SCOPED_TRACE(llmc::strformat("rank %zu piece [%zu, %zu)", r, e.first, e.second));
          const size_t len = e.second - e.first;
          EXPECT_EQ(std::memcmp(master.data() + local, full_master.data() + e.first, len * sizeof(float)), 0);
          const llmc::MomentStorage &ms = this->format.m, &vs = this->format.v;
          EXPECT_EQ(std::memcmp(moments.m.data() + ms.bytes(local), full_moments.m.data() + ms.bytes(e.first),
                                ms.bytes(len)), 0);
          EXPECT_EQ(std::memcmp(moments.v.data() + vs.bytes(local), full_moments.v.data() + vs.bytes(e.first),
                                vs.bytes(len)), 0);
          EXPECT_EQ(std::memcmp(params.data() + e.first, full_p.data() + e.first, len * sizeof(float)), 0);
          local += len;
        }
        EXPECT_EQ(local, pieces[r]->num_elements());
      }
    }
  }
}

// download -> restore into a fresh optimizer of the same ranges (not in ascending order) gives back the same state and
// params = bf16(master) on the ranges.
TYPED_TEST(AdamWState, DownloadRestoreRoundTrip) {
  const std::vector<llmc::StateRange> ranges = {{{6144, this->N}, true}, {{0, 2048}, true}};
  llmc::AdamW a(this->table, config_for(this->format), ranges);
  DeviceBuffer<bf16> pa(this->N);
  a.set_master(this->init.data(), pa.ptr, 0);
  DeviceBuffer<float> grads(table_grads(this->table, this->rng));
  a.step(pa.ptr, grads.ptr, 1e-2f, 1, 1.0f, 0);
  std::vector<float> master;
  llmc::StoredMoments moments;
  a.download(&master, &moments);
  EXPECT_EQ(master.size(), this->N - 6144 + 2048);
  std::vector<float> master_full(this->N, 0.0f);
  size_t local = 0;
  for (const llmc::ElementRange& e : a.ranges()) {
    std::copy(master.begin() + static_cast<long>(local), master.begin() + static_cast<long>(local + e.second - e.first),
              master_full.begin() + static_cast<long>(e.first));
    local += e.second - e.first;
  }
  llmc::AdamW b(this->table, config_for(this->format), ranges);
  DeviceBuffer<bf16> pb(this->N);
  pb.poison();
  b.restore(master_full.data(), moments, pb.ptr, 0);
  std::vector<float> master_b;
  llmc::StoredMoments moments_b;
  b.download(&master_b, &moments_b);
  EXPECT_TRUE(bitwise_equal("master", master_b, master));
  EXPECT_TRUE(moments_b.m == moments.m && moments_b.v == moments.v);
  const std::vector<float> got_a = to_float(pa.download()), got_b = to_float(pb.download());
  for (const llmc::ElementRange& e : a.ranges())
    for (size_t i = e.first; i < e.second; i++) ASSERT_EQ(got_b[i], got_a[i]) << i;
  // moments of another format are refused (the files convert them)
  llmc::StoredMoments other = llmc::StoredMoments::zeros(
      this->format == llmc::StateFormat::fp32() ? llmc::StateFormat::bf16() : llmc::StateFormat::fp32(), master.size());
  EXPECT_THROW(b.restore(master_full.data(), other, pb.ptr, 0), llmc::Error);
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// The grouped formats (fp8, fp8_expand): the fused per-group kernel against the CPU reference, bit for bit.

namespace {

const llmc::StateFormat* const kGroupedFormats[] = {&llmc::StateFormat::fp8(), &llmc::StateFormat::fp8_expand()};

// The host storage block of a moment of n random values (v: squares, so non-negative).
std::vector<uint8_t> random_moment(const llmc::MomentStorage& st, size_t n, std::mt19937_64& rng, bool square) {
  std::vector<float> x = random_floats(n, rng, -1e-2f, 1e-2f);
  if (square)
    for (float& e : x) e *= e;
  std::vector<uint8_t> block(st.bytes(n));
  llmc::encode_moment(st, x.data(), n, block.data());
  return block;
}

// The kernel on device copies of (master, params, m, v) and the reference on the host copies, over `steps` steps with
// fresh gradients each, updating the elements [from, n) (from on a group boundary: an owned sub-range), then compares
// every byte of both moment blocks, master and params.
void run_grouped(const llmc::StateFormat& f, size_t n, size_t from, int steps, std::mt19937_64& rng,
                 const std::function<void(std::vector<float>&, int)>& edit_grads = nullptr, float grad_scale = 0.7f) {
  std::vector<float> master = random_floats(n, rng, -1, 1), params(n, 0.0f);
  std::vector<uint8_t> m = random_moment(f.m, n, rng, false), v = random_moment(f.v, n, rng, true);
  DeviceBuffer<float> d_master(master), d_scale(std::vector<float>{grad_scale});
  DeviceBuffer<uint8_t> d_m(m), d_v(v);
  DeviceBuffer<bf16> d_params(n);
  CUDA_CHECK(cudaMemset(d_params.ptr, 0, n * sizeof(bf16)));
  const size_t count = n - from;
  for (int t = 1; t <= steps; t++) {
    std::vector<float> g = random_floats(n, rng, -0.05f, 0.05f);
    if (edit_grads) edit_grads(g, t);
    DeviceBuffer<float> d_grads(g);
    llmc::adamw_update(f, d_master.ptr + from, d_params.ptr + from, d_grads.ptr + from,
                       llmc::moment_view(f.m, d_m.ptr, n, from), llmc::moment_view(f.v, d_v.ptr, n, from), count,
                       3e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, d_scale.ptr, 0);
    llmc::adamw_update_cpu(f, master.data() + from, params.data() + from, g.data() + from,
                           llmc::moment_view(f.m, m.data(), n, from), llmc::moment_view(f.v, v.data(), n, from),
                           count, 3e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, grad_scale);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(bitwise_equal("m (metadata and codes)", d_m.download(), m));
  EXPECT_TRUE(bitwise_equal("v (metadata and codes)", d_v.download(), v));
  EXPECT_TRUE(bitwise_equal("master", d_master.download(), master));
  EXPECT_TRUE(bitwise_equal("params", to_float(d_params.download()), params));
}

}  // namespace

// Several steps over whole groups, a partial last group, and an owned sub-range starting on a group boundary.
TEST(AdamWGrouped, MatchesReferenceOverSteps) {
  for (const llmc::StateFormat* f : kGroupedFormats)
    for (auto [n, from] : std::vector<std::pair<size_t, size_t>>{{128, 0}, {300, 0}, {128 * 1000 + 77, 0},
                                                                 {128 * 1000 + 77, 128 * 37}, {1, 0}}) {
      SCOPED_TRACE(llmc::strformat("%s n %zu from %zu", f->name, n, from));
      auto rng = rng_for_test();
      run_grouped(*f, n, from, 3, rng);
    }
}

// grad_scale NaN / inf (a skipped step): nothing is written, in the kernel and in the reference.
TEST(AdamWGrouped, SkippedStepWritesNothing) {
  for (const llmc::StateFormat* f : kGroupedFormats) {
    SCOPED_TRACE(f->name);
    auto rng = rng_for_test();
    const size_t n = 300;
    const std::vector<float> master = random_floats(n, rng, -1, 1), g = random_floats(n, rng, -1, 1);
    const std::vector<uint8_t> m = random_moment(f->m, n, rng, false), v = random_moment(f->v, n, rng, true);
    for (float scale : {NAN, INFINITY}) {
      DeviceBuffer<float> d_master(master), d_grads(g), d_scale(std::vector<float>{scale});
      DeviceBuffer<uint8_t> d_m(m), d_v(v);
      DeviceBuffer<bf16> d_params(n);
      CUDA_CHECK(cudaMemset(d_params.ptr, 0x3c, n * sizeof(bf16)));
      const std::vector<bf16> params_before = d_params.download();
      llmc::adamw_update(*f, d_master.ptr, d_params.ptr, d_grads.ptr, llmc::moment_view(f->m, d_m.ptr, n, 0),
                         llmc::moment_view(f->v, d_v.ptr, n, 0), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, d_scale.ptr,
                         0);
      EXPECT_TRUE(bitwise_equal("master", d_master.download(), master)) << scale;
      EXPECT_TRUE(bitwise_equal("m", d_m.download(), m)) << scale;
      EXPECT_TRUE(bitwise_equal("v", d_v.download(), v)) << scale;
      EXPECT_TRUE(bitwise_equal("params", d_params.download(), params_before)) << scale;
    }
  }
}

// A group whose update is not finite (an infinite gradient in group 1 at step 2) keeps its codes, metadata, master
// and params; the other groups update as the reference does.
TEST(AdamWGrouped, NonFiniteGroupKeepsItsState) {
  for (const llmc::StateFormat* f : kGroupedFormats) {
    SCOPED_TRACE(f->name);
    auto rng = rng_for_test();
    run_grouped(*f, 300, 0, 3, rng, [](std::vector<float>& g, int t) {
      if (t == 2) g[128 + 5] = INFINITY;
    });
  }
}

// The optimizer over the whole table in a grouped format: one launch per tensor segment (each ending in a partial
// group before the next tensor's alignment gap), two steps, against the reference per tensor.
TEST(AdamWGrouped, OptimizerStepsMatchTheReferencePerTensor) {
  for (const llmc::StateFormat* f : kGroupedFormats) {
    SCOPED_TRACE(f->name);
    auto rng = rng_for_test();
    const llmc::ParamTable table = small_table();
    const size_t N = table.total_elements;
    const std::vector<float> init = random_floats(N, rng, -1, 1);
    llmc::AdamW opt(table, config_for(*f), {{{0, N}, true}});
    DeviceBuffer<bf16> params(N);
    opt.set_master(init.data(), params.ptr, 0);
    std::vector<float> ref_master = init, ref_params(N);
    for (size_t i = 0; i < N; i++) ref_params[i] = round_bf16(init[i]);
    std::vector<uint8_t> ref_m(f->m.bytes(N), 0), ref_v(f->v.bytes(N), 0);
    for (int t = 1; t <= 2; t++) {
      const std::vector<float> g = table_grads(table, rng);
      DeviceBuffer<float> grads(g);
      opt.step(params.ptr, grads.ptr, 1e-2f, t, /*grad_clip=*/0.0f, 0);
      for (const llmc::ParamInfo& p : table.params)
        llmc::adamw_update_cpu(*f, ref_master.data() + p.offset, ref_params.data() + p.offset, g.data() + p.offset,
                               llmc::moment_view(f->m, ref_m.data(), N, p.offset),
                               llmc::moment_view(f->v, ref_v.data(), N, p.offset), p.numel, 1e-2f, 0.9f, 0.95f,
                               1e-8f, p.weight_decay ? 0.1f : 0.0f, t, 1.0f);
    }
    std::vector<float> master;
    llmc::StoredMoments moments;
    opt.download(&master, &moments);
    EXPECT_TRUE(moments.format == *f);
    EXPECT_TRUE(bitwise_equal("m", moments.m, ref_m));
    EXPECT_TRUE(bitwise_equal("v", moments.v, ref_v));
    EXPECT_TRUE(bitwise_equal("master", master, ref_master));
    EXPECT_TRUE(bitwise_equal("params", to_float(params.download()), ref_params));
  }
}
