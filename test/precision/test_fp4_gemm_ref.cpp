// test/precision/test_fp4_gemm_ref: the FP4 products' exactness rules on the CPU. The MXFP4 -> E4M3 remap of
// llmc/precision/fp4_remap.cuh (the kernels' element function) over every (E2M1 code, E8M0 block code, outer exponent R
// in [-150, 150]) against the E4M3 codec of llmc/core/dtypes.h: its exactness flag is exactly "the E4M3 code times 2^R
// equals the MXFP4 value", its code is the nearest E4M3 value (ties to the even code, saturating at 448) found by brute
// force over all codes, and the closed-form rule written in fp4_remap.cuh (e <= 8; e >= -9, or -8 for significand 1.5;
// whole blocks exact for shifts [-8, 6]) holds; the NVFP4 expansion is exact in BF16 for every (E2M1, E4M3) pair, and
// its block table gives those values for every group of four codes under every scale code. Then the references of
// test/reference/fp4_gemm_ref.h: the remap reference agrees element by element with the kernels' element function on
// random operands with spread exponents, counts the inexact blocks of a hand-built case (and gives the values worked
// out here), the expansion reference equals the element function, and the FP64 GEMM reference equals a product of the
// FP32 dequantisation (fp4_dequantize_cpu). And the GEMM mapping of the FP4 encodings (quant_gemm_operands_error and
// friends) and matmul_quant's FP4 argument errors, host only.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/dtypes.h"
#include "llmc/precision/encoding.h"
#include "llmc/precision/fp4_gemm.h"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/fp4_remap.cuh"
#include "llmc/precision/gemm.h"
#include "llmc/precision/scale_math.cuh"
#include "test/reference/fp4_gemm_ref.h"
#include "test/reference/precision_ref.h"

namespace {

using namespace llmc;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

double e4m3(uint8_t code) { return static_cast<double>(fp8_decode(code, ElementFormat::E4M3)); }

// The E4M3 code nearest to t (ties to the even code, |t| above 448 saturating), by brute force over the finite codes.
uint8_t nearest_e4m3(double t) {
  static const std::vector<double> values = [] {
    std::vector<double> v(0x7F);
    for (int c = 0; c < 0x7F; c++) v[c] = e4m3(static_cast<uint8_t>(c));
    return v;
  }();
  const double a = std::fabs(t);
  uint8_t best = 0;
  double best_err = a;
  for (int c = 1; c <= 0x7E; c++) {
    const double err = std::fabs(values[c] - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) best = static_cast<uint8_t>(c), best_err = err;
  }
  return static_cast<uint8_t>(best | (std::signbit(t) ? 0x80 : 0x00));
}

TEST(Fp4Remap, E2m1ExponentAndSignificand) {
  for (uint8_t code = 1; code < 8; code++) {
    const double v = std::ldexp(e2m1_sig_1_5(code) ? 1.5 : 1.0, e2m1_exponent(code));
    EXPECT_EQ(v, static_cast<double>(e2m1_decode(code))) << +code;
  }
  for (int e = -149; e <= 127; e++) EXPECT_EQ(static_cast<double>(pow2_float(e)), std::ldexp(1.0, e)) << e;
}

// Every (E2M1 code, E8M0 block code, outer exponent R) against the E4M3 codec.
TEST(Fp4Remap, Mxfp4ToE4m3AgainstTheCodecEverywhere) {
  size_t checked = 0, bad = 0;
  for (int s = 0; s < 256; s++) {
    for (int code = 0; code < 16; code++) {
      for (int R = -150; R <= 150; R++) {
        const E4m3Remap m = mxfp4_element_to_e4m3(static_cast<uint8_t>(code), static_cast<uint8_t>(s), R);
        const double v = static_cast<double>(e2m1_decode(static_cast<uint8_t>(code))) *
                         static_cast<double>(e8m0_decode(static_cast<uint8_t>(s)));
        checked++;
        if (s == kE8M0NanCode) {
          bad += !(m.code == kFp8NanCode && m.exact);
          continue;
        }
        const double t = std::ldexp(v, -R);  // exact in FP64 (|t| >= 2^-280 or 0)
        const bool exact = std::ldexp(e4m3(m.code), R) == v && std::signbit(e4m3(m.code)) == std::signbit(v);
        // the closed-form rule of fp4_remap.cuh
        bool rule = true;
        if ((code & 7) != 0) {
          const int e = s - 127 + e2m1_exponent(static_cast<uint8_t>(code)) - R;
          rule = e <= 8 && e >= (e2m1_sig_1_5(static_cast<uint8_t>(code)) ? -8 : -9);
        }
        const bool ok = m.exact == exact && exact == rule && m.code == nearest_e4m3(t);
        if (!ok && bad++ < 10) {
          ADD_FAILURE() << "e2m1 " << code << " e8m0 " << s << " R " << R << ": code " << +m.code << " flag "
                        << m.exact << ", codec says exact " << exact << ", rule " << rule << ", nearest "
                        << +nearest_e4m3(t);
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << checked;
}

// byte_perm's host rule on hand-worked selectors (the device's __byte_perm is checked through the remap kernel by
// gpu.test_fp4_gemm).
TEST(Fp4Remap, BytePermSelectsBytesOfTheEightBytePool) {
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x7531u), 0x77553311u);
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x0000u), 0x00000000u);
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x4567u), 0x44556677u);
  EXPECT_EQ(byte_perm(0xDDCCBBAAu, 0x11223344u, 0x2604u), 0xCC22AA44u);
}

