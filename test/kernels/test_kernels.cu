// test/kernels/test_kernels: every kernel of llmc/kernels/ (but attention) against its CPU reference on random inputs.
// Each run draws a fresh seed (printed; set LLM8_TEST_SEED to replay). Outputs are poisoned with NaN before every
// launch, references are computed from the bf16-rounded inputs, gradients are pre-filled to check +=, shapes include
// odd row counts and GPT-2's (C = 768, V = 50257, Vp = 50304), and every backward / reduction kernel is run twice and
// compared bit for bit.
//
// Tolerances:
//   bf16 outputs: |got - ref| <= 2^-8 |ref| + atol. 2^-8 is bf16's unit roundoff (8 significant bits): rounding the
//     exact result to bf16 moves it by at most that much; atol (documented per test) covers the FP32 noise of the
//     GPU arithmetic, which only matters for results near zero.
//   FP32 sums (parameter gradients, norms): |got - ref| <= depth * 2^-24 * sum|terms| (the classical bound for
//     float summation, depth = the longest chain of additions any term goes through) with a 2x margin.
//
// Helpers (seed, random inputs, device buffers and amax slots, comparisons, tolerances): gpu_test_util.cuh.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "test/support/gpu_test_util.cuh"
#include "llmc/core/common.h"
#include "llmc/kernels/classifier.h"
#include "llmc/kernels/encoder.h"
#include "llmc/kernels/gelu.h"
#include "llmc/kernels/layernorm.h"
#include "llmc/kernels/reduce.h"
#include "test/reference/kernels_ref.h"

