// test/precision/test_fp4_ref: the FP4 pieces on the CPU: Philox4x32-10 against the Random123 known-answer vectors
// and the keying of stochastic rounding's 16-bit stream;
// fp4_codec.cuh's E2M1 round-to-nearest (the kernels') against llmc/core/dtypes' bit-level e2m1_encode on a sweep
// of FP32; the E8M0 / E4M3 scale values; the NVFP4 and MXFP4 formulas on hand-computed blocks; the Hadamard
// transforms against dense matrices (FP64) and their orthogonality; stochastic rounding: its threshold against the
// definition (FP64) on a sweep of FP32, the same key gives the same bits, and over many draws the mean is the input
// within a bound derived below; the reference quantiser
// (fp4_quantize_cpu) against those formulas; the clipped count of the telemetry's reference against the trust mask and
// at its boundary; the FP4 rows of the quantiser table (quantizer_error, sizes); and the
// keying of Quartet's per-micro-step rotation signs.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"
#include "llmc/precision/encoding.h"
#include "llmc/precision/fp4_codec.cuh"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/fp4_rng.cuh"
#include "llmc/precision/hadamard.cuh"
#include "llmc/precision/linear.h"
#include "llmc/precision/precision_state.h"
#include "llmc/precision/quantize.h"
#include "llmc/precision/recipe.h"
#include "test/reference/precision_ref.h"

namespace {

using llmc::bits_to_float;
using llmc::float_to_bits;

TEST(Philox, MatchesRandom123KnownAnswers) {
  const llmc::Philox4 a = llmc::philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(a.v[0], 0x6627e8d5u);
  EXPECT_EQ(a.v[1], 0xe169c58du);
  EXPECT_EQ(a.v[2], 0xbc57ac4cu);
  EXPECT_EQ(a.v[3], 0x9b00dbd8u);
  const llmc::Philox4 b = llmc::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(b.v[0], 0x408f276du);
  EXPECT_EQ(b.v[1], 0x41c83b0eu);
  EXPECT_EQ(b.v[2], 0xa20bc7c6u);
  EXPECT_EQ(b.v[3], 0x6d5451fdu);
  const llmc::Philox4 c =
      llmc::philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(c.v[0], 0xd16cfe09u);
  EXPECT_EQ(c.v[1], 0x94fdccebu);
  EXPECT_EQ(c.v[2], 0x5001e420u);
  EXPECT_EQ(c.v[3], 0x24126ea1u);
}

// Stochastic rounding's 16-bit stream: element i takes half (i % 2) of word (i % 8) / 2 of the Philox call with counter
// (i / 8 low, (i / 8 high) | copy << 31, step, tensor) and key (seed low, seed high); the constants are those of
// test/precision/fp4_numpy_ref.py's random_bits16 (test_fp4_numpy checks them on its side).
TEST(Philox, SixteenBitStreamFollowsTheKeying) {
  const llmc::StochasticKey key{0x0123456789ABCDEFull, 5, 9};
  for (uint64_t i = (1ull << 33); i < (1ull << 33) + 22; i++) {
    const uint64_t g = i >> 3;
    const llmc::Philox4 w = llmc::philox4x32_10(static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32) | (1u << 31),
                                                5, 9, 0x89ABCDEFu, 0x01234567u);
    EXPECT_EQ(llmc::random_bits16(key, i, 1), (w.v[(i % 8) / 2] >> (16 * (i % 2))) & 0xFFFFu) << i;
  }
  EXPECT_EQ(llmc::random_bits16(key, 0, 0), 0x4df1u);
  EXPECT_EQ(llmc::random_bits16(key, 13, 0), 0x85f3u);
  EXPECT_EQ(llmc::random_bits16(key, 13, 1), 0xa0edu);
}