// The block table (every E8M0 code, R in [-150, 150]) holds the element function's code for each magnitude, its
// inexact bits are the element function's flags, and the NaN scale gives NaN codes without signs.
TEST(Fp4Remap, BlockTableIsTheElementFunction) {
  size_t bad = 0;
  for (int s = 0; s < 256; s++) {
    for (int R = -150; R <= 150; R++) {
      const Mxfp4BlockRemap t = mxfp4_block_remap(static_cast<uint8_t>(s), R);
      for (int m = 0; m < 8; m++) {
        const E4m3Remap e = mxfp4_element_to_e4m3(static_cast<uint8_t>(m), static_cast<uint8_t>(s), R);
        const uint32_t code = ((m < 4 ? t.lo : t.hi) >> (8 * (m % 4))) & 0xFF;
        const bool inexact = (t.inexact >> m) & 1;
        if ((code != e.code || inexact != !e.exact) && bad++ < 10)
          ADD_FAILURE() << "e8m0 " << s << " R " << R << " magnitude " << m << ": table " << code << " / "
                        << inexact << ", element function " << +e.code << " / " << !e.exact;
      }
      EXPECT_EQ(t.sign, s == kE8M0NanCode ? 0u : 0x80808080u);
    }
  }
  EXPECT_EQ(bad, 0u);
}

