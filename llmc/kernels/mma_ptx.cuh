// llmc/kernels/mma_ptx.cuh: thin inline-PTX wrappers shared by the tensor-core kernels (llmc/kernels/attention.cu with mma.sync,
// llmc/kernels/attention_sm90.cu with wgmma): asynchronous global->shared copies, ldmatrix, the m16n8k16 BF16 MMA, and the
// register-fragment helpers both use. Each wrapper is one instruction; the comments give its operand layout.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace llmc {
namespace ptx {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous global->shared copy to the shared address `smem`; when `valid` is false nothing is read and the
// 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_16(bf16* smem, const bf16* gmem, bool valid) {
  cp_async_16(smem_address(smem), gmem, valid);
}
// 8-byte asynchronous global->shared copy (both addresses 8-byte aligned; zero-filled when `valid` is false).
__device__ __forceinline__ void cp_async_8(uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
// 4-byte asynchronous global->shared copy (zero-filled when `valid` is false).
__device__ __forceinline__ void cp_async_4(uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `kPending` of the most recently committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives matrix i
// (lane l holds row l/4, columns 2*(l%4), 2*(l%4)+1). The .trans form delivers each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// c (16x8 fp32) += a (16x16 bf16, row-major fragment) * b (16x8 bf16, column fragment).
// Fragment layouts (also those of one warp's 16 rows in a wgmma): lane l, g = l/4, q = l%4:
//   a[0] = A[g][2q..2q+1], a[1] = A[g+8][2q..2q+1], a[2] = A[g][2q+8..2q+9], a[3] = A[g+8][2q+8..2q+9]
//   c[0], c[1] = C[g][2q], C[g][2q+1]; c[2], c[3] = C[g+8][2q], C[g+8][2q+1]
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}

// An A fragment (16 rows x 16 columns, bf16) from two fp32 accumulator tiles of 8 columns each (`lo` = columns 0-7,
// `hi` = columns 8-15, each in the c[] layout above): how a product's result becomes the next product's A operand.
__device__ __forceinline__ void accumulators_to_a_fragment(uint32_t (&a)[4], const float (&lo)[4],
                                                           const float (&hi)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}

// 2^x with one MUFU instruction, subnormal results flushed to 0 (exp2f adds range fix-ups around the same instruction).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Max / sum over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace ptx
}  // namespace llmc