TEST(E2M1Codec, ThresholdRoundingEqualsTheBitLevelEncoder) {
  size_t bad = 0;
  for (uint64_t b = 0; b < (1ull << 32); b += 331) {
    const float x = bits_to_float(static_cast<uint32_t>(b));
    if (llmc::e2m1_rn(x) != llmc::e2m1_encode(x) && bad++ < 8) ADD_FAILURE() << std::hexfloat << x;
  }
  for (int code = 0; code < 16; code++) {
    const float v = llmc::e2m1_decode(static_cast<uint8_t>(code));
    EXPECT_EQ(llmc::e2m1_value(static_cast<uint8_t>(code)), v);
    for (int d = -4; d <= 4; d++) {
      const float x = bits_to_float(float_to_bits(v) + d);
      EXPECT_EQ(llmc::e2m1_rn(x), llmc::e2m1_encode(x)) << std::hexfloat << x;
      const float m = bits_to_float(float_to_bits(v * 1.25f) + d);  // inside the intervals too
      EXPECT_EQ(llmc::e2m1_rn(m), llmc::e2m1_encode(m)) << std::hexfloat << m;
    }
  }
  EXPECT_EQ(bad, 0u);
  for (int c = 0; c < 256; c++) {
    const float want = llmc::e8m0_decode(static_cast<uint8_t>(c)), got = llmc::e8m0_value(static_cast<uint8_t>(c));
    if (c == 255) EXPECT_TRUE(std::isnan(got));
    else EXPECT_EQ(got, want) << c;
  }
}

TEST(E2M1Codec, StochasticRoundingPicksTheNeighbours) {
  // u = 0 (r's low half) rounds up from a point at least 2^-16 of a step inside an interval, 2^16 - 1 never does;
  // r's high half is not used
  EXPECT_EQ(llmc::e2m1_sr(0.6f, 0u), 0x2);
  EXPECT_EQ(llmc::e2m1_sr(0.6f, 0xffff0000u), 0x2);
  EXPECT_EQ(llmc::e2m1_sr(0.6f, 0x0000ffffu), 0x1);
  EXPECT_EQ(llmc::e2m1_sr(0.6f, 0xffffffffu), 0x1);
  EXPECT_EQ(llmc::e2m1_sr(-2.2f, 0u), 0xD);
  EXPECT_EQ(llmc::e2m1_sr(-2.2f, 0xffffffffu), 0xC);
  EXPECT_EQ(llmc::e2m1_sr(4.5f, 0u), 0x7);
  EXPECT_EQ(llmc::e2m1_sr(4.5f, 0xffffffffu), 0x6);
  for (float v : {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f})  // grid values are exact for every draw
    for (uint32_t r : {0u, 0x80000000u, 0xffffffffu}) EXPECT_EQ(llmc::e2m1_sr(v, r), llmc::e2m1_encode(v));
  EXPECT_EQ(llmc::e2m1_sr(100.0f, 0u), 0x7);
  EXPECT_EQ(llmc::e2m1_sr(-INFINITY, 0u), 0xF);
  EXPECT_EQ(llmc::e2m1_sr(NAN, 0u), llmc::kE2M1NanCode);
}

// Unbiasedness. For x in an interval [lo, lo + g), one draw is lo + g * B with B ~ Bernoulli(p), p = f rounded down
// to a multiple of 2^-16 (so E = x - g (f - p), 0 <= f - p < 2^-16). The mean of K draws has standard deviation
// g * sqrt(p (1 - p) / K) <= g / (2 sqrt K); we accept |mean - x| <= 5 of those bounds plus g * 2^-16 (a false
// failure with probability < 6e-7 per value for a correct implementation, by the normal approximation; K = 200000).
// The draws are fp4_rng.cuh's 16-bit stream, eight elements per Philox call.
TEST(E2M1Codec, StochasticRoundingIsUnbiasedWithinTheDerivedBound) {
  const int K = 200000;
  const llmc::StochasticKey key{0x5eed, 1, 2};
  for (float x : {0.1f, 0.3f, 0.7f, 1.1f, 1.9f, 2.3f, 3.7f, 4.2f, 5.9f, -0.45f, -2.75f, -5.0f}) {
    const float a = std::fabs(x);
    const double g = a < 2 ? 0.5 : a < 4 ? 1.0 : 2.0;
    double sum = 0.0;
    for (int k = 0; k < K; k++) sum += llmc::e2m1_decode(llmc::e2m1_sr(x, llmc::random_bits16(key, k, 0)));
    const double mean = sum / K, bound = 5.0 * g / (2.0 * std::sqrt(static_cast<double>(K))) + g / 65536.0;
    EXPECT_NEAR(mean, x, bound) << x;
  }
}

