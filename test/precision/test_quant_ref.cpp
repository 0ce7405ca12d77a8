// test/precision/test_quant_ref: the host references of llmc/precision/fp8_quant.h (test/reference/precision_ref.h,
// which test/precision/test_quant trusts bit for bit) checked on their own: the scale formula on hand-computed cases,
// delayed scaling over several steps (ring buffer, max vs most recent, 0 / inf / NaN amaxes keep the scale), the casts
// against their definitions (codes within half an FP8 ulp of x * scale, each block's largest element at the top of the
// format, padding entries 1, transposed copies, partial edge blocks), dequantisation and the telemetry on inputs whose
// answers are known (the clipped count at and beyond max, with stored scales, and the block-wise casts' multiplier as
// the telemetry recovers it, over every BF16 amax). Also the launchers' argument errors and the dispatch point's
// refusals (llmc/precision/quantize.h), which are raised on the host before any CUDA call (so they are testable
// without a GPU).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"
#include "llmc/precision/encoding.h"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/quantize.h"
#include "llmc/precision/scale_math.cuh"
#include "test/reference/precision_ref.h"

namespace {

using llmc::ElementFormat;
using llmc::Encoding;
using llmc::ScaleFormat;

// The encodings the FP8 quantisers take: one scale per tensor, or per block.
Encoding tensor_encoding(ElementFormat f, bool pow2 = false) {
  return {f, llmc::kWholeTensor, pow2 ? ScaleFormat::Pow2FP32 : ScaleFormat::FP32};
}
Encoding block_encoding(ElementFormat f, llmc::BlockShape block, bool pow2 = false) {
  return {f, block, pow2 ? ScaleFormat::Pow2FP32 : ScaleFormat::FP32};
}

constexpr float kFltMin = std::numeric_limits<float>::min();
constexpr float kFltMax = std::numeric_limits<float>::max();

float bf16_round(float x) { return llmc::bf16_decode(llmc::bf16_encode(x)); }

// Random bf16 values with a spread of magnitudes, zeros and a few outliers.
std::vector<float> test_values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> v(n);
  for (float& x : v) {
    const int p = pick(rng);
    x = p < 5 ? 0.0f : p < 7 ? 100.0f * normal(rng) : p < 10 ? 1e-7f * normal(rng) : normal(rng);
    x = bf16_round(x);
  }
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ScaleFromAmaxRef, HandComputedCases) {
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(1.0f, 7.0f, tensor_encoding(ElementFormat::E4M3), 0), 448.0f);
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(1.0f, 7.0f, tensor_encoding(ElementFormat::E5M2), 0), 57344.0f);
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(1.0f, 7.0f, tensor_encoding(ElementFormat::E4M3), 1), 224.0f);
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(1.0f, 7.0f, tensor_encoding(ElementFormat::E4M3, true), 0), 256.0f);
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(3.0f, 7.0f, tensor_encoding(ElementFormat::E4M3), 0), 448.0f / 3.0f);
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(3.0f, 7.0f, tensor_encoding(ElementFormat::E4M3, true), 2),
            32.0f);  // 448/12 = 37.3 -> 32
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(448.0f, 7.0f, tensor_encoding(ElementFormat::E4M3), 0), 1.0f);
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(2.0f, 7.0f, tensor_encoding(ElementFormat::E4M3), -1),
            448.0f);  // negative margin
  // amax 0, NaN, inf, negative: the previous scale, untouched (no pow2 applied to it).
  for (float bad : {0.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY, -1.0f})
    EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(bad, 7.0f, tensor_encoding(ElementFormat::E4M3, true), 0), 7.0f) << bad;
  // Tiny amax: 448 / 1e-40 overflows to inf -> clamped to FLT_MAX (pow2: 2^127). Huge amax * 2^margin overflows to
  // inf -> the scale 0 -> clamped to 2^-126.
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(1e-40f, 7.0f, tensor_encoding(ElementFormat::E4M3), 0), kFltMax);
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(1e-40f, 7.0f, tensor_encoding(ElementFormat::E4M3, true), 0),
            std::ldexp(1.0f, 127));
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(kFltMax, 7.0f, tensor_encoding(ElementFormat::E4M3), 4), kFltMin);
  EXPECT_EQ(llmc::fp8_scale_from_amax_cpu(kFltMax, 7.0f, tensor_encoding(ElementFormat::E4M3, true), 4), kFltMin);
  EXPECT_THROW(llmc::fp8_scale_from_amax_cpu(1.0f, 1.0f, tensor_encoding(ElementFormat::E4M3), 65), llmc::Error);
}

