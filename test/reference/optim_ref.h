// test/reference/optim_ref.h: the CPU reference of the AdamW update kernel (llmc/optim/adamw_update.h), with the same
// per-element arithmetic (llmc/optim/adamw_math.cuh) and an independent bf16 rounding (llmc/core/dtypes.h).
#pragma once

#include <cstddef>

namespace llmc {

// master, m, v updated in place; params (n) = the bf16 value of master, as floats. grad_scale as the kernel reads it.
void adamw_update_cpu(float* master, float* params, const float* grads, float* m, float* v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale);

}  // namespace llmc
