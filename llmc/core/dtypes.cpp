// llmc/core/dtypes.cpp: the element-format table, and host reference encode / decode of BF16, FP8 E4M3 (OCP e4m3fn),
// FP8 E5M2, FP4 E2M1 (OCP e2m1fn) and E8M0 (OCP e8m0fnu), written from the bit-level definitions of the formats
// (never through the CUDA conversion, which the tests use as an independent cross-check).
//
// Minifloat encoding (FP8 and E2M1), for a format with M mantissa bits, exponent bias B and smallest normal exponent
// emin = 1 - B:
//   |x| = s * 2^(E - 23) with s the 24-bit FP32 significand (implicit 1) and E its unbiased exponent. The quantum of
//   the target at that magnitude is 2^q, q = max(E, emin) - M (normal binades have M bits after the point, the
//   subnormal range has the fixed quantum 2^(emin - M)). n = |x| / 2^q rounded to nearest, ties to even, is the
//   number of quanta; the code is n in the subnormal range (n = 2^M is then exactly the smallest normal's code) and
//   ((E + B - 1) << M) + n in a normal binade (n = 2^(M+1) after rounding carries into the exponent field).
//   Codes above the largest finite one saturate to it: this is round-to-nearest-even in an unbounded exponent range
//   followed by clamping, which is what __NV_SATFINITE does (E4M3: 464 = 448 + half an ulp ties to 448; E5M2:
//   61440 ties to 65536 and clamps to 57344; E2M1 (M = 1, B = 1): 7 ties to 8 and clamps to 6).
#include "llmc/core/dtypes.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "llmc/core/common.h"

namespace llmc {

namespace {

struct ElementFormatInfo {
  const char* name;
  int bits;
  float max;
};

ElementFormatInfo element_format_info(ElementFormat f) {
  switch (f) {
    case ElementFormat::E4M3: return {"e4m3", 8, kE4M3Max};
    case ElementFormat::E5M2: return {"e5m2", 8, kE5M2Max};
    case ElementFormat::E2M1: return {"e2m1", 4, kE2M1Max};
  }
  throw_error("unknown ElementFormat %d", static_cast<int>(f));
}

}  // namespace

const char* element_format_name(ElementFormat f) { return element_format_info(f).name; }
int element_format_bits(ElementFormat f) { return element_format_info(f).bits; }
float element_format_max(ElementFormat f) { return element_format_info(f).max; }

bool parse_element_format(const std::string& s, ElementFormat* out) {
  return find_by_name(s, kElementFormats, element_format_name, out);
}

namespace {

uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

struct MinifloatParams {
  int mantissa_bits;    // M
  int bias;             // B
  uint32_t max_code;    // largest finite magnitude code: 0x7E (448) / 0x7B (57344) / 0x7 (6)
  int sign_shift;       // position of the sign bit: 7 (FP8) / 3 (E2M1)
  uint32_t nan_code;    // what a NaN encodes to
};

MinifloatParams fp8_params(ElementFormat f) {
  switch (f) {
    case ElementFormat::E4M3: return {3, 7, 0x7Eu, 7, kFp8NanCode};
    case ElementFormat::E5M2: return {2, 15, 0x7Bu, 7, kFp8NanCode};
    case ElementFormat::E2M1: break;
  }
  throw_error("fp8_encode / fp8_decode: element format %d is not an FP8 format", static_cast<int>(f));
}

constexpr MinifloatParams kE2M1Params{1, 1, 0x7u, 3, kE2M1NanCode};

uint8_t minifloat_encode(float x, const MinifloatParams& p) {
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 31) << p.sign_shift;
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint8_t>(p.nan_code);  // NaN (any sign, any payload), as CUDA
  if (abs_bits == 0x7f800000u) return static_cast<uint8_t>(sign | p.max_code);  // +-inf saturates
  const int exponent_field = static_cast<int>(abs_bits >> 23);
  // FP32 zeros and subnormals (< 2^-126) are far below half the smallest FP8 subnormal: they round to +-0.
  if (exponent_field == 0) return static_cast<uint8_t>(sign);
  const uint32_t significand = (abs_bits & 0x7fffffu) | 0x800000u;  // s, 24 bits
  const int E = exponent_field - 127;
  const int emin = 1 - p.bias;
  const int q = (E > emin ? E : emin) - p.mantissa_bits;
  const int shift = q - (E - 23);  // |x| / 2^q = s / 2^shift; shift >= 23 - M >= 20
  if (shift > 24) return static_cast<uint8_t>(sign);  // |x| < 2^q / 2: rounds to zero
  uint32_t n = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (n & 1u))) n++;
  uint32_t code = E < emin ? n : (static_cast<uint32_t>(E + p.bias - 1) << p.mantissa_bits) + n;
  if (code > p.max_code) code = p.max_code;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace

uint8_t fp8_encode(float x, ElementFormat f) { return minifloat_encode(x, fp8_params(f)); }

uint8_t e2m1_encode(float x) { return minifloat_encode(x, kE2M1Params); }

float e2m1_decode(uint8_t code) {
  const int magnitude = code & 0x7;
  const int exponent_field = magnitude >> 1, mantissa = magnitude & 1;
  // exponent field 0: the subnormal 0 or 0.5 (m * 2^-1); else (2 + m) * 2^(e - 2)
  const float value = exponent_field == 0 ? std::ldexp(static_cast<float>(mantissa), -1)
                                          : std::ldexp(static_cast<float>(2 + mantissa), exponent_field - 2);
  return (code & 0x8) ? -value : value;
}

uint8_t e8m0_encode(float x) {
  const uint32_t bits = float_bits(x);
  if (!(x > 0.0f) || bits >= 0x7f800000u) return kE8M0NanCode;  // zero, negative, NaN, +inf
  const uint32_t exponent_field = bits >> 23;
  if (exponent_field == 0) return x < std::ldexp(1.5f, -127) ? 0 : 1;  // FP32 subnormal: 2^-127 or 2^-126
  // normal: 2^(e - 127) * 1.m; the code of 2^(e - 127) is e, one more when the mantissa is at least one half
  const uint32_t code = exponent_field + ((bits >> 22) & 1u);
  return code > 254u ? kE8M0NanCode : static_cast<uint8_t>(code);
}

float e8m0_decode(uint8_t code) {
  if (code == kE8M0NanCode) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - kE8M0Bias);
}

float fp8_decode(uint8_t code, ElementFormat f) {
  const MinifloatParams p = fp8_params(f);
  const bool negative = (code & 0x80u) != 0;
  const int magnitude = code & 0x7f;
  const int exponent_field = magnitude >> p.mantissa_bits;
  const int mantissa = magnitude & ((1 << p.mantissa_bits) - 1);
  float value;
  if (f == ElementFormat::E4M3 && magnitude == 0x7f) {
    value = std::numeric_limits<float>::quiet_NaN();  // e4m3fn: S.1111.111 is the only NaN, no infinities
  } else if (f == ElementFormat::E5M2 && exponent_field == 31) {
    value = mantissa == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (exponent_field == 0) {
    value = std::ldexp(static_cast<float>(mantissa), 1 - p.bias - p.mantissa_bits);  // subnormal
  } else {
    value = std::ldexp(static_cast<float>((1 << p.mantissa_bits) + mantissa), exponent_field - p.bias - p.mantissa_bits);
  }
  return negative ? -value : value;
}

uint16_t bf16_encode(float x) {
  uint32_t bits = float_bits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even (overflow carries into inf, as it should)
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_decode(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

float pow2_floor(float x) {
  if (!(x > 0.0f) || !std::isfinite(x))
    throw_error("pow2_floor: x = %g must be positive and finite", static_cast<double>(x));
  const uint32_t bits = float_bits(x);
  if (bits >= 0x00800000u) return bits_float(bits & 0x7f800000u);  // normal: keep the exponent, zero the mantissa
  uint32_t top = 0x00400000u;                                       // subnormal: its highest set bit
  while (!(bits & top)) top >>= 1;
  return bits_float(top);
}

}  // namespace llmc