TEST(DelayedScalingRef, RingBufferMaxAndMostRecent) {
  const int count = 3, len = 3;
  const uint8_t formats[count] = {0, 1, 0};  // e4m3, e5m2, e4m3
  std::vector<float> history(count * len, 0.0f), scale(count, 1.0f), scale_inv(count, 1.0f);
  std::vector<float> max_scale = scale;
  // Step amaxes per tensor; tensor 2 sees 0, inf and NaN.
  const float steps[5][count] = {{2.0f, 4.0f, 1.0f},
                                 {1.0f, 8.0f, 0.0f},
                                 {0.5f, 1.0f, INFINITY},
                                 {0.5f, 1.0f, 2.0f},
                                 {0.25f, 1.0f, std::numeric_limits<float>::quiet_NaN()}};
  std::vector<float> mr_history(count * len, 0.0f), mr_scale(count, 1.0f), mr_scale_inv(count, 1.0f);
  for (int step = 0; step < 5; step++) {
    const int pos = step % len;
    std::vector<float> amax(steps[step], steps[step] + count), amax_mr = amax;
    llmc::fp8_delayed_scaling_update_cpu(history.data(), amax.data(), scale.data(), scale_inv.data(), formats, count,
                                         len, pos, true, 0, ScaleFormat::FP32);
    llmc::fp8_delayed_scaling_update_cpu(mr_history.data(), amax_mr.data(), mr_scale.data(), mr_scale_inv.data(),
                                         formats, count, len, pos, false, 0, ScaleFormat::FP32);
    for (int i = 0; i < count; i++) {
      EXPECT_EQ(amax[i], 0.0f) << "amax is reset after it is recorded";
      EXPECT_EQ(amax_mr[i], 0.0f);
      const float recorded = history[i * len + pos];
      if (std::isnan(steps[step][i])) EXPECT_TRUE(std::isnan(recorded));
      else EXPECT_EQ(recorded, steps[step][i]);
      EXPECT_EQ(scale_inv[i], 1.0f / scale[i]);
    }
  }
  // max over the last 3 steps (steps 2, 3, 4): tensor 0 -> max(0.5, 0.5, 0.25) = 0.5; tensor 1 -> 1.
  EXPECT_EQ(scale[0], 448.0f / 0.5f);
  EXPECT_EQ(scale[1], 57344.0f / 1.0f);
  // tensor 2: the inf of step 2 is still in the window -> the scale kept since step 1 (max(1, 0) = 1 -> 448).
  EXPECT_EQ(scale[2], 448.0f);
  // most recent: tensor 0 -> 0.25; tensor 2 -> NaN at the last step keeps the scale of step 3 (amax 2).
  EXPECT_EQ(mr_scale[0], 448.0f / 0.25f);
  EXPECT_EQ(mr_scale[2], 224.0f);
  EXPECT_EQ(mr_scale_inv[2], 1.0f / 224.0f);
  // One more step with use_max: the inf leaves the window (steps 3, 4, 5 remain: 2, NaN, 3) -> 448 / 3.
  std::vector<float> amax = {0.25f, 1.0f, 3.0f};
  llmc::fp8_delayed_scaling_update_cpu(history.data(), amax.data(), scale.data(), scale_inv.data(), formats, count, len,
                                       5 % len, true, 0, ScaleFormat::FP32);
  EXPECT_EQ(scale[2], 448.0f / 3.0f) << "NaN entries are ignored by the max";
}

TEST(DelayedScalingRef, BadArguments) {
  float h[4] = {}, a[2] = {}, s[2] = {1, 1}, si[2] = {1, 1};
  uint8_t f[2] = {0, 7};
  EXPECT_THROW(llmc::fp8_delayed_scaling_update_cpu(h, a, s, si, f, 2, 2, 0, true, 0, ScaleFormat::FP32),
               llmc::Error);  // format 7
  f[1] = 0;
  EXPECT_THROW(llmc::fp8_delayed_scaling_update_cpu(h, a, s, si, f, 2, 2, 2, true, 0, ScaleFormat::FP32),
               llmc::Error);  // pos
  EXPECT_THROW(llmc::fp8_delayed_scaling_update_cpu(h, a, s, si, f, 2, 0, 0, true, 0, ScaleFormat::FP32),
               llmc::Error);  // len
}

// ---------------------------------------------------------------------------------------------------------------
// Every code is within half an FP8 ulp of x * scale (or saturated at max, or a subnormal within half a quantum).
void expect_code_rounds(float x, float scale, uint8_t code, ElementFormat f, const char* where) {
  const float fmax = llmc::element_format_max(f);
  const float y = x * scale;
  const float q = llmc::fp8_decode(code, f);
  ASSERT_FALSE(std::isnan(q)) << where;
  if (std::fabs(y) >= fmax) {
    ASSERT_EQ(std::fabs(q), fmax) << where << ": x " << x << " scale " << scale;
    return;
  }
  const int mant = f == ElementFormat::E4M3 ? 3 : 2;
  const int emin = f == ElementFormat::E4M3 ? -6 : -14;
  int e;
  std::frexp(std::fabs(y) > 0 ? std::fabs(y) : 1.0f, &e);  // |y| in [2^(e-1), 2^e)
  const double quantum = std::ldexp(1.0, std::max(e - 1, emin) - mant);
  ASSERT_LE(std::fabs(double(q) - double(y)), quantum / 2) << where << ": x " << x << " scale " << scale;
}

