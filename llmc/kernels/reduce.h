// llmc/kernels/reduce.h: reductions and small elementwise helpers: bias gradients, deterministic global norms, bias
// add, float <-> bf16.
// Implemented in llmc/kernels/reduce.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"

namespace llmc {

// Deterministic column sums over rows, in two fixed-shape stages:
//   stage 1 (per kernel): partials (num_row_chunks(N), C): chunk k holds the sum over rows [k*kRowsPerChunk, ...)
//   stage 2 (reduce.cu, shared by the kernel families):  out (C) += sum over k = 0 .. num_chunks-1 of partials[k, :]
constexpr int kRowsPerChunk = 32;
inline int num_row_chunks(int N) { return static_cast<int>(ceil_div(static_cast<size_t>(N), kRowsPerChunk)); }
void sum_column_partials(float* out, const float* partials, int num_chunks, int C, cudaStream_t stream);
// The same for several sums in one launch: outs[a] (C) += the column sums of partials + a * num_chunks * C.
constexpr int kMaxColumnSums = 3;
void sum_column_partials(float* const* outs, int num_outs, const float* partials, int num_chunks, int C,
                         cudaStream_t stream);
// Stage 1 for a bf16 matrix x (N, C) (C a multiple of 8, x 16-byte aligned): partials (num_row_chunks(N), C),
// overwritten. bias_backward is this followed by sum_column_partials.
void column_partials(float* partials, const bf16* x, int N, int C, cudaStream_t stream);


// reductions and small elementwise helpers
// dbias (OC) += sum over the N rows of dout (N, OC). scratch: bias_backward_scratch_floats(N, OC) floats.
size_t bias_backward_scratch_floats(int N, int OC);
void bias_backward(float* dbias, float* scratch, const bf16* dout, int N, int OC, cudaStream_t stream);

// Sum of squares of n FP32 values, deterministically: writes the partial sums of this tensor into
// partials[0 .. global_norm_partials_per_tensor()) (overwrites). The final norm is the fixed-order sum of all the
// partials of all tensors: global_norm_finish.
int global_norm_partials_per_tensor();
void global_norm_squared(float* partials, const float* values, size_t n, cudaStream_t stream);
// out[0] = sqrt(sum of partials[0 .. count)) in a fixed order (single block). out is device memory.
void global_norm_finish(float* out, const float* partials, int count, cudaStream_t stream);

// x (M, N) += bias (N) in place, rounded to bf16 (for FP8 GEMMs whose epilogue cannot add the bias: block scales);
// amax: max |result|. N a multiple of 8.
void add_bias(bf16* x, const bf16* bias, int M, int N, cudaStream_t stream, float* amax = nullptr);

void convert_float_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream);
void convert_bf16_to_float(float* out, const bf16* in, size_t n, cudaStream_t stream);

}  // namespace llmc
