// llmc/kernels/fp8_groups.cuh: the device side of the FP8 1x16 group copies of llmc/kernels/fp8_groups.h: the cast
// of a 16-value group held by a pair of lanes (the producers' and the standalone quantiser's one copy of it), and the
// input loaders over which the backward kernels are templated (BF16: the tensor itself; FP8 groups: its dequantised
// copy), read directly or staged through shared memory with cp.async.
// Bit-exact with the CPU reference (test/reference/group_quant_ref.cpp): the amax is a max over bits, the scales are
// fp8_group_scales' correctly rounded divisions, x * q and code * d are __fmul_rn, and the conversion is
// cvt.rn.satfinite, which the host fp8_encode reproduces.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/core/float_rn.cuh"
#include "llmc/kernels/fp8_groups.h"
#include "llmc/kernels/mma_ptx.cuh"

namespace llmc {

// The E4M3 value of a code (exact: every E4M3 value is an FP16 value).
__device__ inline float e4m3_value(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

// One lane's half of a 16-value group cast: its 8 codes (w.x: the lower address in the low byte) and the group's
// amax and dequant scale d.
struct Fp8GroupCast8 {
  uint2 codes;
  float amax, d;
};

// Casts this thread's 8 values x (columns c .. c + 7 of a row, c % 8 == 0). A group's 16 values are held by the two
// lanes 2k (c % 16 == 0) and 2k + 1 (c + 8) of one warp, which call this together: their amaxes meet in a shuffle
// between those two lanes only.
__device__ inline Fp8GroupCast8 fp8_groups_cast8(const x128& x) {
  unsigned m = 0;
#pragma unroll
  for (int k = 0; k < 8; k++) m = max(m, amax_bits(fabsf(__bfloat162float(x[k]))));
  const unsigned lane = threadIdx.x % kWarpSize;
  m = max(m, __shfl_xor_sync(3u << (lane & ~1u), m, 1));
  Fp8GroupCast8 g;
  g.amax = __uint_as_float(m);
  float q;
  fp8_group_scales(g.amax, &g.d, &q);
  uint32_t words[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(
        make_float2(mul_rn(__bfloat162float(x[4 * h]), q), mul_rn(__bfloat162float(x[4 * h + 1]), q)), __NV_SATFINITE,
        __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(
        make_float2(mul_rn(__bfloat162float(x[4 * h + 2]), q), mul_rn(__bfloat162float(x[4 * h + 3]), q)),
        __NV_SATFINITE, __NV_E4M3);
    words[h] = lo | (hi << 16);
  }
  g.codes = make_uint2(words[0], words[1]);
  return g;
}

// Stores a cast (row `row`, columns c .. c + 7 of a (rows, cols) tensor) into `out`: the even lane of the pair writes
// the group's scale (and, for the last row, the padding entries of its column of scales).
__device__ inline void fp8_groups_store8(const Fp8GroupsOut& out, const Fp8GroupCast8& g, int row, int c, int rows,
                                         int cols) {
  *reinterpret_cast<uint2*>(out.codes + static_cast<size_t>(row) * cols + c) = g.codes;
  if (c % kFp8GroupSize == 0) {
    const int ld = fp8_groups_ld(rows);
    const size_t column = static_cast<size_t>(c / kFp8GroupSize) * ld;
    out.scale_inv[column + row] = g.d;
    if (out.group_amax) out.group_amax[column + row] = g.amax;
    if (row == rows - 1)
      for (int r = rows; r < ld; r++) {
        out.scale_inv[column + r] = 1.0f;
        if (out.group_amax) out.group_amax[column + r] = 0.0f;
      }
  }
}

// Quantises this thread's 8 values x into `out` (fp8_groups_cast8, then fp8_groups_store8; the pair of lanes calls it
// together).
__device__ inline void fp8_groups_store8(const Fp8GroupsOut& out, const x128& x, int row, int c, int rows, int cols) {
  fp8_groups_store8(out, fp8_groups_cast8(x), row, c, rows, cols);
}

// The 8 values of 8 codes (w: the lower address in the low byte) times the group's dequant scale d.
__device__ inline void fp8_groups_decode8(float (&v)[8], uint2 w, float d) {
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const uint32_t word = k < 4 ? w.x : w.y;
    v[k] = mul_rn(e4m3_value(static_cast<uint8_t>(word >> (8 * (k % 4)))), d);
  }
}

// The input loaders of the backward kernels: load8 / load8cs (streaming) give the 8 values of row `row`, columns
// c .. c + 7 as FP32, `at` = row * cols + c being their element index. kGroups: whether the values come from an FP8
// copy (which needs row and c, and cols a multiple of 16).
// Staged reads, for kernels that pipeline rows through shared memory: stage8_async(slot, at, row, c) starts the
// cp.async copies of what those 8 values are made of into a 16-byte shared slot (part of the caller's current commit
// group); once that group has landed, unstage8(slot) reads the slot into registers (Staged) and value(s, k) is value k
// as FP32, the same value load8 gives.
struct Bf16Loader {
  static constexpr bool kGroups = false;
  const bf16* x;  // (rows, cols)
  __device__ void load8(float (&v)[8], size_t at, int, int) const {
    const x128 p = load128(x + at);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = __bfloat162float(p[k]);
  }
  __device__ void load8cs(float (&v)[8], size_t at, int, int) const {
    const x128 p = load128cs(x + at);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = __bfloat162float(p[k]);
  }
  __device__ float load1(size_t at) const { return __bfloat162float(x[at]); }
  using Staged = x128;  // the 8 bf16 as stored, converted where used
  __device__ void stage8_async(uint32_t slot, size_t at, int, int) const { ptx::cp_async_16(slot, x + at, true); }
  __device__ static Staged unstage8(const void* slot) { return *static_cast<const x128*>(slot); }
  __device__ static float value(const Staged& s, int k) { return __bfloat162float(s[k]); }
};

struct Fp8GroupsLoader {
  static constexpr bool kGroups = true;
  const uint8_t* codes;    // (rows, cols)
  const float* scale_inv;  // (cols / 16, ld)
  int ld;                  // fp8_groups_ld(rows)
  __device__ float scale(int row, int c) const {
    return scale_inv[static_cast<size_t>(c / kFp8GroupSize) * ld + row];
  }
  __device__ void load8(float (&v)[8], size_t at, int row, int c) const {
    fp8_groups_decode8(v, *reinterpret_cast<const uint2*>(codes + at), scale(row, c));
  }
  __device__ void load8cs(float (&v)[8], size_t at, int row, int c) const {
    fp8_groups_decode8(v, __ldcs(reinterpret_cast<const uint2*>(codes + at)), scale(row, c));
  }
  struct Staged {  // the 8 values, decoded once
    float v[8];
  };
  // slot bytes 0..7: the codes; 8..11: the group's scale_inv
  __device__ void stage8_async(uint32_t slot, size_t at, int row, int c) const {
    ptx::cp_async_8(slot, codes + at, true);
    ptx::cp_async_4(slot + 8, scale_inv + static_cast<size_t>(c / kFp8GroupSize) * ld + row, true);
  }
  __device__ static Staged unstage8(const void* slot) {
    Staged s;
    fp8_groups_decode8(s.v, *static_cast<const uint2*>(slot), static_cast<const float*>(slot)[2]);
    return s;
  }
  __device__ static float value(const Staged& s, int k) { return s.v[k]; }
};

// Host checks of a copy's pointers and width, naming the kernel and the argument.
inline void require_fp8_groups(const char* kernel, const char* name, const void* codes, const void* scale_inv,
                               int cols) {
  if (cols % kFp8GroupSize != 0)
    throw_error("%s: %s: %d channels is not a multiple of %d, the FP8 copy's group size (keep this tensor in BF16)",
                kernel, name, cols, kFp8GroupSize);
  if (!codes || !scale_inv)
    throw_error("%s: %s: the FP8 copy needs both codes and scale_inv (device pointers; got %p, %p)", kernel, name,
                codes, scale_inv);
  require_aligned16(kernel, name, codes);
  if (!is_aligned(scale_inv, sizeof(float)))
    throw_error("%s: %s: scale_inv %p is not 4-byte aligned", kernel, name, scale_inv);
}

inline Fp8GroupsLoader fp8_groups_loader(const Fp8Groups& g, int rows) {
  return Fp8GroupsLoader{g.codes, g.scale_inv, fp8_groups_ld(rows)};
}

}  // namespace llmc
