// test/kernels/test_fp8_activations: the FP8 1x16 copies of saved activations in the kernels that write and read them
// (llmc/kernels/fp8_groups.h): RMSNorm and LayerNorm (plain and fused residual), SwiGLU and GELU.
//   Producers: with a copy wanted, the BF16 outputs (out, rstd, mean, residual, out_amax) are the same bits as without,
//     and the copy equals the CPU quantiser of the saved tensor (test/reference/group_quant_ref.h) bit for bit (for
//     LayerNorm also with zero, infinite, NaN and tiny groups).
//   Backward, exact plumbing: on a copy with power-of-two scales (its values are bf16 numbers) the FP8-reading
//     backward equals the BF16 backward on the dequantised tensor bit for bit: the same kernel and arithmetic, only the
//     loader differs (a wrong byte, group or scale index breaks this).
//   Backward against the CPU reference: on a real copy of x, the FP8-reading backward against the FP64 reference run
//     on the dequantised values (the reference's dequantiser, bit-exact with the device's), with the tolerances of the
//     BF16 tests (test_llama_kernels, test_kernels; dinp: bf16 rounding + 1e-5 relative + 2e-4 absolute).
//   Backward against BF16, on model shapes (B*T = 4096; C = 768, 2048; FFN 3072, 5632): the difference between the
//     FP8 and the BF16 result is bounded element by element by the first-order effect of the quantisation error
//     e = dequant(x) - x (|e| <= 2^-4 |x| for normal codes, test_group_quant_ref), plus the bf16 rounding of both
//     results (2^-8 each) and FP32 noise:
//       SwiGLU du = d silu(g):           |delta| <= |d| 1.1 |e_g|                  (|silu'| <= 1.1)
//              dg = d u silu'(g):        |delta| <= |d| (|e_u| |silu'(g)| + |u + e_u| 0.5 |e_g|)   (|silu''| <= 0.5)
//       GELU   d gelu'(x):               |delta| <= |d| 0.85 |e|                   (|gelu''| <= 0.8)
//       RMSNorm dinp = s g - x s^3 mean(g x) with the forward's rstd s (linear in x):
//                                        delta_i = -s^3 (e_i mean(g xq) + x_i mean(g e)), computed exactly
//               dweight_c += sum_r dout x s:  |delta_c| <= sum_r |dout e s| + the FP32 sum bounds
//       LayerNorm dinp = s (g - mean(g) - xhat mean(g xhat)), xhat = (x - m) s, with the forward's mean m and rstd s
//                 (linear in x):     delta_i = -s^2 (e_i mean(g xhatq) + xhat_i mean(g e)), computed exactly
//                 dweight_c += sum_r dout xhat:  |delta_c| <= sum_r |dout e s| + the FP32 sum bounds
//                 dbias does not read x: the same bits; dinp_sum and dinp_amax: of the dinp written
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/kernels/gelu.h"
#include "llmc/kernels/layernorm.h"
#include "llmc/kernels/rmsnorm.h"
#include "llmc/kernels/swiglu.h"
#include "test/reference/group_quant_ref.h"
#include "test/reference/kernels_ref.h"
#include "test/support/fp8_groups_test_util.cuh"
#include "test/support/gpu_test_util.cuh"

namespace {

using namespace gpu_test;
using llmc::bf16;

std::mt19937_64 rng_for_test() { return make_rng("test_fp8_activations"); }

struct Shape {
  int rows, cols;  // RMSNorm / LayerNorm / GELU: (N, C); SwiGLU: (N, F), gate_up (N, 2F)
};
std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  return "N" + std::to_string(info.param.rows) + "_C" + std::to_string(info.param.cols);
}

std::vector<float> dequant(const llmc::Fp8GroupsCpu& g, int rows, int cols) {
  return llmc::fp8_groups_dequantize_cpu(g.codes.data(), g.scale_inv.data(), rows, cols);
}

// |got - want| <= bound[i] + (2^-8 + 1e-5) (|got| + |want|) + atol, element by element.
::testing::AssertionResult within_bound(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                                        const std::vector<double>& bound, double atol) {
  std::vector<double> tol(got.size());
  for (size_t i = 0; i < got.size(); i++)
    tol[i] = bound[i] + (kBf16Rtol + 1e-5) * (std::fabs(got[i]) + std::fabs(want[i])) + atol;
  return within(what, got, want, tol);
}

// ---------------------------------------------------------------------------------------------------------------
// RMSNorm
class RmsNormFp8Test : public ::testing::TestWithParam<Shape> {};

TEST_P(RmsNormFp8Test, ForwardWritesTheCopyAndTheSameOutputs) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp = wide_range_bf16(static_cast<size_t>(s.rows) * s.cols, rng, 6);
  const std::vector<float> inp2 = random_bf16_values(inp.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(s.cols, rng, 0.5f, 1.5f);
  auto d_inp = upload_bf16(inp), d_inp2 = upload_bf16(inp2), d_weight = upload_bf16(weight);
  DeviceBuffer<bf16> d_out(inp.size()), d_res(inp.size());
  DeviceBuffer<float> d_rstd(s.rows);
  DeviceGroups g(s.rows, s.cols);
  std::vector<bf16> out[2];
  std::vector<float> rstd[2], amax[2];
  for (int save = 0; save < 2; save++) {
    AmaxSlot slot;
    d_out.poison(), d_rstd.poison();
    llmc::rmsnorm_forward(d_out.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, s.rows, s.cols, 1e-5f, 0, slot.ptr,
                          save ? g.out() : llmc::Fp8GroupsOut{});
    out[save] = d_out.download(), rstd[save] = d_rstd.download(), amax[save] = {slot.value()};
  }
  EXPECT_TRUE(bitwise_equal("rmsnorm out with / without copy", out[0], out[1]));
  EXPECT_TRUE(bitwise_equal("rmsnorm rstd with / without copy", rstd[0], rstd[1]));
  EXPECT_TRUE(bitwise_equal("rmsnorm out_amax with / without copy", amax[0], amax[1]));
  EXPECT_TRUE(g.equals("rmsnorm copy of inp", llmc::fp8_groups_quantize_cpu(inp.data(), s.rows, s.cols), true));

  // Fused residual: the copy is of the residual.
  std::vector<bf16> res[2];
  for (int save = 0; save < 2; save++) {
    g.poison(), d_out.poison(), d_res.poison(), d_rstd.poison();
    llmc::fused_residual_rmsnorm_forward(d_res.ptr, d_out.ptr, d_rstd.ptr, d_inp.ptr, d_inp2.ptr, d_weight.ptr,
                                         s.rows, s.cols, 1e-5f, 0, nullptr, save ? g.out() : llmc::Fp8GroupsOut{});
    out[save] = d_out.download(), res[save] = d_res.download(), rstd[save] = d_rstd.download();
  }
  EXPECT_TRUE(bitwise_equal("fused out with / without copy", out[0], out[1]));
  EXPECT_TRUE(bitwise_equal("fused residual with / without copy", res[0], res[1]));
  EXPECT_TRUE(bitwise_equal("fused rstd with / without copy", rstd[0], rstd[1]));
  const std::vector<float> residual = to_float(res[1]);
  EXPECT_TRUE(g.equals("copy of residual", llmc::fp8_groups_quantize_cpu(residual.data(), s.rows, s.cols), true));
}