// Whole blocks through the table against the element function element by element: random codes (both zeros, every
// magnitude, blocks with few distinct magnitudes), every E8M0 code, shifts from far below to above the exact range;
// the block's top exponent against the largest nonzero element's.
TEST(Fp4Remap, BlockRemapIsTheElementFunctionElementByElement) {
  std::mt19937 rng(20261128);
  size_t bad = 0, inexact_blocks = 0;
  for (int trial = 0; trial < 200000; trial++) {
    const uint8_t s = static_cast<uint8_t>(trial < 256 ? trial : rng() % 256);
    const int R = static_cast<int>(s) - kE8M0Bias - static_cast<int>(rng() % 26) + 13;  // shifts k in [-13, 12]
    const uint32_t allowed = 0x1u | (rng() & 0xFFFFu);  // a random subset of the 16 codes, zero always in
    uint32_t w[kMxfp4BlockWords] = {0, 0, 0, 0};
    uint8_t e2m1[32];
    for (int i = 0; i < 32; i++) {
      uint8_t c;
      do c = static_cast<uint8_t>(rng() % 16); while (!((allowed >> c) & 1));
      e2m1[i] = c;
      w[i / 8] |= static_cast<uint32_t>(c) << (4 * (i % 8));
    }
    uint32_t out[2 * kMxfp4BlockWords];
    const bool inexact = mxfp4_block_to_e4m3(w, s, R, out);
    bool want_inexact = false;
    int want_top = INT_MIN;
    for (int i = 0; i < 32; i++) {
      const E4m3Remap e = mxfp4_element_to_e4m3(e2m1[i], s, R);
      want_inexact |= !e.exact;
      if ((e2m1[i] & 7) != 0) want_top = std::max(want_top, e2m1_exponent(e2m1[i]));
      const uint32_t got = (out[i / 4] >> (8 * (i % 4))) & 0xFF;
      if (got != e.code && bad++ < 10)
        ADD_FAILURE() << "e8m0 " << +s << " R " << R << " element " << i << " e2m1 " << +e2m1[i] << ": " << got
                      << " want " << +e.code;
    }
    inexact_blocks += inexact;
    if (inexact != want_inexact && bad++ < 10)
      ADD_FAILURE() << "e8m0 " << +s << " R " << R << ": inexact " << inexact << " want " << want_inexact;
    if (mxfp4_block_top_p(w) != want_top && bad++ < 10)
      ADD_FAILURE() << "top " << mxfp4_block_top_p(w) << " want " << want_top;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(inexact_blocks, 1000u);  // the fallback path and its count were exercised
}

// A whole block (all 16 codes) is exact exactly for block shifts k = X - R in [-8, 6] (fp4_recipes.md §0).
TEST(Fp4Remap, WholeBlocksAreExactForShiftsMinus8To6) {
  for (int k = -12; k <= 10; k++) {
    bool all = true;
    for (int code = 0; code < 16; code++)
      all = all && mxfp4_element_to_e4m3(static_cast<uint8_t>(code), static_cast<uint8_t>(127 + k), 0).exact;
    EXPECT_EQ(all, k >= -8 && k <= 6) << "shift " << k;
  }
}

// e2m1 * E4M3 scale is exact in FP32 and in BF16 for every pair (NaN scale: NaN); in E4M3 it is not: of the 7 x 126
// products of nonzero magnitudes and positive finite scales, 63 exceed 448 and 212 of the other 819 are not E4M3
// values (fp4_recipes.md §0's count).
TEST(Fp4Remap, Nvfp4ElementsAreExactInBf16) {
  int above = 0, inexact = 0;
  for (uint8_t code = 1; code < 8; code++)
    for (int s = 1; s < 0x7F; s++) {
      const double p = static_cast<double>(e2m1_decode(code)) * e4m3(static_cast<uint8_t>(s));
      if (p > 448.0) above++;
      else if (e4m3(fp8_encode(static_cast<float>(p), ElementFormat::E4M3)) != p) inexact++;
    }
  EXPECT_EQ(above, 63);
  EXPECT_EQ(inexact, 212);
  for (int s = 0; s < 256; s++)
    for (int code = 0; code < 16; code++) {
      const float v = nvfp4_element_value(static_cast<uint8_t>(code), static_cast<uint8_t>(s));
      const double want = static_cast<double>(e2m1_decode(static_cast<uint8_t>(code))) * e4m3(static_cast<uint8_t>(s));
      if ((s & 0x7F) == 0x7F) {
        EXPECT_TRUE(std::isnan(v));
        continue;
      }
      ASSERT_EQ(static_cast<double>(v), want) << code << " " << s;
      ASSERT_EQ(static_cast<double>(bf16_decode(bf16_encode(v))), want) << code << " " << s;
    }
}

// The block table expands every group of four codes (all 65,536) under every E4M3 scale code into the BF16 bits of
// each element's value: the exact product's bits for a finite scale (bf16_encode, which rounds nothing here), the
// device's canonical NaN 0x7FFF for the NaN scale codes whatever the element's sign; words of eight codes likewise.
TEST(Fp4Remap, Nvfp4BlockValuesAreTheElementValues) {
  size_t bad = 0;
  for (int s = 0; s < 256; s++) {
    const uint8_t scale = static_cast<uint8_t>(s);
    const Nvfp4BlockValues t = nvfp4_block_values(scale);
    for (uint32_t quad = 0; quad < 0x10000u; quad++) {
      uint32_t first = 0, second = 0;
      nvfp4_values_quad(t, quad | 0xABCD0000u, &first, &second);  // the high half is not read
      const uint32_t got[4] = {first & 0xFFFF, first >> 16, second & 0xFFFF, second >> 16};
      for (int k = 0; k < 4; k++) {
        const uint8_t code = static_cast<uint8_t>((quad >> (4 * k)) & 0xF);
        const float v = nvfp4_element_value(code, scale);
        const uint32_t want = (s & 0x7F) == 0x7F ? 0x7FFFu : bf16_encode(v);
        if ((got[k] != want || nvfp4_element_bf16(code, scale) != want) && bad++ < 10)
          ADD_FAILURE() << "scale " << s << " code " << +code << ": table " << got[k] << " element "
                        << nvfp4_element_bf16(code, scale) << " want " << want;
      }
    }
    uint32_t word_out[4];
    nvfp4_values_word(t, 0xFEDCBA98u, word_out);
    for (int k = 0; k < 8; k++) {
      const uint32_t want = nvfp4_element_bf16(static_cast<uint8_t>(8 + k), scale);
      EXPECT_EQ((word_out[k / 2] >> (16 * (k % 2))) & 0xFFFF, want) << "scale " << s << " element " << k;
    }
  }
  EXPECT_EQ(bad, 0u);
}

// ---------------------------------------------------------------------------------------------------------------
// Host-built FP4 operands

struct HostFp4 {
  Encoding e;
  int rows, K;
  std::vector<uint8_t> codes, scales;
  float tsi = 1.0f;
  HostFp4(const Encoding& enc, int r, int k)
      : e(enc), rows(r), K(k), codes(code_bytes(enc, r, k), 0),
        scales(scale_inv_bytes(enc, r, k), nvfp4_encoding(enc) ? 0x38 : 127) {}
  void set(int r, int c, uint8_t code) {
    uint8_t& b = codes[static_cast<size_t>(r) * ((K + 1) / 2) + c / 2];
    b = (c & 1) ? e2m1_pack(e2m1_unpack(b, 0), code) : e2m1_pack(code, e2m1_unpack(b, 1));
  }
  uint8_t code(int r, int c) const { return e2m1_unpack(codes[static_cast<size_t>(r) * ((K + 1) / 2) + c / 2], c); }
  uint8_t& scale(int r, int c) { return scales[scale_index(e.block, r, c, scale_inv_ld(e, rows, K))]; }
  Fp4CpuOperand op() const {
    Fp4CpuOperand o;
    o.codes = codes.data(), o.scales = scales.data(), o.tensor_scale_inv = tsi, o.encoding = e, o.rows = rows, o.K = K;
    return o;
  }
};

// Random codes; block scale codes around 127 + center, spread +-spread.
HostFp4 random_fp4(const Encoding& e, int rows, int K, std::mt19937& rng, int center, int spread) {
  HostFp4 h(e, rows, K);
  std::uniform_int_distribution<int> code(0, 15), sc(-spread, spread);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < K; c++) h.set(r, c, static_cast<uint8_t>(code(rng)));
  for (uint8_t& s : h.scales) s = static_cast<uint8_t>(nvfp4_encoding(e) ? 0x38 + sc(rng) : 127 + center + sc(rng));
  if (nvfp4_encoding(e)) h.tsi = 1.0f / 2688.0f;
  return h;
}

