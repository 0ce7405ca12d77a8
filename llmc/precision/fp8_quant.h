// llmc/precision/fp8_quant.h: the FP8 quantiser family: E4M3 / E5M2 codes with one FP32 (or power-of-two) scale per
// tensor or per 1x128 / 128x128 block. Models and linears reach these kernels through the one dispatch point,
// llmc/precision/quantize.h; tests and benchmarks call them directly. Conventions of llmc/precision/tensor.h
// (q = fp8(x * scale), scale_inv = 1 / scale, GEMM-ready block-scale layouts); the scale formulas are
// llmc/precision/scale_math.cuh's, shared with the host references (test/reference/precision_ref.h), which give the
// same codes and scales bit for bit. Every kernel is deterministic; amax reductions use an order-independent max
// (atomicMax on the bits of |x|).
//
// Where the amax comes from, per recipe:
//   current per-tensor: the kernel that PRODUCES the tensor (layernorm, gelu, attention, their backwards...) writes
//     it with atomic_max_abs (llmc/core/cuda_utils.cuh) into a slot the caller zeroed; fp8_scale_from_amax turns it
//     into scale / scale_inv on the device; fp8_quantize_tensorwise casts with it (one more read of the tensor, the
//     cast); fp8_quantize_tensorwise_from_amax does both in the cast's launch.
//   delayed per-tensor: the scale comes from the amax history (fp8_delayed_scaling_update, once per step for every
//     delayed tensor at once); the cast reports the tensor's amax into amax_out for the next update.
//   blocks: each block's scale comes from its own amax, inside fp8_quantize_blockwise.
// Power-of-two scales: the encoding's scale format Pow2FP32 (FP32 otherwise).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/precision/encoding.h"
#include "llmc/precision/tensor.h"

namespace llmc {

using bf16 = __nv_bfloat16;

// The encodings of the family: an FP8 element format, no second-level scale, FP32 or Pow2FP32 scales of the whole
// tensor (tensorwise) or of 1x128 / 128x128 blocks (blockwise).
bool fp8_tensorwise_encoding(const Encoding& e);
bool fp8_blockwise_encoding(const Encoding& e);

// ---------------------------------------------------------------------------------------------------------------
// Scales
// scale[0], scale_inv[0] from amax[0] (one thread), with e's format maximum and power-of-two rounding (e a tensorwise
// encoding). Keeps scale (and writes scale_inv = 1/scale) when amax is 0 or not finite.
void fp8_scale_from_amax(float* scale, float* scale_inv, const float* amax, const Encoding& e, int margin,
                         cudaStream_t stream);

// Delayed scaling for `count` tensors at once (one launch per optimizer step).
//   history (count, len): ring buffers of amaxes, slot `pos` receives this step's amax;
//   amax (count): this step's amax of each tensor (reset to 0 after it is recorded);
//   scale, scale_inv (count): replaced by the scale from max(history) (use_max) or from the recorded amax alone
//     (most recent), with the format maximum of formats[i], the margin and the scale format `scales` (FP32 or
//     Pow2FP32); kept where that amax is 0 or not finite.
//   formats (count): uint8_t(ElementFormat) per tensor (the device treats 1 as E5M2 and anything else as E4M3; the
//     host reference throws on a value that is not an FP8 format).
// The max over the history ignores NaN entries (fmaxf, as Transformer Engine) and an infinite entry keeps the previous
// scale for as long as it is in the window. pos is the caller's step counter modulo len; margin in [-64, 64].
void fp8_delayed_scaling_update(float* history, float* amax, float* scale, float* scale_inv, const uint8_t* formats,
                                int count, int len, int pos, bool use_max, int margin, ScaleFormat scales,
                                cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------------
// Casts. x (rows, cols) bf16 row-major, cols a multiple of 16; rows any.
// max |x| of n bf16 values into *amax (atomic max: the caller zeroes *amax first). For tensors no producer reports.
void amax_bf16(float* amax, const bf16* x, size_t n, cudaStream_t stream);

// Per-tensor (q.encoding tensorwise): q.data (if non-null) = fp8(x * q.scale[0]); q.data_t (if non-null) = the same
// codes transposed (cols, rows), written in the same pass over x. If amax_out is non-null, max |x| is atomically
// maxed into it.
void fp8_quantize_tensorwise(const QTensor& q, const bf16* x, float* amax_out, cudaStream_t stream);
// Current per-tensor scaling in one launch: q.scale / q.scale_inv = fp8_scale_from_amax(amax[0], previous q.scale,
// q.encoding, margin) and the cast with that scale, the same codes and scales as fp8_scale_from_amax followed by
// fp8_quantize_tensorwise (amax: the slot the producer filled).
void fp8_quantize_tensorwise_from_amax(const QTensor& q, const bf16* x, const float* amax, int margin,
                                       cudaStream_t stream);

// Block-wise (q.encoding blockwise: 1x128 or 128x128): every block's scale from its own amax (margin 0), the codes
// and GEMM-ready scale_inv of q.data (if non-null) and of q.data_t (if non-null), in one pass over x. For 1x128 the
// transposed copy is quantised from x along rows (never by transposing the 1x128 codes). If q.amax is non-null it
// receives max |x| (overwritten: a cudaMemsetAsync to 0 on the stream, then an atomic max per tile). Both copies need
// q.data / q.data_t 16-byte aligned; data_t rows use 16-byte stores when rows % 16 == 0 and byte stores otherwise
// (correct for any rows, slower).
void fp8_quantize_blockwise(const QTensor& q, const bf16* x, cudaStream_t stream);

// Transpose of FP8 codes: dst (cols, rows) = src (rows, cols)ᵀ, byte for byte. For a per-tensor or 128x128-block
// quantised tensor this is exactly the transposed copy the cast would have written (same scale per element), so a
// weight can keep only its row-wise codes and make the transposed ones when backward needs them. rows and cols
// multiples of 16, src and dst 16-byte aligned.
void fp8_transpose_codes(uint8_t* dst, const uint8_t* src, int rows, int cols, cudaStream_t stream);

// Dequantisation (tests, telemetry): out (rows, cols) FP32 = codes * scale_inv of their block; transposed = true reads
// q.data_t / q.scale_inv_t and writes (cols, rows).
void fp8_dequantize(float* out, const QTensor& q, bool transposed, cudaStream_t stream);

// Numerics telemetry of one quantisation (llmc/precision/quantize.h's quant_stats for this family): x (rows, cols)
// bf16 and q.data quantised from it; the raw sums into stats_out (kQuantStatsSlots doubles on the device, the slots
// quantize.h names: amax, min scale, saturated count, underflow count, nonzero count, sum x^2, sum err^2, element
// count, clipped count: scale_math.cuh's fp8_clipped with *q.scale per tensor, fp8_block_multiplier per block),
// deterministically: a fixed grid of per-block partials (FP64, fixed reduction order) combined by one block in a
// fixed order; the partials live in stream-ordered scratch (cudaMallocAsync / cudaFreeAsync on `stream`).
// err = x - dequant(q) as fp8_dequantize computes it. Per tensor, q.scale (the multiplier) is read as well. The host
// reference sums in another order: counts, amax and scale agree exactly, the sums to ~1e-12.
void fp8_quant_stats(double* stats_out, const QTensor& q, const bf16* x, cudaStream_t stream);

}  // namespace llmc
