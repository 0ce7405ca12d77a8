// llmc/core/float_rn.cuh: FP32 arithmetic that rounds the same way on the host and on the device, for the kernels
// whose results must equal their host references bit for bit (quantisers, the AdamW update). Each operation is
// correctly rounded to nearest even on both sides: on the device the __f*_rn intrinsics, which the compiler never
// contracts into fused multiply-adds (fma_rn is the one fused operation, asked for by name); on the host plain IEEE
// operations (no fast math on either side). Also the bit views of a float and floor_to_uint, an exact truncation.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

namespace llmc {

__host__ __device__ inline uint32_t float_to_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  return u;
}
__host__ __device__ inline float bits_to_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof(x));
  return x;
}

__host__ __device__ inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
__host__ __device__ inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ inline float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// a * b + c with one rounding (IEEE fusedMultiplyAdd).
__host__ __device__ inline float fma_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
// floor(a) as an unsigned integer, for a in [0, 2^32).
__host__ __device__ inline uint32_t floor_to_uint(float a) {
#ifdef __CUDA_ARCH__
  return __float2uint_rz(a);
#else
  return static_cast<uint32_t>(a);
#endif
}

__host__ __device__ inline float sqrt_rn(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace llmc