struct RmsBackwardRun {
  std::vector<float> dinp, dweight;
  float amax;
};

template <class Inp>
RmsBackwardRun run_rmsnorm_backward(const Shape& s, const Inp& inp, const std::vector<float>& dout,
                                    const std::vector<float>& weight, const std::vector<float>& rstd,
                                    const std::vector<float>& dinp0, const std::vector<float>& dweight0) {
  auto d_dout = upload_bf16(dout), d_weight = upload_bf16(weight), d_dinp = upload_bf16(dinp0);
  DeviceBuffer<float> d_rstd(rstd), d_dweight(dweight0);
  DeviceBuffer<float> d_scratch(llmc::rmsnorm_backward_scratch_floats(s.rows, s.cols));
  d_scratch.poison();
  AmaxSlot slot;
  llmc::rmsnorm_backward(d_dinp.ptr, d_dweight.ptr, d_scratch.ptr, d_dout.ptr, inp, d_weight.ptr, d_rstd.ptr, s.rows,
                         s.cols, 0, slot.ptr);
  return {download_bf16(d_dinp), d_dweight.download(), slot.value()};
}

TEST_P(RmsNormFp8Test, BackwardOnExactCopyEqualsBf16Backward) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const llmc::Fp8GroupsCpu copy = exact_pow2_groups(s.rows, s.cols, rng, 3);
  const std::vector<float> x = dequant(copy, s.rows, s.cols);
  ASSERT_TRUE(bitwise_equal("pow2 copy is bf16-exact", to_float(to_bf16(x)), x));
  const std::vector<float> dout = random_bf16_values(x.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(s.cols, rng, 0.5f, 1.5f);
  const std::vector<float> dinp0 = random_bf16_values(x.size(), rng, -1, 1);
  const std::vector<float> dweight0 = random_floats(s.cols, rng, -1, 1);
  std::vector<float> out(x.size()), rstd(s.rows);
  llmc::rmsnorm_forward_cpu(out.data(), rstd.data(), x.data(), weight.data(), s.rows, s.cols, 1e-5f);
  auto d_x = upload_bf16(x);
  DeviceGroups g(s.rows, s.cols);
  g.upload(copy);
  const bf16* bf16_x = d_x.ptr;
  const RmsBackwardRun a = run_rmsnorm_backward(s, bf16_x, dout, weight, rstd, dinp0, dweight0);
  const RmsBackwardRun b = run_rmsnorm_backward(s, g.in(), dout, weight, rstd, dinp0, dweight0);
  EXPECT_TRUE(bitwise_equal("dinp fp8 vs bf16", b.dinp, a.dinp));
  EXPECT_TRUE(bitwise_equal("dweight fp8 vs bf16", b.dweight, a.dweight));
  EXPECT_EQ(llmc::float_to_bits(a.amax), llmc::float_to_bits(b.amax));
}

TEST_P(RmsNormFp8Test, BackwardMatchesReferenceAndBf16WithinQuantisationBound) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> x = wide_range_bf16(static_cast<size_t>(s.rows) * s.cols, rng, 2);
  const llmc::Fp8GroupsCpu copy = llmc::fp8_groups_quantize_cpu(x.data(), s.rows, s.cols);
  const std::vector<float> xq = dequant(copy, s.rows, s.cols);
  const std::vector<float> dout = random_bf16_values(x.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(s.cols, rng, 0.5f, 1.5f);
  const std::vector<float> dinp0 = random_bf16_values(x.size(), rng, -1, 1);
  const std::vector<float> dweight0 = random_floats(s.cols, rng, -1, 1);
  std::vector<float> out(x.size()), rstd(s.rows);
  llmc::rmsnorm_forward_cpu(out.data(), rstd.data(), x.data(), weight.data(), s.rows, s.cols, 1e-5f);
  auto d_x = upload_bf16(x);
  DeviceGroups g(s.rows, s.cols);
  g.upload(copy);
  const bf16* bf16_x = d_x.ptr;
  const RmsBackwardRun a = run_rmsnorm_backward(s, bf16_x, dout, weight, rstd, dinp0, dweight0);
  const RmsBackwardRun b = run_rmsnorm_backward(s, g.in(), dout, weight, rstd, dinp0, dweight0);
  // Against the reference on the dequantised values (test_llama_kernels' tolerances).
  std::vector<float> ref_dinp = dinp0, ref_dweight = dweight0;
  llmc::rmsnorm_backward_cpu(ref_dinp.data(), ref_dweight.data(), dout.data(), xq.data(), weight.data(), rstd.data(),
                             s.rows, s.cols);
  std::vector<float> abs_dweight = absolute(dweight0), dweight_bound(s.cols, 0.0f);
  std::vector<double> dinp_bound(x.size());
  for (int n = 0; n < s.rows; n++) {
    double sum_gxq = 0, sum_ge = 0;
    const double r = rstd[n];
    for (int c = 0; c < s.cols; c++) {
      const size_t i = static_cast<size_t>(n) * s.cols + c;
      const double gw = static_cast<double>(weight[c]) * dout[i];
      sum_gxq += gw * xq[i];
      sum_ge += gw * (static_cast<double>(xq[i]) - x[i]);
      abs_dweight[c] += std::fabs(dout[i] * xq[i] * rstd[n]) + std::fabs(dout[i] * x[i] * rstd[n]);
      dweight_bound[c] += static_cast<float>(std::fabs(dout[i] * (static_cast<double>(xq[i]) - x[i]) * r));
    }
    for (int c = 0; c < s.cols; c++) {
      const size_t i = static_cast<size_t>(n) * s.cols + c;
      const double e = static_cast<double>(xq[i]) - x[i];
      dinp_bound[i] = r * r * r * std::fabs(e * sum_gxq / s.cols + x[i] * sum_ge / s.cols);
    }
  }
  EXPECT_TRUE(within("dinp fp8 vs reference", b.dinp, ref_dinp, bf16_tolerance(ref_dinp, 2e-4, 1e-5)));
  std::vector<double> dw_tol = fp32_sum_tolerance(abs_dweight, column_sum_depth(s.rows));
  EXPECT_TRUE(within("dweight fp8 vs reference", b.dweight, ref_dweight, dw_tol));
  EXPECT_TRUE(within_bound("dinp fp8 vs bf16", b.dinp, a.dinp, dinp_bound, 2e-4));
  for (int c = 0; c < s.cols; c++) dw_tol[c] += dweight_bound[c];
  EXPECT_TRUE(within("dweight fp8 vs bf16", b.dweight, a.dweight, dw_tol));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormFp8Test,
                         ::testing::Values(Shape{1, 16}, Shape{5, 48}, Shape{37, 768}, Shape{4096, 768},
                                           Shape{4096, 2048}, Shape{7, 4112}),
                         shape_name);

