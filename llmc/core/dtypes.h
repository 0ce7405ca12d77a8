// llmc/core/dtypes.h: the element formats of quantised tensors (ElementFormat: name, bits per code, largest finite
// value), and host reference encode / decode of the number formats llm8 stores: BF16, FP8 E4M3 (OCP "e4m3fn": no
// infinities, one NaN code per sign, max 448) and FP8 E5M2 (IEEE-like, max 57344). Round to nearest, ties to even;
// encoding saturates finite overflow and +-inf to +-max (as CUDA's __NV_SATFINITE conversion does), subnormals are
// kept, NaN stays NaN. These are the references every GPU quantisation kernel is tested against bit for bit, and
// they are themselves tested against ml_dtypes (test/core/test_dtypes.cpp, vectors from test/core/data/).
#pragma once

#include <cstdint>

#include <string>

namespace llmc {

// The format of one element code of a quantised tensor. The values are stable (device code and the delayed-scaling
// format arrays store them as uint8_t). E2M1 (OCP FP4: 1 sign, 2 exponent, 1 mantissa bit, max 6, no inf / NaN) is
// packed two codes per byte, the element of the lower column in the low nibble; its host encode / decode come with
// its quantiser.
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

// bf16 bits of x (round to nearest even, NaN stays NaN) and back.
uint16_t bf16_encode(float x);
float bf16_decode(uint16_t bits);

// Power of two at or below x (x > 0 finite, else llmc::Error): the value with x's exponent and a zero mantissa. Used
// for power-of-two scales ("floor"), exactly as zeroing the mantissa bits of an FP32 scale (for a normal x; a
// subnormal x gives its highest set bit, though scales are clamped to >= 2^-126 and never get there).
float pow2_floor(float x);

}  // namespace llmc
