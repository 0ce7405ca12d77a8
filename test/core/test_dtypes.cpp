// test/core/test_dtypes: the host number formats of llmc/core/dtypes (fp8_encode / fp8_decode for E4M3 and E5M2,
// bf16_encode / bf16_decode, e2m1_encode / e2m1_decode and the FP4 packing, e8m0_encode / e8m0_decode, pow2_floor) bit
// for bit against the ml_dtypes vectors in test/core/data/fp8_vectors.txt (test/core/gen_fp8_vectors.py), then against
// CUDA's own host conversions (cuda_fp8.h / cuda_fp4.h / cuda_bf16.h, an independent implementation) on a sweep of the
// whole FP32 space and on NaNs; and the element-format table (names, bits, maxima).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"

namespace {

using llmc::ElementFormat;

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// The vector file: section name ("encode e4m3") -> (input, expected) pairs.
using Vectors = std::map<std::string, std::vector<std::pair<uint32_t, uint32_t>>>;

const Vectors& vectors() {
  static const Vectors v = [] {
    const std::string path = std::string(LLM8_SOURCE_DIR) + "/test/core/data/fp8_vectors.txt";
    std::ifstream in(path);
    if (!in) throw llmc::Error("cannot open " + path);
    Vectors out;
    std::string line, section;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      if (line[0] == '@') {
        section = line.substr(2);
        continue;
      }
      std::istringstream fields(line);
      std::string a, b;
      fields >> a >> b;
      out[section].emplace_back(static_cast<uint32_t>(std::stoul(a, nullptr, 16)),
                                static_cast<uint32_t>(std::stoul(b, nullptr, 16)));
    }
    return out;
  }();
  return v;
}

const std::vector<std::pair<uint32_t, uint32_t>>& section(const std::string& name) {
  const auto it = vectors().find(name);
  if (it == vectors().end()) throw llmc::Error("fp8_vectors.txt has no section '" + name + "'");
  return it->second;
}

struct FormatCase {
  ElementFormat format;
  const char* name;
  __nv_fp8_interpretation_t cuda;
  uint8_t max_code;
  float max;
};
const FormatCase kFormats[] = {{ElementFormat::E4M3, "e4m3", __NV_E4M3, 0x7E, 448.0f},
                               {ElementFormat::E5M2, "e5m2", __NV_E5M2, 0x7B, 57344.0f}};

// ---------------------------------------------------------------------------------------------------------------
// ml_dtypes vectors
TEST(Fp8Vectors, DecodeEveryCodeMatchesMlDtypes) {
  for (const FormatCase& fc : kFormats) {
    const auto& v = section(std::string("decode ") + fc.name);
    ASSERT_EQ(v.size(), 256u) << fc.name;
    int bad = 0;
    for (const auto& [code, want_bits] : v) {
      const float got = llmc::fp8_decode(static_cast<uint8_t>(code), fc.format);
      const float want = float_of(want_bits);
      const bool ok = std::isnan(want) ? std::isnan(got) : bits_of(got) == want_bits;
      if (!ok && bad++ < 10)
        ADD_FAILURE() << fc.name << " decode 0x" << std::hex << code << ": got " << std::hexfloat << got
                      << " want " << want;
    }
    EXPECT_EQ(bad, 0) << fc.name;
  }
}

TEST(Fp8Vectors, EncodeMatchesMlDtypes) {
  for (const FormatCase& fc : kFormats) {
    const auto& v = section(std::string("encode ") + fc.name);
    ASSERT_GT(v.size(), 3000u) << fc.name;
    int bad = 0;
    for (const auto& [x_bits, want] : v) {
      const uint8_t got = llmc::fp8_encode(float_of(x_bits), fc.format);
      if (got != want && bad++ < 10)
        ADD_FAILURE() << llmc::strformat("%s encode %08x (%a): got %02x want %02x", fc.name, x_bits,
                                         static_cast<double>(float_of(x_bits)), got, want);
    }
    EXPECT_EQ(bad, 0) << fc.name << ": " << bad << " of " << v.size() << " vectors differ";
  }
}

TEST(Bf16Vectors, EncodeMatchesMlDtypes) {
  const auto& v = section("encode bf16");
  ASSERT_GT(v.size(), 2000u);
  int bad = 0;
  for (const auto& [x_bits, want] : v) {
    const uint16_t got = llmc::bf16_encode(float_of(x_bits));
    if (got != want && bad++ < 10)
      ADD_FAILURE() << llmc::strformat("bf16 encode %08x: got %04x want %04x", x_bits, got, want);
  }
  EXPECT_EQ(bad, 0);
}