// ---------------------------------------------------------------------------------------------------------------
// LayerNorm (GPT-2's norm) over (N, C)
class LayerNormFp8Test : public ::testing::TestWithParam<Shape> {};

// bf16-exact x with a per-row offset (the mean subtraction matters) and a wide range inside and across groups.
std::vector<float> layernorm_fp8_inputs(int N, int C, std::mt19937_64& rng, int spread) {
  std::vector<float> x = wide_range_bf16(static_cast<size_t>(N) * C, rng, spread);
  const std::vector<float> offset = random_floats(N, rng, -2, 2);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      float& v = x[static_cast<size_t>(n) * C + c];
      v = round_bf16(v + offset[n]);
    }
  return x;
}

// The outputs are LayerNorm's (so that "the same bits with and without the copy" cannot pass on two unwritten
// buffers); loose tolerances, test_kernels' LayerNormTest checks the values themselves.
void expect_layernorm_outputs(const char* what, const std::vector<bf16>& out, const std::vector<float>& mean,
                              const std::vector<float>& rstd, const std::vector<float>& x,
                              const std::vector<float>& weight, const std::vector<float>& bias, int N, int C) {
  std::vector<float> ref_out(x.size()), ref_mean(N), ref_rstd(N);
  llmc::layernorm_forward_cpu(ref_out.data(), ref_mean.data(), ref_rstd.data(), x.data(), weight.data(), bias.data(),
                              N, C);
  std::vector<double> mean_tol(N), rstd_tol(N);
  for (int n = 0; n < N; n++) {
    mean_tol[n] = 1e-4 * (std::fabs(ref_mean[n]) + 1.0 / ref_rstd[n]);
    rstd_tol[n] = 1e-4 * ref_rstd[n];
  }
  EXPECT_TRUE(within("out", to_float(out), ref_out, bf16_tolerance(ref_out, 1e-3))) << what;
  EXPECT_TRUE(within("mean", mean, ref_mean, mean_tol)) << what;
  EXPECT_TRUE(within("rstd", rstd, ref_rstd, rstd_tol)) << what;
}

TEST_P(LayerNormFp8Test, ForwardWritesTheCopyAndTheSameOutputs) {
  const Shape s = GetParam();
  const int N = s.rows, C = s.cols;
  auto rng = rng_for_test();
  std::vector<float> inp = layernorm_fp8_inputs(N, C, rng, 4);
  std::fill(inp.begin(), inp.begin() + llmc::kFp8GroupSize, 0.0f);  // an all-zero group: scale 1, codes +0
  const std::vector<float> inp2 = random_bf16_values(inp.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(C, rng, 0.5f, 1.5f), bias = random_bf16_values(C, rng, -1, 1);
  auto d_inp = upload_bf16(inp), d_inp2 = upload_bf16(inp2), d_weight = upload_bf16(weight),
       d_bias = upload_bf16(bias);
  DeviceBuffer<bf16> d_out(inp.size()), d_res(inp.size());
  DeviceBuffer<float> d_mean(N), d_rstd(N);
  DeviceGroups g(N, C);
  std::vector<bf16> out[2];
  std::vector<float> mean[2], rstd[2], amax[2];
  for (int save = 0; save < 2; save++) {
    AmaxSlot slot;
    d_out.poison(), d_mean.poison(), d_rstd.poison();
    llmc::layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, N, C, 0, slot.ptr,
                            save ? g.out() : llmc::Fp8GroupsOut{});
    out[save] = d_out.download(), mean[save] = d_mean.download(), rstd[save] = d_rstd.download();
    amax[save] = {slot.value()};
  }
  EXPECT_TRUE(bitwise_equal("layernorm out with / without copy", out[0], out[1]));
  EXPECT_TRUE(bitwise_equal("layernorm mean with / without copy", mean[0], mean[1]));
  EXPECT_TRUE(bitwise_equal("layernorm rstd with / without copy", rstd[0], rstd[1]));
  EXPECT_TRUE(bitwise_equal("layernorm out_amax with / without copy", amax[0], amax[1]));
  expect_layernorm_outputs("layernorm without copy", out[0], mean[0], rstd[0], inp, weight, bias, N, C);
  EXPECT_TRUE(g.equals("layernorm copy of inp", llmc::fp8_groups_quantize_cpu(inp.data(), N, C), true));

  // Fused residual: the copy is of the rounded residual; written without group_amax, which stays untouched.
  std::vector<bf16> res[2];
  for (int save = 0; save < 2; save++) {
    AmaxSlot slot;
    g.poison(), d_out.poison(), d_res.poison(), d_mean.poison(), d_rstd.poison();
    llmc::fused_residual_layernorm_forward(d_res.ptr, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_inp2.ptr,
                                           d_weight.ptr, d_bias.ptr, N, C, 0, slot.ptr,
                                           save ? g.out(false) : llmc::Fp8GroupsOut{});
    out[save] = d_out.download(), res[save] = d_res.download(), mean[save] = d_mean.download();
    rstd[save] = d_rstd.download(), amax[save] = {slot.value()};
  }
  EXPECT_TRUE(bitwise_equal("fused out with / without copy", out[0], out[1]));
  EXPECT_TRUE(bitwise_equal("fused residual with / without copy", res[0], res[1]));
  EXPECT_TRUE(bitwise_equal("fused mean with / without copy", mean[0], mean[1]));
  EXPECT_TRUE(bitwise_equal("fused rstd with / without copy", rstd[0], rstd[1]));
  EXPECT_TRUE(bitwise_equal("fused out_amax with / without copy", amax[0], amax[1]));
  std::vector<float> residual(inp.size());
  for (size_t i = 0; i < residual.size(); i++) residual[i] = round_bf16(inp[i] + inp2[i]);
  EXPECT_TRUE(bitwise_equal("fused residual", to_float(res[0]), residual));
  expect_layernorm_outputs("fused without copy", out[0], mean[0], rstd[0], residual, weight, bias, N, C);
  EXPECT_TRUE(g.equals("copy of residual", llmc::fp8_groups_quantize_cpu(residual.data(), N, C), false));
  const std::vector<float> group_amax = g.group_amax.download();
  EXPECT_TRUE(std::all_of(group_amax.begin(), group_amax.end(),
                          [](float a) { return llmc::float_to_bits(a) == 0xffffffffu; }))
      << "group_amax written although not asked for";
}