// The reference remap against the kernels' element function: the outer exponent read back from the reference's
// scale, every code equal, the count equal to the blocks with an inexact element.
void expect_remap_matches_element_function(const HostFp4& h) {
  const int Kp = static_cast<int>(round_up(h.K, 128)), ld = static_cast<int>(round_up(h.rows, 4));
  std::vector<uint8_t> codes(static_cast<size_t>(h.rows) * Kp);
  std::vector<float> scale(static_cast<size_t>(Kp / 128) * ld);
  const uint64_t count = mxfp4_to_e4m3_cpu(codes.data(), scale.data(), h.op());
  uint64_t want = 0;
  size_t bad = 0;
  for (int r = 0; r < h.rows; r++) {
    for (int j = 0; j < Kp / 128; j++) {
      int R = 0;
      std::frexp(scale[static_cast<size_t>(j) * ld + r], &R);
      R -= 1;
      for (int c0 = j * 128; c0 < std::min(h.K, j * 128 + 128); c0 += 32) {
        bool inexact = false;
        for (int c = c0; c < std::min(h.K, c0 + 32); c++) {
          const E4m3Remap m = mxfp4_element_to_e4m3(h.code(r, c), h.scales[scale_index(h.e.block, r, c,
                                                                                        scale_inv_ld(h.e, h.rows, h.K))], R);
          inexact |= !m.exact;
          if (m.code != codes[static_cast<size_t>(r) * Kp + c] && bad++ < 5)
            ADD_FAILURE() << "(" << r << ", " << c << "): reference " << +codes[static_cast<size_t>(r) * Kp + c]
                          << ", element function " << +m.code << " (R " << R << ")";
        }
        want += inexact;
      }
      for (int c = std::max(h.K, j * 128); c < j * 128 + 128; c++) EXPECT_EQ(codes[static_cast<size_t>(r) * Kp + c], 0);
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(count, want);
}

TEST(Fp4GemmRef, RemapReferenceMatchesTheElementFunction) {
  std::mt19937 rng(11);
  // narrow spreads: every run within range (count 0); wide: many inexact blocks; K with a partial 128-run and block
  expect_remap_matches_element_function(random_fp4(kMxfp4Encoding, 24, 384, rng, 0, 3));
  expect_remap_matches_element_function(random_fp4(kMxfp4Encoding, 13, 200, rng, -20, 12));
  expect_remap_matches_element_function(random_fp4(kMxfp4Encoding, 5, 77, rng, 90, 30));
  HostFp4 narrow = random_fp4(kMxfp4Encoding, 16, 256, rng, 5, 3);
  const int Kp = 256;
  std::vector<uint8_t> codes(16 * Kp);
  std::vector<float> scale(2 * 16);
  EXPECT_EQ(mxfp4_to_e4m3_cpu(codes.data(), scale.data(), narrow.op()), 0u);
}

// The hand-built case: row 3's first 128-run has blocks with X = 20, 0, 5, 5 (E8M0 codes 147, 127, 132, 132).
//   block 0: 6 * 2^20 = 1.5 * 2^22 sets R = 22 - 8 = 14 (element 0; the rest 0)
//   block 1: 1 * 2^0 = 2^0, shift -14 < -9: flushed to 0                                      -> inexact
//   block 2: 1.5 * 2^5, shift -9 < -8: 1.5 * 2^-9 ties between 2^-9 and 2^-8, goes to the even code (2^-8) -> inexact
//   block 3: 1 * 2^5, shift -9: 2^-9, E4M3's least subnormal                                  -> exact
// Every other row: codes 6 with X = 0 (exact). Count 2.
TEST(Fp4GemmRef, RemapCountsAndRoundsAHandBuiltCase) {
  HostFp4 h(kMxfp4Encoding, 8, 128);
  for (int r = 0; r < 8; r++)
    for (int c = 0; c < 128; c++) h.set(r, c, r == 3 ? 0 : 7);
  h.set(3, 0, 7);
  h.set(3, 32, 2);
  h.set(3, 64, 3);
  h.set(3, 96, 2);
  h.scale(3, 0) = 147, h.scale(3, 32) = 127, h.scale(3, 64) = 132, h.scale(3, 96) = 132;
  std::vector<uint8_t> codes(8 * 128);
  std::vector<float> scale(8);
  EXPECT_EQ(mxfp4_to_e4m3_cpu(codes.data(), scale.data(), h.op()), 2u);
  EXPECT_EQ(scale[3], std::ldexp(1.0f, 14));
  EXPECT_EQ(e4m3(codes[3 * 128 + 0]) * std::ldexp(1.0, 14), 6.0 * std::ldexp(1.0, 20));
  EXPECT_EQ(e4m3(codes[3 * 128 + 32]), 0.0);
  EXPECT_EQ(e4m3(codes[3 * 128 + 64]), std::ldexp(1.0, -8));
  EXPECT_EQ(e4m3(codes[3 * 128 + 96]), std::ldexp(1.0, -9));
  EXPECT_EQ(scale[0], std::ldexp(1.0f, 2 - 8));  // 6 * 2^0: top exponent 2
  EXPECT_EQ(e4m3(codes[0]), 384.0);
}

// NaN blocks stay NaN, are not counted and do not set the outer scale.
TEST(Fp4GemmRef, RemapKeepsNanBlocks) {
  HostFp4 h(kMxfp4Encoding, 4, 64);
  for (int c = 0; c < 64; c++) h.set(0, c, 2);
  h.scale(0, 0) = kE8M0NanCode;
  std::vector<uint8_t> codes(4 * 128);
  std::vector<float> scale(4);
  EXPECT_EQ(mxfp4_to_e4m3_cpu(codes.data(), scale.data(), h.op()), 0u);
  EXPECT_EQ(codes[0], kFp8NanCode);
  EXPECT_EQ(scale[0], std::ldexp(1.0f, -8));  // from block 1 only: 1 * 2^0
  EXPECT_EQ(e4m3(codes[32]), 256.0);
}

TEST(Fp4GemmRef, ExpansionReferenceMatchesTheElementFunction) {
  std::mt19937 rng(5);
  for (const Encoding& e : {kNvfp4Encoding, kNvfp4WeightEncoding}) {
    const HostFp4 h = random_fp4(e, 37, 75, rng, 0, 40);
    const int Kp = 80;
    std::vector<uint16_t> out(37 * Kp);
    nvfp4_to_bf16_cpu(out.data(), h.op());
    for (int r = 0; r < 37; r++)
      for (int c = 0; c < Kp; c++) {
        const float want = c < 75 ? nvfp4_element_value(h.code(r, c), h.scales[scale_index(e.block, r, c,
                                                                                           scale_inv_ld(e, 37, 75))])
                                  : 0.0f;
        ASSERT_EQ(bf16_encode(want), out[static_cast<size_t>(r) * Kp + c]) << r << " " << c;
      }
  }
}

// The FP64 reference GEMM against the FP32 dequantisation of fp4_dequantize_cpu (MXFP4: equal values, so equal sums
// up to FP64 rounding; NVFP4: the FP32 values differ from the exact ones by at most 2^-24 relative each).
TEST(Fp4GemmRef, MatmulReferenceAgreesWithTheDequantisation) {
  std::mt19937 rng(9);
  for (const Encoding& ea : {kMxfp4Encoding, kNvfp4Encoding}) {
    const Encoding eb = ea == kMxfp4Encoding ? kMxfp4Encoding : kNvfp4WeightEncoding;
    const int M = 19, N = 24, K = 70;
    const HostFp4 A = random_fp4(ea, M, K, rng, 2, 4), B = random_fp4(eb, N, K, rng, -3, 4);
    std::vector<double> D(M * N), absref(M * N), D2(5 * N), absref2(5 * N);
    fp4_matmul_cpu(D.data(), absref.data(), A.op(), B.op(), 0, M);
    fp4_matmul_cpu(D2.data(), absref2.data(), A.op(), B.op(), 7, 12);
    std::vector<float> a(M * K), b(N * K);
    fp4_dequantize_cpu(a.data(), A.codes.data(), A.scales.data(), A.tsi, M, K, ea);
    fp4_dequantize_cpu(b.data(), B.codes.data(), B.scales.data(), B.tsi, N, K, eb);
    const double rel = ea == kMxfp4Encoding ? 1e-15 : 3.0 * std::ldexp(1.0, -24);
    for (int m = 0; m < M; m++)
      for (int n = 0; n < N; n++) {
        double s = 0;
        for (int k = 0; k < K; k++) s += static_cast<double>(a[m * K + k]) * static_cast<double>(b[n * K + k]);
        EXPECT_LE(std::fabs(s - D[m * N + n]), rel * absref[m * N + n] + 1e-300) << m << " " << n;
        if (m >= 7 && m < 12) EXPECT_EQ(D2[(m - 7) * N + n], D[m * N + n]);
      }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The GEMM mapping of the FP4 encodings (host only)

TEST(Fp4GemmMapping, PairsSizesAndErrors) {
  const Encoding e4m3_tensor{ElementFormat::E4M3, kWholeTensor, ScaleFormat::FP32};
  EXPECT_EQ(quant_gemm_operands_error(kMxfp4Encoding, "x", kMxfp4Encoding, "w"), "");
  EXPECT_EQ(quant_gemm_operands_error(kNvfp4Encoding, "x", kNvfp4WeightEncoding, "w"), "");
  EXPECT_EQ(quant_gemm_operands_error(kNvfp4WeightEncoding, "wt", kNvfp4Encoding, "dy"), "");
  EXPECT_EQ(quant_gemm_operands_error(kNvfp4Encoding, "dyt", kNvfp4Encoding, "xt"), "");
  const std::string mixed = quant_gemm_operands_error(kMxfp4Encoding, "x", kNvfp4WeightEncoding, "w");
  EXPECT_TRUE(contains(mixed, "x is e2m1 1x32 e8m0 scales and w is e2m1 16x16 e4m3 scales + fp32 tensor scale")) << mixed;
  const std::string fp8 = quant_gemm_operands_error(e4m3_tensor, "x", kMxfp4Encoding, "w");
  EXPECT_TRUE(contains(fp8, "x is e4m3 tensor and w is e2m1 1x32 e8m0 scales")) << fp8;
  const Encoding odd{ElementFormat::E2M1, kBlock1x16, ScaleFormat::E8M0};
  EXPECT_FALSE(quant_gemm_operands_error(odd, "a", odd, "b").empty());
  EXPECT_EQ(quant_gemm_min_compute_capability(kMxfp4Encoding, kMxfp4Encoding), 90);
  EXPECT_EQ(quant_gemm_min_compute_capability(kNvfp4Encoding, kNvfp4WeightEncoding), 80);
  EXPECT_THROW(quant_gemm_min_compute_capability(kNvfp4Encoding, kMxfp4Encoding), Error);
  EXPECT_EQ(quant_gemm_dim_multiple(kMxfp4Encoding), 16);
  EXPECT_EQ(quant_gemm_dim_multiple(kNvfp4Encoding), 8);
  EXPECT_EQ(quant_gemm_dim_multiple(kNvfp4WeightEncoding), 8);
  EXPECT_EQ(quant_gemm_scratch_bytes(e4m3_tensor, e4m3_tensor, 128, 128, 128), 0u);
  // MXFP4: E4M3 copies (M + N) x 1152 plus FP32 scales 9 x (M + N); NVFP4: BF16 copies (M + N) x 1032, 2 scalars
  EXPECT_EQ(quant_gemm_scratch_bytes(kMxfp4Encoding, kMxfp4Encoding, 256, 512, 1056),
            256u * 1152 + 512u * 1152 + round_up(9u * 256 * 4, 256) + round_up(9u * 512 * 4, 256));
  EXPECT_EQ(quant_gemm_scratch_bytes(kNvfp4Encoding, kNvfp4WeightEncoding, 777, 64, 1030),
            round_up(777u * 1032 * 2, 256) + 64u * 1032 * 2 + 256);
  EXPECT_EQ(mxfp4_remap_cols(1056), 1152);
  EXPECT_EQ(nvfp4_expand_cols(1030), 1032);
}

// matmul_quant's FP4 argument errors come before any device work: each names what is wrong (fake, never
// dereferenced, 256-byte aligned pointers). matmul_quant_supported refuses the same combinations, except a missing
// pointer (it checks only the alignment of the pointers given): `missing_pointer` says the error is one.
std::string quant_error(const QuantOperand& A, const QuantOperand& B, int M, int N, int K, const QuantGemmOptions& opt,
                        bool d_fp32, bool missing_pointer = false) {
  try {
    if (d_fp32) matmul_quant(reinterpret_cast<float*>(0x10000), A, B, M, N, K, opt, nullptr);
    else matmul_quant(reinterpret_cast<bf16*>(0x10000), A, B, M, N, K, opt, nullptr);
  } catch (const Error& e) {
    if (!missing_pointer) EXPECT_FALSE(matmul_quant_supported(d_fp32, A, B, M, N, K, opt));
    return e.what();
  }
  return "no error";
}

TEST(Fp4GemmMapping, ArgumentErrorsNameTheProblem) {
  const auto fake_u8 = reinterpret_cast<const uint8_t*>(0x20000);
  const auto fake_f = reinterpret_cast<const float*>(0x30000);
  auto operand = [&](const Encoding& e) {
    QuantOperand o;
    o.data = fake_u8, o.scale_inv = fake_f, o.encoding = e;
    if (e.tensor_scale) o.tensor_scale_inv = fake_f;
    return o;
  };
  const QuantOperand mx = operand(kMxfp4Encoding), nv = operand(kNvfp4Encoding), nvw = operand(kNvfp4WeightEncoding);
  QuantGemmOptions opt;
  opt.inexact_blocks = reinterpret_cast<unsigned long long*>(0x40000);
  const QuantOperand e4m3 = operand({ElementFormat::E4M3, kWholeTensor, ScaleFormat::FP32});
  std::string e = quant_error(mx, nvw, 256, 256, 256, opt, false);
  EXPECT_TRUE(contains(e, "A is e2m1 1x32 e8m0 scales and B is e2m1 16x16 e4m3 scales + fp32 tensor scale")) << e;
  e = quant_error(e4m3, mx, 256, 256, 256, opt, false);
  EXPECT_TRUE(contains(e, "A is e4m3 tensor and B is e2m1 1x32")) << e;
  e = quant_error(mx, mx, 777, 256, 256, opt, false);
  EXPECT_TRUE(contains(e, "M=777 and N=256 must be multiples of 16")) << e;
  e = quant_error(nv, nvw, 777, 100, 1004, opt, false);
  EXPECT_TRUE(contains(e, "N=100 must be a multiple of 8")) << e;
  QuantGemmOptions fast = opt;
  fast.fast_accum = true;
  EXPECT_TRUE(contains(quant_error(nv, nvw, 64, 64, 64, fast, false), "fast_accum with FP4 operands"));
  QuantGemmOptions acc = opt;
  acc.accumulate = true;
  EXPECT_TRUE(contains(quant_error(mx, mx, 64, 64, 64, acc, false), "accumulate (D += A*B^T) is for an FP32 D"));
  QuantGemmOptions no_counter;
  e = quant_error(mx, mx, 64, 64, 64, no_counter, true, true);
  EXPECT_TRUE(contains(e, "opt.inexact_blocks is null")) << e;
  QuantOperand nv_no_scale = nv;
  nv_no_scale.tensor_scale_inv = nullptr;
  e = quant_error(nv_no_scale, nvw, 64, 64, 64, opt, true, true);
  EXPECT_TRUE(contains(e, "A.tensor_scale_inv is null")) << e;
}

}  // namespace
