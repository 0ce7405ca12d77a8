// llmc/optim/moment_storage.cuh: the moment storages the AdamW update kernel (llmc/optim/adamw_update.cu) and its CPU
// reference (test/reference/optim_ref.h) are templated on, one type per StateFormat (llmc/optim/state_format.h).
// A storage names the code type of m and v and, for the kernel, decodes a code to the FP32 value the update reads
// and encodes the updated FP32 value back; the update arithmetic between the two is llmc/optim/adamw_math.cuh for
// every storage. A grouped storage (FP8 codes with per-group scales) adds its group metadata and its
// (de)quantisation here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

}  // namespace llmc
