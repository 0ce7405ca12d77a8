// llmc/kernels/conventions.h: what every handwritten kernel of llmc/kernels (everything but the GEMMs, which live in
// llmc/precision/gemm.h) has in common. One header per operation family (encoder, layernorm, gelu, attention,
// rmsnorm, rope, swiglu, classifier, reduce) declares its launchers; each has a CPU reference in the test-side library
// (test/reference/kernels_ref.h, FP32/FP64 on host arrays) that the GPU tests compare against.
//
// Conventions
//   - bf16 = __nv_bfloat16. Activations are row-major (B, T, C) with N = B*T rows. Weights use PyTorch nn.Linear
//     layout (out_features, in_features).
//   - Gradients of parameters are FP32 and ACCUMULATED (+=) so that gradient-accumulation micro-steps add up;
//     the caller zeroes them once per optimizer step. Gradients of activations are bf16 and as each comment says.
//   - Every kernel is deterministic: the same inputs give bit-identical outputs on every run (no float atomics whose
//     order varies). Reductions go through fixed-shape partial sums.
//   - All launchers take a cudaStream_t and check the launch (CUDA_CHECK_LAUNCH); none synchronises.
//   - Optional `*_amax` arguments (may be null): max |value written| is atomically maxed into that float
//     (llmc/core/cuda_utils.cuh atomic_max_amax; the caller zeroed it), the amax of the per-tensor scale of the
//     quantised linear that consumes the tensor.
//   - CPU references take/return float arrays with the same shapes and semantics (including the += accumulation).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace llmc {

using bf16 = __nv_bfloat16;

}  // namespace llmc
