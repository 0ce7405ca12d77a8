// test/precision/test_group_quant_ref: the CPU reference of the FP8 1x16 group copies
// (test/reference/group_quant_ref.h, which the GPU tests test/precision/test_group_quant and
// test/kernels/test_fp8_activations trust bit for bit) checked on its own against the definition of
// llmc/kernels/fp8_groups.h: the scale rule's cases (all-zero, +-0, inf, NaN, below the 2^-117 clamp, exact powers of
// two), each group's largest element on +-448, the error of every dequantised
// value within E4M3's half ulp, padding entries; the sizes the memory plan uses; the quantize() table's entry and its
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
  float d = 0, q = 0;
  llmc::fp8_group_scales(448.0f, &d, &q);
  EXPECT_EQ(d, 1.0f);
  EXPECT_EQ(q, 1.0f);
  llmc::fp8_group_scales(3.5f, &d, &q);  // 448 / 3.5 = 128 exactly
  EXPECT_EQ(d, 3.5f / 448.0f);
  EXPECT_EQ(q, 128.0f);
  llmc::fp8_group_scales(0.0f, &d, &q);
  EXPECT_EQ(d, 1.0f);
  EXPECT_EQ(q, 1.0f);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    llmc::fp8_group_scales(bad, &d, &q);
    EXPECT_TRUE(std::isnan(d));
    EXPECT_EQ(q, 1.0f);
  }
  // Below the clamp both scales are those of 2^-117, normal numbers.
  llmc::fp8_group_scales(0x1p-130f, &d, &q);
  EXPECT_EQ(d, 0x1p-117f / 448.0f);
  EXPECT_EQ(q, 448.0f / 0x1p-117f);
  EXPECT_GE(d, std::numeric_limits<float>::min());
  EXPECT_TRUE(std::isfinite(q));
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
  EXPECT_EQ(g.scale_inv[0], 1.0f);
  EXPECT_EQ(g.codes[0], 0x00);
  EXPECT_EQ(g.codes[1], 0x80);
  EXPECT_EQ(g.group_amax[0], 0.0f);
  // 3.75: the max lands on 448 (0x7E), d = 3.75 / 448
  EXPECT_EQ(g.codes[31], 0x7E);
  EXPECT_EQ(g.scale_inv[1 * ld + 0], 3.75f / 448.0f);
  EXPECT_EQ(g.group_amax[1 * ld + 0], 3.75f);
  // inf: NaN scale, inf saturates to 448, the group dequantises to NaN
  EXPECT_TRUE(std::isnan(g.scale_inv[2 * ld + 0]));
  EXPECT_EQ(g.codes[32], 0x7E);
  const std::vector<float> v = llmc::fp8_groups_dequantize_cpu(g.codes.data(), g.scale_inv.data(), rows, cols);
  for (int k = 32; k < 48; k++) EXPECT_TRUE(std::isnan(v[k])) << k;
  // NaN: the NaN code, NaN scale, NaN group amax
  EXPECT_EQ(g.codes[48 + 5], llmc::kFp8NanCode);
  EXPECT_TRUE(std::isnan(g.scale_inv[0 * ld + 1]));
  EXPECT_TRUE(std::isnan(g.group_amax[0 * ld + 1]));
  // tiny: clamped scale, values kept to E4M3's precision relative to 2^-117 (subnormal codes for 2^-125:
  // 2^-125 * 448 * 2^117 = 1.75 * 2^-0 ... normal codes here, within half an ulp)
  for (int k = 0; k < 16; k++) {
    const float want = x[48 + 16 + k], got = v[48 + 16 + k];
    EXPECT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -4)) << k;
  }
  // powers of two within 2^15 of the max: exact
  for (int k = 0; k < 16; k++) EXPECT_EQ(v[96 + k], x[96 + k]) << k;
  // padding row 3: scale 1, group amax 0
  for (int c = 0; c < 3; c++) {
    EXPECT_EQ(g.scale_inv[c * ld + 3], 1.0f);
    EXPECT_EQ(g.group_amax[c * ld + 3], 0.0f);
  }
  EXPECT_THROW(llmc::fp8_groups_quantize_cpu(x.data(), 1, 40), llmc::Error);
}

// Random rows with a wide dynamic range: each group's largest |x| codes as +-448, and every value whose code is normal
// (|x| q >= 2^-6) dequantises within E4M3's relative half ulp 2^-4; the smaller ones within half a subnormal step.
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
      const float amax = g.group_amax[grp * ld + r], d = g.scale_inv[grp * ld + r];
      bool max_on_448 = false;
      for (int k = 0; k < 16; k++) {
        const size_t i = static_cast<size_t>(r) * cols + grp * 16 + k;
        EXPECT_LE(std::fabs(x[i]), amax);
        if (std::fabs(x[i]) == amax) max_on_448 = max_on_448 || (g.codes[i] & 0x7f) == 0x7e;
        const double bound = std::fabs(x[i]) / amax * 448.0 >= 0x1p-6 ? std::ldexp(std::fabs(x[i]), -4)
                                                                       : std::ldexp(static_cast<double>(d), -10);
        EXPECT_LE(std::fabs(v[i] - x[i]), bound * (1 + 1e-6)) << "row " << r << " col " << grp * 16 + k;
      }
      EXPECT_TRUE(max_on_448) << "row " << r << " group " << grp;
    }
}

TEST(Fp8Groups, SizesAreTheEncodingsSizes) {
  EXPECT_EQ(llmc::fp8_groups_code_bytes(4096, 2048), 4096u * 2048u);
  EXPECT_EQ(llmc::fp8_groups_scale_bytes(4096, 2048), 4u * 128u * 4096u);
  EXPECT_EQ(llmc::fp8_groups_bytes(4097, 768), 4097u * 768u + 4u * 48u * 4100u);  // rows padded to 4
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

// The quantize() table: e4m3 1x16 (fp32 scales) has this quantiser, the others of its shape do not; its refusals.
TEST(Fp8Groups, QuantizeTableEntry) {
  EXPECT_TRUE(llmc::has_quantizer(llmc::kFp8Groups1x16)) << llmc::quantizer_error(llmc::kFp8Groups1x16);
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
