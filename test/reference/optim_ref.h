// test/reference/optim_ref.h: the CPU reference of the AdamW update kernel (llmc/optim/adamw_update.h), templated on
// the same moment storages (llmc/optim/moment_storage.cuh), with the same per-element arithmetic
// (llmc/optim/adamw_math.cuh) and an independent bf16 rounding (llmc/core/dtypes.h) of the moments and the params.
#pragma once

#include <cstddef>

#include "llmc/optim/moment_storage.cuh"

namespace llmc {

// master, m, v updated in place (m and v as Storage stores them: decoded to FP32, updated, encoded); params (n) =
// the bf16 value of master, as floats. grad_scale as the kernel reads it: a non-finite one changes nothing.
// Instantiated for Fp32Moments and Bf16Moments.
template <class Storage>
void adamw_update_cpu(float* master, float* params, const float* grads, typename Storage::Code* m,
                      typename Storage::Code* v, size_t n, float lr, float beta1, float beta2, float eps,
                      float weight_decay, int t, float grad_scale);

// FP32 moments.
void adamw_update_cpu(float* master, float* params, const float* grads, float* m, float* v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale);

}  // namespace llmc
