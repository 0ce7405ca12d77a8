// llmc/precision/quant.h: the FP8 quantisation kernels and their host references (`*_cpu`, bit-exact: same codes, same scales).
// Conventions of llmc/precision/tensor.h (q = fp8(x * scale), scale_inv = 1 / scale, GEMM-ready block-scale layouts). Every
// kernel is deterministic; amax reductions use an order-independent max (atomicMax on the bits of |x|).
//
// Scale from an amax (the one formula every path uses, host and device):
//   scale = fp8_max(format) / amax / 2^margin, computed in FP32 as fp8_max / (amax * 2^margin);
//   pow2: scale = pow2_floor(scale);  scale is clamped to [2^-126, FLT_MAX] before that (a tiny amax never gives inf);
//   amax == 0 or not finite: per-tensor paths keep the previous scale; blocks use scale = 1.
//   scale_inv = 1.0f / scale.
//   (FP32 division and product correctly rounded on both sides: llmc/precision/quant.cu uses __fdiv_rn / __fmul_rn on the device
//   and must not be compiled with --use_fast_math.)
//
// Where the amax comes from, per recipe:
//   current per-tensor: the kernel that PRODUCES the tensor (layernorm, gelu, attention, their backwards...) writes
//     it with atomic_max_abs (llmc/core/cuda_utils.cuh) into a slot the caller zeroed; fp8_scale_from_amax turns it into
//     scale / scale_inv on the device; fp8_quantize_tensorwise casts with it (one more read of the tensor, the cast);
//     fp8_quantize_tensorwise_from_amax does both in the cast's launch.
//   delayed per-tensor: the scale comes from the amax history (fp8_delayed_scaling_update, once per step for every
//     delayed tensor at once); the cast reports the tensor's amax into amax_out for the next update.
//   blocks: each block's scale comes from its own amax, inside fp8_quantize_blockwise.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/precision/tensor.h"