namespace {

using namespace gpu_test;
using llmc::bf16;

constexpr const char* kProgram = "test_kernels";  // names the run seed's line

std::mt19937_64 rng_for_test() { return make_rng(kProgram); }

// ---------------------------------------------------------------------------------------------------------------
struct EncoderShape {
  int B, T, C, Vp, distinct_tokens;  // tokens drawn from [0, distinct_tokens)
};

class EncoderTest : public ::testing::TestWithParam<EncoderShape> {};

// out = bf16(wte + wpe): one FP32 add of two bf16 values and one rounding on both sides, so exact equality.
TEST_P(EncoderTest, ForwardMatchesReference) {
  const EncoderShape s = GetParam();
  auto rng = rng_for_test();
  const int N = s.B * s.T;
  std::uniform_int_distribution<int> token_dist(0, s.distinct_tokens - 1);
  std::vector<int> tokens(N);
  for (int& t : tokens) t = token_dist(rng);
  const std::vector<float> wte = random_bf16_values(static_cast<size_t>(s.Vp) * s.C, rng, -1, 1);
  const std::vector<float> wpe = random_bf16_values(static_cast<size_t>(s.T) * s.C, rng, -1, 1);
  DeviceBuffer<int> d_tokens(tokens);
  auto d_wte = upload_bf16(wte), d_wpe = upload_bf16(wpe);
  DeviceBuffer<bf16> d_out(static_cast<size_t>(N) * s.C);
  d_out.poison();
  llmc::encoder_forward(d_out.ptr, d_tokens.ptr, d_wte.ptr, d_wpe.ptr, s.B, s.T, s.C, 0);
  std::vector<float> ref(static_cast<size_t>(N) * s.C);
  llmc::encoder_forward_cpu(ref.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
  for (float& x : ref) x = round_bf16(x);
  EXPECT_TRUE(within("encoder out", download_bf16(d_out), ref, std::vector<double>(ref.size(), 0.0)));
}

TEST_P(EncoderTest, BackwardMatchesReferenceAndIsDeterministic) {
  const EncoderShape s = GetParam();
  auto rng = rng_for_test();
  const int N = s.B * s.T;
  std::uniform_int_distribution<int> token_dist(0, s.distinct_tokens - 1);
  std::vector<int> tokens(N);
  for (int& t : tokens) t = token_dist(rng);
  const std::vector<float> dout = random_bf16_values(static_cast<size_t>(N) * s.C, rng, -1, 1);
  const std::vector<float> dwte0 = random_floats(static_cast<size_t>(s.Vp) * s.C, rng, -1, 1);
  const std::vector<float> dwpe0 = random_floats(static_cast<size_t>(s.T) * s.C, rng, -1, 1);

  llmc::EncoderBackwardPlan plan;
  plan.build(tokens.data(), s.B, s.T, 0);
  auto d_dout = upload_bf16(dout);
  std::vector<float> dwte_runs[2], dwpe_runs[2];
  for (int run = 0; run < 2; run++) {
    DeviceBuffer<float> d_dwte(dwte0), d_dwpe(dwpe0);
    llmc::encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_dout.ptr, plan, s.B, s.T, s.C, 0);
    dwte_runs[run] = d_dwte.download();
    dwpe_runs[run] = d_dwpe.download();
  }
  plan.free();

  std::vector<float> ref_wte = dwte0, ref_wpe = dwpe0;
  llmc::encoder_backward_cpu(ref_wte.data(), ref_wpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
  // Error scale: the same sums over |dout| plus |pre-fill|; depth: the largest bucket (dwte) or B (dwpe), plus 1.
  std::vector<float> abs_wte = absolute(dwte0), abs_wpe = absolute(dwpe0);
  llmc::encoder_backward_cpu(abs_wte.data(), abs_wpe.data(), absolute(dout).data(), tokens.data(), s.B, s.T, s.C);
  std::vector<int> count(s.Vp, 0);
  for (int t : tokens) count[t]++;
  const int largest_bucket = *std::max_element(count.begin(), count.end());
  EXPECT_TRUE(within("dwte", dwte_runs[0], ref_wte, fp32_sum_tolerance(abs_wte, largest_bucket + 1)));
  EXPECT_TRUE(within("dwpe", dwpe_runs[0], ref_wpe, fp32_sum_tolerance(abs_wpe, s.B + 1)));
  EXPECT_TRUE(bitwise_equal("dwte", dwte_runs[0], dwte_runs[1]));
  EXPECT_TRUE(bitwise_equal("dwpe", dwpe_runs[0], dwpe_runs[1]));
}

INSTANTIATE_TEST_SUITE_P(Shapes, EncoderTest,
                         ::testing::Values(EncoderShape{1, 1, 8, 8, 8}, EncoderShape{3, 37, 128, 1001, 7},
                                           EncoderShape{2, 33, 2056, 64, 64},
                                           EncoderShape{4, 256, 768, 50304, 50257},
                                           EncoderShape{4, 1024, 768, 50304, 300},
                                           EncoderShape{8, 1024, 768, 50304, 3},     // a few buckets of ~2700 rows
                                           EncoderShape{2, 64, 2048, 128, 100}));   // C = 2048: two column chunks

TEST(EncoderChecks, RejectsChannelsNotMultipleOf8) {
  DeviceBuffer<bf16> out(12), table(12);
  DeviceBuffer<int> tokens(std::vector<int>{0});
  EXPECT_THROW(llmc::encoder_forward(out.ptr, tokens.ptr, table.ptr, table.ptr, 1, 1, 12, 0), llmc::Error);
}

// ---------------------------------------------------------------------------------------------------------------
struct RowsShape {
  int N, C;
};

class LayerNormTest : public ::testing::TestWithParam<RowsShape> {};

// Inputs with a per-row offset and scale so that the mean subtraction and the variance both matter.
std::vector<float> layernorm_inputs(int N, int C, std::mt19937_64& rng) {
  std::vector<float> x = random_floats(static_cast<size_t>(N) * C, rng, -1, 1);
  const std::vector<float> offset = random_floats(N, rng, -3, 3), scale = random_floats(N, rng, 0.2f, 4.0f);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      float& value = x[static_cast<size_t>(n) * C + c];
      value = round_bf16(offset[n] + scale[n] * value);
    }
  return x;
}

// out atol 1e-4: |out| is O(5) and its FP32 error ~1e-6 relative; mean / rstd: FP32 statistics vs FP64, 1e-5
// relative to the row's magnitude.
void check_layernorm_outputs(const std::vector<float>& out, const std::vector<float>& mean,
                             const std::vector<float>& rstd, const std::vector<float>& ref_out,
                             const std::vector<float>& ref_mean, const std::vector<float>& ref_rstd) {
  EXPECT_TRUE(within("layernorm out", out, ref_out, bf16_tolerance(ref_out, 1e-4)));
  std::vector<double> mean_tol(mean.size()), rstd_tol(rstd.size());
  for (size_t n = 0; n < mean.size(); n++) {
    mean_tol[n] = 1e-5 * (std::fabs(ref_mean[n]) + 1.0 / ref_rstd[n]);
    rstd_tol[n] = 1e-5 * ref_rstd[n];
  }
  EXPECT_TRUE(within("layernorm mean", mean, ref_mean, mean_tol));
  EXPECT_TRUE(within("layernorm rstd", rstd, ref_rstd, rstd_tol));
}

TEST_P(LayerNormTest, ForwardMatchesReference) {
  const auto [N, C] = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp = layernorm_inputs(N, C, rng);
  const std::vector<float> weight = random_bf16_values(C, rng, 0.5f, 1.5f), bias = random_bf16_values(C, rng, -1, 1);
  auto d_inp = upload_bf16(inp), d_weight = upload_bf16(weight), d_bias = upload_bf16(bias);
  DeviceBuffer<bf16> d_out(inp.size());
  DeviceBuffer<float> d_mean(N), d_rstd(N);
  d_out.poison(), d_mean.poison(), d_rstd.poison();
  AmaxSlot amax;
  llmc::layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, N, C, 0, amax.ptr);
  std::vector<float> ref_out(inp.size()), ref_mean(N), ref_rstd(N);
  llmc::layernorm_forward_cpu(ref_out.data(), ref_mean.data(), ref_rstd.data(), inp.data(), weight.data(),
                              bias.data(), N, C);
  const std::vector<float> out = download_bf16(d_out);
  check_layernorm_outputs(out, d_mean.download(), d_rstd.download(), ref_out, ref_mean, ref_rstd);
  EXPECT_EQ(amax.value(), max_abs(out)) << "amax of the LayerNorm output";
}

