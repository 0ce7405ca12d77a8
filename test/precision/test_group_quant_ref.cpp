// test/precision/test_group_quant_ref: the CPU reference of the FP8 1x16 group copies
// (test/reference/group_quant_ref.h, which the GPU tests test/precision/test_group_quant and
// test/kernels/test_fp8_activations trust bit for bit) checked on its own against the definition of
// llmc/kernels/fp8_groups.h: the scale rule's cases (all-zero, +-0, inf, NaN, the 2^-126 clamp, the 1.75 mantissa
// edge) and its definition over the FP32 range, each group's largest element in (224, 448], the error of every
// dequantised value within E4M3's half ulp, padding entries; the sizes the memory plan uses; the quantize() table's entry and its
// refusals, raised on the host before any CUDA call.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/kernels/fp8_groups.h"
#include "llmc/precision/group_quant.h"
#include "llmc/precision/quantize.h"
#include "test/reference/group_quant_ref.h"

namespace {

using llmc::ElementFormat;

float bf16_round(float x) {  // round to nearest even to bf16 (finite inputs)
  uint32_t u = llmc::float_to_bits(x);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return llmc::bits_to_float(u);
}

bool same_bits(float a, float b) { return llmc::float_to_bits(a) == llmc::float_to_bits(b); }

TEST(Fp8GroupsRef, ScaleRule) {
  using llmc::fp8_group_scale_code;
  EXPECT_EQ(fp8_group_scale_code(448.0f), 127);                        // 448 / 2^0 = 448
  EXPECT_EQ(fp8_group_scale_code(std::nextafter(448.0f, 1e9f)), 128);  // just above: 2^1
  EXPECT_EQ(fp8_group_scale_code(3.5f), 127 - 7);                      // 3.5 * 2^7 = 448
  EXPECT_EQ(fp8_group_scale_code(3.75f), 127 - 6);                     // 3.75 * 2^6 = 240 (3.75 * 2^7 > 448)
  EXPECT_EQ(fp8_group_scale_code(1.0f), 127 - 8);                      // 256
  EXPECT_EQ(fp8_group_scale_code(-2.0f), 127 - 7);                     // the sign of an amax is ignored
  EXPECT_EQ(fp8_group_scale_code(0.0f), llmc::kFp8GroupScaleOne);
  EXPECT_EQ(fp8_group_scale_code(-0.0f), llmc::kFp8GroupScaleOne);
  EXPECT_EQ(fp8_group_scale_code(std::numeric_limits<float>::max()), 127 + 120);
  EXPECT_EQ(fp8_group_scale_code(0x1p-130f), 1);  // clamped: 2^-126
  EXPECT_EQ(fp8_group_scale_code(std::numeric_limits<float>::denorm_min()), 1);
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()})
    EXPECT_EQ(fp8_group_scale_code(bad), llmc::kFp8GroupScaleNan);
  // Every code the rule gives: its value is E8M0's (the ml_dtypes-checked host codec), the multiplier its exact
  // inverse.
  for (int code = 1; code <= 254; code++) {
    const auto c = static_cast<uint8_t>(code);
    EXPECT_TRUE(same_bits(llmc::fp8_group_scale_value(c), llmc::e8m0_decode(c))) << code;
    if (code <= 253) EXPECT_EQ(llmc::fp8_group_scale_value(c) * llmc::fp8_group_multiplier(c), 1.0f) << code;
  }
  EXPECT_TRUE(std::isnan(llmc::fp8_group_scale_value(llmc::kFp8GroupScaleNan)));
  EXPECT_EQ(llmc::fp8_group_multiplier(llmc::kFp8GroupScaleNan), 1.0f);
  // The definition, on amaxes over the whole FP32 range (both sides of the 1.75 mantissa edge included): 2^k is the
  // smallest power of two that puts the amax at or below 448, k >= -126.
  std::mt19937_64 rng(99);
  std::uniform_int_distribution<uint32_t> bits(1, 0x7f7fffffu);
  std::vector<float> amaxes;
  for (int i = 0; i < 200000; i++) amaxes.push_back(llmc::bits_to_float(bits(rng)));
  for (int e = -149; e < 128; e++)
    for (float m : {1.0f, 1.75f, std::nextafter(1.75f, 2.0f), std::nextafter(2.0f, 1.0f)}) {
      const float a = std::ldexp(m, e);
      if (std::isfinite(a) && a > 0) amaxes.push_back(a);
    }
  for (float a : amaxes) {
    const int k = fp8_group_scale_code(a) - 127;
    ASSERT_GE(k, -126) << a;
    ASSERT_LE(std::ldexp(static_cast<double>(a), -k), 448.0) << a;
    if (k > -126) ASSERT_GT(std::ldexp(static_cast<double>(a), -(k - 1)), 448.0) << a;
  }
}

