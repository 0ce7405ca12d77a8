// llmc/optim/moment_storage.cuh: the moment storages the AdamW update kernel (llmc/optim/adamw_update.cu), its CPU
// reference (test/reference/optim_ref.h) and the host codecs (llmc/optim/state_format.cpp) are templated on, one type
// per StateFormat (llmc/optim/state_format.h). A storage names the code type of m and v, decodes a code to the FP32
// value the update reads and encodes the updated FP32 value back; the update arithmetic between the two is
// llmc/optim/adamw_math.cuh for every storage.
//
// Element-wise storages (Fp32Moments, Bf16Moments): decode(code), encode(x).
// Grouped storages (Fp8Moments, Fp8ExpandMoments; groups of kMomentGroupSize elements): a Group holds a group's
// metadata (load / store: kScalesPerGroup floats); fit(stats) computes it from the group's values, then
// encode(x, group) / decode(code, group) convert one element. Every operation is correctly rounded on both sides
// (llmc/core/float_rn.cuh, IEEE sqrtf) and the powers are log2_rn / exp2_rn below, written out from + - * / and bit
// operations, so the host and the device give the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"
#include "llmc/optim/state_format.h"

namespace llmc {

// FP32 moments: the codes are the values.
struct Fp32Moments {
  using Code = float;
  static constexpr StateFormat::Id kFormat = StateFormat::Id::FP32;
  __host__ __device__ static float decode(Code c) { return c; }
  __host__ __device__ static Code encode(float x) { return x; }
};

// BF16 moments: exact widening on load, round to nearest even on store.
struct Bf16Moments {
  using Code = __nv_bfloat16;
  static constexpr StateFormat::Id kFormat = StateFormat::Id::BF16;
  __host__ __device__ static float decode(Code c) { return __bfloat162float(c); }
  __host__ __device__ static Code encode(float x) { return __float2bfloat16_rn(x); }
};

// ------------------------------------------------------------------------------------------------------------------
// Helpers of the grouped storages

// E4M3 code of x: saturating, round to nearest even (the device's cvt.rn.satfinite; on the host llmc/core/dtypes'
// reference, which is tested against it and against ml_dtypes).
__host__ __device__ inline uint8_t e4m3_encode(float x) {
#ifdef __CUDA_ARCH__
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
#else
  return fp8_encode(x, ElementFormat::E4M3);
#endif
}
// The exact value of an E4M3 code.
__host__ __device__ inline float e4m3_decode(uint8_t code) {
#ifdef __CUDA_ARCH__
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
#else
  return fp8_decode(code, ElementFormat::E4M3);
#endif
}

// log2(x) for finite x > 0 (subnormals included): x = 2^e * f with f in [sqrt(1/2), sqrt(2)], t = (f - 1) / (f + 1),
// log2 f = (2 / ln 2) * atanh(t) by its series to t^11 (|t| <= 0.172: truncation below 4e-10). About 1e-7 absolute.
__host__ __device__ inline float log2_rn(float x) {
  int e = 0;
  if ((float_to_bits(x) & 0x7f800000u) == 0) {  // subnormal: exact scaling by 2^23
    x = mul_rn(x, 8388608.0f);
    e = -23;
  }
  const uint32_t u = float_to_bits(x);
  e += static_cast<int>((u >> 23) & 0xffu) - 127;
  float f = bits_to_float((u & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  if (f > 1.41421356f) {
    f = mul_rn(f, 0.5f);
    e += 1;
  }
  const float t = div_rn(add_rn(f, -1.0f), add_rn(f, 1.0f));
  const float t2 = mul_rn(t, t);
  float p = 1.0f / 11.0f;
  p = add_rn(mul_rn(p, t2), 1.0f / 9.0f);
  p = add_rn(mul_rn(p, t2), 1.0f / 7.0f);
  p = add_rn(mul_rn(p, t2), 1.0f / 5.0f);
  p = add_rn(mul_rn(p, t2), 1.0f / 3.0f);
  p = add_rn(mul_rn(p, t2), 1.0f);
  return add_rn(static_cast<float>(e), mul_rn(mul_rn(p, t), 2.88539008f));  // 2 / ln 2
}

// 2^y: y = n + r with n = floor(y + 1/2), r in [-1/2, 1/2], 2^r by the Taylor series of e^(r ln 2) to degree 7
// (truncation below 1e-8 relative), times 2^n exactly (two steps when the result is subnormal: one rounding).
// +inf above the float range, 0 below it.
__host__ __device__ inline float exp2_rn(float y) {
  if (y >= 128.0f) return bits_to_float(0x7f800000u);
  if (y < -151.0f) return 0.0f;
  const float n = floorf(add_rn(y, 0.5f));
  const float r = add_rn(y, -n);
  const float a = mul_rn(r, 0.693147182f);  // ln 2
  float p = 1.0f / 5040.0f;
  p = add_rn(mul_rn(p, a), 1.0f / 720.0f);
  p = add_rn(mul_rn(p, a), 1.0f / 120.0f);
  p = add_rn(mul_rn(p, a), 1.0f / 24.0f);
  p = add_rn(mul_rn(p, a), 1.0f / 6.0f);
  p = add_rn(mul_rn(p, a), 0.5f);
  p = add_rn(mul_rn(p, a), 1.0f);
  p = add_rn(mul_rn(p, a), 1.0f);
  const int ni = static_cast<int>(n);
  if (ni > 127) return mul_rn(mul_rn(p, 0x1p127f), 2.0f);
  if (ni >= -126) return mul_rn(p, bits_to_float(static_cast<uint32_t>(ni + 127) << 23));
  return mul_rn(mul_rn(p, bits_to_float(static_cast<uint32_t>(ni + 64 + 127) << 23)), 0x1p-64f);
}

// The two statistics a group is fitted to: max |x| and the smallest nonzero |x| (+inf when every value is zero).
// Both are exact and independent of the order in which the values are visited.
struct GroupStats {
  float max_abs = 0.0f;
  float min_nonzero = __builtin_huge_valf();

  __host__ __device__ void add(float x) {
    const float a = fabsf(x);
    max_abs = fmaxf(max_abs, a);
    if (a > 0.0f) min_nonzero = fminf(min_nonzero, a);
  }
  __host__ __device__ void merge(float other_max, float other_min) {
    max_abs = fmaxf(max_abs, other_max);
    min_nonzero = fminf(min_nonzero, other_min);
  }
};

// ------------------------------------------------------------------------------------------------------------------
// fp8: E4M3 codes with one FP32 scale per group (COAT's baseline, fp8_adamw_cuda_kernel.cu):
//   s = (max|x| + 1e-20) / 448,  code = e4m3(x / s),  x = e4m3_value(code) * s.
// An all-zero group stores s = 1e-20 / 448 and zero codes.
struct Fp8Moments {
  using Code = uint8_t;
  static constexpr StateFormat::Id kFormat = StateFormat::Id::FP8;
  static constexpr int kScalesPerGroup = 1;
  struct Group {
    float scale;  // the dequantisation multiplier s
  };
  __host__ __device__ static Group load(const float* meta) { return {meta[0]}; }
  __host__ __device__ static void store(const Group& g, float* meta) { meta[0] = g.scale; }
  __host__ __device__ static Group fit(const GroupStats& st) {
    return {div_rn(add_rn(st.max_abs, 1e-20f), kE4M3Max)};
  }
  __host__ __device__ static Code encode(float x, const Group& g) { return e4m3_encode(div_rn(x, g.scale)); }
  __host__ __device__ static float decode(Code c, const Group& g) { return mul_rn(e4m3_decode(c), g.scale); }
};

// fp8_expand: E4M3 codes with COAT's Dynamic Range Expansion (fp8_adamw_expand_cuda_kernel.cu), per group:
//   M = max|x| + 1e-30,  m = min nonzero |x| + 1e-30 (m = M when the group is all zero),
//   k = clamp(floor(E log2(T) / log2(M / m)) / E, 1/2, 8) with E = 16 and T = 448^2 / 2 (E log2 T = 265.835358 as a
//       float; log2(M / m) = log2_rn(M) - log2_rn(m); log2(M / m) <= 0, i.e. a constant or zero group, gives k = 8),
//   c = sqrt(M) sqrt(m),  y = sign(x) |x / c|^k,  s = (M / c)^k / 448,  code = e4m3(y / s),
//   x = sign(q) |q s|^(1/k) c  with q = e4m3_value(code).
// Powers: |a / b|^k = exp2_rn(k (log2_rn |a| - log2_rn b)), |q s|^(1/k) = exp2_rn(log2_rn |q s| / k) (the ratio is never
// formed, so it cannot overflow); a zero value or code stays zero. k is a multiple of 1/16 in [1/2, 8]: it is stored
// exactly. The clamp keeps an all-zero or constant group finite (k would be infinite) and bounds the compression of
// a group with a huge range (there the smallest values fall below E4M3's subnormals and are stored as 0).
struct Fp8ExpandMoments {
  using Code = uint8_t;
  static constexpr StateFormat::Id kFormat = StateFormat::Id::FP8_EXPAND;
  static constexpr int kScalesPerGroup = 3;
  static constexpr int kExpandSteps = 16;                // E: k is a multiple of 1/E
  static constexpr float kExpandNumerator = 265.835358f;  // E log2(448^2 / 2)
  static constexpr int kMinSteps = 8, kMaxSteps = 128;    // k in [1/2, 8]
  struct Group {
    float scale;        // s
    float k;            // the expansion exponent
    float centre;       // c
    float log2_centre;  // log2_rn(c): derived, not stored
  };
  __host__ __device__ static Group with_centre(float scale, float k, float centre) {
    return {scale, k, centre, centre > 0.0f ? log2_rn(centre) : 0.0f};
  }
  __host__ __device__ static Group load(const float* meta) { return with_centre(meta[0], meta[1], meta[2]); }
  __host__ __device__ static void store(const Group& g, float* meta) {
    meta[0] = g.scale;
    meta[1] = g.k;
    meta[2] = g.centre;
  }
  __host__ __device__ static Group fit(const GroupStats& st) {
    const float M = add_rn(st.max_abs, 1e-30f);
    const float m = st.min_nonzero > st.max_abs ? M : add_rn(st.min_nonzero, 1e-30f);
    const float log2_M = log2_rn(M);
    const float range = add_rn(log2_M, -log2_rn(m));  // log2(M / m)
    int steps = kMaxSteps;
    if (range > 0.0f) {
      const float r = div_rn(kExpandNumerator, range);
      if (r < static_cast<float>(kMaxSteps)) steps = static_cast<int>(floorf(r));
      if (steps < kMinSteps) steps = kMinSteps;
    }
    const float k = div_rn(static_cast<float>(steps), static_cast<float>(kExpandSteps));
    const float centre = mul_rn(sqrtf(M), sqrtf(m));
    Group g = with_centre(0.0f, k, centre);
    g.scale = div_rn(exp2_rn(mul_rn(k, add_rn(log2_M, -g.log2_centre))), kE4M3Max);
    return g;
  }
  __host__ __device__ static Code encode(float x, const Group& g) {
    if (x == 0.0f) return e4m3_encode(x);
    const float y = exp2_rn(mul_rn(g.k, add_rn(log2_rn(fabsf(x)), -g.log2_centre)));
    return e4m3_encode(div_rn(x < 0.0f ? -y : y, g.scale));
  }
  __host__ __device__ static float decode(Code c, const Group& g) {
    const float q = e4m3_decode(c);
    const float a = mul_rn(fabsf(q), g.scale);
    if (a == 0.0f) return copysignf(0.0f, q);
    const float x = mul_rn(exp2_rn(div_rn(log2_rn(a), g.k)), g.centre);
    return q < 0.0f ? -x : x;
  }
};

// ------------------------------------------------------------------------------------------------------------------
// One group of `count` values (1..kMomentGroupSize) on one thread, as the update kernel encodes it with a warp: the
// host codecs and the CPU reference.
template <class Storage>
__host__ __device__ inline void encode_group(const float* values, size_t count, typename Storage::Code* codes,
                                             float* meta) {
  GroupStats stats;
  for (size_t i = 0; i < count; i++) stats.add(values[i]);
  const typename Storage::Group g = Storage::fit(stats);
  Storage::store(g, meta);
  for (size_t i = 0; i < count; i++) codes[i] = Storage::encode(values[i], g);
}
template <class Storage>
__host__ __device__ inline void decode_group(const typename Storage::Code* codes, const float* meta, size_t count,
                                             float* values) {
  const typename Storage::Group g = Storage::load(meta);
  for (size_t i = 0; i < count; i++) values[i] = Storage::decode(codes[i], g);
}

}  // namespace llmc