// e2m1_sr against its definition on a sweep of FP32, at both sides of each value's threshold: lo = the E2M1 grid value
// at or below |x| and g the grid step there (found on the grid in FP64), c = floor((|x| - lo) / g * 2^16) (exact in
// FP64), and u = r & 0xFFFF rounds up exactly when u < c: u = c - 1 must give lo + g, u = c lo, whatever r's high
// half holds. |x| >= 6 and +-inf give +-6, NaN kE2M1NanCode, for any word.
TEST(E2M1Codec, StochasticRoundingThresholdIsTheDefinition) {
  static const double grid[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  size_t bad = 0;
  for (uint64_t b = 0; b < (1ull << 32); b += 331) {
    const float x = bits_to_float(static_cast<uint32_t>(b));
    const double a = std::fabs(static_cast<double>(x));
    const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
    std::vector<std::pair<uint32_t, uint8_t>> want;  // (random word, code)
    if (std::isnan(x)) {
      want = {{0u, llmc::kE2M1NanCode}, {0xFFFFFFFFu, llmc::kE2M1NanCode}};
    } else if (a >= 6.0) {
      want = {{0u, static_cast<uint8_t>(sign | 7)}, {0xFFFFFFFFu, static_cast<uint8_t>(sign | 7)}};
    } else {
      int k = 0;
      while (grid[k + 1] <= a) k++;
      const double c = std::floor((a - grid[k]) / (grid[k + 1] - grid[k]) * 65536.0);
      const uint32_t high = static_cast<uint32_t>(b * 2654435761u) & 0xFFFF0000u;  // any high half
      if (c >= 1) want.push_back({high | static_cast<uint32_t>(c - 1), static_cast<uint8_t>(sign | (k + 1))});
      if (c < 65536.0) want.push_back({high | static_cast<uint32_t>(c), static_cast<uint8_t>(sign | k)});
    }
    for (const auto& [r, code] : want)
      if (llmc::e2m1_sr(x, r) != code && bad++ < 8)
        ADD_FAILURE() << std::hexfloat << x << " r " << r << ": " << +llmc::e2m1_sr(x, r) << " want " << +code;
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Hadamard, MatchesDenseMatricesAndIsOrthogonal) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int size : {16, 32}) {
    for (uint32_t signs : {0u, 0xA5C3u, static_cast<uint32_t>(rng())}) {
      std::vector<float> x(size);
      for (float& v : x) v = u(rng);
      std::vector<float> y = x;
      llmc::hadamard_cpu(y.data(), y.size(), size, signs);
      double norm_x = 0, norm_y = 0, l1 = 0;
      for (int j = 0; j < size; j++) l1 += std::fabs(x[j]);
      for (int i = 0; i < size; i++) {
        double acc = 0;
        for (int j = 0; j < size; j++)
          acc += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * ((signs >> j) & 1 ? -1.0 : 1.0) * x[j];
        acc /= std::sqrt(static_cast<double>(size));
        EXPECT_NEAR(y[i], acc, 8 * l1 / 16777216.0) << size << " " << i;
        norm_x += double(x[i]) * x[i];
        norm_y += double(y[i]) * y[i];
      }
      EXPECT_NEAR(norm_y, norm_x, 1e-5 * norm_x);
      // applying H twice (no signs) is the identity: H is symmetric and orthogonal
      if (signs == 0) {
        llmc::hadamard_cpu(y.data(), y.size(), size, 0);
        for (int i = 0; i < size; i++) EXPECT_NEAR(y[i], x[i], 1e-5);
      }
    }
  }
}