// residual = bf16(inp1 + inp2) exactly (one FP32 add, one rounding); out from the rounded residual.
TEST_P(LayerNormTest, FusedResidualForwardMatchesReference) {
  const auto [N, C] = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp1 = layernorm_inputs(N, C, rng), inp2 = random_bf16_values(inp1.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(C, rng, 0.5f, 1.5f), bias = random_bf16_values(C, rng, -1, 1);
  auto d_inp1 = upload_bf16(inp1), d_inp2 = upload_bf16(inp2), d_weight = upload_bf16(weight),
       d_bias = upload_bf16(bias);
  DeviceBuffer<bf16> d_residual(inp1.size()), d_out(inp1.size());
  DeviceBuffer<float> d_mean(N), d_rstd(N);
  d_residual.poison(), d_out.poison(), d_mean.poison(), d_rstd.poison();
  AmaxSlot amax;
  llmc::fused_residual_layernorm_forward(d_residual.ptr, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp1.ptr, d_inp2.ptr,
                                         d_weight.ptr, d_bias.ptr, N, C, 0, amax.ptr);
  std::vector<float> residual(inp1.size());
  for (size_t i = 0; i < residual.size(); i++) residual[i] = round_bf16(inp1[i] + inp2[i]);
  EXPECT_TRUE(within("residual", download_bf16(d_residual), residual, std::vector<double>(residual.size(), 0.0)));
  std::vector<float> ref_out(inp1.size()), ref_mean(N), ref_rstd(N);
  llmc::layernorm_forward_cpu(ref_out.data(), ref_mean.data(), ref_rstd.data(), residual.data(), weight.data(),
                              bias.data(), N, C);
  const std::vector<float> out = download_bf16(d_out);
  check_layernorm_outputs(out, d_mean.download(), d_rstd.download(), ref_out, ref_mean, ref_rstd);
  EXPECT_EQ(amax.value(), max_abs(out)) << "amax of the fused LayerNorm output";
}

// dinp (bf16, pre-filled) atol 2e-4: the row terms are O(rstd * |weight * dout|) = O(10) with FP32 noise ~1e-6
// relative, plus cancellation between the three terms. dweight, dbias: FP32 sums (see top of file).
TEST_P(LayerNormTest, BackwardMatchesReferenceAndIsDeterministic) {
  const auto [N, C] = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp = layernorm_inputs(N, C, rng), dout = random_bf16_values(inp.size(), rng, -1, 1);
  const std::vector<float> weight = random_bf16_values(C, rng, 0.5f, 1.5f), bias(C, 0.0f);
  const std::vector<float> dinp0 = random_bf16_values(inp.size(), rng, -1, 1);
  const std::vector<float> dweight0 = random_floats(C, rng, -1, 1), dbias0 = random_floats(C, rng, -1, 1);
  const std::vector<float> dsum0 = random_floats(C, rng, -1, 1);  // dinp_sum's starting value
  std::vector<float> out(inp.size()), mean(N), rstd(N);
  llmc::layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);

  auto d_inp = upload_bf16(inp), d_dout = upload_bf16(dout), d_weight = upload_bf16(weight);
  DeviceBuffer<float> d_mean(mean), d_rstd(rstd);
  DeviceBuffer<float> d_scratch(llmc::layernorm_backward_scratch_floats(N, C));
  // run 0: with the amax and the column sums of dinp; run 1: the same call (determinism); run 2: neither (the
  // optional outputs change nothing else)
  std::vector<float> dinp_runs[3], dweight_runs[3], dbias_runs[3], dsum_runs[2];
  AmaxSlot amax;
  for (int run = 0; run < 3; run++) {
    auto d_dinp = upload_bf16(dinp0);
    DeviceBuffer<float> d_dweight(dweight0), d_dbias(dbias0), d_dsum(dsum0);
    d_scratch.poison();
    llmc::layernorm_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_scratch.ptr, d_dout.ptr, d_inp.ptr,
                             d_weight.ptr, d_mean.ptr, d_rstd.ptr, N, C, 0, run == 0 ? amax.ptr : nullptr,
                             run < 2 ? d_dsum.ptr : nullptr);
    dinp_runs[run] = download_bf16(d_dinp);
    dweight_runs[run] = d_dweight.download();
    dbias_runs[run] = d_dbias.download();
    if (run < 2) dsum_runs[run] = d_dsum.download();
  }
  std::vector<float> ref_dinp = dinp0, ref_dweight = dweight0, ref_dbias = dbias0;
  llmc::layernorm_backward_cpu(ref_dinp.data(), ref_dweight.data(), ref_dbias.data(), dout.data(), inp.data(),
                               weight.data(), mean.data(), rstd.data(), N, C);
  std::vector<float> abs_dweight = absolute(dweight0), abs_dbias = absolute(dbias0);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      const size_t i = static_cast<size_t>(n) * C + c;
      abs_dweight[c] += std::fabs(dout[i] * (inp[i] - mean[n]) * rstd[n]);
      abs_dbias[c] += std::fabs(dout[i]);
    }
  EXPECT_TRUE(within("dinp", dinp_runs[0], ref_dinp, bf16_tolerance(ref_dinp, 2e-4)));
  EXPECT_EQ(amax.value(), max_abs(dinp_runs[0])) << "amax of dinp (after the accumulation)";
  EXPECT_TRUE(within("dweight", dweight_runs[0], ref_dweight, fp32_sum_tolerance(abs_dweight, column_sum_depth(N))));
  EXPECT_TRUE(within("dbias", dbias_runs[0], ref_dbias, fp32_sum_tolerance(abs_dbias, column_sum_depth(N))));
  // dinp_sum += the column sums of the dinp the kernel wrote (FP64 over the downloaded bf16 values)
  std::vector<double> col_sum(dsum0.begin(), dsum0.end());
  std::vector<float> abs_col_sum = absolute(dsum0);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      const float v = dinp_runs[0][static_cast<size_t>(n) * C + c];
      col_sum[c] += v;
      abs_col_sum[c] += std::fabs(v);
    }
  const std::vector<float> ref_dsum(col_sum.begin(), col_sum.end());
  EXPECT_TRUE(within("dinp_sum", dsum_runs[0], ref_dsum, fp32_sum_tolerance(abs_col_sum, column_sum_depth(N))));
  for (int run = 1; run < 3; run++) {
    EXPECT_TRUE(bitwise_equal("dinp", dinp_runs[0], dinp_runs[run])) << "run " << run;
    EXPECT_TRUE(bitwise_equal("dweight", dweight_runs[0], dweight_runs[run])) << "run " << run;
    EXPECT_TRUE(bitwise_equal("dbias", dbias_runs[0], dbias_runs[run])) << "run " << run;
  }
  EXPECT_TRUE(bitwise_equal("dinp_sum", dsum_runs[0], dsum_runs[1]));
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormTest,
                         ::testing::Values(RowsShape{1, 8}, RowsShape{5, 40}, RowsShape{37, 768}, RowsShape{33, 1600},
                                           RowsShape{1031, 768}, RowsShape{4096, 768}, RowsShape{7, 4104},
                                           RowsShape{17, 264}, RowsShape{300, 1024},   // C <= 4096: fused backward
                                           RowsShape{2, 4096}));