// Special groups: all zero (with -0), an inf, a NaN, tiny values, a group of powers of two.
TEST(Fp8GroupsRef, SpecialGroups) {
  const int rows = 3, cols = 48;
  std::vector<float> x(rows * cols, 0.0f);
  x[1] = -0.0f;                                            // row 0, group 0: all zero
  for (int k = 0; k < 16; k++) x[16 + k] = 0.25f * k;       // row 0, group 1: max 3.75
  x[32] = std::numeric_limits<float>::infinity();           // row 0, group 2: inf
  x[33] = 1.0f;
  x[48 + 5] = std::numeric_limits<float>::quiet_NaN();      // row 1, group 0: NaN
  x[48 + 6] = -2.0f;
  for (int k = 0; k < 16; k++) x[48 + 16 + k] = bf16_round(std::ldexp(1.0f + k / 16.0f, -125));  // row 1, group 1: tiny
  for (int k = 0; k < 16; k++) x[96 + k] = std::ldexp(1.0f, k - 8) * (k % 2 ? -1.0f : 1.0f);    // row 2, group 0
  const llmc::Fp8GroupsCpu g = llmc::fp8_groups_quantize_cpu(x.data(), rows, cols);
  const int ld = llmc::fp8_groups_ld(rows);
  ASSERT_EQ(ld, 4);
  ASSERT_EQ(g.scale_inv.size(), 3u * 4u);
  // all zero: scale 1, codes +0 / -0
  EXPECT_EQ(g.scale_inv[0], llmc::kFp8GroupScaleOne);
  EXPECT_EQ(g.codes[0], 0x00);
  EXPECT_EQ(g.codes[1], 0x80);
  EXPECT_EQ(g.group_amax[0], 0.0f);
  // 3.75: scale 2^-6, the max codes as 240 (0x77), every value of the group exactly (16 k)
  EXPECT_EQ(g.codes[31], 0x77);
  EXPECT_EQ(g.scale_inv[1 * ld + 0], 127 - 6);
  EXPECT_EQ(g.group_amax[1 * ld + 0], 3.75f);
  // inf: NaN scale, inf saturates to 448, the group dequantises to NaN
  EXPECT_EQ(g.scale_inv[2 * ld + 0], llmc::kFp8GroupScaleNan);
  EXPECT_EQ(g.codes[32], 0x7E);
  const std::vector<float> v = llmc::fp8_groups_dequantize_cpu(g.codes.data(), g.scale_inv.data(), rows, cols);
  for (int k = 16; k < 32; k++) EXPECT_EQ(v[k], x[k]) << k;
  for (int k = 32; k < 48; k++) EXPECT_TRUE(std::isnan(v[k])) << k;
  // NaN: the NaN code, NaN scale, NaN group amax
  EXPECT_EQ(g.codes[48 + 5], llmc::kFp8NanCode);
  EXPECT_EQ(g.scale_inv[0 * ld + 1], llmc::kFp8GroupScaleNan);
  EXPECT_TRUE(std::isnan(g.group_amax[0 * ld + 1]));
  // tiny: the scale clamped to 2^-126 (code 1); x * 2^126 lies in [2, 4), normal codes, within half an ulp
  EXPECT_EQ(g.scale_inv[1 * ld + 1], 1);
  for (int k = 0; k < 16; k++) {
    const float want = x[48 + 16 + k], got = v[48 + 16 + k];
    EXPECT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -4)) << k;
  }
  // powers of two from 2^-8 to 2^7: scale 2^-1, x * 2 from 2^-7 (an E4M3 subnormal) to 2^8, all exact
  for (int k = 0; k < 16; k++) EXPECT_EQ(v[96 + k], x[96 + k]) << k;
  // padding row 3: scale 1, group amax 0
  for (int c = 0; c < 3; c++) {
    EXPECT_EQ(g.scale_inv[c * ld + 3], llmc::kFp8GroupScaleOne);
    EXPECT_EQ(g.group_amax[c * ld + 3], 0.0f);
  }
  EXPECT_THROW(llmc::fp8_groups_quantize_cpu(x.data(), 1, 40), llmc::Error);
}

