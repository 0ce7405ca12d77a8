// llmc/dtypes: host reference encode / decode of the number formats llm8 stores: BF16, FP8 E4M3 (OCP "e4m3fn": no
// infinities, one NaN code per sign, max 448) and FP8 E5M2 (IEEE-like, max 57344). Round to nearest, ties to even;
// encoding saturates finite overflow and +-inf to +-max (as CUDA's __NV_SATFINITE conversion does), subnormals are
// kept, NaN stays NaN. These are the references every GPU quantisation kernel is tested against bit for bit, and
// they are themselves tested against ml_dtypes (test/cpu/test_dtypes.cpp, vectors from test/cpu/data/).
#pragma once

#include <cstdint>

#include "llmc/tensor.h"

namespace llmc {

// FP8 code of x (saturating, round to nearest even). NaN -> 0x7F (E4M3) / 0x7E (E5M2) with the sign of x.
uint8_t fp8_encode(float x, Fp8Format f);
// The exact value of an FP8 code (NaN codes -> NaN; E5M2 +-inf codes -> +-inf).
float fp8_decode(uint8_t code, Fp8Format f);

// bf16 bits of x (round to nearest even, NaN stays NaN) and back.
uint16_t bf16_encode(float x);
float bf16_decode(uint16_t bits);

// Power of two at or below x (x > 0 finite): the value with x's exponent and a zero mantissa. Used for
// power-of-two scales ("floor"), exactly as zeroing the mantissa bits of an FP32 scale.
float pow2_floor(float x);

}  // namespace llmc