// ---------------------------------------------------------------------------------------------------------------
// Against CUDA's host conversions (cuda_fp8.hpp converts through FP64 with its own rounding code).
TEST(Fp8Encode, MatchesCudaSatfiniteConversionOnFp32Sweep) {
  // Every 997th FP32 bit pattern (all signs, exponents, NaN payloads and infinities get hit) plus the neighbourhood
  // of every FP8 value. (An exhaustive run over all 2^32 floats matched too; it takes minutes.)
  std::vector<uint32_t> inputs;
  for (uint64_t b = 0; b < (1ull << 32); b += 997) inputs.push_back(static_cast<uint32_t>(b));
  for (const FormatCase& fc : kFormats)
    for (int code = 0; code < 256; code++) {
      const float v = llmc::fp8_decode(static_cast<uint8_t>(code), fc.format);
      for (int d = -3; d <= 3; d++) inputs.push_back(bits_of(v) + d);
    }
  for (const FormatCase& fc : kFormats) {
    size_t bad = 0;
    for (uint32_t b : inputs) {
      const float x = float_of(b);
      const uint8_t got = llmc::fp8_encode(x, fc.format);
      const uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fc.cuda);
      if (got != want && bad++ < 10)
        ADD_FAILURE() << llmc::strformat("%s encode %08x (%a): got %02x, CUDA %02x", fc.name, b,
                                         static_cast<double>(x), got, want);
    }
    EXPECT_EQ(bad, 0u) << fc.name << " over " << inputs.size() << " inputs";
  }
}

TEST(Fp8Encode, NanGivesTheCanonicalCodeLikeCuda) {
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x7fa00000u};
  for (const FormatCase& fc : kFormats)
    for (uint32_t b : nans) {
      EXPECT_EQ(llmc::fp8_encode(float_of(b), fc.format), llmc::kFp8NanCode) << fc.name << std::hex << " " << b;
      EXPECT_EQ(__nv_cvt_float_to_fp8(float_of(b), __NV_SATFINITE, fc.cuda), llmc::kFp8NanCode)
          << fc.name << std::hex << " " << b;
    }
  EXPECT_TRUE(std::isnan(llmc::fp8_decode(llmc::kFp8NanCode, ElementFormat::E4M3)));
  EXPECT_TRUE(std::isnan(llmc::fp8_decode(llmc::kFp8NanCode, ElementFormat::E5M2)));
}

TEST(Fp8Encode, SaturatesAndRoundsAtTheEdges) {
  // Hand-computed anchors, independent of both ml_dtypes and CUDA.
  EXPECT_EQ(llmc::fp8_encode(448.0f, ElementFormat::E4M3), 0x7E);
  EXPECT_EQ(llmc::fp8_encode(464.0f, ElementFormat::E4M3), 0x7E);   // tie between 448 and (NaN) 480: even, 448
  EXPECT_EQ(llmc::fp8_encode(1e9f, ElementFormat::E4M3), 0x7E);
  EXPECT_EQ(llmc::fp8_encode(-INFINITY, ElementFormat::E4M3), 0xFE);
  EXPECT_EQ(llmc::fp8_encode(61440.0f, ElementFormat::E5M2), 0x7B);  // ties up to 65536 = inf, saturates
  EXPECT_EQ(llmc::fp8_encode(INFINITY, ElementFormat::E5M2), 0x7B);
  EXPECT_EQ(llmc::fp8_encode(1.0f, ElementFormat::E4M3), 0x38);
  EXPECT_EQ(llmc::fp8_encode(1.0f, ElementFormat::E5M2), 0x3C);
  EXPECT_EQ(llmc::fp8_encode(1.0625f, ElementFormat::E4M3), 0x38);  // tie: 1.0 (even) vs 1.125
  EXPECT_EQ(llmc::fp8_encode(1.1875f, ElementFormat::E4M3), 0x3A);  // tie: 1.25 (even) vs 1.125
  EXPECT_EQ(llmc::fp8_encode(std::ldexp(1.0f, -9), ElementFormat::E4M3), 0x01);   // smallest subnormal
  EXPECT_EQ(llmc::fp8_encode(std::ldexp(1.0f, -10), ElementFormat::E4M3), 0x00);  // half of it: tie to 0
  EXPECT_EQ(llmc::fp8_encode(-std::ldexp(1.0f, -10), ElementFormat::E4M3), 0x80);
  EXPECT_EQ(llmc::fp8_encode(std::ldexp(3.0f, -10), ElementFormat::E4M3), 0x02);  // 1.5 quanta: tie to 2
  EXPECT_EQ(llmc::fp8_encode(std::ldexp(1.0f, -16), ElementFormat::E5M2), 0x01);
  EXPECT_EQ(llmc::fp8_encode(-0.0f, ElementFormat::E5M2), 0x80);
  EXPECT_EQ(llmc::fp8_decode(0x7E, ElementFormat::E4M3), 448.0f);
  EXPECT_EQ(llmc::fp8_decode(0x7B, ElementFormat::E5M2), 57344.0f);
  EXPECT_EQ(llmc::fp8_decode(0x7C, ElementFormat::E5M2), INFINITY);
  EXPECT_EQ(llmc::fp8_decode(0xFC, ElementFormat::E5M2), -INFINITY);
  EXPECT_EQ(llmc::fp8_decode(0x01, ElementFormat::E4M3), std::ldexp(1.0f, -9));
}

