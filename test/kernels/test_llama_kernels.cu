// test/kernels/test_llama_kernels: the Llama kernels (llmc/kernels/rmsnorm.cu, rope.cu, swiglu.cu) against their CPU references
// (themselves checked against finite differences in test/kernels/test_llama_kernel_refs). Each run draws a fresh seed
// (printed; LLM8_TEST_SEED replays it). Outputs are poisoned with NaN before every launch, references are computed from
// the bf16-rounded inputs, accumulated gradients are pre-filled to check +=, shapes include odd row counts, head sizes
// 64 and 128, grouped-query layouts and Llama-1B/3B widths; backward kernels run twice and must agree bit for bit.
// Every optional amax output is checked EXACTLY: it must equal max |bf16 value| of the tensor the kernel wrote (both
// are maxima of the same bf16 numbers), and passing an amax slot must not change the output bits.
//
// Tolerances (per element, |got - ref| <= tol; see gpu_test_util.cuh):
//   bf16 outputs: (2^-8 + rel) |ref| + atol. 2^-8 is the bf16 rounding of the exact result; rel is the relative FP32
//     noise before that rounding (it can push a value across a rounding boundary); atol covers results near zero.
//     Each test states its rel / atol and why.
//   FP32 parameter gradients: 2 * depth * 2^-24 * sum |terms| (classical float-summation bound, 2x margin).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test/support/gpu_test_util.cuh"
#include "llmc/core/common.h"
#include "llmc/kernels/encoder.h"
#include "llmc/kernels/rmsnorm.h"
#include "llmc/kernels/rope.h"
#include "llmc/kernels/swiglu.h"
#include "test/reference/kernels_ref.h"

namespace {

using namespace gpu_test;
using llmc::bf16;

std::mt19937_64 rng_for_test() { return make_rng("test_llama_kernels"); }

// The amax slot after a launch (zeroed before it).
float read_amax(const DeviceBuffer<float>& slot) { return slot.download()[0]; }

// ---------------------------------------------------------------------------------------------------------------
// RMSNorm
struct RowsShape {
  int N, C;
  float eps;
};
std::string shape_name(const ::testing::TestParamInfo<RowsShape>& info) {
  return "N" + std::to_string(info.param.N) + "_C" + std::to_string(info.param.C);
}

class RmsNormTest : public ::testing::TestWithParam<RowsShape> {};

// Inputs with a per-row scale (and an offset, which RMSNorm does not remove) so the statistics matter.
std::vector<float> rmsnorm_inputs(int N, int C, std::mt19937_64& rng) {
  std::vector<float> x = random_floats(static_cast<size_t>(N) * C, rng, -1, 1);
  const std::vector<float> offset = random_floats(N, rng, -1, 1), scale = random_floats(N, rng, 0.05f, 8.0f);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      float& value = x[static_cast<size_t>(n) * C + c];
      value = round_bf16(scale[n] * (offset[n] + value));
    }
  return x;
}

// out: atol 1e-4, rel 1e-5: |out| = |x| rstd |w| is O(5); rstd carries the FP32 error of a C-term sum of squares
// (<= ~1e-5 relative for C <= 4104 with the per-lane chains of C/256 terms). rstd: 1e-5 relative.
void check_rmsnorm_outputs(const std::vector<float>& out, const std::vector<float>& rstd,
                           const std::vector<float>& ref_out, const std::vector<float>& ref_rstd) {
  EXPECT_TRUE(within("rmsnorm out", out, ref_out, bf16_tolerance(ref_out, 1e-4, 1e-5)));
  std::vector<double> rstd_tol(rstd.size());
  for (size_t n = 0; n < rstd.size(); n++) rstd_tol[n] = 1e-5 * ref_rstd[n];
  EXPECT_TRUE(within("rmsnorm rstd", rstd, ref_rstd, rstd_tol));
}