// Zero, infinite, NaN and tiny (below the 2^-117 clamp) groups in the copy, for the row-in-registers (C = 48) and the
// three-read (C = 1600) forward kernels; the outputs of rows with a non-finite value are NaN either way.
TEST(LayerNormFp8, ForwardCopyOfSpecialGroups) {
  for (int C : {48, 1600}) {
    const int N = 6;
    auto rng = rng_for_test();
    std::vector<float> inp = layernorm_fp8_inputs(N, C, rng, 2);
    std::fill(inp.begin() + C + 16, inp.begin() + C + 32, 0.0f);  // row 1, group 1: zeros
    inp[C + 17] = -0.0f;
    inp[2 * C + 20] = std::numeric_limits<float>::infinity();  // row 2, group 1: +inf
    inp[3 * C + 40] = std::numeric_limits<float>::quiet_NaN();  // row 3, group 2: NaN
    inp[4 * C + 3] = -std::numeric_limits<float>::infinity();   // row 4, group 0: -inf
    for (int c = 16; c < 32; c++) inp[5 * C + c] = round_bf16(std::ldexp(static_cast<float>(c - 20), -125));  // tiny
    const std::vector<float> weight = random_bf16_values(C, rng, 0.5f, 1.5f);
    const std::vector<float> bias = random_bf16_values(C, rng, -1, 1);
    auto d_inp = upload_bf16(inp), d_weight = upload_bf16(weight), d_bias = upload_bf16(bias);
    DeviceBuffer<bf16> d_out(inp.size());
    DeviceBuffer<float> d_mean(N), d_rstd(N);
    DeviceGroups g(N, C);
    std::vector<bf16> out[2];
    std::vector<float> mean[2], rstd[2];
    for (int save = 0; save < 2; save++) {
      d_out.poison(), d_mean.poison(), d_rstd.poison();
      llmc::layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, N, C, 0,
                              nullptr, save ? g.out() : llmc::Fp8GroupsOut{});
      out[save] = d_out.download(), mean[save] = d_mean.download(), rstd[save] = d_rstd.download();
    }
    EXPECT_TRUE(bitwise_equal("out with / without copy", out[0], out[1])) << "C = " << C;
    EXPECT_TRUE(bitwise_equal("mean with / without copy", mean[0], mean[1])) << "C = " << C;
    EXPECT_TRUE(bitwise_equal("rstd with / without copy", rstd[0], rstd[1])) << "C = " << C;
    EXPECT_TRUE(std::isfinite(mean[0][1]) && std::isfinite(mean[0][5]) && std::isnan(mean[0][3])) << "C = " << C;
    EXPECT_TRUE(g.equals("copy of special groups", llmc::fp8_groups_quantize_cpu(inp.data(), N, C), true))
        << "C = " << C;
  }
}

struct LnBackwardRun {
  std::vector<float> dinp, dweight, dbias, dinp_sum;
  float amax;
};

// The starting values the backward accumulates into: dinp, dweight, dbias, dinp_sum.
struct LnGradients {
  std::vector<float> dinp, dweight, dbias, dinp_sum;
};

// optional_outputs: with dinp_amax and dinp_sum (else both null: dinp_sum comes back empty, amax 0).
template <class Inp>
LnBackwardRun run_layernorm_backward(const Shape& s, const Inp& inp, const std::vector<float>& dout,
                                     const std::vector<float>& weight, const std::vector<float>& mean,
                                     const std::vector<float>& rstd, const LnGradients& start,
                                     bool optional_outputs = true) {
  auto d_dout = upload_bf16(dout), d_weight = upload_bf16(weight), d_dinp = upload_bf16(start.dinp);
  DeviceBuffer<float> d_mean(mean), d_rstd(rstd), d_dweight(start.dweight), d_dbias(start.dbias),
      d_dsum(start.dinp_sum);
  DeviceBuffer<float> d_scratch(llmc::layernorm_backward_scratch_floats(s.rows, s.cols));
  d_scratch.poison();
  AmaxSlot slot;
  llmc::layernorm_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_scratch.ptr, d_dout.ptr, inp, d_weight.ptr,
                           d_mean.ptr, d_rstd.ptr, s.rows, s.cols, 0, optional_outputs ? slot.ptr : nullptr,
                           optional_outputs ? d_dsum.ptr : nullptr);
  return {download_bf16(d_dinp), d_dweight.download(), d_dbias.download(),
          optional_outputs ? d_dsum.download() : std::vector<float>{}, slot.value()};
}

LnGradients layernorm_start_gradients(int N, int C, std::mt19937_64& rng) {
  return {random_bf16_values(static_cast<size_t>(N) * C, rng, -1, 1), random_floats(C, rng, -1, 1),
          random_floats(C, rng, -1, 1), random_floats(C, rng, -1, 1)};
}