TEST(QuantizeTensorwiseRef, CodesRoundAndTransposeAndAmax) {
  std::mt19937 rng(1);
  const int rows = 37, cols = 48;
  const std::vector<float> x = test_values(size_t(rows) * cols, rng);
  for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2}) {
    const float scale = 3.0f;
    std::vector<uint8_t> data(x.size()), data_t(x.size());
    float amax = 0.0f;
    llmc::fp8_quantize_tensorwise_cpu(data.data(), data_t.data(), &amax, x.data(), rows, cols, scale, f);
    float want_amax = 0.0f;
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) {
        const float v = x[size_t(r) * cols + c];
        want_amax = std::max(want_amax, std::fabs(v));
        ASSERT_EQ(data[size_t(r) * cols + c], data_t[size_t(c) * rows + r]);
        expect_code_rounds(v, scale, data[size_t(r) * cols + c], f, "tensorwise");
      }
    EXPECT_EQ(amax, want_amax);
    float bigger = 1e9f;  // the amax is a running max: a larger value already there stays
    llmc::fp8_quantize_tensorwise_cpu(data.data(), nullptr, &bigger, x.data(), rows, cols, scale, f);
    EXPECT_EQ(bigger, 1e9f);
  }
}

// Block-wise: each block's scale from its own amax, its largest element lands at the top of the format.
TEST(QuantizeBlockwiseRef, Block1x128RowAndColumnBlocks) {
  std::mt19937 rng(2);
  const int rows = 200, cols = 272;  // partial blocks on both edges; rows not a multiple of 4 -> padding
  std::vector<float> x = test_values(size_t(rows) * cols, rng);
  for (int c = 0; c < 128; c++) x[size_t(5) * cols + c] = 0.0f;        // an all-zero 1x128 block
  for (int r = 128; r < rows; r++) x[size_t(r) * cols + 200] = 0.0f;  // an all-zero (partial) 128x1 block
  const int rbs = 2, cbs = 3, ld = 200, ld_t = 272;
  for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2})
    for (bool pow2 : {false, true}) {
      std::vector<uint8_t> data(x.size()), data_t(x.size());
      std::vector<float> si(llmc::scale_inv_count(block_encoding(ElementFormat::E4M3, llmc::kBlock1x128), rows, cols),
                            -1.0f);
      std::vector<float> si_t(llmc::scale_inv_count(block_encoding(ElementFormat::E4M3, llmc::kBlock1x128), cols, rows),
                              -1.0f);
      ASSERT_EQ(si.size(), size_t(cbs) * ld);
      ASSERT_EQ(si_t.size(), size_t(rbs) * ld_t);
      llmc::fp8_quantize_blockwise_cpu(data.data(), si.data(), data_t.data(), si_t.data(), x.data(), rows, cols,
                                       block_encoding(f, llmc::kBlock1x128, pow2));
      const float fmax = llmc::element_format_max(f);
      for (int r = 0; r < rows; r++)
        for (int cb = 0; cb < cbs; cb++) {
          float amax = 0.0f;
          for (int c = cb * 128; c < std::min(cols, cb * 128 + 128); c++) amax = std::max(amax, std::fabs(x[size_t(r) * cols + c]));
          if (amax == 0.0f) {
            ASSERT_EQ(si[size_t(cb) * ld + r], 1.0f);
            continue;
          }
          const float scale = llmc::fp8_scale_from_amax_cpu(amax, 1.0f, tensor_encoding(f, pow2), 0);
          ASSERT_EQ(si[size_t(cb) * ld + r], 1.0f / scale);
          // the block max maps to the top binade (exactly max without pow2)
          const float top = std::fabs(llmc::fp8_decode(
              [&] { for (int c = cb * 128;; c++) if (std::fabs(x[size_t(r) * cols + c]) == amax) return data[size_t(r) * cols + c]; }(), f));
          if (!pow2) ASSERT_EQ(top, fmax);
          else ASSERT_GT(top, fmax / 2.01f);
          for (int c = cb * 128; c < std::min(cols, cb * 128 + 128); c++)
            expect_code_rounds(x[size_t(r) * cols + c], scale, data[size_t(r) * cols + c], f, "1x128 rows");
        }
      for (int c = 0; c < cols; c++)
        for (int rb = 0; rb < rbs; rb++) {
          float amax = 0.0f;
          for (int r = rb * 128; r < std::min(rows, rb * 128 + 128); r++) amax = std::max(amax, std::fabs(x[size_t(r) * cols + c]));
          const float scale =
              amax == 0.0f ? 1.0f : llmc::fp8_scale_from_amax_cpu(amax, 1.0f, tensor_encoding(f, pow2), 0);
          ASSERT_EQ(si_t[size_t(rb) * ld_t + c], 1.0f / scale);
          for (int r = rb * 128; r < std::min(rows, rb * 128 + 128); r++)
            expect_code_rounds(x[size_t(r) * cols + c], scale, data_t[size_t(c) * rows + r], f, "128x1 columns");
        }
      EXPECT_EQ(si[size_t(0) * ld + 5], 1.0f);     // the zero block
      EXPECT_EQ(si_t[size_t(1) * ld_t + 200], 1.0f);
      // 1x128 data_t is not the transpose of data (different blocks): somewhere they differ
      size_t differ = 0;
      for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) differ += data[size_t(r) * cols + c] != data_t[size_t(c) * rows + r];
      EXPECT_GT(differ, 0u);
    }
  // padding: rows 201..203 of a 201-row tensor
  const int rows2 = 201;
  std::vector<float> x2(size_t(rows2) * cols, 1.0f),
      si2(llmc::scale_inv_count(block_encoding(ElementFormat::E4M3, llmc::kBlock1x128), rows2, cols), -1.0f);
  std::vector<uint8_t> d2(x2.size());
  llmc::fp8_quantize_blockwise_cpu(d2.data(), si2.data(), nullptr, nullptr, x2.data(), rows2, cols,
                                   block_encoding(ElementFormat::E4M3, llmc::kBlock1x128));
  ASSERT_EQ(si2.size(), size_t(3) * 204);
  for (int cb = 0; cb < 3; cb++) {
    EXPECT_EQ(si2[size_t(cb) * 204 + 200], 1.0f / 448.0f);
    for (int r = 201; r < 204; r++) EXPECT_EQ(si2[size_t(cb) * 204 + r], 1.0f) << "padding";
  }
}