TEST(Fp4Formulas, HandComputedNvfp4AndMxfp4Blocks) {
  // NVFP4: tensor amax 448 * 6 / 10 = 268.8 is not needed: take A = 2688, s_enc = 1; block amax 12 -> s_b = e4m3(2) =
  // 2, multiplier 0.5: 12 -> 6, 5 -> e2m1(2.5) = 2 (tie to even), -1 -> -0.5.
  EXPECT_EQ(llmc::nvfp4_tensor_encode_scale(2688.0f), 1.0f);
  EXPECT_EQ(llmc::nvfp4_tensor_encode_scale(0.0f), 1.0f);
  EXPECT_EQ(llmc::nvfp4_tensor_encode_scale(INFINITY), 1.0f);
  const uint8_t sb = llmc::nvfp4_block_scale_code(12.0f, 1.0f);
  EXPECT_EQ(llmc::fp8_decode(sb, llmc::ElementFormat::E4M3), 2.0f);
  EXPECT_EQ(llmc::nvfp4_element_multiplier(sb, 1.0f), 0.5f);
  EXPECT_EQ(llmc::nvfp4_block_scale_code(NAN, 1.0f), 0x7F);
  EXPECT_EQ(llmc::nvfp4_element_multiplier(0x7F, 1.0f), 0.0f);
  EXPECT_EQ(llmc::nvfp4_element_multiplier(0x00, 1.0f), 0.0f);
  // a tensor amax under 6 * 448 * 2^9 / FLT_MAX: s_enc clamps to FLT_MAX, and for a block scale under 1 so does
  // s_enc / s_b (unclamped it is inf, and a zero element would become NaN, code 0x7); the zero keeps code 0
  const float flt_max = std::numeric_limits<float>::max(), s_max = llmc::nvfp4_tensor_encode_scale(1e-36f);
  EXPECT_EQ(s_max, flt_max);
  const uint8_t small_sb = llmc::nvfp4_block_scale_code(1e-40f, s_max);
  EXPECT_LT(llmc::fp8_decode(small_sb, llmc::ElementFormat::E4M3), 1.0f);
  EXPECT_EQ(llmc::nvfp4_element_multiplier(small_sb, s_max), flt_max);
  {
    std::vector<float> x(32, 0.0f);
    x[0] = 1e-36f, x[16] = 1e-40f;  // x[17 ..] zeros in the block of scale small_sb
    std::vector<uint8_t> data(llmc::code_bytes(llmc::kNvfp4Encoding, 1, 32));
    std::vector<uint8_t> s(llmc::scale_inv_bytes(llmc::kNvfp4Encoding, 1, 32));
    llmc::Fp4CpuOut out;
    out.data = data.data(), out.scale_inv = s.data();
    llmc::fp4_quantize_cpu(&out, x.data(), 1, 32, llmc::kNvfp4Encoding, llmc::QuantizeArgs{}, nullptr);
    EXPECT_EQ(s[4], small_sb);
    for (int i = 17; i < 32; i++) EXPECT_EQ(llmc::e2m1_unpack(data[i / 2], i), 0) << i;
  }
  // the block amax maps to 6 * s_b within E4M3 rounding: a_b = 7 -> 7/6 -> e4m3 1.125 (nearest), multiplier 1/1.125
  EXPECT_EQ(llmc::fp8_decode(llmc::nvfp4_block_scale_code(7.0f, 1.0f), llmc::ElementFormat::E4M3), 1.125f);
  // MXFP4: amax 5 -> floor(log2 5) = 2 -> X = 0 -> code 127, multiplier 1; amax 8 -> X = 1; amax 7.99 -> X = 0 (7.99
  // saturates to 6: the MX rule's clip); zero -> 127; subnormal -> 0; inf -> 0xFF
  EXPECT_EQ(llmc::mxfp4_scale_code(5.0f), 127);
  EXPECT_EQ(llmc::mxfp4_scale_code(8.0f), 128);
  EXPECT_EQ(llmc::mxfp4_scale_code(7.99f), 127);
  EXPECT_EQ(llmc::mxfp4_scale_code(0.0f), 127);
  EXPECT_EQ(llmc::mxfp4_scale_code(1e-40f), 0);
  EXPECT_EQ(llmc::mxfp4_scale_code(INFINITY), 0xFF);
  EXPECT_EQ(llmc::mxfp4_scale_code(std::numeric_limits<float>::max()), 252);
  for (int code = 0; code < 255; code++) {
    const uint8_t c = static_cast<uint8_t>(code);
    EXPECT_EQ(llmc::mxfp4_element_multiplier(c) * llmc::e8m0_decode(c), 1.0f) << code;
  }
}