TEST(Fp8Decode, MatchesCudaAndRoundTrips) {
  for (const FormatCase& fc : kFormats)
    for (int c = 0; c < 256; c++) {
      const uint8_t code = static_cast<uint8_t>(c);
      const float got = llmc::fp8_decode(code, fc.format);
      const float cuda = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, fc.cuda)));
      if (std::isnan(cuda)) {
        EXPECT_TRUE(std::isnan(got)) << fc.name << " code " << c;
        continue;
      }
      EXPECT_EQ(bits_of(got), bits_of(cuda)) << fc.name << " code " << c;
      if (std::isfinite(got)) {
        EXPECT_EQ(llmc::fp8_encode(got, fc.format), code) << fc.name << " code " << c;
        EXPECT_LE(std::fabs(got), fc.max);
      }
    }
}

TEST(Bf16, MatchesCudaHostConversionOnFp32Sweep) {
  size_t bad = 0, count = 0;
  for (uint64_t b = 0; b < (1ull << 32); b += 1009, count++) {
    const float x = float_of(static_cast<uint32_t>(b));
    const uint16_t got = llmc::bf16_encode(x);
    const __nv_bfloat16 cuda = __float2bfloat16_rn(x);
    uint16_t want;
    std::memcpy(&want, &cuda, sizeof(want));
    const bool ok = std::isnan(x) ? std::isnan(llmc::bf16_decode(got)) : got == want;
    if (!ok && bad++ < 10) ADD_FAILURE() << llmc::strformat("bf16 %08x: got %04x, CUDA %04x", uint32_t(b), got, want);
  }
  EXPECT_EQ(bad, 0u) << "over " << count << " inputs";
}

