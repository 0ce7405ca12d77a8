// test/kernels/test_attention.cu: the flash attention kernels (llmc/kernels/attention.cu) against the CPU reference.
// Random inputs with a fresh seed per run (printed; set LLM8_TEST_SEED=<n> to replay one), outputs poisoned with NaN
// before every launch (so an unwritten element fails), the CPU reference evaluated on the same bf16-rounded inputs.
//
// Tolerances (bf16 has a unit roundoff u = 2^-9 ~ 2e-3):
//   out   rel-norm error <= 1e-2. The kernel rounds P to bf16 before P V (relative error <= u per term, random signs)
//         and rounds the result to bf16 (<= u): expected ~2-3e-3. Any indexing/masking/softmax bug gives O(0.1-1).
//   lse   max abs error <= 1e-3. Scores come from exact bf16 products accumulated in FP32 and the softmax statistics
//         are FP32: expected ~1e-5.
//   dqkv  rel-norm error <= 2e-2 separately for dQ, dK, dV of every head. The kernels round P and dS to bf16 before
//         the dV, dK, dQ products and round the results to bf16: expected ~3-6e-3.
//   (norms are floored at an RMS of 1e-3, so an exactly-zero reference, e.g. dQ at T = 1, is not divided by 0)
//   every element additionally |gpu - ref| <= 0.1 * (|ref| + rms(ref of that head)) (catches a single bad row/column
//         that a norm could hide). A numpy emulation of the kernels' bf16 roundings (P, dS, outputs) gives rel-norm
//         errors 1.7-2.4e-3 and a worst element at 0.028 of this measure (dV, T = 4096).
// The backward reference is given the GPU's own out and lse, so the backward is judged on exactly its inputs.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/kernels/attention.h"
#include "test/reference/kernels_ref.h"

namespace {

using llmc::bf16;

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("LLM8_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("test_attention: seed %llu (replay with LLM8_TEST_SEED=%llu)\n", (unsigned long long)s,
                (unsigned long long)s);
    return s;
  }();
  return seed;
}

struct Shape {
  int B, T, NH, NKV, HS;
  int qkv_channels() const { return (NH + 2 * NKV) * HS; }
  size_t qkv_size() const { return (size_t)B * T * qkv_channels(); }
  size_t out_size() const { return (size_t)B * T * NH * HS; }
  size_t lse_size() const { return (size_t)B * NH * T; }
};

std::string describe(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " NKV=" + std::to_string(s.NKV) + " HS=" + std::to_string(s.HS);
}

// Random bf16 values; `values` receives the exact float value of each bf16.
void random_bf16(std::vector<bf16>& out, std::vector<float>& values, size_t n, float stddev, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, stddev);
  out.resize(n);
  values.resize(n);
  for (size_t i = 0; i < n; i++) {
    out[i] = __float2bfloat16(normal(rng));
    values[i] = __bfloat162float(out[i]);
  }
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) { CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T))); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void poison() { CUDA_CHECK(cudaMemset(ptr, 0xFF, count * sizeof(T))); }  // all-ones: NaN in bf16 and in fp32
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count);
    CUDA_CHECK(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
};

std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); i++) f[i] = __bfloat162float(v[i]);
  return f;
}

constexpr double kRmsFloor = 1e-3;