TEST(Fp4Reference, QuantisesBlocksAsTheFormulasSay) {
  // MXFP4, one row of 40 (a full block and a partial one of 8), transposed copy too.
  std::vector<float> x(40);
  for (int i = 0; i < 40; i++) x[i] = static_cast<float>(i % 7) * (i < 32 ? 0.75f : 16.0f) * (i % 2 ? -1.0f : 1.0f);
  const llmc::Encoding e = llmc::kMxfp4Encoding;
  std::vector<uint8_t> data(llmc::code_bytes(e, 1, 40)), s(llmc::scale_inv_bytes(e, 1, 40));
  std::vector<uint8_t> data_t(llmc::code_bytes(e, 40, 1)), s_t(llmc::scale_inv_bytes(e, 40, 1));
  llmc::Fp4CpuOut out;
  out.data = data.data(), out.scale_inv = s.data(), out.data_t = data_t.data(), out.scale_inv_t = s_t.data();
  llmc::fp4_quantize_cpu(&out, x.data(), 1, 40, e, llmc::QuantizeArgs{}, nullptr);
  ASSERT_EQ(data.size(), 20u);
  ASSERT_EQ(s.size(), 8u);  // 2 blocks x ld 4
  EXPECT_EQ(s[0], llmc::mxfp4_scale_code(4.5f));   // block 0 amax 6 * 0.75
  EXPECT_EQ(s[1], llmc::kE8M0One);                  // padding
  EXPECT_EQ(s[4], llmc::mxfp4_scale_code(96.0f));  // block 1 amax 6 * 16
  for (int i = 0; i < 40; i++) {
    const uint8_t sc = s[(i / 32) * 4];
    const uint8_t want = llmc::e2m1_encode(x[i] * llmc::mxfp4_element_multiplier(sc));
    EXPECT_EQ(llmc::e2m1_unpack(data[i / 2], i), want) << i;
    // data_t (40, 1): a row of one element is its own block; one code per byte, low nibble, the high nibble 0
    const uint8_t own = llmc::mxfp4_scale_code(std::fabs(x[i]));
    EXPECT_EQ(s_t[i], own) << i;
    EXPECT_EQ(data_t[i], llmc::e2m1_encode(x[i] * llmc::mxfp4_element_multiplier(own))) << i;
  }
}