TEST(QuantizeBlockwiseRef, Block128x128TilesAndTransposedCodes) {
  std::mt19937 rng(3);
  const int rows = 300, cols = 400;  // 3 x 4 tiles, partial on both edges
  std::vector<float> x = test_values(size_t(rows) * cols, rng);
  for (int r = 128; r < 256; r++)
    for (int c = 0; c < 128; c++) x[size_t(r) * cols + c] = 0.0f;  // tile (1, 0) all zero
  for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2}) {
    std::vector<uint8_t> data(x.size()), data_t(x.size());
    std::vector<float> si(llmc::scale_inv_count(block_encoding(ElementFormat::E4M3, llmc::kBlock128x128), rows, cols),
                          -1.0f);
    std::vector<float> si_t(llmc::scale_inv_count(block_encoding(ElementFormat::E4M3, llmc::kBlock128x128), cols, rows),
                            -1.0f);
    const int ld = 4, ld_t = 4;  // round_up(4, 4), round_up(3, 4)
    ASSERT_EQ(si.size(), size_t(3) * ld);
    ASSERT_EQ(si_t.size(), size_t(4) * ld_t);
    llmc::fp8_quantize_blockwise_cpu(data.data(), si.data(), data_t.data(), si_t.data(), x.data(), rows, cols,
                                     block_encoding(f, llmc::kBlock128x128, true));
    for (int rb = 0; rb < 3; rb++)
      for (int cb = 0; cb < 4; cb++) {
        float amax = 0.0f;
        for (int r = rb * 128; r < std::min(rows, rb * 128 + 128); r++)
          for (int c = cb * 128; c < std::min(cols, cb * 128 + 128); c++) amax = std::max(amax, std::fabs(x[size_t(r) * cols + c]));
        const float scale =
            amax == 0.0f ? 1.0f : llmc::fp8_scale_from_amax_cpu(amax, 1.0f, tensor_encoding(f, true), 0);
        ASSERT_EQ(si[size_t(rb) * ld + cb], 1.0f / scale);
        ASSERT_EQ(si_t[size_t(cb) * ld_t + rb], 1.0f / scale);
        for (int r = rb * 128; r < std::min(rows, rb * 128 + 128); r++)
          for (int c = cb * 128; c < std::min(cols, cb * 128 + 128); c++)
            expect_code_rounds(x[size_t(r) * cols + c], scale, data[size_t(r) * cols + c], f, "128x128");
      }
    EXPECT_EQ(si[size_t(1) * ld + 0], 1.0f);  // the zero tile
    for (int cb = 0; cb < 4; cb++) EXPECT_EQ(si_t[size_t(cb) * ld_t + 3], 1.0f) << "padding";
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) ASSERT_EQ(data[size_t(r) * cols + c], data_t[size_t(c) * rows + r]);
  }
}

TEST(DequantizeRef, CodesTimesTheirBlockScale) {
  const int rows = 2, cols = 256;
  std::vector<uint8_t> data(size_t(rows) * cols, 0x38);  // 1.0 in E4M3
  data[1] = 0xB8;                                          // -1.0
  data[300] = 0x7E;                                        // 448 (row 1, col 44)
  // 1x128: scale_inv[kb * 4 + r]
  std::vector<float> si = {0.5f, 0.25f, 1.0f, 1.0f, 2.0f, 4.0f, 1.0f, 1.0f};
  std::vector<float> out(data.size());
  llmc::fp8_dequantize_cpu(out.data(), data.data(), si.data(), rows, cols,
                           block_encoding(ElementFormat::E4M3, llmc::kBlock1x128));
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -0.5f);
  EXPECT_EQ(out[200], 2.0f);           // row 0, block 1
  EXPECT_EQ(out[300], 448.0f * 0.25f);  // row 1, block 0
  EXPECT_EQ(out[256 + 200], 4.0f);      // row 1, block 1
  std::vector<float> one = {0.125f};
  llmc::fp8_dequantize_cpu(out.data(), data.data(), one.data(), rows, cols,
                           block_encoding(ElementFormat::E4M3, llmc::kWholeTensor));
  EXPECT_EQ(out[300], 56.0f);
}