TEST_P(LayerNormFp8Test, BackwardOnExactCopyEqualsBf16Backward) {
  const Shape s = GetParam();
  const int N = s.rows, C = s.cols;
  auto rng = rng_for_test();
  const llmc::Fp8GroupsCpu copy = exact_pow2_groups(N, C, rng, 3);
  const std::vector<float> x = dequant(copy, N, C);
  ASSERT_TRUE(bitwise_equal("pow2 copy is bf16-exact", to_float(to_bf16(x)), x));
  const std::vector<float> dout = random_bf16_values(x.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(C, rng, 0.5f, 1.5f), bias(C, 0.0f);
  const LnGradients start = layernorm_start_gradients(N, C, rng);
  std::vector<float> out(x.size()), mean(N), rstd(N);
  llmc::layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), weight.data(), bias.data(), N, C);
  auto d_x = upload_bf16(x);
  DeviceGroups g(N, C);
  g.upload(copy);
  const bf16* bf16_x = d_x.ptr;
  const LnBackwardRun a = run_layernorm_backward(s, bf16_x, dout, weight, mean, rstd, start);
  const LnBackwardRun b = run_layernorm_backward(s, g.in(), dout, weight, mean, rstd, start);
  EXPECT_TRUE(bitwise_equal("dinp fp8 vs bf16", b.dinp, a.dinp));
  EXPECT_TRUE(bitwise_equal("dweight fp8 vs bf16", b.dweight, a.dweight));
  EXPECT_TRUE(bitwise_equal("dbias fp8 vs bf16", b.dbias, a.dbias));
  EXPECT_TRUE(bitwise_equal("dinp_sum fp8 vs bf16", b.dinp_sum, a.dinp_sum));
  EXPECT_EQ(llmc::float_to_bits(a.amax), llmc::float_to_bits(b.amax));
  // without dinp_amax and dinp_sum: the same gradients
  const LnBackwardRun c = run_layernorm_backward(s, g.in(), dout, weight, mean, rstd, start, false);
  EXPECT_TRUE(bitwise_equal("dinp fp8 without optional outputs", c.dinp, b.dinp));
  EXPECT_TRUE(bitwise_equal("dweight fp8 without optional outputs", c.dweight, b.dweight));
  EXPECT_TRUE(bitwise_equal("dbias fp8 without optional outputs", c.dbias, b.dbias));
}

TEST_P(LayerNormFp8Test, BackwardMatchesReferenceAndBf16WithinQuantisationBound) {
  const Shape s = GetParam();
  const int N = s.rows, C = s.cols;
  auto rng = rng_for_test();
  const std::vector<float> x = layernorm_fp8_inputs(N, C, rng, 2);
  const llmc::Fp8GroupsCpu copy = llmc::fp8_groups_quantize_cpu(x.data(), N, C);
  const std::vector<float> xq = dequant(copy, N, C);
  const std::vector<float> dout = random_bf16_values(x.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(C, rng, 0.5f, 1.5f), bias(C, 0.0f);
  const LnGradients start = layernorm_start_gradients(N, C, rng);
  std::vector<float> out(x.size()), mean(N), rstd(N);
  llmc::layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), weight.data(), bias.data(), N, C);
  auto d_x = upload_bf16(x);
  DeviceGroups g(N, C);
  g.upload(copy);
  const bf16* bf16_x = d_x.ptr;
  const LnBackwardRun a = run_layernorm_backward(s, bf16_x, dout, weight, mean, rstd, start);
  const LnBackwardRun b = run_layernorm_backward(s, g.in(), dout, weight, mean, rstd, start);
  // Against the reference on the dequantised values, with the forward's mean and rstd (test_kernels' tolerances).
  std::vector<float> ref_dinp = start.dinp, ref_dweight = start.dweight, ref_dbias = start.dbias;
  llmc::layernorm_backward_cpu(ref_dinp.data(), ref_dweight.data(), ref_dbias.data(), dout.data(), xq.data(),
                               weight.data(), mean.data(), rstd.data(), N, C);
  std::vector<float> abs_dweight = absolute(start.dweight), abs_dbias = absolute(start.dbias), dweight_bound(C, 0.0f);
  std::vector<double> dinp_bound(x.size());
  for (int n = 0; n < N; n++) {
    const double m = mean[n], r = rstd[n];
    double sum_g_xhatq = 0, sum_ge = 0;
    for (int c = 0; c < C; c++) {
      const size_t i = static_cast<size_t>(n) * C + c;
      const double gw = static_cast<double>(weight[c]) * dout[i], e = static_cast<double>(xq[i]) - x[i];
      sum_g_xhatq += gw * (xq[i] - m) * r;
      sum_ge += gw * e;
      abs_dweight[c] += static_cast<float>(std::fabs(dout[i] * (xq[i] - m) * r) + std::fabs(dout[i] * (x[i] - m) * r));
      abs_dbias[c] += std::fabs(dout[i]);
      dweight_bound[c] += static_cast<float>(std::fabs(dout[i] * e * r));
    }
    for (int c = 0; c < C; c++) {
      const size_t i = static_cast<size_t>(n) * C + c;
      const double e = static_cast<double>(xq[i]) - x[i], xhat = (x[i] - m) * r;
      dinp_bound[i] = r * r * std::fabs(e * sum_g_xhatq / C + xhat * sum_ge / C);
    }
  }
  EXPECT_TRUE(within("dinp fp8 vs reference", b.dinp, ref_dinp, bf16_tolerance(ref_dinp, 2e-4, 1e-5)));
  std::vector<double> dw_tol = fp32_sum_tolerance(abs_dweight, column_sum_depth(N));
  EXPECT_TRUE(within("dweight fp8 vs reference", b.dweight, ref_dweight, dw_tol));
  EXPECT_TRUE(within("dbias fp8 vs reference", b.dbias, ref_dbias, fp32_sum_tolerance(abs_dbias, column_sum_depth(N))));
  EXPECT_TRUE(within_bound("dinp fp8 vs bf16", b.dinp, a.dinp, dinp_bound, 2e-4));
  for (int c = 0; c < C; c++) dw_tol[c] += dweight_bound[c];
  EXPECT_TRUE(within("dweight fp8 vs bf16", b.dweight, a.dweight, dw_tol));
  EXPECT_TRUE(bitwise_equal("dbias fp8 vs bf16 (independent of x)", b.dbias, a.dbias));
  // dinp_sum += the column sums of the dinp written (FP64 over the downloaded values); dinp_amax = max |dinp|
  std::vector<double> col_sum(start.dinp_sum.begin(), start.dinp_sum.end());
  std::vector<float> abs_col_sum = absolute(start.dinp_sum);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      const float v = b.dinp[static_cast<size_t>(n) * C + c];
      col_sum[c] += v;
      abs_col_sum[c] += std::fabs(v);
    }
  const std::vector<float> ref_dsum(col_sum.begin(), col_sum.end());
  EXPECT_TRUE(within("dinp_sum fp8", b.dinp_sum, ref_dsum, fp32_sum_tolerance(abs_col_sum, column_sum_depth(N))));
  EXPECT_TRUE(amax_equals("dinp_amax fp8", b.amax, max_abs(b.dinp)));
}