// The FP4 clipped count (fp4_codec.cuh's e2m1_clipped; fp4_quant_stats_cpu, which the GPU telemetry is compared
// with): |v * m| >= 6 or NaN, the complement of QuEST's trust mask. An MXFP4 block under Gaussian scales with one
// outlier: the outlier alone is clipped, and it is the one element the mask clears. The boundary: under the amax rule
// a block amax of 6 (X = 0, m = 1) lands on 6 exactly and counts, 5.5 does not, 7 does (the MX rule's clip); range
// matching clips nothing; NVFP4's block scale rounded down by E4M3 (amax 7 -> s_b 1.125) puts 7 at 6.22, and the
// tensor amax 2688 lands at 6 (one FP32 ulp above: 2688 * RN(1 / 448)).
TEST(Fp4Telemetry, ClippedCountIsTheTrustMasksComplement) {
  EXPECT_TRUE(llmc::e2m1_clipped(6.0f, 1.0f));
  EXPECT_FALSE(llmc::e2m1_clipped(std::nextafter(6.0f, 0.0f), 1.0f));
  EXPECT_TRUE(llmc::e2m1_clipped(-12.0f, 0.5f));
  EXPECT_TRUE(llmc::e2m1_clipped(NAN, 1.0f));
  EXPECT_FALSE(llmc::e2m1_clipped(0.0f, 0.0f));  // a zeroed block's elements: not clipped, and not trusted
  EXPECT_FALSE(llmc::e2m1_clipped(5.0f, 0.0f));
  EXPECT_TRUE(llmc::e2m1_clipped(INFINITY, 0.0f));
  EXPECT_FALSE(llmc::e2m1_trusted(0.0f, 0.0f));
  EXPECT_EQ(llmc::e2m1_trusted(3.0f, 2.0f), !llmc::e2m1_clipped(3.0f, 2.0f));
  EXPECT_EQ(llmc::e2m1_trusted(3.0f, 1.0f), !llmc::e2m1_clipped(3.0f, 1.0f));

  const llmc::Encoding e = llmc::kMxfp4Encoding;
  const int cols = 64;  // two blocks of 32
  auto quantize_and_measure = [&](const std::vector<float>& x, const llmc::QuantizeArgs& args_in,
                                  std::vector<uint32_t>* mask) {
    std::vector<uint8_t> data(llmc::code_bytes(e, 1, cols)), s(llmc::scale_inv_bytes(e, 1, cols));
    llmc::QuantizeArgs args = args_in;
    llmc::Fp4CpuOut out;
    out.data = data.data(), out.scale_inv = s.data();
    if (mask) mask->assign(2, 0u), out.trust_mask = mask->data();
    llmc::fp4_quantize_cpu(&out, x.data(), 1, cols, e, args, nullptr);
    return llmc::fp4_quant_stats_cpu(x.data(), data.data(), s.data(), 0.0f, 1, cols, e, args);
  };
  // Gaussian: block 0 small values with one outlier (index 5), block 1 small values only
  std::vector<float> x(cols);
  for (int i = 0; i < cols; i++) x[i] = llmc::bf16_decode(llmc::bf16_encode(0.1f * static_cast<float>(i % 7 - 3)));
  x[5] = 100.0f;
  llmc::QuantizeArgs quest;
  quest.mxfp4_scale = llmc::Mxfp4Scale::Gaussian;
  std::vector<uint32_t> mask;
  const llmc::QuantStats g = quantize_and_measure(x, quest, &mask);
  EXPECT_EQ(mask[0], ~(1u << 5));
  EXPECT_EQ(mask[1], ~0u);
  EXPECT_EQ(g.clipped_frac, 1.0 / cols);
  int untrusted = 0;
  for (uint32_t w : mask) untrusted += 32 - __builtin_popcount(w);
  EXPECT_EQ(g.clipped_frac * cols, untrusted);
  // amax rule: block 0 amax 6 (index 0 at 6, index 1 at 5.5), block 1 amax 7 (index 33) with 6.5 (index 34)
  std::vector<float> y(cols, 1.0f);
  y[0] = 6.0f, y[1] = 5.5f, y[33] = 7.0f, y[34] = -6.5f;
  const llmc::QuantStats a = quantize_and_measure(y, llmc::QuantizeArgs{}, nullptr);
  EXPECT_EQ(a.clipped_frac, 3.0 / cols);
  EXPECT_EQ(a.saturated_frac, 4.0 / cols);  // and 5.5, rounded up to 6
  llmc::QuantizeArgs range_matched;
  range_matched.mxfp4_scale = llmc::Mxfp4Scale::RangeMatched;
  EXPECT_EQ(quantize_and_measure(y, range_matched, nullptr).clipped_frac, 0.0);
  // NVFP4 1x16, tensor amax 2688 (s_enc 1): block 0 [2688, 1, ...], block 1 [7, 1, ...]
  const llmc::Encoding nv = llmc::kNvfp4Encoding;
  std::vector<float> z(32, 1.0f);
  z[0] = 2688.0f, z[16] = 7.0f;
  std::vector<uint8_t> data(llmc::code_bytes(nv, 1, 32)), s(llmc::scale_inv_bytes(nv, 1, 32));
  llmc::Fp4CpuOut out;
  out.data = data.data(), out.scale_inv = s.data();
  llmc::fp4_quantize_cpu(&out, z.data(), 1, 32, nv, llmc::QuantizeArgs{}, nullptr);
  const llmc::QuantStats n =
      llmc::fp4_quant_stats_cpu(z.data(), data.data(), s.data(), out.tensor_scale_inv, 1, 32, nv, llmc::QuantizeArgs{});
  EXPECT_EQ(n.clipped_frac, 2.0 / 32);
}