TEST(QuantStatsRef, KnownCounts) {
  // 1 x 16, per-tensor scale 1 (scale_inv 1), E4M3: two saturated (1000 clipped, 448 exact: saturated, not clipped),
  // one underflow (1e-4), two zeros, the rest exact.
  const int rows = 1, cols = 16;
  std::vector<float> x = {1000.0f, 448.0f, 1e-4f, 0.0f, 0.0f, 1.0f, -2.0f, 0.5f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 0.25f, 1.5f};
  for (float& v : x) v = bf16_round(v);
  std::vector<uint8_t> data(cols);
  llmc::fp8_quantize_tensorwise_cpu(data.data(), nullptr, nullptr, x.data(), rows, cols, 1.0f, ElementFormat::E4M3);
  const float si = 1.0f;
  const llmc::QuantStats s = llmc::fp8_quant_stats_cpu(x.data(), data.data(), &si, rows, cols,
                                                       block_encoding(ElementFormat::E4M3, llmc::kWholeTensor), 1.0f);
  EXPECT_EQ(s.amax, 1000.0);
  EXPECT_EQ(s.scale, 1.0);
  EXPECT_DOUBLE_EQ(s.saturated_frac, 2.0 / 16.0);
  EXPECT_EQ(s.clipped_frac, 1.0 / 16.0);
  EXPECT_DOUBLE_EQ(s.underflow_frac, 1.0 / 14.0);
  double sx2 = 0, se2 = 0;
  for (int i = 0; i < cols; i++) {
    sx2 += double(x[i]) * x[i];
    const double e = double(x[i]) - llmc::fp8_decode(data[i], ElementFormat::E4M3);
    se2 += e * e;
  }
  EXPECT_NEAR(se2, 552.0 * 552.0 + 1e-8, 1e-3);  // 1000 -> 448; 1e-4 -> 0
  EXPECT_DOUBLE_EQ(s.snr_db, 10.0 * std::log10(sx2 / se2));
  // exact quantisation -> +inf dB; blocks -> the smallest scale over the real blocks (padding excluded). Row 0:
  // amax 3.5 -> scale 128; rows 1..3: all 1.75 -> scale 256, every element lands on 448.
  std::vector<float> y(size_t(4) * 16, 1.75f);
  y[0] = 3.5f;
  std::vector<uint8_t> dy(y.size());
  std::vector<float> siy(llmc::scale_inv_count(block_encoding(ElementFormat::E4M3, llmc::kBlock1x128), 4, 16), -1.0f);
  llmc::fp8_quantize_blockwise_cpu(dy.data(), siy.data(), nullptr, nullptr, y.data(), 4, 16,
                                   block_encoding(ElementFormat::E4M3, llmc::kBlock1x128));
  const llmc::QuantStats t = llmc::fp8_quant_stats_cpu(y.data(), dy.data(), siy.data(), 4, 16,
                                                       block_encoding(ElementFormat::E4M3, llmc::kBlock1x128), 0.0f);
  EXPECT_EQ(t.snr_db, INFINITY);
  EXPECT_EQ(t.scale, 128.0);
  EXPECT_DOUBLE_EQ(t.saturated_frac, 49.0 / 64.0);
  EXPECT_EQ(t.clipped_frac, 0.0);  // at 448 exactly: saturated codes, nothing beyond max
  double zeros[llmc::kQuantStatsSlots] = {};
  zeros[llmc::kStatScale] = 1.0;
  const llmc::QuantStats z = llmc::finish_quant_stats(zeros);
  EXPECT_EQ(z.saturated_frac, 0.0);
  EXPECT_EQ(z.underflow_frac, 0.0);
  EXPECT_EQ(z.clipped_frac, 0.0);
  EXPECT_EQ(z.snr_db, INFINITY);
}

