// test/kernels/test_fp8_activations: the FP8 1x16 copies of saved activations in the kernels that write and read them
// (llmc/kernels/fp8_groups.h): RMSNorm (plain and fused residual), SwiGLU and GELU.
//   Producers: with a copy wanted, the BF16 outputs (out, rstd, residual, out_amax) are the same bits as without, and
//     the copy equals the CPU quantiser of the saved tensor (test/reference/group_quant_ref.h) bit for bit.
//   Backward, exact plumbing: on a copy with power-of-two scales (its values are bf16 numbers) the FP8-reading
//     backward equals the BF16 backward on the dequantised tensor bit for bit: the same kernel and arithmetic, only the
//     loader differs (a wrong byte, group or scale index breaks this).
//   Backward against the CPU reference: on a real copy of x, the FP8-reading backward against the FP64 reference run
//     on the dequantised values (the reference's dequantiser, bit-exact with the device's), with the tolerances of the
//     BF16 tests (test_llama_kernels, test_kernels).
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
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/kernels/gelu.h"
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
  int rows, cols;  // RMSNorm / GELU: (N, C); SwiGLU: (N, F), gate_up (N, 2F)
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
}

}  // namespace