TEST_P(RmsNormTest, ForwardMatchesReferenceWithExactAmax) {
  const RowsShape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp = rmsnorm_inputs(s.N, s.C, rng), weight = random_bf16_values(s.C, rng, -1.5f, 1.5f);
  auto d_inp = upload_bf16(inp), d_weight = upload_bf16(weight);
  DeviceBuffer<bf16> d_out(inp.size());
  DeviceBuffer<float> d_rstd(s.N), d_amax(1);
  // without amax
  d_out.poison(), d_rstd.poison();
  llmc::rmsnorm_forward(d_out.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, s.N, s.C, s.eps, 0);
  const std::vector<bf16> out_plain = d_out.download();
  // with amax
  d_out.poison(), d_rstd.poison(), d_amax.fill_value(0.0f);
  llmc::rmsnorm_forward(d_out.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, s.N, s.C, s.eps, 0, d_amax.ptr);
  const std::vector<float> out = download_bf16(d_out);
  EXPECT_TRUE(bitwise_equal("rmsnorm out with / without amax", to_bf16(out), out_plain));

  std::vector<float> ref_out(inp.size()), ref_rstd(s.N);
  llmc::rmsnorm_forward_cpu(ref_out.data(), ref_rstd.data(), inp.data(), weight.data(), s.N, s.C, s.eps);
  check_rmsnorm_outputs(out, d_rstd.download(), ref_out, ref_rstd);
  EXPECT_TRUE(amax_equals("rmsnorm out amax", read_amax(d_amax), max_abs(out)));
}