// The clipped count of FP8: fp8_clipped with the cast's multiplier, |x * scale| > max (max itself is exact and does
// not count; NaN does). A stored (delayed) scale 4 puts 112 at 448 exactly, 113 and 200 beyond it; E5M2's max is
// 57344.
TEST(QuantStatsRef, ClippedCountsValuesBeyondMaxWithTheStoredScale) {
  const float e4m3_max = llmc::kE4M3Max, e5m2_max = llmc::kE5M2Max;
  EXPECT_FALSE(llmc::fp8_clipped(448.0f, 1.0f, e4m3_max));
  EXPECT_TRUE(llmc::fp8_clipped(std::nextafter(448.0f, 1000.0f), 1.0f, e4m3_max));
  EXPECT_TRUE(llmc::fp8_clipped(-449.0f, 1.0f, e4m3_max));
  EXPECT_TRUE(llmc::fp8_clipped(NAN, 1.0f, e4m3_max));
  EXPECT_FALSE(llmc::fp8_clipped(0.0f, 0.0f, e4m3_max));
  EXPECT_FALSE(llmc::fp8_clipped(57344.0f, 1.0f, e5m2_max));
  EXPECT_TRUE(llmc::fp8_clipped(57344.0f, 1.0f, e4m3_max));
  const int rows = 1, cols = 16;
  std::vector<float> x = {112.0f, 113.0f, -200.0f, 1.0f, -2.0f, 0.5f, 3.0f, 0.0f,
                          111.0f, 64.0f, -100.0f, 7.0f, 8.0f, 0.25f, 1.5f, 2.5f};
  for (float& v : x) v = bf16_round(v);
  const float scale = 4.0f, si = 0.25f;
  std::vector<uint8_t> data(cols);
  const Encoding e4 = block_encoding(ElementFormat::E4M3, llmc::kWholeTensor);
  llmc::fp8_quantize_tensorwise_cpu(data.data(), nullptr, nullptr, x.data(), rows, cols, scale, ElementFormat::E4M3);
  const llmc::QuantStats s = llmc::fp8_quant_stats_cpu(x.data(), data.data(), &si, rows, cols, e4, scale);
  EXPECT_EQ(s.clipped_frac, 2.0 / 16.0);      // 113 and -200
  EXPECT_EQ(s.saturated_frac, 4.0 / 16.0);    // and 112 at 448, 111 rounded up to it (444)
  // the same codes measured with another multiplier count another set: scale 2 clips nothing (200 * 2 = 400)
  EXPECT_EQ(llmc::fp8_quant_stats_cpu(x.data(), data.data(), &si, rows, cols, e4, 2.0f).clipped_frac, 0.0);
  // E5M2, scale 1: 57344 exact, 61440 beyond
  std::vector<float> y(cols, 1.0f);
  y[0] = 57344.0f, y[1] = -61440.0f;
  const float one = 1.0f;
  llmc::fp8_quantize_tensorwise_cpu(data.data(), nullptr, nullptr, y.data(), rows, cols, 1.0f, ElementFormat::E5M2);
  const llmc::QuantStats t = llmc::fp8_quant_stats_cpu(y.data(), data.data(), &one, rows, cols,
                                                       block_encoding(ElementFormat::E5M2, llmc::kWholeTensor), 1.0f);
  EXPECT_EQ(t.clipped_frac, 1.0 / 16.0);
  EXPECT_EQ(t.saturated_frac, 2.0 / 16.0);
}

// fp8_block_multiplier (the device telemetry's view of a block-wise cast's scale, stored only as scale_inv) decides
// clipping as the block's own scale block_scale(a) does, for every positive finite BF16 amax a: for the amax element
// itself and for the next BF16 magnitude below it, fp32 and power-of-two scales, E4M3 and E5M2. With FP32 scales
// some amaxes land one FP32 ulp past max (a * RN(max / a) rounds up): those are counted, and exist.
TEST(QuantStatsRef, BlockMultiplierDecidesClippingAsTheBlockScale) {
  int clipped_amaxes = 0;
  for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2})
    for (bool pow2 : {false, true}) {
      const float fmax = llmc::fp8_max_of(f);
      for (uint32_t b = 0x0001; b < 0x7f80; b++) {
        const float a = llmc::bf16_decode(static_cast<uint16_t>(b));
        const float scale = llmc::block_scale(a, fmax, pow2), si = llmc::div_rn(1.0f, scale);
        const float below = llmc::bf16_decode(static_cast<uint16_t>(b - 1));
        for (float x : {a, -a, below}) {
          const bool want = llmc::fp8_clipped(x, scale, fmax);
          ASSERT_EQ(llmc::fp8_clipped(x, llmc::fp8_block_multiplier(x, si, fmax, pow2), fmax), want)
              << llmc::element_format_name(f) << (pow2 ? " pow2" : " fp32") << " amax " << a << " x " << x;
          if (x == a && want) clipped_amaxes++;
          if (x == below) EXPECT_FALSE(want) << a;
        }
      }
    }
  EXPECT_GT(clipped_amaxes, 0);
  // an all-zero or non-finite block has scale 1 (scale_inv 1): its elements beyond max, and NaN, are clipped
  EXPECT_EQ(llmc::fp8_block_multiplier(1000.0f, 1.0f, llmc::kE4M3Max, false), 1.0f);
  EXPECT_TRUE(llmc::fp8_clipped(NAN, llmc::fp8_block_multiplier(NAN, 1.0f, llmc::kE4M3Max, false), llmc::kE4M3Max));
}

// ---------------------------------------------------------------------------------------------------------------
// Argument errors of the device launchers (raised on the host before any CUDA call). `what` must appear in the message.
template <class F>
void expect_error(F&& call, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming '" << what << "'";
  } catch (const llmc::Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "message: " << e.what();
  }
}