// C = 16, 48: one 8-channel chunk per lane; 768 / 1024: the row-in-registers forward with 3 / 4 chunks and the fused
// backward with an 8-row ring; 1600, 4096: the three-read forward and the fused backward with a 4-row ring; 4112: the
// row-per-warp backward. N = 1031, 37, 33, 7, 5: rows not a multiple of the 8-row blocks, the 16-row backward chunks
// or the 4-row padding of the scales.
INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormFp8Test,
                         ::testing::Values(Shape{1, 16}, Shape{5, 48}, Shape{37, 768}, Shape{4096, 768},
                                           Shape{1031, 1024}, Shape{33, 1600}, Shape{2, 4096}, Shape{7, 4112}),
                         shape_name);

// ---------------------------------------------------------------------------------------------------------------
// SwiGLU: rows N, cols F; gate_up (N, 2F).
class SwigluFp8Test : public ::testing::TestWithParam<Shape> {};

TEST_P(SwigluFp8Test, ForwardWritesTheCopyAndTheSameOutput) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> gate_up = wide_range_bf16(static_cast<size_t>(s.rows) * 2 * s.cols, rng, 4);
  auto d_gate_up = upload_bf16(gate_up);
  DeviceBuffer<bf16> d_out(static_cast<size_t>(s.rows) * s.cols);
  DeviceGroups g(s.rows, 2 * s.cols);
  std::vector<bf16> out[2];
  std::vector<float> amax[2];
  for (int save = 0; save < 2; save++) {
    AmaxSlot slot;
    d_out.poison();
    llmc::swiglu_forward(d_out.ptr, d_gate_up.ptr, s.rows, s.cols, 0, slot.ptr, save ? g.out() : llmc::Fp8GroupsOut{});
    out[save] = d_out.download(), amax[save] = {slot.value()};
  }
  EXPECT_TRUE(bitwise_equal("swiglu out with / without copy", out[0], out[1]));
  EXPECT_TRUE(bitwise_equal("swiglu out_amax with / without copy", amax[0], amax[1]));
  EXPECT_TRUE(g.equals("swiglu copy of gate_up", llmc::fp8_groups_quantize_cpu(gate_up.data(), s.rows, 2 * s.cols),
                       true));
}

// COAT's flow (from_copy): the output is computed from the copy's values, stored or not, and the recomputation from
// the stored copy gives the same bits; against the host SwiGLU of the host quantiser's values.
TEST_P(SwigluFp8Test, ForwardFromCopyIsRecomputedBitForBit) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const int N = s.rows, F = s.cols;
  const std::vector<float> gate_up = wide_range_bf16(static_cast<size_t>(N) * 2 * F, rng, 4);
  auto d_gate_up = upload_bf16(gate_up);
  DeviceBuffer<bf16> d_out(static_cast<size_t>(N) * F);
  DeviceGroups g(N, 2 * F);
  std::vector<bf16> out[3];
  std::vector<float> amax[3];
  for (int run = 0; run < 3; run++) {  // from_copy without storing it, storing it, recomputed from the stored copy
    AmaxSlot slot;
    d_out.poison();
    if (run < 2)
      llmc::swiglu_forward(d_out.ptr, d_gate_up.ptr, N, F, 0, slot.ptr, run == 1 ? g.out() : llmc::Fp8GroupsOut{},
                           /*from_copy=*/true);
    else
      llmc::swiglu_forward(d_out.ptr, g.in(), N, F, 0, slot.ptr);
    out[run] = d_out.download(), amax[run] = {slot.value()};
  }
  const llmc::Fp8GroupsCpu copy = llmc::fp8_groups_quantize_cpu(gate_up.data(), N, 2 * F);
  EXPECT_TRUE(g.equals("swiglu copy of gate_up (from_copy)", copy, true));
  EXPECT_TRUE(bitwise_equal("swiglu from_copy with / without storing it", out[1], out[0]));
  EXPECT_TRUE(bitwise_equal("swiglu recomputed from the stored copy", out[2], out[1]));
  EXPECT_TRUE(bitwise_equal("swiglu out_amax recomputed", amax[2], amax[1]));
  const std::vector<float> y = to_float(out[1]);
  EXPECT_TRUE(amax_equals("swiglu out_amax (from_copy)", amax[1][0], max_abs(y)));
  const std::vector<float> xq = dequant(copy, N, 2 * F);
  std::vector<float> ref(y.size());
  llmc::swiglu_forward_cpu(ref.data(), xq.data(), N, F);
  EXPECT_TRUE(within("swiglu from_copy vs reference on the copy's values", y, ref, bf16_tolerance(ref, 4e-6, 1e-6)));
  // and not the BF16 forward's output (the copy's rounding shows)
  d_out.poison();
  llmc::swiglu_forward(d_out.ptr, d_gate_up.ptr, N, F, 0);
  EXPECT_FALSE(bitwise_equal("swiglu from_copy vs from gate_up (expected to differ)", out[1], d_out.download()));
}

template <class Inp>
std::vector<float> run_swiglu_backward(const Shape& s, const Inp& gate_up, const std::vector<float>& dout) {
  auto d_dout = upload_bf16(dout);
  DeviceBuffer<bf16> d_dgate_up(static_cast<size_t>(s.rows) * 2 * s.cols);
  d_dgate_up.poison();
  llmc::swiglu_backward(d_dgate_up.ptr, d_dout.ptr, gate_up, s.rows, s.cols, 0);
  return download_bf16(d_dgate_up);
}

TEST_P(SwigluFp8Test, BackwardOnExactCopyEqualsBf16Backward) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const llmc::Fp8GroupsCpu copy = exact_pow2_groups(s.rows, 2 * s.cols, rng, 2);
  const std::vector<float> x = dequant(copy, s.rows, 2 * s.cols);
  const std::vector<float> dout = random_bf16_values(static_cast<size_t>(s.rows) * s.cols, rng, -1, 1);
  auto d_x = upload_bf16(x);
  DeviceGroups g(s.rows, 2 * s.cols);
  g.upload(copy);
  EXPECT_TRUE(bitwise_equal("dgate_up fp8 vs bf16", run_swiglu_backward(s, g.in(), dout),
                            run_swiglu_backward(s, static_cast<const bf16*>(d_x.ptr), dout)));
}