// ---------------------------------------------------------------------------------------------------------------
class GeluTest : public ::testing::TestWithParam<size_t> {};

// atol 2e-6: FP32 tanhf (2 ulp) and the cancellation in 1 + tanh(u) for u << 0, times |x| <= 6.
TEST_P(GeluTest, ForwardMatchesReference) {
  const size_t n = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp = random_bf16_values(n, rng, -6, 6);
  auto d_inp = upload_bf16(inp);
  DeviceBuffer<bf16> d_out(n);
  d_out.poison();
  AmaxSlot amax;
  llmc::gelu_forward(d_out.ptr, d_inp.ptr, n, 0, amax.ptr);
  std::vector<float> ref(n);
  llmc::gelu_forward_cpu(ref.data(), inp.data(), n);
  const std::vector<float> out = download_bf16(d_out);
  EXPECT_TRUE(within("gelu out", out, ref, bf16_tolerance(ref, 2e-6)));
  EXPECT_EQ(amax.value(), max_abs(out)) << "amax of the GELU output";
}

// atol 1e-5: as above for gelu' (O(1) terms), times |dout| <= 1.
TEST_P(GeluTest, BackwardMatchesReferenceAndIsDeterministic) {
  const size_t n = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> inp = random_bf16_values(n, rng, -6, 6), dout = random_bf16_values(n, rng, -1, 1);
  auto d_inp = upload_bf16(inp);
  std::vector<float> runs[2];
  AmaxSlot amax;
  for (int run = 0; run < 2; run++) {
    auto d_dinout = upload_bf16(dout);
    llmc::gelu_backward_inplace(d_dinout.ptr, d_inp.ptr, n, 0, run == 0 ? amax.ptr : nullptr);
    runs[run] = download_bf16(d_dinout);
  }
  EXPECT_EQ(amax.value(), max_abs(runs[0])) << "amax of the GELU input gradient";
  std::vector<float> ref = dout;
  llmc::gelu_backward_inplace_cpu(ref.data(), inp.data(), n);
  EXPECT_TRUE(within("gelu dinp", runs[0], ref, bf16_tolerance(ref, 1e-5)));
  EXPECT_TRUE(bitwise_equal("gelu dinp", runs[0], runs[1]));
}

