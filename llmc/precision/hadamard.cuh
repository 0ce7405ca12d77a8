// llmc/precision/hadamard.cuh: the block Hadamard transforms that quantisers apply before rounding (compiled on the
// host and the device: the FP4 kernels, llmc/precision/fp4_quant.cu, and their references compute the same bits).
//
//   hadamard_transform<N>(v, signs): v[0 .. N) <- H_N · diag(s) · v, N = 16 or 32, where s_i = -1 when bit i of
//   `signs` is set (else +1; signs = 0 is the plain transform) and H_N is the normalised Sylvester (Walsh–Hadamard)
//   matrix, H_N[i][j] = (-1)^popcount(i & j) / sqrt(N). With random signs this is the random Hadamard transform (RHT)
//   of the NVFP4 recipe (N = 16: reference doc fp4_recipes.md §3, wgrad inputs) and Quartet's re-randomised rotation
//   (N = 32, §1). H_N · diag(s) is orthogonal: rotating both operands of a product along K leaves it unchanged.
//
// Arithmetic (FP32, every operation rounded to nearest even: llmc/core/float_rn.cuh): the signs are applied exactly
// (negation), then the butterflies h = 1, 2, 4, ..., N/2, each replacing (v[i], v[i + h]) for every i with bit h clear
// by (v[i] + v[i + h], v[i] - v[i + h]), then every element is multiplied by kHadamardNorm<N> (0.25 exactly for 16;
// for 32 the FP32 value nearest 1/sqrt(32)). test/precision/test_hadamard checks it against dense matrices.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "llmc/core/float_rn.cuh"

namespace llmc {

template <int N>
struct HadamardNorm;
template <>
struct HadamardNorm<16> {
  static constexpr float value = 0.25f;
};
template <>
struct HadamardNorm<32> {
  static constexpr float value = 0.17677669529663688f;  // 1 / sqrt(32), rounded to FP32
};

// Device code unrolls the loops completely, so that a caller's array stays in registers.
#ifdef __CUDA_ARCH__
#define LLMC_HADAMARD_UNROLL _Pragma("unroll")
#else
#define LLMC_HADAMARD_UNROLL
#endif

template <int N>
__host__ __device__ inline void hadamard_transform(float* v, uint32_t signs) {
  static_assert(N == 16 || N == 32, "block Hadamard transforms of size 16 or 32");
  LLMC_HADAMARD_UNROLL
  for (int i = 0; i < N; i++)
    if ((signs >> i) & 1u) v[i] = -v[i];
  LLMC_HADAMARD_UNROLL
  for (int h = 1; h < N; h *= 2) {
    LLMC_HADAMARD_UNROLL
    for (int i = 0; i < N; i++)
      if (!(i & h)) {
        const float a = v[i], b = v[i + h];
        v[i] = add_rn(a, b);
        v[i + h] = add_rn(a, -b);
      }
  }
  LLMC_HADAMARD_UNROLL
  for (int i = 0; i < N; i++) v[i] = mul_rn(v[i], HadamardNorm<N>::value);
}

// Runtime size: hadamard_transform<size> (size 16 or 32) over v[0 .. size).
__host__ __device__ inline void hadamard_transform_n(float* v, int size, uint32_t signs) {
  if (size == 16)
    hadamard_transform<16>(v, signs);
  else
    hadamard_transform<32>(v, signs);
}

#undef LLMC_HADAMARD_UNROLL

}  // namespace llmc