TEST_P(SwigluFp8Test, BackwardMatchesReferenceAndBf16WithinQuantisationBound) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const int N = s.rows, F = s.cols;
  const std::vector<float> x = wide_range_bf16(static_cast<size_t>(N) * 2 * F, rng, 2);
  const llmc::Fp8GroupsCpu copy = llmc::fp8_groups_quantize_cpu(x.data(), N, 2 * F);
  const std::vector<float> xq = dequant(copy, N, 2 * F);
  const std::vector<float> dout = random_bf16_values(static_cast<size_t>(N) * F, rng, -1, 1);
  auto d_x = upload_bf16(x);
  DeviceGroups g(N, 2 * F);
  g.upload(copy);
  const std::vector<float> a = run_swiglu_backward(s, static_cast<const bf16*>(d_x.ptr), dout);
  const std::vector<float> b = run_swiglu_backward(s, g.in(), dout);
  std::vector<float> ref(a.size());
  llmc::swiglu_backward_cpu(ref.data(), dout.data(), xq.data(), N, F);
  EXPECT_TRUE(within("dgate_up fp8 vs reference", b, ref, bf16_tolerance(ref, 4e-6, 1e-6)));
  std::vector<double> bound(a.size());
  for (int n = 0; n < N; n++)
    for (int j = 0; j < F; j++) {
      const size_t gi = static_cast<size_t>(n) * 2 * F + j, ui = gi + F;
      const double d = std::fabs(dout[static_cast<size_t>(n) * F + j]);
      const double e_g = std::fabs(static_cast<double>(xq[gi]) - x[gi]);
      const double e_u = std::fabs(static_cast<double>(xq[ui]) - x[ui]);
      const double gv = x[gi], sig = 1.0 / (1.0 + std::exp(-gv)), dsilu = sig * (1.0 + gv * (1.0 - sig));
      bound[gi] = d * (e_u * std::fabs(dsilu) + std::fabs(static_cast<double>(xq[ui])) * 0.5 * e_g);
      bound[ui] = d * 1.1 * e_g;
    }
  EXPECT_TRUE(within_bound("dgate_up fp8 vs bf16", b, a, bound, 4e-6));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwigluFp8Test,
                         ::testing::Values(Shape{1, 16}, Shape{3, 48}, Shape{37, 768}, Shape{4096, 5632},
                                           Shape{4096, 3072}),
                         shape_name);

// ---------------------------------------------------------------------------------------------------------------
// GELU over (N, C)
class GeluFp8Test : public ::testing::TestWithParam<Shape> {};

TEST_P(GeluFp8Test, ForwardWritesTheCopyAndTheSameOutput) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp = wide_range_bf16(static_cast<size_t>(s.rows) * s.cols, rng, 4);
  auto d_inp = upload_bf16(inp);
  DeviceBuffer<bf16> d_out(inp.size());
  DeviceGroups g(s.rows, s.cols);
  AmaxSlot plain_amax, save_amax;
  d_out.poison();
  llmc::gelu_forward(d_out.ptr, d_inp.ptr, inp.size(), 0, plain_amax.ptr);
  const std::vector<bf16> plain = d_out.download();
  d_out.poison();
  llmc::gelu_forward(d_out.ptr, d_inp.ptr, s.rows, s.cols, 0, save_amax.ptr, g.out());
  EXPECT_TRUE(bitwise_equal("gelu out with / without copy", d_out.download(), plain));
  EXPECT_EQ(llmc::float_to_bits(plain_amax.value()), llmc::float_to_bits(save_amax.value()));
  EXPECT_TRUE(g.equals("gelu copy of inp", llmc::fp8_groups_quantize_cpu(inp.data(), s.rows, s.cols), true));
}

TEST_P(GeluFp8Test, ForwardFromCopyIsRecomputedBitForBit) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp = wide_range_bf16(static_cast<size_t>(s.rows) * s.cols, rng, 4);
  auto d_inp = upload_bf16(inp);
  DeviceBuffer<bf16> d_out(inp.size());
  DeviceGroups g(s.rows, s.cols);
  std::vector<bf16> out[3];
  std::vector<float> amax[3];
  for (int run = 0; run < 3; run++) {  // from_copy without storing it, storing it, recomputed from the stored copy
    AmaxSlot slot;
    d_out.poison();
    if (run < 2)
      llmc::gelu_forward(d_out.ptr, d_inp.ptr, s.rows, s.cols, 0, slot.ptr, run == 1 ? g.out() : llmc::Fp8GroupsOut{},
                         /*from_copy=*/true);
    else
      llmc::gelu_forward(d_out.ptr, g.in(), s.rows, s.cols, 0, slot.ptr);
    out[run] = d_out.download(), amax[run] = {slot.value()};
  }
  const llmc::Fp8GroupsCpu copy = llmc::fp8_groups_quantize_cpu(inp.data(), s.rows, s.cols);
  EXPECT_TRUE(g.equals("gelu copy of inp (from_copy)", copy, true));
  EXPECT_TRUE(bitwise_equal("gelu from_copy with / without storing it", out[1], out[0]));
  EXPECT_TRUE(bitwise_equal("gelu recomputed from the stored copy", out[2], out[1]));
  EXPECT_TRUE(bitwise_equal("gelu out_amax recomputed", amax[2], amax[1]));
  const std::vector<float> y = to_float(out[1]);
  EXPECT_TRUE(amax_equals("gelu out_amax (from_copy)", amax[1][0], max_abs(y)));
  const std::vector<float> xq = dequant(copy, s.rows, s.cols);
  std::vector<float> ref(y.size());
  llmc::gelu_forward_cpu(ref.data(), xq.data(), xq.size());
  EXPECT_TRUE(within("gelu from_copy vs reference on the copy's values", y, ref, bf16_tolerance(ref, 1e-5)));
  d_out.poison();
  llmc::gelu_forward(d_out.ptr, d_inp.ptr, inp.size(), 0);
  EXPECT_FALSE(bitwise_equal("gelu from_copy vs from inp (expected to differ)", out[1], d_out.download()));
}

