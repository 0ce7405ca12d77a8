// llmc/optim/adamw_update.h: the AdamW update kernel (implemented in llmc/optim/adamw_update.cu; CPU reference in
// test/reference/optim_ref.h) and the clip scale it reads.
//
// AdamW on FP32 master weights with moments in their stored format (llmc/optim/state_format.h); writes the bf16
// working copy (round to nearest even).
//   g = grads[i] * grad_scale (grad_scale folds in clipping: min(1, clip / norm), and 1 when clipping is off)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  mhat = m / (1 - b1^t);  vhat = v / (1 - b2^t)
//   master -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * master);  params = bf16(master)
// m and v are decoded to FP32 before and encoded after (fp32: unchanged; bf16: round to nearest even; fp8 and
// fp8_expand: per group of 128, see below). t is the 1-based optimizer step. grad_scale is read from device memory (computed there by the norm kernels) so the whole step
// stays on the GPU without a host sync.
#pragma once

#include <cstddef>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/optim/state_format.h"

namespace llmc {

using bf16 = __nv_bfloat16;

// FP32 moments.
void adamw_update(float* master, bf16* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t, const float* grad_scale,
                  cudaStream_t stream);
// BF16 moments.
void adamw_update(float* master, bf16* params, const float* grads, bf16* m, bf16* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t, const float* grad_scale,
                  cudaStream_t stream);
// Moments in the run-time `format` (the one place a format picks its kernel): m and v view the codes (and group
// metadata) of the same n elements, which start on a group boundary (moment_view, llmc/optim/state_format.h).
//
// The grouped formats (fp8, fp8_expand) run one fused kernel: one warp per group of 128 (lane l holds the elements
// l, l + 32, l + 64, l + 96: coalesced loads, and the group's max / min reductions are warp shuffles with no shared
// memory or barrier), which dequantises m and v, updates them and the master weight in FP32 (adamw_math.cuh), writes
// master and params, reduces max|x| and the smallest nonzero |x| of the updated m and of v over the group, fits the
// group's metadata and requantises (llmc/optim/moment_storage.cuh). When n is not a multiple of 128 the last group
// holds the n % 128 elements that remain; elements past n are neither read nor written. A group whose updated master,
// m or v holds a non-finite value (impossible with finite gradients and a finite grad_scale) writes nothing: its
// codes, metadata, master weights and params keep their values, as in a skipped step.
void adamw_update(const StateFormat& format, float* master, bf16* params, const float* grads, MomentView m,
                  MomentView v, size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                  const float* grad_scale, cudaStream_t stream);

// grad_scale[0] = (clip > 0 && norm[0] > clip) ? clip / norm[0] : 1   (device memory; norm from global_norm_finish);
// NaN when norm[0] is not finite, and adamw_update then leaves everything unchanged (a skipped step).
void clip_scale_from_norm(float* grad_scale, const float* norm, float clip, cudaStream_t stream);

}  // namespace llmc