// Range-matched codes (Quartet's backward) are stored at 3/4 of what they stand for; the telemetry measures them at
// the value they stand for. A block whose values {0, +-4, +-8} (amax 8: X = 1, multiplier 3/8) land on the E2M1 grid
// {0, 1.5, 3} is exact: infinite SNR (decoded at the stored value it would be 12.04 dB, 10 log10(16), whatever the
// rounding), and the same block under the amax rule (multiplier 1/2: 0, 2, 4) is exact too.
TEST(Fp4Telemetry, RangeMatchedCodesAreMeasuredAtTheValueTheyStandFor) {
  const llmc::Encoding e = llmc::kMxfp4Encoding;
  const int cols = 32;
  std::vector<float> x(cols);
  const float pattern[5] = {8.0f, -4.0f, 0.0f, 4.0f, -8.0f};
  for (int i = 0; i < cols; i++) x[i] = pattern[i % 5];
  for (llmc::Mxfp4Scale rule : {llmc::Mxfp4Scale::RangeMatched, llmc::Mxfp4Scale::Amax}) {
    llmc::QuantizeArgs args;
    args.mxfp4_scale = rule;
    std::vector<uint8_t> data(llmc::code_bytes(e, 1, cols)), s(llmc::scale_inv_bytes(e, 1, cols));
    llmc::Fp4CpuOut out;
    out.data = data.data(), out.scale_inv = s.data();
    llmc::fp4_quantize_cpu(&out, x.data(), 1, cols, e, args, nullptr);
    std::vector<float> deq(cols);
    llmc::fp4_dequantize_cpu(deq.data(), data.data(), s.data(), 0.0f, 1, cols, e);
    const bool range_matched = rule == llmc::Mxfp4Scale::RangeMatched;
    for (int i = 0; i < cols; i++) {  // the codes are exact: decoded at 3/4 (range-matched) or at the value itself
      EXPECT_EQ(deq[i], range_matched ? 0.75f * x[i] : x[i]) << i;
      EXPECT_EQ(llmc::fp4_represented_value(deq[i], range_matched), static_cast<double>(x[i])) << i;
    }
    const llmc::QuantStats q = llmc::fp4_quant_stats_cpu(x.data(), data.data(), s.data(), 0.0f, 1, cols, e, args);
    EXPECT_TRUE(std::isinf(q.snr_db) && q.snr_db > 0) << "rule " << static_cast<int>(rule) << ": " << q.snr_db;
    EXPECT_EQ(q.clipped_frac, 0.0);
  }
}

