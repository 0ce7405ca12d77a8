// llmc/core/dtypes.h: the element formats of quantised tensors (ElementFormat: name, bits per code, largest finite
// value), and host reference encode / decode of the number formats llm8 stores: BF16, FP8 E4M3 (OCP "e4m3fn": no
// infinities, one NaN code per sign, max 448), FP8 E5M2 (IEEE-like, max 57344), FP4 E2M1 (OCP "e2m1fn": no infinities,
// no NaN, max 6; packed two codes per byte) and the E8M0 scale format (OCP "e8m0fnu": an unsigned power of two
// 2^(code - 127), 0xFF the NaN, no zero). Round to nearest, ties to even; encoding saturates finite overflow and
// +-inf to +-max (as CUDA's __NV_SATFINITE conversion does), subnormals are kept, NaN stays NaN where the format has
// one. These are the references every GPU quantisation kernel is tested against bit for bit, and they are
// themselves tested against ml_dtypes (test/core/test_dtypes.cpp, vectors from test/core/data/).
#pragma once

#include <cstdint>

#include <string>

namespace llmc {

// The format of one element code of a quantised tensor. The values are stable (device code and the delayed-scaling
// format arrays store them as uint8_t). E2M1 (OCP FP4: 1 sign, 2 exponent, 1 mantissa bit, max 6, no inf / NaN) is
// packed two codes per byte, the element of the lower column in the low nibble (e2m1_pack below).
enum class ElementFormat : uint8_t { E4M3 = 0, E5M2 = 1, E2M1 = 2 };
constexpr ElementFormat kElementFormats[] = {ElementFormat::E4M3, ElementFormat::E5M2, ElementFormat::E2M1};
constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
constexpr float kE2M1Max = 6.0f;
const char* element_format_name(ElementFormat f);          // "e4m3" | "e5m2" | "e2m1"
bool parse_element_format(const std::string& s, ElementFormat* out);  // false (out untouched) for an unknown name
int element_format_bits(ElementFormat f);                  // bits of one code: 8, 8, 4
float element_format_max(ElementFormat f);                 // the largest finite value: 448, 57344, 6
inline bool is_fp8(ElementFormat f) { return f == ElementFormat::E4M3 || f == ElementFormat::E5M2; }

// The code every NaN encodes to, in both formats and whatever the sign and payload of the NaN: 0x7F (E4M3: e4m3fn's
// NaN S.1111.111; E5M2: the quiet NaN 0.11111.11). This is what CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)
// gives (cuda_fp8.hpp canonicalises a NaN input to 0x7FFFFFFF, dropping its sign, before converting; for E5M2 it
// keeps the two top mantissa bits of that canonical NaN: 0x7C | 0x3). ml_dtypes differs here (it keeps the sign and
// gives 0x7E for E5M2), which is why the ml_dtypes vectors hold no NaN encodes; test/precision/test_quant checks the device
// conversion against this.
constexpr uint8_t kFp8NanCode = 0x7F;

// FP8 code of x (f an FP8 format, else llmc::Error; saturating, round to nearest even): finite overflow and +-inf ->
// +-max (0x7E / 0x7B with x's sign), NaN -> kFp8NanCode, values at or below half the smallest subnormal -> +-0 (x's
// sign).
uint8_t fp8_encode(float x, ElementFormat f);
// The exact value of an FP8 code (NaN codes -> NaN; E5M2 +-inf codes -> +-inf).
float fp8_decode(uint8_t code, ElementFormat f);

// FP4 E2M1 code of x in the low 4 bits (S.EE.M; round to nearest even, saturating): the values +-{0, 0.5, 1, 1.5, 2,
// 3, 4, 6}; |x| > 6 and +-inf -> +-6, |x| <= 0.25 -> +-0 (x's sign). E2M1 has no NaN: a NaN encodes to kE2M1NanCode,
// +6, as CUDA's __nv_cvt_float_to_fp4 (cuda_fp4.hpp) does; the quantisers never rely on it (a block holding a NaN gets
// a NaN scale, llmc/precision/fp4_codec.cuh). ml_dtypes gives +-0 there, so the vectors hold no NaN encodes.
constexpr uint8_t kE2M1NanCode = 0x7;
uint8_t e2m1_encode(float x);
float e2m1_decode(uint8_t code);  // the exact value of the low 4 bits of code
// Two E2M1 codes in one byte: the element with the even index (the lower column) in the low nibble, as the packed
// FP4 layouts of CUDA (__nv_fp4x2_storage_t: the first element of a float2 in bits 0..3) and cuBLASLt use.
inline uint8_t e2m1_pack(uint8_t even, uint8_t odd) { return static_cast<uint8_t>((even & 0xFu) | ((odd & 0xFu) << 4)); }
inline uint8_t e2m1_unpack(uint8_t byte, int index) { return static_cast<uint8_t>((byte >> (4 * (index & 1))) & 0xFu); }

// E8M0 (unsigned, exponent only, bias 127): decode is 2^(code - 127) for codes 0..254 and NaN for 0xFF. Encode rounds
// a positive normal FP32 to the nearest power of two in the linear domain with halfway cases rounded up (a mantissa of
// at least 0.5 goes to the next exponent: ml_dtypes' float8_e8m0fnu cast); above 2^127 it gives 0xFF (E8M0 has no
// larger value and ml_dtypes does not saturate); zero, negative values, NaN and +-inf give 0xFF (no zero, no sign);
// positive FP32 subnormals (below 2^-126) give 0 (2^-127) below 1.5 * 2^-127 and 1 (2^-126) from there (ml_dtypes
// differs inside that range, which the quantisers never produce: their scales are exact powers of two, encoded from
// the exponent).
constexpr uint8_t kE8M0NanCode = 0xFF;
constexpr int kE8M0Bias = 127;
uint8_t e8m0_encode(float x);
float e8m0_decode(uint8_t code);

// bf16 bits of x (round to nearest even, NaN stays NaN) and back.
uint16_t bf16_encode(float x);
float bf16_decode(uint16_t bits);

// Power of two at or below x (x > 0 finite, else llmc::Error): the value with x's exponent and a zero mantissa. Used
// for power-of-two scales ("floor"), exactly as zeroing the mantissa bits of an FP32 scale (for a normal x; a
// subnormal x gives its highest set bit, though scales are clamped to >= 2^-126 and never get there).
float pow2_floor(float x);

}  // namespace llmc
