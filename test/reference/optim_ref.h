// test/reference/optim_ref.h: the CPU reference of the AdamW update kernels (llmc/optim/adamw_update.h), templated on
// the same moment storages (llmc/optim/moment_storage.cuh), with the same per-element arithmetic
// (llmc/optim/adamw_math.cuh) and an independent bf16 rounding (llmc/core/dtypes.h) of the moments and the params.
// The grouped formats run group after group on one thread with the storages' own fit / encode / decode (the one copy
// of the quantiser) and the host E4M3 conversion of llmc/core/dtypes; test/optim/gen_moment_vectors.py checks this
// reference against NumPy (test/optim/test_moment_vectors.cpp).
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

// Moments in the run-time `format`, as adamw_update(format, ...) updates them: m and v view host storage of the n
// elements (moment_view of a MomentStorage::bytes block), starting on a group boundary; the last group may be partial.
// A grouped format updates group by group and leaves a group whose updated values are not all finite unchanged.
void adamw_update_cpu(const StateFormat& format, float* master, float* params, const float* grads, MomentView m,
                      MomentView v, size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                      float grad_scale);

// FP32 moments.
void adamw_update_cpu(float* master, float* params, const float* grads, float* m, float* v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale);

}  // namespace llmc
