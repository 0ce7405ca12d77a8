// llmc/core/cuda_utils.cuh: device helpers shared by the handwritten kernels: 128-bit packed loads/stores (8 bf16 or 4 float
// per access), warp and block reductions that combine values in a fixed order (so results are bit-reproducible),
// and host-side shape/alignment checks with clear errors.
// Only .cu files include this header.
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/core/common.h"

namespace llmc {

using bf16 = __nv_bfloat16;

constexpr int kWarpSize = 32;

// ---------------------------------------------------------------------------------------------------------------
// Packed128: 16 bytes of T, loaded and stored with one 128-bit instruction. x128 = 8 bf16, f128 = 4 float.
template <class T>
struct alignas(16) Packed128 {
  static constexpr int size = 16 / sizeof(T);
  T v[size];
  __device__ T& operator[](int i) { return v[i]; }
  __device__ const T& operator[](int i) const { return v[i]; }
  __device__ static Packed128 filled(float value) {
    Packed128 p;
#pragma unroll
    for (int k = 0; k < size; k++) p.v[k] = T(value);
    return p;
  }
};
using x128 = Packed128<bf16>;
using f128 = Packed128<float>;

// Plain 128-bit load / store (p must be 16-byte aligned).
template <class T>
__device__ inline Packed128<T> load128(const T* p) {
  return *reinterpret_cast<const Packed128<T>*>(p);
}
template <class T>
__device__ inline void store128(T* p, const Packed128<T>& value) {
  *reinterpret_cast<Packed128<T>*>(p) = value;
}
// Streaming variants (cache hint "evict first") for data touched once.
template <class T>
__device__ inline Packed128<T> load128cs(const T* p) {
  int4 bits = __ldcs(reinterpret_cast<const int4*>(p));
  Packed128<T> result;
  memcpy(&result, &bits, sizeof(bits));
  return result;
}
template <class T>
__device__ inline void store128cs(T* p, const Packed128<T>& value) {
  int4 bits;
  memcpy(&bits, &value, sizeof(bits));
  __stcs(reinterpret_cast<int4*>(p), bits);
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions. The xor butterfly gives every lane the same bits (each step adds the same two values, and float
// addition is commutative), so results depend only on the launch shape, never on scheduling.
template <class T>
__device__ inline T warp_sum(T x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ inline float warp_max(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// Fixed order: butterfly inside each warp, then the per-warp sums in warp order. Safe to call repeatedly.
template <class T>
__device__ inline T block_sum(T x) {
  __shared__ T warp_sums[kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  x = warp_sum(x);
  __syncthreads();  // a previous call may still be reading warp_sums
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  x = lane < num_warps ? warp_sums[lane] : T(0);
  return warp_sum(x);
}

// ---------------------------------------------------------------------------------------------------------------
// amax (max |x|) for FP8 scaling, reported by the kernels that produce a tensor. |x| is non-negative, and
// non-negative floats order exactly like their bit patterns as unsigned integers, so the max is taken on the bits:
// exact, independent of the order of the atomics (deterministic), and NaN-propagating (a NaN's bits exceed +inf's),
// so a non-finite tensor is seen. The caller zeroes the float slot before the producer runs.
//   unsigned m = amax_bits(fabsf(v)); ... m = max(m, amax_bits(...)); m = warp_max_bits(m);
//   if (lane == 0) atomic_max_amax(amax, m);      (or reduce over the block first and issue one atomic per block)
__device__ inline unsigned amax_bits(float abs_value) { return __float_as_uint(abs_value); }
__device__ inline unsigned warp_max_bits(unsigned bits) { return __reduce_max_sync(0xffffffffu, bits); }
__device__ inline void atomic_max_amax(float* amax, unsigned bits) {
  atomicMax(reinterpret_cast<unsigned int*>(amax), bits);
}
// One atomic per block: the max of every thread's `bits` over a 1-D block (blockDim.x a multiple of 32), issued by
// thread 0. Every thread of the block must call it (it synchronises the block), at most once per kernel.
__device__ inline void block_atomic_max_amax(float* amax, unsigned bits) {
  __shared__ unsigned warp_bits[kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  bits = warp_max_bits(bits);
  if (lane == 0) warp_bits[warp] = bits;
  __syncthreads();
  if (warp == 0) {
    bits = warp_max_bits(lane < static_cast<int>(blockDim.x / kWarpSize) ? warp_bits[lane] : 0u);
    if (lane == 0) atomic_max_amax(amax, bits);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Host-side checks, each naming the kernel and the argument.
inline bool is_aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline void require_multiple_of_8(const char* kernel, const char* name, long long value) {
  if (value <= 0 || value % 8 != 0)
    throw_error("%s: %s = %lld must be a positive multiple of 8 (the kernels move 8 bf16 per 128-bit access; "
                "pad the dimension to a multiple of 8)",
                kernel, name, value);
}
inline void require_aligned16(const char* kernel, const char* name, const void* p) {
  if (!is_aligned(p, 16))
    throw_error("%s: pointer %s = %p is not 16-byte aligned (128-bit loads need it; allocate with cudaMalloc and "
                "offset by multiples of 8 bf16 / 4 floats)",
                kernel, name, p);
}

}  // namespace llmc