INSTANTIATE_TEST_SUITE_P(Lengths, GeluTest,
                         ::testing::Values(size_t{1}, size_t{7}, size_t{8}, size_t{13}, size_t{4099},
                                           size_t{16 * 64 * 3072}, (size_t{1} << 20) + 5));

// ---------------------------------------------------------------------------------------------------------------
struct ClassifierShape {
  int N, V, Vp;
};

class ClassifierTest : public ::testing::TestWithParam<ClassifierShape> {};

// losses: FP32 log-sum-exp over V terms, atol 1e-4 + 1e-5 |ref|. dlogits (bf16): 2^-8 |ref| + 1e-6 * dloss (the
// FP32 noise of expf and of the sum is ~1e-5 relative to the probability). Padding columns and ignored rows: exactly 0.
TEST_P(ClassifierTest, MatchesReferenceAndIsDeterministic) {
  const auto [N, V, Vp] = GetParam();
  auto rng = rng_for_test();
  const size_t size = static_cast<size_t>(N) * Vp;
  std::vector<float> logits = random_bf16_values(size, rng, -6, 6);
  for (int n = 0; n < N; n++) {
    if (n % 3 == 1)  // a row with large logits: the max subtraction must keep exp() finite
      for (int c = 0; c < V; c++) {
        float& logit = logits[static_cast<size_t>(n) * Vp + c];
        logit = round_bf16(logit + 80);
      }
    for (int c = V; c < Vp; c++) logits[static_cast<size_t>(n) * Vp + c] = NAN;  // padding is never read
  }
  std::uniform_int_distribution<int> target_dist(0, V - 1);
  std::vector<int> targets(N);
  for (int n = 0; n < N; n++) targets[n] = (n % 5 == 2) ? -1 : target_dist(rng);
  targets[0] = V - 1;  // the last real column
  const float dloss = 1.0f / N;
  DeviceBuffer<int> d_targets(targets);

  // Loss only: logits stay untouched.
  auto d_logits = upload_bf16(logits);
  DeviceBuffer<float> d_losses(N);
  d_losses.poison();
  llmc::fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, N, V, Vp, dloss, false, 0);
  const std::vector<float> losses_only = d_losses.download();
  EXPECT_TRUE(bitwise_equal("logits untouched without write_dlogits", to_bf16(logits), d_logits.download()));

  std::vector<float> dlogit_runs[2], loss_runs[2];
  for (int run = 0; run < 2; run++) {
    d_logits.upload(to_bf16(logits));
    d_losses.poison();
    llmc::fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, N, V, Vp, dloss, true, 0);
    dlogit_runs[run] = download_bf16(d_logits);
    loss_runs[run] = d_losses.download();
  }
  std::vector<float> ref_dlogits = logits, ref_losses(N);
  llmc::fused_classifier_cpu(ref_dlogits.data(), ref_losses.data(), targets.data(), N, V, Vp, dloss, true);

  std::vector<double> loss_tol(N);
  for (int n = 0; n < N; n++) loss_tol[n] = 1e-4 + 1e-5 * std::fabs(ref_losses[n]);
  EXPECT_TRUE(within("losses", loss_runs[0], ref_losses, loss_tol));
  EXPECT_TRUE(within("dlogits", dlogit_runs[0], ref_dlogits, bf16_tolerance(ref_dlogits, 1e-6 * dloss)));
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < Vp; c++)
      if (c >= V || targets[n] < 0)
        ASSERT_EQ(dlogit_runs[0][static_cast<size_t>(n) * Vp + c], 0.0f) << "row " << n << " column " << c;
    if (targets[n] < 0) EXPECT_EQ(loss_runs[0][n], 0.0f) << "ignored row " << n;
  }
  EXPECT_TRUE(bitwise_equal("losses with and without dlogits", losses_only, loss_runs[0]));
  EXPECT_TRUE(bitwise_equal("dlogits", dlogit_runs[0], dlogit_runs[1]));
  EXPECT_TRUE(bitwise_equal("losses", loss_runs[0], loss_runs[1]));
}