// Compares a set of elements (given by index) of gpu against ref: rel-norm and elementwise checks described at the top.
// Returns the rel-norm error; records gtest failures naming `what`.
double compare_slice(const std::vector<float>& gpu, const std::vector<float>& ref, const std::vector<size_t>& indices,
                     double rel_norm_tol, double elem_tol, const std::string& what) {
  double diff2 = 0.0, ref2 = 0.0;
  size_t non_finite = 0;
  for (size_t i : indices) {
    if (!std::isfinite(gpu[i])) {
      non_finite++;
      continue;
    }
    const double d = (double)gpu[i] - ref[i];
    diff2 += d * d;
    ref2 += (double)ref[i] * ref[i];
  }
  EXPECT_EQ(non_finite, 0u) << what << ": " << non_finite << " elements not finite (unwritten or NaN)";
  // a reference that is (almost) exactly zero (e.g. dQ, dK at T = 1, where dS = P (dP - D) cancels) is judged
  // against an RMS floor of kRmsFloor instead; real gradients here are >= 1e-2 in RMS
  const double n = (double)std::max<size_t>(indices.size(), 1);
  const double ref_rms = std::max(std::sqrt(ref2 / n), kRmsFloor);
  const double rel = std::sqrt(diff2) / (ref_rms * std::sqrt(n));
  EXPECT_LE(rel, rel_norm_tol) << what << ": relative-norm error (ref norm " << std::sqrt(ref2) << ")";
  size_t bad = 0;
  for (size_t i : indices) {
    if (!std::isfinite(gpu[i])) continue;
    if (std::fabs((double)gpu[i] - ref[i]) > elem_tol * (std::fabs(ref[i]) + ref_rms)) {
      if (bad < 3)
        ADD_FAILURE() << what << ": element " << i << " gpu " << gpu[i] << " ref " << ref[i] << " (rms " << ref_rms
                      << ")";
      bad++;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": elements outside the elementwise tolerance";
  return rel;
}

constexpr double kOutRelTol = 1e-2;
constexpr double kLseAbsTol = 1e-3;
constexpr double kGradRelTol = 2e-2;
constexpr double kElemTol = 0.1;

void check_attention(const Shape& s) {
  SCOPED_TRACE(describe(s));
  std::mt19937_64 rng(test_seed() ^ ((uint64_t)s.T * 1000003u + s.NH * 101u + s.NKV * 11u + s.HS + s.B * 7919u));
  // qkv with stddev 1.5: q.k/sqrt(HS) has stddev ~2.2, so peaked and flat rows both occur
  std::vector<bf16> qkv_h, dout_h;
  std::vector<float> qkv_f, dout_f;
  random_bf16(qkv_h, qkv_f, s.qkv_size(), 1.5f, rng);
  random_bf16(dout_h, dout_f, s.out_size(), 1.0f, rng);

  DeviceBuffer<bf16> qkv(s.qkv_size()), out(s.out_size()), dout(s.out_size()), dqkv(s.qkv_size()),
      dqkv2(s.qkv_size()), out2(s.out_size());
  DeviceBuffer<float> lse(s.lse_size()), lse2(s.lse_size());
  DeviceBuffer<float> scratch(llmc::attention_backward_scratch_floats(s.B, s.T, s.NH, s.HS, /*qkv_bias_grad=*/true));
  qkv.upload(qkv_h);
  dout.upload(dout_h);

  // ---- forward
  out.poison();
  lse.poison();
  llmc::attention_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.NH, s.NKV, s.HS, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> out_gpu_bf16 = out.download();
  const std::vector<float> out_gpu = to_float(out_gpu_bf16);
  const std::vector<float> lse_gpu = lse.download();

  std::vector<float> out_ref(s.out_size()), lse_ref(s.lse_size());
  llmc::attention_forward_cpu(out_ref.data(), lse_ref.data(), qkv_f.data(), s.B, s.T, s.NH, s.NKV, s.HS);

  for (int h = 0; h < s.NH; h++) {  // per head: a wrong head mapping cannot hide in the average
    std::vector<size_t> idx;
    for (int b = 0; b < s.B; b++)
      for (int t = 0; t < s.T; t++)
        for (int d = 0; d < s.HS; d++) idx.push_back(((size_t)b * s.T + t) * s.NH * s.HS + h * s.HS + d);
    const double rel = compare_slice(out_gpu, out_ref, idx, kOutRelTol, kElemTol, "out head " + std::to_string(h));
    if (h == 0) std::printf("  %s  out rel err %.2e", describe(s).c_str(), rel);
  }
  double lse_max_err = 0.0;
  size_t lse_bad = 0;
  for (size_t i = 0; i < lse_gpu.size(); i++) {
    const double err = std::fabs((double)lse_gpu[i] - lse_ref[i]);
    if (!(err <= kLseAbsTol)) {  // also catches NaN
      if (lse_bad < 3) ADD_FAILURE() << "lse[" << i << "] gpu " << lse_gpu[i] << " ref " << lse_ref[i];
      lse_bad++;
    } else {
      lse_max_err = std::max(lse_max_err, err);
    }
  }
  EXPECT_EQ(lse_bad, 0u) << "lse elements outside " << kLseAbsTol;
  std::printf("  lse max err %.2e", lse_max_err);

  // forward determinism (this run also reports the amax of out, which must be max |out| exactly)
  out2.poison();
  lse2.poison();
  DeviceBuffer<float> amax(1);
  CUDA_CHECK(cudaMemset(amax.ptr, 0, sizeof(float)));
  llmc::attention_forward(out2.ptr, lse2.ptr, qkv.ptr, s.B, s.T, s.NH, s.NKV, s.HS, 0, amax.ptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(0, std::memcmp(out2.download().data(), out_gpu_bf16.data(), s.out_size() * sizeof(bf16)))
      << "forward out not bit-identical across runs";
  EXPECT_EQ(0, std::memcmp(lse2.download().data(), lse_gpu.data(), s.lse_size() * sizeof(float)))
      << "forward lse not bit-identical across runs";
  float max_out = 0.0f;
  for (float v : out_gpu) max_out = std::max(max_out, std::fabs(v));
  EXPECT_EQ(amax.download()[0], max_out) << "forward amax";

  // ---- backward (on the GPU's own out and lse, as in training)
  dqkv.poison();
  scratch.poison();
  llmc::attention_backward(dqkv.ptr, scratch.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, s.B, s.T, s.NH, s.NKV, s.HS,
                           0);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> dqkv_gpu_bf16 = dqkv.download();
  const std::vector<float> dqkv_gpu = to_float(dqkv_gpu_bf16);

  std::vector<float> dqkv_ref(s.qkv_size());
  llmc::attention_backward_cpu(dqkv_ref.data(), dout_f.data(), qkv_f.data(), out_gpu.data(), lse_gpu.data(), s.B, s.T,
                               s.NH, s.NKV, s.HS);
  const int C3 = s.qkv_channels();
  double worst[3] = {0, 0, 0};
  const char* names[3] = {"dQ", "dK", "dV"};
  for (int section = 0; section < 3; section++) {
    const int heads = section == 0 ? s.NH : s.NKV;
    const int first_channel = section == 0 ? 0 : section == 1 ? s.NH * s.HS : (s.NH + s.NKV) * s.HS;
    for (int h = 0; h < heads; h++) {
      std::vector<size_t> idx;
      for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.T; t++)
          for (int d = 0; d < s.HS; d++) idx.push_back(((size_t)b * s.T + t) * C3 + first_channel + h * s.HS + d);
      const double rel = compare_slice(dqkv_gpu, dqkv_ref, idx, kGradRelTol, kElemTol,
                                       std::string(names[section]) + " head " + std::to_string(h));
      worst[section] = std::max(worst[section], rel);
    }
  }
  std::printf("  dq/dk/dv rel err %.2e %.2e %.2e\n", worst[0], worst[1], worst[2]);

  // backward determinism: two more runs, with the amax and the qkv bias gradient, must give the same dqkv bit for bit
  // (and the same bias gradient twice)
  std::mt19937_64 bias_rng(rng());
  std::vector<float> dbias0(C3);
  for (float& v : dbias0) v = std::uniform_real_distribution<float>(-1.f, 1.f)(bias_rng);
  std::vector<float> dbias_runs[2];
  for (int run = 0; run < 2; run++) {
    DeviceBuffer<float> dbias(C3);
    dbias.upload(dbias0);
    dqkv2.poison();
    scratch.poison();
    CUDA_CHECK(cudaMemset(amax.ptr, 0, sizeof(float)));
    llmc::attention_backward(dqkv2.ptr, scratch.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, s.B, s.T, s.NH, s.NKV,
                             s.HS, 0, amax.ptr, dbias.ptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(0, std::memcmp(dqkv2.download().data(), dqkv_gpu_bf16.data(), s.qkv_size() * sizeof(bf16)))
        << "backward dqkv not bit-identical across runs (run " << run << ")";
    dbias_runs[run] = dbias.download();
  }
  float max_dqkv = 0.0f;
  for (float v : dqkv_gpu) max_dqkv = std::max(max_dqkv, std::fabs(v));
  EXPECT_EQ(amax.download()[0], max_dqkv) << "backward amax (dQ, dK, dV)";
  // dbias = dbias0 + the column sums of the dqkv the kernels stored (FP64 reference over the bf16 values). FP32
  // sums of at most B*T terms in a fixed tree: error <= 2 * depth * 2^-24 * sum |terms| with depth <= 64 + B*T/32.
  std::vector<double> col_sum(dbias0.begin(), dbias0.end()), abs_sum(C3);
  for (int c = 0; c < C3; c++) abs_sum[c] = std::fabs(dbias0[c]);
  for (size_t row = 0; row < (size_t)s.B * s.T; row++)
    for (int c = 0; c < C3; c++) {
      col_sum[c] += dqkv_gpu[row * C3 + c];
      abs_sum[c] += std::fabs(dqkv_gpu[row * C3 + c]);
    }
  const double depth = 64.0 + (double)s.B * s.T / 32.0;
  size_t bias_bad = 0;
  for (int c = 0; c < C3; c++) {
    const double tol = 2.0 * depth * std::ldexp(1.0, -24) * abs_sum[c] + 1e-30;
    if (!(std::fabs(dbias_runs[0][c] - col_sum[c]) <= tol)) {  // also catches NaN
      if (bias_bad < 3) ADD_FAILURE() << "dbias[" << c << "] gpu " << dbias_runs[0][c] << " ref " << col_sum[c];
      bias_bad++;
    }
  }
  EXPECT_EQ(bias_bad, 0u) << "qkv bias gradient elements outside the FP32 summation bound";
  EXPECT_EQ(0, std::memcmp(dbias_runs[0].data(), dbias_runs[1].data(), C3 * sizeof(float)))
      << "qkv bias gradient not bit-identical across runs";
}

// Runs `check` with the given attention kernels selected, restoring the default afterwards. kAuto is skipped where it
// selects the same (portable) kernels as kPortable, i.e. for head size 128 and on GPUs other than Hopper.
void with_kernels(llmc::AttentionKernels kernels, int HS, const Shape& s) {
  struct Restore {
    ~Restore() { llmc::set_attention_kernels(llmc::AttentionKernels::kAuto); }
  } restore;
  llmc::set_attention_kernels(kernels);
  const std::string name = llmc::attention_kernels_name(HS);
  if (kernels == llmc::AttentionKernels::kAuto && name == "mma.sync")
    GTEST_SKIP() << "the default kernels here are the portable ones, tested by the kPortable case";
  std::printf("  kernels: %s\n", name.c_str());
  check_attention(s);
}

const char* kernels_label(llmc::AttentionKernels k) { return k == llmc::AttentionKernels::kAuto ? "auto" : "portable"; }

class AttentionShapes : public ::testing::TestWithParam<std::tuple<Shape, llmc::AttentionKernels>> {};

TEST_P(AttentionShapes, MatchesCpuReference) {
  const Shape& s = std::get<0>(GetParam());
  with_kernels(std::get<1>(GetParam()), s.HS, s);
}

std::vector<Shape> all_shapes() {
  std::vector<Shape> shapes;
  for (int hs : {64, 128}) {
    for (int t : {1, 7, 64, 100, 128, 257, 1024}) shapes.push_back({2, t, 2, 2, hs});  // multi-head
    for (int t : {100, 257}) {
      shapes.push_back({2, t, 4, 2, hs});  // grouped-query, 2 query heads per kv head
      shapes.push_back({1, t, 4, 1, hs});  // multi-query
    }
    shapes.push_back({3, 130, 3, 3, hs});  // odd batch and head counts
  }
  // several 128-row CTAs and streamed blocks per CTA (the Hopper kernels own 128 rows per CTA, 64 per warpgroup)
  shapes.push_back({2, 384, 2, 2, 64});
  shapes.push_back({1, 575, 4, 2, 64});
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionShapes,
                         ::testing::Combine(::testing::ValuesIn(all_shapes()),
                                            ::testing::Values(llmc::AttentionKernels::kPortable,
                                                              llmc::AttentionKernels::kAuto)),
                         [](const ::testing::TestParamInfo<std::tuple<Shape, llmc::AttentionKernels>>& info) {
                           const Shape& s = std::get<0>(info.param);
                           return "B" + std::to_string(s.B) + "_T" + std::to_string(s.T) + "_NH" +
                                  std::to_string(s.NH) + "_NKV" + std::to_string(s.NKV) + "_HS" +
                                  std::to_string(s.HS) + "_" + kernels_label(std::get<1>(info.param));
                         });

// A long sequence, every row checked (the CPU reference is O(T^2) per head: two heads sharing one kv head keep it
// to a few seconds).
TEST(AttentionLong, T4096MatchesCpuReference) {
  with_kernels(llmc::AttentionKernels::kPortable, 64, {1, 4096, 2, 1, 64});
}
TEST(AttentionLong, T4096DefaultKernelsMatchCpuReference) {
  with_kernels(llmc::AttentionKernels::kAuto, 64, {1, 4096, 2, 1, 64});
}

TEST(AttentionErrors, RejectsUnsupportedShapes) {
  EXPECT_THROW(llmc::attention_forward(nullptr, nullptr, nullptr, 1, 8, 2, 2, 80, 0), llmc::Error);  // head size
  EXPECT_THROW(llmc::attention_forward(nullptr, nullptr, nullptr, 1, 8, 6, 4, 64, 0), llmc::Error);  // NKV !| NH
}

}  // namespace