// Random rows with a wide dynamic range: each group's largest |x| codes in (224, 448], and every value whose code is
// normal (|x| / d >= 2^-6) dequantises within E4M3's relative half ulp 2^-4; the smaller ones within half a
// subnormal step (d 2^-10).
TEST(Fp8GroupsRef, ErrorWithinE4M3HalfUlp) {
  std::mt19937_64 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int rows = 64, cols = 256;
  std::vector<float> x(rows * cols);
  for (size_t i = 0; i < x.size(); i++)
    x[i] = bf16_round(normal(rng) * std::ldexp(1.0f, static_cast<int>(i % 23) - 11));
  const llmc::Fp8GroupsCpu g = llmc::fp8_groups_quantize_cpu(x.data(), rows, cols);
  const std::vector<float> v = llmc::fp8_groups_dequantize_cpu(g.codes.data(), g.scale_inv.data(), rows, cols);
  const int ld = llmc::fp8_groups_ld(rows);
  for (int r = 0; r < rows; r++)
    for (int grp = 0; grp < cols / 16; grp++) {
      const float amax = g.group_amax[grp * ld + r], d = llmc::e8m0_decode(g.scale_inv[grp * ld + r]);
      EXPECT_GT(amax / d, 224.0f) << "row " << r << " group " << grp;
      EXPECT_LE(amax / d, 448.0f) << "row " << r << " group " << grp;
      for (int k = 0; k < 16; k++) {
        const size_t i = static_cast<size_t>(r) * cols + grp * 16 + k;
        EXPECT_LE(std::fabs(x[i]), amax);
        const double bound = std::fabs(x[i]) / d >= 0x1p-6 ? std::ldexp(std::fabs(x[i]), -4)
                                                           : std::ldexp(static_cast<double>(d), -10);
        EXPECT_LE(std::fabs(v[i] - x[i]), bound * (1 + 1e-6)) << "row " << r << " col " << grp * 16 + k;
      }
    }
}

TEST(Fp8Groups, SizesAreTheEncodingsSizes) {
  EXPECT_EQ(llmc::fp8_groups_code_bytes(4096, 2048), 4096u * 2048u);
  EXPECT_EQ(llmc::fp8_groups_scale_bytes(4096, 2048), 128u * 4096u);  // one byte per group
  EXPECT_EQ(llmc::fp8_groups_bytes(4097, 768), 4097u * 768u + 48u * 4100u);  // rows padded to 4
  EXPECT_EQ(llmc::fp8_groups_bytes(0, 768), 0u);
  EXPECT_EQ(llmc::fp8_groups_code_bytes(7, 32), llmc::code_bytes(llmc::kFp8Groups1x16, 7, 32));
  EXPECT_EQ(llmc::fp8_groups_scale_bytes(7, 32), llmc::scale_inv_bytes(llmc::kFp8Groups1x16, 7, 32));
  EXPECT_THROW(llmc::fp8_groups_bytes(-1, 16), llmc::Error);
}

template <class F>
void expect_error(F&& call, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing: " << what;
  } catch (const llmc::Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// The quantize() table: e4m3 1x16 (e8m0 scales) has this quantiser, the others of its shape do not; its refusals.
TEST(Fp8Groups, QuantizeTableEntry) {
  EXPECT_TRUE(llmc::has_quantizer(llmc::kFp8Groups1x16)) << llmc::quantizer_error(llmc::kFp8Groups1x16);
  EXPECT_FALSE(llmc::has_quantizer({ElementFormat::E4M3, llmc::kBlock1x16, llmc::ScaleFormat::FP32}));
  EXPECT_FALSE(llmc::has_quantizer({ElementFormat::E5M2, llmc::kBlock1x16}));
  EXPECT_FALSE(llmc::has_quantizer({ElementFormat::E4M3, llmc::kBlock1x16, llmc::ScaleFormat::Pow2FP32}));
  auto* x = reinterpret_cast<const llmc::bf16*>(uintptr_t(0x10000));
  auto* bytes = reinterpret_cast<uint8_t*>(uintptr_t(0x20000));
  auto* floats = reinterpret_cast<float*>(uintptr_t(0x30000));
  llmc::QTensor q;
  q.rows = 64;
  q.cols = 64;
  q.encoding = llmc::kFp8Groups1x16;
  q.data = bytes;
  q.scale_inv = floats;
  q.data_t = bytes;
  llmc::QuantizeArgs args;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "no transposed form");
  q.data_t = nullptr;
  args.amax = floats;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "each group's own amax");
  args = llmc::QuantizeArgs();
  args.rounding = llmc::Rounding::Stochastic;
  expect_error([&] { llmc::quantize(q, x, args, 0); }, "are options of the fp4 quantisers");
  expect_error([&] { llmc::quant_stats(reinterpret_cast<double*>(floats), q, x, 0); }, "has no telemetry");
  q.cols = 40;
  expect_error([&] { llmc::quantize(q, x, llmc::QuantizeArgs(), 0); }, "cols = 40");
  expect_error([&] { llmc::fp8_groups_view(llmc::QTensor()); }, "not e4m3 1x16");
}

}  // namespace