// residual = bf16(inp1 + inp2) exactly (one FP32 add, one rounding); out from the rounded residual.
TEST_P(RmsNormTest, FusedResidualForwardMatchesReferenceWithExactAmax) {
  const RowsShape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp1 = rmsnorm_inputs(s.N, s.C, rng), inp2 = random_bf16_values(inp1.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(s.C, rng, 0.5f, 1.5f);
  auto d_inp1 = upload_bf16(inp1), d_inp2 = upload_bf16(inp2), d_weight = upload_bf16(weight);
  DeviceBuffer<bf16> d_residual(inp1.size()), d_out(inp1.size());
  DeviceBuffer<float> d_rstd(s.N), d_amax(1);
  d_residual.poison(), d_out.poison(), d_rstd.poison(), d_amax.fill_value(0.0f);
  llmc::fused_residual_rmsnorm_forward(d_residual.ptr, d_out.ptr, d_rstd.ptr, d_inp1.ptr, d_inp2.ptr, d_weight.ptr,
                                       s.N, s.C, s.eps, 0, d_amax.ptr);
  std::vector<float> residual(inp1.size());
  for (size_t i = 0; i < residual.size(); i++) residual[i] = round_bf16(inp1[i] + inp2[i]);
  EXPECT_TRUE(within("residual", download_bf16(d_residual), residual, std::vector<double>(residual.size(), 0.0)));
  std::vector<float> ref_out(inp1.size()), ref_rstd(s.N);
  llmc::rmsnorm_forward_cpu(ref_out.data(), ref_rstd.data(), residual.data(), weight.data(), s.N, s.C, s.eps);
  const std::vector<float> out = download_bf16(d_out);
  check_rmsnorm_outputs(out, d_rstd.download(), ref_out, ref_rstd);
  EXPECT_TRUE(amax_equals("fused rmsnorm out amax", read_amax(d_amax), max_abs(out)));
  // Without rstd (null: not saved) and without amax the output is the same.
  d_out.poison();
  llmc::fused_residual_rmsnorm_forward(d_residual.ptr, d_out.ptr, nullptr, d_inp1.ptr, d_inp2.ptr, d_weight.ptr, s.N,
                                       s.C, s.eps, 0);
  EXPECT_TRUE(bitwise_equal("fused rmsnorm out without rstd / amax", download_bf16(d_out), out));
}

// dinp (bf16, pre-filled): atol 2e-4, rel 1e-5: the row terms are O(rstd |w dout|) with rstd up to ~20 for the
// small-scale rows, FP32 noise ~1e-6 relative plus the cancellation between the two terms. dweight: FP32 sums.
// dinp_amax: exactly max |dinp| after the addition.
TEST_P(RmsNormTest, BackwardMatchesReferenceIsDeterministicWithExactAmax) {
  const RowsShape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp = rmsnorm_inputs(s.N, s.C, rng), dout = random_bf16_values(inp.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(s.C, rng, 0.5f, 1.5f);
  const std::vector<float> dinp0 = random_bf16_values(inp.size(), rng, -1, 1);
  const std::vector<float> dweight0 = random_floats(s.C, rng, -1, 1);
  std::vector<float> out(inp.size()), rstd(s.N);
  llmc::rmsnorm_forward_cpu(out.data(), rstd.data(), inp.data(), weight.data(), s.N, s.C, s.eps);

  auto d_inp = upload_bf16(inp), d_dout = upload_bf16(dout), d_weight = upload_bf16(weight);
  DeviceBuffer<float> d_rstd(rstd), d_amax(1);
  DeviceBuffer<float> d_scratch(llmc::rmsnorm_backward_scratch_floats(s.N, s.C));
  std::vector<float> dinp_runs[3], dweight_runs[3];
  float amax = 0.0f;
  for (int run = 0; run < 3; run++) {  // runs 0, 1 with amax, run 2 without
    auto d_dinp = upload_bf16(dinp0);
    DeviceBuffer<float> d_dweight(dweight0);
    d_scratch.poison();
    d_amax.fill_value(0.0f);
    llmc::rmsnorm_backward(d_dinp.ptr, d_dweight.ptr, d_scratch.ptr, d_dout.ptr, d_inp.ptr, d_weight.ptr, d_rstd.ptr,
                           s.N, s.C, 0, run < 2 ? d_amax.ptr : nullptr);
    dinp_runs[run] = download_bf16(d_dinp);
    dweight_runs[run] = d_dweight.download();
    if (run == 0) amax = read_amax(d_amax);
  }
  std::vector<float> ref_dinp = dinp0, ref_dweight = dweight0;
  llmc::rmsnorm_backward_cpu(ref_dinp.data(), ref_dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(),
                             s.N, s.C);
  std::vector<float> abs_dweight = absolute(dweight0);
  for (int n = 0; n < s.N; n++)
    for (int c = 0; c < s.C; c++) {
      const size_t i = static_cast<size_t>(n) * s.C + c;
      abs_dweight[c] += std::fabs(dout[i] * inp[i] * rstd[n]);
    }
  EXPECT_TRUE(within("dinp", dinp_runs[0], ref_dinp, bf16_tolerance(ref_dinp, 2e-4, 1e-5)));
  EXPECT_TRUE(within("dweight", dweight_runs[0], ref_dweight,
                     fp32_sum_tolerance(abs_dweight, column_sum_depth(s.N))));
  EXPECT_TRUE(bitwise_equal("dinp", dinp_runs[0], dinp_runs[1]));
  EXPECT_TRUE(bitwise_equal("dweight", dweight_runs[0], dweight_runs[1]));
  EXPECT_TRUE(bitwise_equal("dinp with / without amax", dinp_runs[0], dinp_runs[2]));
  EXPECT_TRUE(bitwise_equal("dweight with / without amax", dweight_runs[0], dweight_runs[2]));
  EXPECT_TRUE(amax_equals("dinp amax", amax, max_abs(dinp_runs[0])));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormTest,
                         ::testing::Values(RowsShape{1, 8, 1e-5f}, RowsShape{5, 40, 1e-6f}, RowsShape{37, 768, 1e-5f},
                                           RowsShape{1031, 2048, 1e-5f}, RowsShape{4096, 2048, 1e-5f},
                                           RowsShape{33, 3072, 1e-5f}, RowsShape{7, 4104, 1e-6f}),
                         shape_name);

TEST(RmsNormChecks, RejectsBadArguments) {
  DeviceBuffer<bf16> out(24), inp(24), weight(12);
  DeviceBuffer<float> rstd(2);
  EXPECT_THROW(llmc::rmsnorm_forward(out.ptr, rstd.ptr, inp.ptr, weight.ptr, 2, 12, 1e-5f, 0), llmc::Error);
  EXPECT_THROW(llmc::rmsnorm_forward(out.ptr, rstd.ptr, inp.ptr, weight.ptr, 1, 8, 0.0f, 0), llmc::Error);
  EXPECT_THROW(llmc::rmsnorm_forward(out.ptr + 1, rstd.ptr, inp.ptr, weight.ptr, 1, 8, 1e-5f, 0), llmc::Error);
}

// ---------------------------------------------------------------------------------------------------------------
// RoPE
struct RopeShape {
  int B, T, NH, NKV, HS;
  float theta;
  int width() const { return (NH + 2 * NKV) * HS; }
  size_t size() const { return static_cast<size_t>(B) * T * width(); }
};
std::string rope_name(const ::testing::TestParamInfo<RopeShape>& info) {
  const RopeShape& s = info.param;
  return "B" + std::to_string(s.B) + "_T" + std::to_string(s.T) + "_NH" + std::to_string(s.NH) + "_NKV" +
         std::to_string(s.NKV) + "_HS" + std::to_string(s.HS) + "_theta" + std::to_string(static_cast<int>(s.theta));
}

class RopeTest : public ::testing::TestWithParam<RopeShape> {};

// q, k heads in [-2, 2]; value heads 4x larger so that an amax that skipped them would be caught.
std::vector<float> rope_inputs(const RopeShape& s, std::mt19937_64& rng) {
  std::vector<float> x = random_floats(s.size(), rng, -2, 2);
  const int value_begin = (s.NH + s.NKV) * s.HS;
  for (size_t row = 0; row < static_cast<size_t>(s.B) * s.T; row++)
    for (int j = 0; j < s.width(); j++) {
      float& v = x[row * s.width() + j];
      v = round_bf16(j >= value_begin ? 4.0f * v : v);
    }
  return x;
}

// Value heads must come back bit for bit.
::testing::AssertionResult values_untouched(const RopeShape& s, const std::vector<float>& got,
                                            const std::vector<float>& in) {
  const int value_begin = (s.NH + s.NKV) * s.HS;
  for (size_t row = 0; row < static_cast<size_t>(s.B) * s.T; row++)
    for (int j = value_begin; j < s.width(); j++) {
      const size_t i = row * s.width() + j;
      if (std::memcmp(&got[i], &in[i], sizeof(float)) != 0)
        return ::testing::AssertionFailure() << "value head element (row " << row << ", channel " << j
                                             << ") changed: " << in[i] << " -> " << got[i];
    }
  return ::testing::AssertionSuccess();
}

// The angle fl32(t * inv_freq) is the same FP32 number on both sides (inv_freq from FP64 pow, rounded), so the
// difference is sincosf (<= 2 ulp) and the FP32 rotation: atol 4e-6 for |q|, |k| <= 2 (about 4 * 2^-24 * (|a| + |b|)
// per term), on top of the bf16 rounding.
TEST_P(RopeTest, ForwardMatchesReference) {
  const RopeShape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> x = rope_inputs(s, rng);
  auto d_qkv = upload_bf16(x);
  llmc::rope_forward(d_qkv.ptr, s.B, s.T, s.NH, s.NKV, s.HS, s.theta, 0);
  const std::vector<float> got = download_bf16(d_qkv);
  std::vector<float> ref = x;
  llmc::rope_forward_cpu(ref.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.theta);
  EXPECT_TRUE(within("rope forward", got, ref, bf16_tolerance(ref, 4e-6)));
  EXPECT_TRUE(values_untouched(s, got, x));
}

// Backward (the inverse rotation, in place on dqkv) with and without the amax over the WHOLE dqkv (value heads
// included); two runs bitwise equal.
TEST_P(RopeTest, BackwardMatchesReferenceIsDeterministicWithExactAmax) {
  const RopeShape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> dy = rope_inputs(s, rng);
  std::vector<float> runs[3];
  float amax = 0.0f;
  DeviceBuffer<float> d_amax(1);
  for (int run = 0; run < 3; run++) {  // runs 0, 1 with amax, run 2 without
    auto d_dqkv = upload_bf16(dy);
    d_amax.fill_value(0.0f);
    llmc::rope_backward(d_dqkv.ptr, s.B, s.T, s.NH, s.NKV, s.HS, s.theta, 0, run < 2 ? d_amax.ptr : nullptr);
    runs[run] = download_bf16(d_dqkv);
    if (run == 0) amax = read_amax(d_amax);
  }
  std::vector<float> ref = dy;
  llmc::rope_backward_cpu(ref.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.theta);
  EXPECT_TRUE(within("rope backward", runs[0], ref, bf16_tolerance(ref, 4e-6)));
  EXPECT_TRUE(values_untouched(s, runs[0], dy));
  EXPECT_TRUE(bitwise_equal("rope backward", runs[0], runs[1]));
  EXPECT_TRUE(bitwise_equal("rope backward with / without amax", runs[0], runs[2]));
  EXPECT_TRUE(amax_equals("dqkv amax (whole tensor)", amax, max_abs(runs[0])));
}

// backward(forward(x)) = x up to two bf16 roundings: a check of the pairing that needs no reference.
TEST_P(RopeTest, BackwardUndoesForward) {
  const RopeShape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> x = rope_inputs(s, rng);
  auto d_qkv = upload_bf16(x);
  llmc::rope_forward(d_qkv.ptr, s.B, s.T, s.NH, s.NKV, s.HS, s.theta, 0);
  llmc::rope_backward(d_qkv.ptr, s.B, s.T, s.NH, s.NKV, s.HS, s.theta, 0);
  // Each rounding moves a value by <= 2^-8 of its pair's length (<= 2 sqrt(2)); after the second rotation the first
  // error is rotated too: |error| <= 2 * 2^-8 * 2 sqrt(2) + FP32 noise.
  EXPECT_TRUE(within("rope backward(forward(x))", download_bf16(d_qkv), x,
                     std::vector<double>(x.size(), 2 * kBf16Rtol * 2 * std::sqrt(2.0) + 1e-5)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Values(RopeShape{1, 1, 1, 1, 64, 10000.0f},        // one token: identity
                                           RopeShape{2, 37, 4, 4, 64, 10000.0f},       // multi-head, odd T
                                           RopeShape{3, 100, 8, 2, 128, 500000.0f},    // GQA 4:1, HS 128
                                           RopeShape{2, 257, 32, 8, 64, 500000.0f},    // Llama-3.2-1B heads
                                           RopeShape{1, 2048, 24, 8, 128, 500000.0f},  // Llama-3.2-3B, long T
                                           RopeShape{5, 33, 12, 3, 128, 10000.0f},     // GQA 4:1, 11 head groups
                                           RopeShape{1, 4096, 2, 1, 64, 10000.0f}),    // large angles
                         rope_name);

TEST(RopeChecks, RejectsBadArguments) {
  DeviceBuffer<bf16> qkv(3 * 48);
  EXPECT_THROW(llmc::rope_forward(qkv.ptr, 1, 1, 1, 1, 48 + 8, 10000.0f, 0), llmc::Error);  // HS % 16 != 0
  EXPECT_THROW(llmc::rope_forward(qkv.ptr, 1, 1, 3, 2, 16, 10000.0f, 0), llmc::Error);      // NKV does not divide NH
  EXPECT_THROW(llmc::rope_forward(qkv.ptr, 1, 1, 1, 1, 16, 0.0f, 0), llmc::Error);          // theta
  EXPECT_THROW(llmc::rope_backward(qkv.ptr + 1, 1, 1, 1, 1, 16, 10000.0f, 0), llmc::Error);  // alignment
}

// ---------------------------------------------------------------------------------------------------------------
// SwiGLU
struct SwigluShape {
  int N, F;
};
std::string swiglu_name(const ::testing::TestParamInfo<SwigluShape>& info) {
  return "N" + std::to_string(info.param.N) + "_F" + std::to_string(info.param.F);
}

class SwigluTest : public ::testing::TestWithParam<SwigluShape> {};

// gate in [-8, 8] (sigmoid saturating at both ends), up in [-2, 2].
std::vector<float> swiglu_inputs(const SwigluShape& s, std::mt19937_64& rng) {
  std::vector<float> gate_up(static_cast<size_t>(s.N) * 2 * s.F);
  const std::vector<float> g = random_bf16_values(gate_up.size(), rng, -8, 8), u = random_bf16_values(gate_up.size(), rng, -2, 2);
  for (int n = 0; n < s.N; n++)
    for (int j = 0; j < 2 * s.F; j++) {
      const size_t i = static_cast<size_t>(n) * 2 * s.F + j;
      gate_up[i] = j < s.F ? g[i] : u[i];
    }
  return gate_up;
}

// out: rel 1e-6 (expf 2 ulp, the IEEE division and two products: < 10 FP32 roundings), atol 1e-7 (near zero).
TEST_P(SwigluTest, ForwardMatchesReferenceWithExactAmax) {
  const SwigluShape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> gate_up = swiglu_inputs(s, rng);
  auto d_gate_up = upload_bf16(gate_up);
  DeviceBuffer<bf16> d_out(static_cast<size_t>(s.N) * s.F);
  DeviceBuffer<float> d_amax(1);
  d_out.poison();
  llmc::swiglu_forward(d_out.ptr, d_gate_up.ptr, s.N, s.F, 0);
  const std::vector<bf16> plain = d_out.download();
  d_out.poison();
  d_amax.fill_value(0.0f);
  llmc::swiglu_forward(d_out.ptr, d_gate_up.ptr, s.N, s.F, 0, d_amax.ptr);
  const std::vector<float> out = download_bf16(d_out);
  std::vector<float> ref(out.size());
  llmc::swiglu_forward_cpu(ref.data(), gate_up.data(), s.N, s.F);
  EXPECT_TRUE(within("swiglu out", out, ref, bf16_tolerance(ref, 1e-7, 1e-6)));
  EXPECT_TRUE(bitwise_equal("swiglu out with / without amax", to_bf16(out), plain));
  EXPECT_TRUE(amax_equals("swiglu out amax", read_amax(d_amax), max_abs(out)));
}

// dgate: atol 4e-6: silu'(g) = sig (1 + g (1 - sig)) crosses zero near g = -1.28, where its FP32 value carries an
// absolute error of ~|g| 2^-24 * few, times |dout up| <= 2. dup: rel 1e-6. Both halves overwritten (poisoned first).
TEST_P(SwigluTest, BackwardMatchesReferenceIsDeterministicWithExactAmax) {
  const SwigluShape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> gate_up = swiglu_inputs(s, rng);
  const std::vector<float> dout = random_bf16_values(static_cast<size_t>(s.N) * s.F, rng, -1, 1);
  auto d_gate_up = upload_bf16(gate_up), d_dout = upload_bf16(dout);
  DeviceBuffer<bf16> d_dgate_up(gate_up.size());
  DeviceBuffer<float> d_amax(1);
  std::vector<float> runs[3];
  float amax = 0.0f;
  for (int run = 0; run < 3; run++) {  // runs 0, 1 with amax, run 2 without
    d_dgate_up.poison();
    d_amax.fill_value(0.0f);
    llmc::swiglu_backward(d_dgate_up.ptr, d_dout.ptr, d_gate_up.ptr, s.N, s.F, 0, run < 2 ? d_amax.ptr : nullptr);
    runs[run] = download_bf16(d_dgate_up);
    if (run == 0) amax = read_amax(d_amax);
  }
  std::vector<float> ref(gate_up.size());
  llmc::swiglu_backward_cpu(ref.data(), dout.data(), gate_up.data(), s.N, s.F);
  EXPECT_TRUE(within("swiglu dgate_up", runs[0], ref, bf16_tolerance(ref, 4e-6, 1e-6)));
  EXPECT_TRUE(bitwise_equal("swiglu dgate_up", runs[0], runs[1]));
  EXPECT_TRUE(bitwise_equal("swiglu dgate_up with / without amax", runs[0], runs[2]));
  EXPECT_TRUE(amax_equals("dgate_up amax", amax, max_abs(runs[0])));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwigluTest,
                         ::testing::Values(SwigluShape{1, 8}, SwigluShape{3, 24}, SwigluShape{37, 1376},
                                           SwigluShape{1031, 2048}, SwigluShape{4096, 5632}, SwigluShape{9, 8192}),
                         swiglu_name);

TEST(SwigluChecks, RejectsBadArguments) {
  DeviceBuffer<bf16> out(64), gate_up(128);
  EXPECT_THROW(llmc::swiglu_forward(out.ptr, gate_up.ptr, 2, 12, 0), llmc::Error);       // F % 8 != 0
  EXPECT_THROW(llmc::swiglu_forward(out.ptr + 1, gate_up.ptr, 1, 8, 0), llmc::Error);    // alignment
  EXPECT_THROW(llmc::swiglu_backward(out.ptr, out.ptr, gate_up.ptr + 4, 1, 8, 0), llmc::Error);
}

// ---------------------------------------------------------------------------------------------------------------
// Token embedding without positions (Llama: wpe = dwpe = null): the forward copies the rows bit for bit; the backward
// matches the reference and never touches a position table.
TEST(EncoderTokenOnly, ForwardCopiesRowsBackwardMatchesReference) {
  auto rng = rng_for_test();
  const int B = 3, T = 37, C = 2048, Vp = 1024;
  std::uniform_int_distribution<int> token_dist(0, 50);  // repeats: buckets of several rows
  std::vector<int> tokens(B * T);
  for (int& t : tokens) t = token_dist(rng);
  const std::vector<float> wte = random_bf16_values(static_cast<size_t>(Vp) * C, rng, -1, 1);
  DeviceBuffer<int> d_tokens(tokens);
  auto d_wte = upload_bf16(wte);
  DeviceBuffer<bf16> d_out(static_cast<size_t>(B) * T * C);
  d_out.poison();
  llmc::encoder_forward(d_out.ptr, d_tokens.ptr, d_wte.ptr, nullptr, B, T, C, 0);
  std::vector<float> ref(static_cast<size_t>(B) * T * C);
  llmc::encoder_forward_cpu(ref.data(), tokens.data(), wte.data(), nullptr, B, T, C);
  EXPECT_TRUE(bitwise_equal("token-only embedding", download_bf16(d_out), ref));

  const std::vector<float> dout = random_bf16_values(ref.size(), rng, -1, 1);
  const std::vector<float> dwte0 = random_floats(wte.size(), rng, -1, 1);
  llmc::EncoderBackwardPlan plan;
  plan.build(tokens.data(), B, T, 0);
  auto d_dout = upload_bf16(dout);
  DeviceBuffer<float> d_dwte(dwte0);
  llmc::encoder_backward(d_dwte.ptr, nullptr, d_dout.ptr, plan, B, T, C, 0);
  const std::vector<float> got = d_dwte.download();
  plan.free();
  std::vector<float> want = dwte0, abs_sum = absolute(dwte0);
  llmc::encoder_backward_cpu(want.data(), nullptr, dout.data(), tokens.data(), B, T, C);
  llmc::encoder_backward_cpu(abs_sum.data(), nullptr, absolute(dout).data(), tokens.data(), B, T, C);
  EXPECT_TRUE(within("dwte (token-only)", got, want, fp32_sum_tolerance(abs_sum, B * T + 1)));
}

// An amax slot already holding a larger value keeps it (atomic max, never a store).
TEST(AmaxSlot, KeepsALargerPreviousValue) {
  auto rng = rng_for_test();
  const SwigluShape s{64, 256};
  auto d_gate_up = upload_bf16(swiglu_inputs(s, rng));
  DeviceBuffer<bf16> d_out(static_cast<size_t>(s.N) * s.F);
  DeviceBuffer<float> d_amax(std::vector<float>{1e30f});
  llmc::swiglu_forward(d_out.ptr, d_gate_up.ptr, s.N, s.F, 0, d_amax.ptr);
  EXPECT_EQ(read_amax(d_amax), 1e30f);
}

}  // namespace