TEST_P(GeluFp8Test, BackwardOnExactCopyAndWithinQuantisationBound) {
  const Shape s = GetParam();
  auto rng = rng_for_test();
  const size_t n = static_cast<size_t>(s.rows) * s.cols;
  const std::vector<float> dout = random_bf16_values(n, rng, -1, 1);
  auto run = [&](auto inp) {
    auto d = upload_bf16(dout);
    if constexpr (std::is_same_v<decltype(inp), const bf16*>)
      llmc::gelu_backward_inplace(d.ptr, inp, n, 0);
    else
      llmc::gelu_backward_inplace(d.ptr, inp, s.rows, s.cols, 0);
    return download_bf16(d);
  };
  {  // exact copy: the same bits as the BF16 backward on its values
    const llmc::Fp8GroupsCpu copy = exact_pow2_groups(s.rows, s.cols, rng, 2);
    auto d_x = upload_bf16(dequant(copy, s.rows, s.cols));
    DeviceGroups g(s.rows, s.cols);
    g.upload(copy);
    const bf16* bf16_x = d_x.ptr;
    EXPECT_TRUE(bitwise_equal("gelu dinp fp8 vs bf16 (exact copy)", run(g.in()), run(bf16_x)));
  }
  const std::vector<float> x = wide_range_bf16(n, rng, 2);
  const llmc::Fp8GroupsCpu copy = llmc::fp8_groups_quantize_cpu(x.data(), s.rows, s.cols);
  const std::vector<float> xq = dequant(copy, s.rows, s.cols);
  auto d_x = upload_bf16(x);
  DeviceGroups g(s.rows, s.cols);
  g.upload(copy);
  const std::vector<float> a = run(static_cast<const bf16*>(d_x.ptr)), b = run(g.in());
  std::vector<float> ref = dout;
  llmc::gelu_backward_inplace_cpu(ref.data(), xq.data(), n);
  EXPECT_TRUE(within("gelu dinp fp8 vs reference", b, ref, bf16_tolerance(ref, 1e-5)));
  std::vector<double> bound(n);
  for (size_t i = 0; i < n; i++) bound[i] = std::fabs(dout[i]) * 0.85 * std::fabs(static_cast<double>(xq[i]) - x[i]);
  EXPECT_TRUE(within_bound("gelu dinp fp8 vs bf16", b, a, bound, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GeluFp8Test,
                         ::testing::Values(Shape{1, 16}, Shape{5, 48}, Shape{4096, 3072}, Shape{33, 784}),
                         shape_name);

TEST(Fp8ActivationChecks, RejectsBadArguments) {
  DeviceBuffer<bf16> out(64), inp(64), weight(40);
  DeviceBuffer<float> rstd(2);
  DeviceGroups g(1, 48);
  // C not a multiple of 16
  EXPECT_THROW(llmc::rmsnorm_forward(out.ptr, rstd.ptr, inp.ptr, weight.ptr, 1, 40, 1e-5f, 0, nullptr, g.out()),
               llmc::Error);
  EXPECT_THROW(llmc::swiglu_forward(out.ptr, inp.ptr, 1, 24, 0, nullptr, g.out()), llmc::Error);
  EXPECT_THROW(llmc::gelu_backward_inplace(out.ptr, g.in(), 1, 40, 0), llmc::Error);
  // a copy without scales
  llmc::Fp8GroupsOut no_scales = g.out();
  no_scales.scale_inv = nullptr;
  EXPECT_THROW(llmc::gelu_forward(out.ptr, inp.ptr, 1, 48, 0, nullptr, no_scales), llmc::Error);
  EXPECT_THROW(llmc::swiglu_backward(out.ptr, inp.ptr, llmc::Fp8Groups{g.codes.ptr, nullptr}, 1, 16, 0), llmc::Error);
  // from_copy without a copy stored still needs whole groups; the recomputations need a whole copy
  EXPECT_THROW(llmc::swiglu_forward(out.ptr, inp.ptr, 1, 24, 0, nullptr, llmc::Fp8GroupsOut{}, true), llmc::Error);
  EXPECT_THROW(llmc::gelu_forward(out.ptr, inp.ptr, 1, 40, 0, nullptr, llmc::Fp8GroupsOut{}, true), llmc::Error);
  EXPECT_THROW(llmc::swiglu_forward(out.ptr, llmc::Fp8Groups{g.codes.ptr, nullptr}, 1, 16, 0), llmc::Error);
  EXPECT_THROW(llmc::gelu_forward(out.ptr, llmc::Fp8Groups{g.codes.ptr, g.scale_inv.ptr}, 1, 40, 0), llmc::Error);
}

TEST(Fp8ActivationChecks, LayerNormRejectsBadArguments) {
  DeviceBuffer<bf16> out(64), res(64), inp(64), weight(48), bias(48);
  DeviceBuffer<float> mean(2), rstd(2), dweight(48), dbias(48), scratch(llmc::layernorm_backward_scratch_floats(1, 48));
  DeviceGroups g(1, 48);
  // C not a multiple of 16 with a copy asked for (without one, C = 40 is fine)
  EXPECT_THROW(llmc::layernorm_forward(out.ptr, mean.ptr, rstd.ptr, inp.ptr, weight.ptr, bias.ptr, 1, 40, 0, nullptr,
                                       g.out()),
               llmc::Error);
  EXPECT_THROW(llmc::fused_residual_layernorm_forward(res.ptr, out.ptr, mean.ptr, rstd.ptr, inp.ptr, inp.ptr,
                                                      weight.ptr, bias.ptr, 1, 40, 0, nullptr, g.out()),
               llmc::Error);
  EXPECT_THROW(llmc::layernorm_backward(out.ptr, dweight.ptr, dbias.ptr, scratch.ptr, inp.ptr, g.in(), weight.ptr,
                                        mean.ptr, rstd.ptr, 1, 40, 0),
               llmc::Error);
  EXPECT_NO_THROW(llmc::layernorm_forward(out.ptr, mean.ptr, rstd.ptr, inp.ptr, weight.ptr, bias.ptr, 1, 40, 0));
  // a copy without codes or scales
  llmc::Fp8GroupsOut no_scales = g.out();
  no_scales.scale_inv = nullptr;
  EXPECT_THROW(llmc::layernorm_forward(out.ptr, mean.ptr, rstd.ptr, inp.ptr, weight.ptr, bias.ptr, 1, 48, 0, nullptr,
                                       no_scales),
               llmc::Error);
  EXPECT_THROW(llmc::layernorm_backward(out.ptr, dweight.ptr, dbias.ptr, scratch.ptr, inp.ptr,
                                        llmc::Fp8Groups{g.codes.ptr, nullptr}, weight.ptr, mean.ptr, rstd.ptr, 1, 48, 0),
               llmc::Error);
  EXPECT_THROW(llmc::layernorm_backward(out.ptr, dweight.ptr, dbias.ptr, scratch.ptr, inp.ptr,
                                        llmc::Fp8Groups{nullptr, g.scale_inv.ptr}, weight.ptr, mean.ptr, rstd.ptr, 1,
                                        48, 0),
               llmc::Error);
}

}  // namespace