namespace llmc {

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------------------------------------------------------
// Scales
float fp8_scale_from_amax_cpu(float amax, float previous_scale, Fp8Format f, int margin, bool pow2);
// scale[0], scale_inv[0] from amax[0] (one thread). Keeps scale (and writes scale_inv = 1/scale) when amax is 0 or
// not finite.
void fp8_scale_from_amax(float* scale, float* scale_inv, const float* amax, Fp8Format f, int margin, bool pow2,
                         cudaStream_t stream);

// Delayed scaling for `count` tensors at once (one launch per optimizer step).
//   history (count, len): ring buffers of amaxes, slot `pos` receives this step's amax;
//   amax (count): this step's amax of each tensor (reset to 0 after it is recorded);
//   scale, scale_inv (count): replaced by the scale from max(history) (use_max) or from the recorded amax alone
//     (most recent), with fp8_max of formats[i] and the margin; kept where that amax is 0 or not finite.
//   formats (count): uint8_t(Fp8Format) per tensor (the device treats 1 as E5M2 and anything else as E4M3; the host
//     reference throws on a value that is not an Fp8Format).
// The max over the history ignores NaN entries (fmaxf, as Transformer Engine) and an infinite entry keeps the previous
// scale for as long as it is in the window. pos is the caller's step counter modulo len; margin in [-64, 64].
void fp8_delayed_scaling_update(float* history, float* amax, float* scale, float* scale_inv, const uint8_t* formats,
                                int count, int len, int pos, bool use_max, int margin, bool pow2, cudaStream_t stream);
void fp8_delayed_scaling_update_cpu(float* history, float* amax, float* scale, float* scale_inv,
                                    const uint8_t* formats, int count, int len, int pos, bool use_max, int margin,
                                    bool pow2);

// ---------------------------------------------------------------------------------------------------------------
// Casts. x (rows, cols) bf16 row-major, cols a multiple of 16; rows any.
// max |x| of n bf16 values into *amax (atomic max: the caller zeroes *amax first). For tensors no producer reports.
void amax_bf16(float* amax, const bf16* x, size_t n, cudaStream_t stream);
float amax_bf16_cpu(const float* x, size_t n);

// Per-tensor: q.data (if non-null) = fp8(x * q.scale[0]); q.data_t (if non-null) = the same codes transposed
// (cols, rows), written in the same pass over x. If amax_out is non-null, max |x| is atomically maxed into it.
void fp8_quantize_tensorwise(const QTensor& q, const bf16* x, float* amax_out, cudaStream_t stream);
// Current per-tensor scaling in one launch: q.scale / q.scale_inv = fp8_scale_from_amax(amax[0], previous q.scale,
// q.format, margin, pow2) and the cast with that scale, the same codes and scales as fp8_scale_from_amax followed by
// fp8_quantize_tensorwise (amax: the slot the producer filled).
void fp8_quantize_tensorwise_from_amax(const QTensor& q, const bf16* x, const float* amax, int margin, bool pow2,
                                       cudaStream_t stream);
// Host reference on float values (exactly representable in bf16); scale is the multiplier.
void fp8_quantize_tensorwise_cpu(uint8_t* data, uint8_t* data_t, float* amax_out, const float* x, int rows, int cols,
                                 float scale, Fp8Format f);

// Block-wise (q.granularity Block1x128 or Block128x128): every block's scale from its own amax (margin 0), the
// codes and GEMM-ready scale_inv of q.data (if non-null) and of q.data_t (if non-null), in one pass over x. For
// Block1x128 the transposed copy is quantised from x along rows (never by transposing the 1x128 codes). If q.amax
// is non-null it receives max |x| (overwritten: a cudaMemsetAsync to 0 on the stream, then an atomic max per tile).
// Both copies need q.data / q.data_t 16-byte aligned; data_t rows use 16-byte stores when rows % 16 == 0 and byte
// stores otherwise (correct for any rows, slower).
void fp8_quantize_blockwise(const QTensor& q, const bf16* x, bool pow2, cudaStream_t stream);
// Host reference: scale_inv / scale_inv_t in the GEMM-ready layouts (padding entries 1).
void fp8_quantize_blockwise_cpu(uint8_t* data, float* scale_inv, uint8_t* data_t, float* scale_inv_t, const float* x,
                                int rows, int cols, ScaleGranularity g, Fp8Format f, bool pow2);

// Transpose of FP8 codes: dst (cols, rows) = src (rows, cols)ᵀ, byte for byte. For a per-tensor or 128x128-block
// quantised tensor this is exactly the transposed copy the cast would have written (same scale per element), so a
// weight can keep only its row-wise codes and make the transposed ones when backward needs them. rows and cols
// multiples of 16, src and dst 16-byte aligned.
void fp8_transpose_codes(uint8_t* dst, const uint8_t* src, int rows, int cols, cudaStream_t stream);
void fp8_transpose_codes_cpu(uint8_t* dst, const uint8_t* src, int rows, int cols);

// Dequantisation (tests, telemetry): out (rows, cols) FP32 = codes * scale_inv of their block; transposed = true reads
// q.data_t / q.scale_inv_t and writes (cols, rows).
void fp8_dequantize(float* out, const QTensor& q, bool transposed, cudaStream_t stream);
void fp8_dequantize_cpu(float* out, const uint8_t* data, const float* scale_inv, int rows, int cols,
                        ScaleGranularity g, Fp8Format f);

// ---------------------------------------------------------------------------------------------------------------
// Numerics telemetry of one quantisation: x (rows, cols) bf16 and q.data quantised from it.
struct QuantStats {
  double amax = 0;             // max |x|
  double scale = 0;            // 1 / scale_inv: per-tensor, the scale used; blocks, the smallest block scale
                               // (1 / the largest scale_inv of a real block, padding entries excluded)
  double saturated_frac = 0;   // fraction of elements whose code is +-fp8_max (clipped, or rounded up to max)
  double underflow_frac = 0;   // fraction of nonzero x whose code is +-0
  double snr_db = 0;           // 10 log10(sum x^2 / sum (x - dequant(q))^2); +inf when exact
};
// Writes the raw sums for one tensor into stats_out (kQuantStatsSlots doubles on the device: amax, min scale,
// saturated count, underflow count, nonzero count, sum x^2, sum err^2, element count), deterministically: a fixed grid
// of per-block partials (FP64, fixed reduction order) combined by one block in a fixed order; the partials live in
// stream-ordered scratch (cudaMallocAsync / cudaFreeAsync on `stream`). err = x - dequant(q) as fp8_dequantize
// computes it. The host reference sums in another order: counts, amax and scale agree exactly, the sums to ~1e-12.
constexpr int kQuantStatsSlots = 8;
void fp8_quant_stats(double* stats_out, const QTensor& q, const bf16* x, cudaStream_t stream);
QuantStats finish_quant_stats(const double* host_slots);  // the 8 slots (downloaded) -> fractions and dB
QuantStats fp8_quant_stats_cpu(const float* x, const uint8_t* data, const float* scale_inv, int rows, int cols,
                               ScaleGranularity g, Fp8Format f);

}  // namespace llmc