// Quartet's backward signs: PrecisionState::rotation_signs is fp4_rng.cuh's random_signs on the stochastic key of
// (micro-step, rank, linear, role), i.e. word 0 of Philox counter (0, 0x40000000, step, tensor) with tensor =
// ((micro * world_size + rank) * linears + index) * 3 + role (the constants come from the NumPy reference's
// philox4x32_10, test/precision/fp4_numpy_ref.py); fresh for another step, micro-step, rank or linear, the same again
// for the same ones (a resumed run). A counting state: no GPU.
TEST(Fp4Rng, QuartetRotationSignsAreKeyedAndRepeat) {
  constexpr uint64_t kSeed = 0x0123456789ABCDEFull;
  EXPECT_EQ(llmc::random_signs({kSeed, 7, 5}, 32), 0x935ed6ddu);
  EXPECT_EQ(llmc::random_signs({kSeed, 7, 6}, 32), 0x8e06d38bu);
  EXPECT_EQ(llmc::random_signs({kSeed, 8, 5}, 32), 0x2e2795b6u);
  EXPECT_EQ(llmc::random_signs({kSeed, 7, 5}, 16), 0xd6ddu);
  llmc::PrecisionRecipe r;
  ASSERT_TRUE(llmc::precision_recipe_preset("mxfp4", &r));
  const llmc::LinearPlan plan = llmc::plan_linear(r, 0, 2, llmc::LinearKind::Qkv);
  // two linears; the signs of linear `index` in micro-step `micro` of `step` on `rank` of 2
  auto signs = [&](long long step, int micro, int rank, int index) {
    llmc::PrecisionState state(r, llmc::DeviceMemory::Count);
    state.set_random_stream(kSeed, rank, 2);
    llmc::Linear a(state, "a", llmc::LinearKind::Qkv, 0, 96, 64, plan, 64);
    llmc::Linear b(state, "b", llmc::LinearKind::Qkv, 1, 96, 64, plan, 64);
    state.begin_step(step);
    for (int i = 0; i <= micro; i++) state.begin_backward(0);
    return state.rotation_signs(index, llmc::LinearRole::Dy, 32);
  };
  EXPECT_EQ(signs(7, 0, 0, 1), 0x935ed6ddu);  // tensor ((0 * 2 + 0) * 2 + 1) * 3 + 2 = 5
  EXPECT_EQ(signs(8, 0, 0, 1), 0x2e2795b6u);  // another step
  EXPECT_EQ(signs(7, 0, 0, 1), signs(7, 0, 0, 1));
  EXPECT_NE(signs(7, 1, 0, 1), signs(7, 0, 0, 1));  // another micro-step
  EXPECT_NE(signs(7, 0, 1, 1), signs(7, 0, 0, 1));  // another rank
  EXPECT_NE(signs(7, 0, 0, 0), signs(7, 0, 0, 1));  // another linear
}

TEST(Fp4Encodings, AreQuantisableNamedAndSized) {
  for (const llmc::Encoding& e : {llmc::kNvfp4Encoding, llmc::kNvfp4WeightEncoding, llmc::kMxfp4Encoding}) {
    EXPECT_EQ(llmc::quantizer_error(e), "") << llmc::encoding_name(e);
    EXPECT_EQ(llmc::encoding_error(e), "");
    llmc::Encoding parsed;
    ASSERT_TRUE(llmc::parse_encoding(llmc::encoding_name(e), &parsed)) << llmc::encoding_name(e);
    EXPECT_EQ(parsed, e);
  }
  EXPECT_EQ(llmc::encoding_name(llmc::kNvfp4Encoding), "e2m1 1x16 e4m3 scales + fp32 tensor scale");
  EXPECT_EQ(llmc::encoding_name(llmc::kMxfp4Encoding), "e2m1 1x32 e8m0 scales");
  EXPECT_EQ(llmc::code_bytes(llmc::kNvfp4Encoding, 3, 33), 3u * 17u);
  EXPECT_EQ(llmc::scale_inv_bytes(llmc::kNvfp4Encoding, 3, 33), 3u * 4u);
  EXPECT_EQ(llmc::scale_inv_bytes(llmc::kNvfp4WeightEncoding, 33, 48), 3u * 4u);
  // FP4 element codes with other scales have no quantiser; the error names what exists
  const llmc::Encoding odd{llmc::ElementFormat::E2M1, llmc::kBlock1x16, llmc::ScaleFormat::E8M0, false};
  EXPECT_NE(llmc::quantizer_error(odd).find("nvfp4"), std::string::npos) << llmc::quantizer_error(odd);
  const auto formats = llmc::quantizable_element_formats();
  EXPECT_NE(std::find(formats.begin(), formats.end(), llmc::ElementFormat::E2M1), formats.end());
}

}  // namespace