TEST(QuantLaunchers, BadArgumentsAreClearErrors) {
  // Fake, never dereferenced device pointers (16-byte aligned unless the test says otherwise).
  auto* x = reinterpret_cast<const llmc::bf16*>(uintptr_t(0x10000));
  auto* bytes = reinterpret_cast<uint8_t*>(uintptr_t(0x20000));
  auto* floats = reinterpret_cast<float*>(uintptr_t(0x30000));
  llmc::QTensor q;
  q.rows = 64;
  q.cols = 24;  // not a multiple of 16
  q.data = bytes;
  q.scale = floats;
  q.scale_inv = floats;
  expect_error([&] { llmc::fp8_quantize_tensorwise(q, x, nullptr, 0); }, "q.cols = 24");
  q.cols = 0;
  expect_error([&] { llmc::fp8_quantize_tensorwise(q, x, nullptr, 0); }, "q.cols = 0");
  q.cols = 64;
  q.rows = -1;
  expect_error([&] { llmc::fp8_quantize_tensorwise(q, x, nullptr, 0); }, "q.rows = -1");
  q.rows = 64;
  q.scale = nullptr;
  expect_error([&] { llmc::fp8_quantize_tensorwise(q, x, nullptr, 0); }, "q.scale is null");
  q.scale = floats;
  expect_error([&] { llmc::fp8_quantize_tensorwise(q, reinterpret_cast<const llmc::bf16*>(uintptr_t(0x10002)), nullptr, 0); },
               "pointer x");
  expect_error([&] { llmc::fp8_quantize_tensorwise(q, nullptr, nullptr, 0); }, "x is null");
  q.encoding.block = llmc::kBlock1x128;
  expect_error([&] { llmc::fp8_quantize_tensorwise(q, x, nullptr, 0); }, "q.encoding is e4m3 1x128; per-tensor casts");
  q.encoding.block = llmc::kWholeTensor;
  expect_error([&] { llmc::fp8_quantize_blockwise(q, x, 0); }, "q.encoding is e4m3 tensor; block casts");
  q.encoding = {ElementFormat::E2M1, llmc::kBlock1x32, ScaleFormat::E8M0};
  expect_error([&] { llmc::fp8_quantize_blockwise(q, x, 0); }, "q.encoding is e2m1 1x32 e8m0 scales; the FP8 kernels");
  q.encoding = {ElementFormat::E4M3, llmc::kBlock1x128, ScaleFormat::FP32, true};
  expect_error([&] { llmc::fp8_quantize_blockwise(q, x, 0); }, "q.encoding is e4m3 1x128 + fp32 tensor scale");
  q.encoding = block_encoding(ElementFormat::E4M3, llmc::kBlock128x128);
  q.data_t = bytes;
  q.scale_inv_t = nullptr;
  expect_error([&] { llmc::fp8_quantize_blockwise(q, x, 0); }, "q.scale_inv_t is null");
  q.cols = 100;
  expect_error([&] { llmc::fp8_quantize_blockwise(q, x, 0); }, "q.cols = 100");
  q.cols = 64;
  q.data_t = reinterpret_cast<uint8_t*>(uintptr_t(0x20008));
  q.scale_inv_t = floats;
  expect_error([&] { llmc::fp8_quantize_blockwise(q, x, 0); }, "q.data_t");
  q.data_t = nullptr;
  q.data = nullptr;
  expect_error([&] { llmc::fp8_quant_stats(reinterpret_cast<double*>(floats), q, x, 0); }, "q.data is null");
  expect_error([&] { llmc::fp8_dequantize(floats, q, true, 0); }, "q.data_t is null");
  {  // per tensor, the clipped count multiplies x by the cast's scale
    llmc::QTensor t = q;
    t.encoding = tensor_encoding(ElementFormat::E4M3);
    t.data = bytes;
    t.scale = nullptr;
    expect_error([&] { llmc::fp8_quant_stats(reinterpret_cast<double*>(floats), t, x, 0); }, "q.scale is null");
  }
  expect_error([&] { llmc::amax_bf16(floats, reinterpret_cast<const llmc::bf16*>(uintptr_t(0x10004)), 100, 0); },
               "pointer x");
  expect_error([&] { llmc::amax_bf16(nullptr, x, 100, 0); }, "amax must be a device pointer");
  auto* fmt = reinterpret_cast<const uint8_t*>(uintptr_t(0x40000));
  expect_error(
      [&] {
        llmc::fp8_delayed_scaling_update(floats, floats, floats, floats, fmt, 4, 16, 16, true, 0, ScaleFormat::FP32, 0);
      },
      "pos = 16");
  expect_error(
      [&] {
        llmc::fp8_delayed_scaling_update(floats, floats, floats, floats, fmt, 4, 0, 0, true, 0, ScaleFormat::FP32, 0);
      },
      "len = 0");
  expect_error(
      [&] {
        llmc::fp8_delayed_scaling_update(floats, floats, floats, floats, fmt, 4, 16, 0, true, 99, ScaleFormat::FP32, 0);
      },
      "margin = 99");
  expect_error(
      [&] {
        llmc::fp8_delayed_scaling_update(floats, floats, floats, floats, fmt, 4, 16, 0, true, 0, ScaleFormat::E8M0, 0);
      },
      "scales = e8m0");
  expect_error([&] { llmc::fp8_scale_from_amax(floats, nullptr, floats, tensor_encoding(ElementFormat::E4M3), 0, 0); },
               "scale_inv");
  expect_error(
      [&] {
        llmc::fp8_scale_from_amax(floats, floats, floats, block_encoding(ElementFormat::E4M3, llmc::kBlock1x128), 0, 0);
      },
      "e is e4m3 1x128");
}

