// llmc/core/float_rn.cuh: FP32 arithmetic that rounds the same way on the host and on the device, for the kernels
// whose results must equal their host references bit for bit (quantisers, the AdamW update). Each operation is
// correctly rounded to nearest even on both sides: on the device the __f*_rn intrinsics, which the compiler never
// contracts into fused multiply-adds; on the host plain IEEE operations (no fast math on either side). Also the bit
// views of a float.
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

__host__ __device__ inline float sqrt_rn(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace llmc