INSTANTIATE_TEST_SUITE_P(Shapes, ClassifierTest,
                         ::testing::Values(ClassifierShape{3, 10, 16}, ClassifierShape{37, 1000, 1008},
                                           ClassifierShape{5, 50257, 50304}, ClassifierShape{64, 50257, 50304},
                                           ClassifierShape{2, 8, 8}, ClassifierShape{9, 20000, 20008},
                                           ClassifierShape{6, 128256, 128256}));  // last: the two-pass kernel

// The mean loss accumulated on the device against the FP64 host mean: both sum FP32 losses in FP64 (in different
// orders), so they agree to ~1e-15 relative; ignored rows must not count; nothing is added when all are ignored.
TEST(AccumulateMeanLoss, MatchesReferenceAndAccumulates) {
  auto rng = rng_for_test();
  for (const int N : {1, 1000, 32768, 70001}) {
    std::uniform_real_distribution<float> loss_dist(0.0f, 12.0f);
    std::uniform_int_distribution<int> target_dist(-1, 9);  // about 1 in 11 ignored
    std::vector<float> losses(N);
    std::vector<int> targets(N);
    for (int i = 0; i < N; i++) {
      losses[i] = loss_dist(rng);
      targets[i] = target_dist(rng);
    }
    targets[0] = 3;  // at least one kept row
    DeviceBuffer<float> d_losses(losses);
    DeviceBuffer<int> d_targets(targets);
    DeviceBuffer<double> d_total(1);
    const double start = 1.25;
    d_total.upload(std::vector<double>{start});
    llmc::accumulate_mean_loss(d_total.ptr, d_losses.ptr, d_targets.ptr, N, 0.5, 0);
    llmc::accumulate_mean_loss(d_total.ptr, d_losses.ptr, d_targets.ptr, N, 0.25, 0);
    const double expected = start + 0.75 * llmc::mean_loss_host(losses.data(), targets.data(), N);
    EXPECT_NEAR(d_total.download()[0], expected, 1e-12 * expected) << "N=" << N;

    std::vector<int> ignored(N, -1);
    DeviceBuffer<int> d_ignored(ignored);
    d_total.upload(std::vector<double>{start});
    llmc::accumulate_mean_loss(d_total.ptr, d_losses.ptr, d_ignored.ptr, N, 1.0, 0);
    EXPECT_EQ(d_total.download()[0], start) << "all targets ignored: nothing added (N=" << N << ")";
    EXPECT_EQ(llmc::mean_loss_host(losses.data(), ignored.data(), N), 0.0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
class BiasBackwardTest : public ::testing::TestWithParam<RowsShape> {};

TEST_P(BiasBackwardTest, MatchesReferenceAndIsDeterministic) {
  const auto [N, OC] = GetParam();
  auto rng = rng_for_test();
  const std::vector<float> dout = random_bf16_values(static_cast<size_t>(N) * OC, rng, -1, 1);
  const std::vector<float> dbias0 = random_floats(OC, rng, -1, 1);
  auto d_dout = upload_bf16(dout);
  DeviceBuffer<float> d_scratch(llmc::bias_backward_scratch_floats(N, OC));
  std::vector<float> runs[2];
  for (int run = 0; run < 2; run++) {
    DeviceBuffer<float> d_dbias(dbias0);
    d_scratch.poison();
    llmc::bias_backward(d_dbias.ptr, d_scratch.ptr, d_dout.ptr, N, OC, 0);
    runs[run] = d_dbias.download();
  }
  std::vector<float> ref = dbias0, abs_sum = absolute(dbias0);
  llmc::bias_backward_cpu(ref.data(), dout.data(), N, OC);
  llmc::bias_backward_cpu(abs_sum.data(), absolute(dout).data(), N, OC);
  EXPECT_TRUE(within("dbias", runs[0], ref, fp32_sum_tolerance(abs_sum, column_sum_depth(N))));
  EXPECT_TRUE(bitwise_equal("dbias", runs[0], runs[1]));
}

INSTANTIATE_TEST_SUITE_P(Shapes, BiasBackwardTest,
                         ::testing::Values(RowsShape{1, 8}, RowsShape{37, 2304}, RowsShape{1031, 3072},
                                           RowsShape{16384, 768}, RowsShape{9, 50304}));

// ---------------------------------------------------------------------------------------------------------------
// Several tensors (one misaligned, to take the scalar path) into one partials array, then the final norm.
// Sum of squares: all terms positive, so the relative error is at most depth * 2^-24 with depth = the per-thread
// chain (n / (blocks * threads) + 1) + the block reduction (10); the finish is FP64. Norm: half that, 2x margin.
TEST(GlobalNormTest, MatchesReferenceAndIsDeterministic) {
  auto rng = rng_for_test();
  const std::vector<size_t> sizes = {1, 7, 1000, (size_t{1} << 20) + 3, size_t{50304} * 768};
  const int per_tensor = llmc::global_norm_partials_per_tensor();
  const int count = per_tensor * static_cast<int>(sizes.size());
  DeviceBuffer<float> d_partials(count), d_norm(1);
  std::vector<std::vector<float>> tensors;
  double sum_sq = 0.0;
  size_t longest = 0;
  for (size_t n : sizes) {
    tensors.push_back(random_floats(n, rng, -2, 2));
    sum_sq += std::pow(llmc::global_norm_cpu(tensors.back().data(), n), 2);
    longest = std::max(longest, n);
  }
  std::vector<float> norms[2];
  for (int run = 0; run < 2; run++) {
    d_partials.poison();
    d_norm.poison();
    for (size_t i = 0; i < sizes.size(); i++) {
      DeviceBuffer<float> d_values(sizes[i] + 1);  // + 1: room for the misaligned copy
      const bool misaligned = i == 2;
      CUDA_CHECK(cudaMemcpy(d_values.ptr + (misaligned ? 1 : 0), tensors[i].data(), sizes[i] * sizeof(float),
                            cudaMemcpyHostToDevice));
      llmc::global_norm_squared(d_partials.ptr + i * per_tensor, d_values.ptr + (misaligned ? 1 : 0), sizes[i], 0);
      CUDA_CHECK(cudaDeviceSynchronize());  // d_values is freed at the end of this iteration
    }
    llmc::global_norm_finish(d_norm.ptr, d_partials.ptr, count, 0);
    norms[run] = d_norm.download();
  }
  const double ref = std::sqrt(sum_sq);
  const double depth = std::ceil(static_cast<double>(longest) / (per_tensor * 512.0)) + 1 + 10;
  EXPECT_NEAR(norms[0][0], ref, depth * kFp32Eps * ref) << "seed " << run_seed(kProgram);
  EXPECT_TRUE(bitwise_equal("global norm", norms[0], norms[1]));
}

// add_bias: x += bias per row, one bf16 rounding of the FP32 sum (exact reference), and the amax of the result.
TEST(AddBias, MatchesReferenceWithAmax) {
  auto rng = rng_for_test();
  for (const auto& [M, N] : {std::pair<int, int>{1, 8}, {37, 768}, {1024, 3072}}) {
    const std::vector<float> x = random_bf16_values(static_cast<size_t>(M) * N, rng, -4, 4),
                             bias = random_bf16_values(N, rng, -1, 1);
    auto d_x = upload_bf16(x), d_bias = upload_bf16(bias);
    AmaxSlot amax;
    llmc::add_bias(d_x.ptr, d_bias.ptr, M, N, 0, amax.ptr);
    std::vector<float> ref = x;
    llmc::add_bias_cpu(ref.data(), bias.data(), M, N);
    for (float& v : ref) v = round_bf16(v);
    const std::vector<float> got = download_bf16(d_x);
    EXPECT_TRUE(within("add_bias", got, ref, std::vector<double>(ref.size(), 0.0))) << M << "x" << N;
    EXPECT_EQ(amax.value(), max_abs(got)) << M << "x" << N;
  }
}

TEST(ConvertTest, RoundTripsAndRoundsToNearestEven) {
  auto rng = rng_for_test();
  std::vector<float> values = random_floats(100003, rng, -100, 100);
  values[0] = 1.0f + 0x1p-8f;      // tie: rounds down to even 1.0
  values[1] = 1.0f + 3 * 0x1p-8f;  // tie: rounds up to even 1 + 2^-6
  DeviceBuffer<float> d_in(values), d_back(values.size());
  DeviceBuffer<bf16> d_bf16(values.size());
  d_bf16.poison();
  d_back.poison();
  llmc::convert_float_to_bf16(d_bf16.ptr, d_in.ptr, values.size(), 0);
  llmc::convert_bf16_to_float(d_back.ptr, d_bf16.ptr, values.size(), 0);
  std::vector<float> rounded(values.size());
  for (size_t i = 0; i < values.size(); i++) rounded[i] = round_bf16(values[i]);
  EXPECT_EQ(rounded[0], 1.0f);
  EXPECT_EQ(rounded[1], 1.0f + 0x1p-6f);
  EXPECT_TRUE(bitwise_equal("float -> bf16 -> float", d_back.download(), rounded));
}

}  // namespace