// The dispatch point: an encoding no quantiser handles, and arguments that do not fit the scale source.
TEST(QuantizeDispatch, RefusesWhatNoQuantiserHandles) {
  auto* x = reinterpret_cast<const llmc::bf16*>(uintptr_t(0x10000));
  auto* bytes = reinterpret_cast<uint8_t*>(uintptr_t(0x20000));
  auto* floats = reinterpret_cast<float*>(uintptr_t(0x30000));
  llmc::QTensor q;
  q.rows = 64;
  q.cols = 64;
  q.data = bytes;
  q.scale = floats;
  q.scale_inv = floats;
  q.encoding = {ElementFormat::E2M1, llmc::kBlock1x16, ScaleFormat::E8M0, false};
  llmc::QuantizeArgs args;
  expect_error([&] { llmc::quantize(q, x, args, 0); },
               "quantize: this build has no quantiser for e2m1 1x16 e8m0 scales");
  expect_error([&] { llmc::quant_stats(reinterpret_cast<double*>(floats), q, x, 0); },
               "quant_stats: this build has no quantiser for e2m1");
  // an MXFP4 scale rule (the clipped count's multiplier) is for the FP4 family's MXFP4 telemetry
  q.encoding = tensor_encoding(ElementFormat::E4M3);
  expect_error([&] { llmc::quant_stats(reinterpret_cast<double*>(floats), q, x, 0, {}, llmc::Mxfp4Scale::Gaussian); },
               "has no MXFP4 scale rule; pass Mxfp4Scale::Amax");
  q.encoding = llmc::kNvfp4Encoding;
  expect_error([&] { llmc::quant_stats(reinterpret_cast<double*>(floats), q, x, 0, {}, llmc::Mxfp4Scale::Gaussian); },
               "mxfp4_scale is an MXFP4 option");
  q.encoding = {ElementFormat::E2M1, llmc::kBlock1x16, ScaleFormat::E8M0, false};
  q.encoding = {ElementFormat::E4M3, llmc::BlockShape{4, 8}};
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "not an encoding");
  // Stochastic rounding, Hadamard transforms, Gaussian scales and trust masks are FP4 options: an FP8 family refuses
  // them.
  q.encoding = tensor_encoding(ElementFormat::E4M3);
  args.amax = floats;
  args.rounding = llmc::Rounding::Stochastic;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "are options of the fp4 quantisers");
  args = llmc::QuantizeArgs();
  args.hadamard.size = 16;
  args.hadamard.data = true;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "are options of the fp4 quantisers");
  args = llmc::QuantizeArgs();
  args.mxfp4_scale = llmc::Mxfp4Scale::Gaussian;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "are options of the fp4 quantisers");
  args = llmc::QuantizeArgs();
  args.trust_mask = reinterpret_cast<uint32_t*>(floats);
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "are options of the fp4 quantisers");
  args = llmc::QuantizeArgs();
  args.mxfp4_scale = llmc::Mxfp4Scale::RangeMatched;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "are options of the fp4 quantisers");
  // Quartet's range-matched scales are an MXFP4 rule too
  q.encoding = llmc::kNvfp4Encoding;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "range-matched (Quartet backward) block scales are an MXFP4");
  args = llmc::QuantizeArgs();
  // QuEST's Gaussian scales: MXFP4 only, whole blocks of 32 along every quantised direction; the trust mask belongs
  // to an MXFP4 data copy.
  args.mxfp4_scale = llmc::Mxfp4Scale::Gaussian;
  q.encoding = llmc::kNvfp4Encoding;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "Gaussian (QuEST) block scales are an MXFP4 rule");
  q.encoding = llmc::kMxfp4Encoding;
  q.cols = 48;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "take whole blocks of 32; (64, 48)");
  q.cols = 64;
  args = llmc::QuantizeArgs();
  args.trust_mask = reinterpret_cast<uint32_t*>(floats);
  q.encoding = llmc::kNvfp4Encoding;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "a trust mask is kept for the data copy of an MXFP4 tensor");
  q.encoding = llmc::kMxfp4Encoding;
  q.data = nullptr;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "no data copy asked for");
  q.data = bytes;
  args = llmc::QuantizeArgs();
  // The FP4 family's own checks: NVFP4 needs its tensor scale slot; Hadamard sizes and tiles.
  q.encoding = llmc::kNvfp4Encoding;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "q.tensor_scale_inv");
  q.encoding = llmc::kNvfp4WeightEncoding;
  args.hadamard.size = 16;
  args.hadamard.data = true;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "rotates 1xN blocks");
  q.encoding = llmc::kMxfp4Encoding;
  args.hadamard.size = 8;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "of size 16 or 32");
  args = llmc::QuantizeArgs();
  // Whole-tensor scale from an amax: the amax must be given, and nothing recorded besides.
  q.encoding = tensor_encoding(ElementFormat::E4M3);
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "amax");
  args.amax = floats;
  args.amax_out = floats;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "amax_out");
  // Each family's own argument checks still apply behind the dispatch.
  args = llmc::QuantizeArgs();
  args.source = llmc::ScaleSource::Stored;
  q.cols = 24;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "fp8_quantize_tensorwise: q.cols = 24");
  q.cols = 64;
  q.encoding = block_encoding(ElementFormat::E5M2, llmc::kBlock1x128);
  q.scale_inv = nullptr;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "fp8_quantize_blockwise: q.data is set but q.scale_inv is null");
}

}  // namespace