TEST(Bf16, DecodeIsExactAndRoundTrips) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float x = llmc::bf16_decode(static_cast<uint16_t>(h));
    ASSERT_EQ(bits_of(x), h << 16);
    if (!std::isnan(x)) ASSERT_EQ(llmc::bf16_encode(x), h);
    else ASSERT_TRUE(std::isnan(llmc::bf16_decode(llmc::bf16_encode(x))));
  }
  EXPECT_EQ(llmc::bf16_encode(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie to even (down)
  EXPECT_EQ(llmc::bf16_encode(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie to even (up)
  EXPECT_EQ(llmc::bf16_encode(std::numeric_limits<float>::max()), 0x7F80);  // rounds to inf
}

TEST(Pow2Floor, KeepsTheExponent) {
  EXPECT_EQ(llmc::pow2_floor(1.0f), 1.0f);
  EXPECT_EQ(llmc::pow2_floor(1.9999999f), 1.0f);
  EXPECT_EQ(llmc::pow2_floor(0.75f), 0.5f);
  EXPECT_EQ(llmc::pow2_floor(448.0f / 3.0f), 128.0f);
  EXPECT_EQ(llmc::pow2_floor(std::numeric_limits<float>::max()), std::ldexp(1.0f, 127));
  EXPECT_EQ(llmc::pow2_floor(std::numeric_limits<float>::min()), std::numeric_limits<float>::min());
  EXPECT_EQ(llmc::pow2_floor(std::ldexp(3.0f, -149)), std::ldexp(1.0f, -148));  // subnormal: highest bit
  EXPECT_EQ(llmc::pow2_floor(std::ldexp(1.0f, -149)), std::ldexp(1.0f, -149));
  for (float bad : {0.0f, -0.0f, -1.0f, INFINITY, NAN}) {
    try {
      llmc::pow2_floor(bad);
      ADD_FAILURE() << "pow2_floor(" << bad << ") did not throw";
    } catch (const llmc::Error& e) {
      EXPECT_NE(std::string(e.what()).find("pow2_floor: x"), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// FP4 E2M1 and E8M0
TEST(E2M1Vectors, DecodeAndEncodeMatchMlDtypes) {
  const auto& dec = section("decode e2m1");
  ASSERT_EQ(dec.size(), 16u);
  for (const auto& [code, want_bits] : dec)
    EXPECT_EQ(bits_of(llmc::e2m1_decode(static_cast<uint8_t>(code))), want_bits) << "code " << code;
  const auto& enc = section("encode e2m1");
  ASSERT_GT(enc.size(), 2000u);
  int bad = 0;
  for (const auto& [x_bits, want] : enc) {
    const uint8_t got = llmc::e2m1_encode(float_of(x_bits));
    if (got != want && bad++ < 10)
      ADD_FAILURE() << llmc::strformat("e2m1 encode %08x (%a): got %x want %x", x_bits,
                                       static_cast<double>(float_of(x_bits)), got, want);
  }
  EXPECT_EQ(bad, 0) << bad << " of " << enc.size() << " vectors differ";
}

TEST(E2M1Encode, MatchesCudaSatfiniteConversionOnFp32Sweep) {
  // cuda_fp4.hpp's host path converts through FP64 with its own rounding code; NaN -> +6 (0x7) there and here.
  std::vector<uint32_t> inputs;
  for (uint64_t b = 0; b < (1ull << 32); b += 997) inputs.push_back(static_cast<uint32_t>(b));
  for (int code = 0; code < 16; code++) {
    const float v = llmc::e2m1_decode(static_cast<uint8_t>(code));
    for (int d = -3; d <= 3; d++) inputs.push_back(bits_of(v) + d);
  }
  for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 7.0f})  // the rounding thresholds and 6 + half an ulp
    for (float s : {1.0f, -1.0f})
      for (int d = -2; d <= 2; d++) inputs.push_back(bits_of(s * t) + d);
  size_t bad = 0;
  for (uint32_t b : inputs) {
    const float x = float_of(b);
    const uint8_t got = llmc::e2m1_encode(x);
    const uint8_t want = __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    if (got != want && bad++ < 10)
      ADD_FAILURE() << llmc::strformat("e2m1 encode %08x (%a): got %x, CUDA %x", b, static_cast<double>(x), got, want);
  }
  EXPECT_EQ(bad, 0u) << "over " << inputs.size() << " inputs";
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu})
    EXPECT_EQ(llmc::e2m1_encode(float_of(nan)), llmc::kE2M1NanCode) << std::hex << nan;
  // decode agrees with CUDA's exact conversion to half
  for (int c = 0; c < 16; c++)
    EXPECT_EQ(llmc::e2m1_decode(static_cast<uint8_t>(c)),
              __half2float(__half(__nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(c), __NV_E2M1))))
        << "code " << c;
}

TEST(E2M1Encode, HandComputedAnchorsAndPacking) {
  const float values[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; c++) {
    EXPECT_EQ(llmc::e2m1_decode(static_cast<uint8_t>(c)), values[c]);
    EXPECT_EQ(llmc::e2m1_decode(static_cast<uint8_t>(c | 8)), -values[c]);
    EXPECT_EQ(llmc::e2m1_encode(values[c]), c);
    EXPECT_EQ(llmc::e2m1_encode(-values[c]), c | 8);
  }
  // ties to even: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t tie_codes[] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; i++) {
    EXPECT_EQ(llmc::e2m1_encode(ties[i]), tie_codes[i]) << ties[i];
    EXPECT_EQ(llmc::e2m1_encode(std::nextafter(ties[i], 10.0f)), i + 1) << "just above " << ties[i];
    EXPECT_EQ(llmc::e2m1_encode(std::nextafter(ties[i], 0.0f)), i) << "just below " << ties[i];
  }
  EXPECT_EQ(llmc::e2m1_encode(6.9f), 0x7);
  EXPECT_EQ(llmc::e2m1_encode(-1e30f), 0xF);
  EXPECT_EQ(llmc::e2m1_encode(-INFINITY), 0xF);
  EXPECT_EQ(llmc::e2m1_encode(-0.0f), 0x8);
  EXPECT_EQ(llmc::e2m1_encode(-0.2f), 0x8);
  EXPECT_EQ(llmc::e2m1_pack(0x3, 0xC), 0xC3);  // element 0 in the low nibble
  EXPECT_EQ(llmc::e2m1_unpack(0xC3, 0), 0x3);
  EXPECT_EQ(llmc::e2m1_unpack(0xC3, 1), 0xC);
  // CUDA's packed pair conversion puts the first element (x) in the low nibble too
  EXPECT_EQ(__nv_cvt_float2_to_fp4x2(make_float2(1.5f, -4.0f), __NV_E2M1, cudaRoundNearest),
            llmc::e2m1_pack(llmc::e2m1_encode(1.5f), llmc::e2m1_encode(-4.0f)));
}

TEST(E8M0Vectors, DecodeAndEncodeMatchMlDtypes) {
  const auto& dec = section("decode e8m0");
  ASSERT_EQ(dec.size(), 256u);
  for (const auto& [code, want_bits] : dec) {
    const float got = llmc::e8m0_decode(static_cast<uint8_t>(code));
    if (code == llmc::kE8M0NanCode) EXPECT_TRUE(std::isnan(got));
    else EXPECT_EQ(bits_of(got), want_bits) << "code " << code;
  }
  const auto& enc = section("encode e8m0");
  ASSERT_GT(enc.size(), 2500u);
  int bad = 0;
  for (const auto& [x_bits, want] : enc) {
    const uint8_t got = llmc::e8m0_encode(float_of(x_bits));
    if (got != want && bad++ < 10)
      ADD_FAILURE() << llmc::strformat("e8m0 encode %08x (%a): got %02x want %02x", x_bits,
                                       static_cast<double>(float_of(x_bits)), got, want);
  }
  EXPECT_EQ(bad, 0) << bad << " of " << enc.size() << " vectors differ";
  EXPECT_EQ(llmc::e8m0_encode(NAN), llmc::kE8M0NanCode);
  EXPECT_EQ(llmc::e8m0_encode(std::ldexp(1.0f, -127)), 0);    // FP32 subnormal 2^-127: code 0
  EXPECT_EQ(llmc::e8m0_encode(std::ldexp(1.5f, -127)), 1);    // rounds up to 2^-126
  EXPECT_EQ(llmc::e8m0_decode(0), std::ldexp(1.0f, -127));
  for (int c = 0; c < 255; c++) EXPECT_EQ(llmc::e8m0_encode(llmc::e8m0_decode(static_cast<uint8_t>(c))), c);
}

// ---------------------------------------------------------------------------------------------------------------
// The element-format table
TEST(ElementFormats, NamesBitsAndMaxima) {
  for (ElementFormat f : llmc::kElementFormats) {
    ElementFormat parsed = f == ElementFormat::E4M3 ? ElementFormat::E5M2 : ElementFormat::E4M3;
    ASSERT_TRUE(llmc::parse_element_format(llmc::element_format_name(f), &parsed)) << llmc::element_format_name(f);
    EXPECT_EQ(parsed, f);
  }
  EXPECT_STREQ(llmc::element_format_name(ElementFormat::E4M3), "e4m3");
  EXPECT_STREQ(llmc::element_format_name(ElementFormat::E5M2), "e5m2");
  EXPECT_STREQ(llmc::element_format_name(ElementFormat::E2M1), "e2m1");
  EXPECT_EQ(llmc::element_format_bits(ElementFormat::E4M3), 8);
  EXPECT_EQ(llmc::element_format_bits(ElementFormat::E5M2), 8);
  EXPECT_EQ(llmc::element_format_bits(ElementFormat::E2M1), 4);  // two codes per byte
  for (const FormatCase& fc : kFormats) EXPECT_EQ(llmc::element_format_max(fc.format), fc.max) << fc.name;
  EXPECT_EQ(llmc::element_format_max(ElementFormat::E2M1), 6.0f);
  EXPECT_TRUE(llmc::is_fp8(ElementFormat::E4M3) && llmc::is_fp8(ElementFormat::E5M2));
  EXPECT_FALSE(llmc::is_fp8(ElementFormat::E2M1));
  // The values are stable: device code and the delayed-scaling format arrays store them as bytes.
  EXPECT_EQ(static_cast<int>(ElementFormat::E4M3), 0);
  EXPECT_EQ(static_cast<int>(ElementFormat::E5M2), 1);
  ElementFormat f = ElementFormat::E5M2;
  EXPECT_FALSE(llmc::parse_element_format("E4M3", &f));
  EXPECT_FALSE(llmc::parse_element_format("fp8", &f));
  EXPECT_EQ(f, ElementFormat::E5M2);  // untouched on failure
  // The FP8 codec refuses a format that is not FP8.
  EXPECT_THROW(llmc::fp8_encode(1.0f, ElementFormat::E2M1), llmc::Error);
  EXPECT_THROW(llmc::fp8_decode(0x01, ElementFormat::E2M1), llmc::Error);
}

}  // namespace
