// llmc/precision/quantize.h: the one dispatch point of quantisation. quantize() turns a BF16 tensor into the QTensor
// its encoding describes, choosing the quantiser family from the encoding (whole-tensor or block scales) and, for a
// whole-tensor scale, from where the scale comes (the current amax, or the scale already stored: delayed scaling);
// quant_stats() measures a quantisation's numerics with the same family. The table of families lives in
// quantize.cu: an encoding no family handles is refused here (quantizer_error, which recipe validation asks first, so
// a run never reaches a kernel with one). Adding a number format = one encoding value (llmc/precision/encoding.h) +
// its quantiser file + one row in that table + its GEMM mapping (llmc/precision/gemm.cu).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/precision/encoding.h"
#include "llmc/precision/fp4_rng.cuh"
#include "llmc/precision/tensor.h"

namespace llmc {

using bf16 = __nv_bfloat16;

// Where a whole-tensor scale comes from (block encodings ignore it: every block is scaled from its own amax).
enum class ScaleSource : uint8_t {
  Amax,    // current scaling: from *QuantizeArgs::amax, computed inside the cast's launch and written to q.scale,
           // q.scale_inv (q.scale's previous value is kept when that amax is 0 or not finite)
  Stored,  // q.scale as it is: delayed scaling's (set from the amax history), or an earlier cast's of the same tensor
};

// How codes are rounded: to nearest, ties to even, or stochastically (unbiased; FP4 quantisers only).
enum class Rounding : uint8_t { Nearest, Stochastic };

// A block Hadamard transform applied to the source before it is quantised (FP4 quantisers only, along the
// quantisation direction of the chosen copies; llmc/precision/hadamard.cuh): size 0 (none), 16 or 32, the random sign
// vector (bit i negates element i of every size-block; 0: the plain transform; llmc/precision/fp4_rng.cuh's
// random_signs draws one from a seed), and which copies it rotates: data (along cols) and / or data_t (along rows).
struct HadamardOption {
  int size = 0;
  uint32_t signs = 0;
  bool data = false;
  bool data_t = false;
  bool any() const { return size != 0 && (data || data_t); }
};

// How MXFP4 block scales are chosen (llmc/precision/fp4_codec.cuh has the rules): Amax, the OCP MX rule from the
// block's largest magnitude; Gaussian, QuEST's (Quartet's forward) from the block's standard deviation, which clips
// the outliers it trades for resolution (whole 32-element blocks only); RangeMatched, Quartet's backward: the amax
// rule's scale with the elements multiplied by 3/4 before rounding, so nothing clips; the stored codes and scales
// then decode to 3/4 of the values they stand for, and a product of two such operands must be multiplied by 16/9
// (fp4_codec.cuh's kRangeMatchProductFactor; the caller does it).
enum class Mxfp4Scale : uint8_t { Amax, Gaussian, RangeMatched };

struct QuantizeArgs {
  ScaleSource source = ScaleSource::Amax;
  const float* amax = nullptr;   // Amax: device (1), max |src| (its producer filled it, or amax_bf16 measured it);
                                 // NVFP4: the tensor amax of its second-level scale (null: measured by the quantiser)
  float* amax_out = nullptr;     // Stored: max |src| is atomically maxed into it (delayed scaling's record), or null
  int margin = 0;                // Amax: scale = max(format) / amax / 2^margin
  Rounding rounding = Rounding::Nearest;
  StochasticKey sr_key;          // Stochastic: the key of the random numbers (fp4_rng.cuh)
  HadamardOption hadamard;
  Mxfp4Scale mxfp4_scale = Mxfp4Scale::Amax;  // MXFP4 encodings only
  uint32_t* trust_mask = nullptr;  // MXFP4, data copy: one word per block, [r * blocks_per_row + kb] (device), bit i
                                   // set when element i of the block was not clipped (fp4_codec.cuh's e2m1_trusted):
                                   // QuEST's trust mask, which lets the backward pass gradients only where it is set
};

// q (its encoding, shape, and the buffers the encoding needs: codes data / data_t where wanted, scale and scale_inv
// for a whole-tensor scale, scale_inv / scale_inv_t for block scales, tensor_scale_inv / tensor_scale_inv_t for a
// second-level scale, amax optional) from src (q.rows, q.cols) bf16. llmc::Error naming the encoding when no quantiser
// handles it, or when args ask for stochastic rounding or a Hadamard transform of a family that has none.
void quantize(const QTensor& q, const bf16* src, const QuantizeArgs& args, cudaStream_t stream);

// Empty when this build has a quantiser for e; otherwise why not, with the encodings it does handle.
std::string quantizer_error(const Encoding& e);
inline bool has_quantizer(const Encoding& e) { return quantizer_error(e).empty(); }
// The element formats and block shapes that some quantiser of this build handles (the choices of the config keys).
std::vector<ElementFormat> quantizable_element_formats();
std::vector<BlockShape> quantizable_block_shapes();

// ---------------------------------------------------------------------------------------------------------------
// Numerics telemetry of one quantisation: x (rows, cols) bf16 and q.data quantised from it.
struct QuantStats {
  double amax = 0;             // max |x|
  double scale = 0;            // 1 / scale_inv: per-tensor, the scale used; blocks, the smallest block scale
                               // (1 / the largest scale_inv of a real block, padding entries excluded)
  double saturated_frac = 0;   // fraction of elements whose code is +-max (clipped, or rounded up to max)
  double underflow_frac = 0;   // fraction of nonzero x whose code is +-0
  double snr_db = 0;           // 10 log10(sum x^2 / sum (x - dequant(q))^2); +inf when exact. dequant(q): the
                               // value a code stands for (range-matched MXFP4: 4/3 of its decoded value;
                               // fp4_represented_value)
  double clipped_frac = 0;     // fraction of elements beyond the format's range: their scaled value (the FP32
                               // product x * multiplier that the quantiser rounds, with its multiplier) is NaN or
                               // beyond 448 (E4M3) / 57344 (E5M2), or for E2M1 at or beyond 6 (fp8_clipped,
                               // e2m1_clipped: one definition each). MXFP4 under QuEST's Gaussian scales: the
                               // fraction the trust mask masks (but in a block with a non-finite element, which the
                               // mask drops whole, only that element counts); range-matched scales clip nothing.
};
// The raw sums of one tensor: kQuantStatsSlots doubles on the device, computed deterministically by q's quantiser
// family (slots named below). rotation (FP4 only): the data copy was quantised from x rotated along cols
// (QuantizeArgs::hadamard); the statistics are then those of the rotated values the quantiser saw (amax, SNR,
// fractions), each rotated again from x. mxfp4_scale (MXFP4 only): the rule its block scales were chosen by
// (QuantizeArgs::mxfp4_scale), which gives the element multiplier of the clipped count (the amax and Gaussian rules
// scale by 2^-X of the stored code, range matching by 3/4 of that).
enum QuantStatsSlot : int {
  kStatAmax = 0,        // max |x| (partials: its FP32 bits)
  kStatScale,           // the smallest scale (partials: the bits of the largest scale_inv)
  kStatSaturated,       // count of codes at +-max
  kStatUnderflow,       // count of nonzero x with code +-0
  kStatNonzero,         // count of nonzero x
  kStatSumX2,           // sum x^2
  kStatSumErr2,         // sum (x - dequant(q))^2 (dequant: as QuantStats::snr_db)
  kStatElements,        // element count (added by combine_quant_stats)
  kStatClipped,         // count of clipped elements (QuantStats::clipped_frac)
};
constexpr int kQuantStatsSlots = kStatClipped + 1;
// Whether a family sums slot k (combine_quant_stats adds it over the blocks in a fixed order): every slot but the
// two maxima and the element count.
__host__ __device__ constexpr bool quant_stats_sum_slot(int k) {
  return k != kStatAmax && k != kStatScale && k != kStatElements;
}
void quant_stats(double* stats_out, const QTensor& q, const bf16* x, cudaStream_t stream,
                 const HadamardOption& rotation = HadamardOption(), Mxfp4Scale mxfp4_scale = Mxfp4Scale::Amax);
// The numerics of a product against its reference (both n elements): the same slots, with amax, nonzero count and
// sum x^2 of ref, underflow = ref nonzero where got is 0, sum err^2 of got - ref, no scale (1), no saturation and no
// clipping (0): finish_quant_stats gives the product's SNR (llmc/precision/product_stats.cu; Linear's product
// telemetry).
void product_error_stats(double* stats_out, const bf16* got, const bf16* ref, size_t n, cudaStream_t stream);
void product_error_stats(double* stats_out, const float* got, const float* ref, size_t n, cudaStream_t stream);
// The families' shared second stage: a family's stats kernel runs kQuantStatsBlocks blocks, each writing
// kQuantStatsSlots partials (kStatAmax the amax bits, kStatScale the largest scale_inv bits, as exact doubles; the
// quant_stats_sum_slot slots its sums); this combines them in a fixed order into stats_out and adds the element count.
constexpr int kQuantStatsBlocks = 256;
void combine_quant_stats(double* stats_out, const double* partials, double elements, cudaStream_t stream);
QuantStats finish_quant_stats(const double* host_slots);  // the kQuantStatsSlots slots (downloaded) -> fractions, dB

}  // namespace llmc
