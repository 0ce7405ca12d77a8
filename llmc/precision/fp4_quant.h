// llmc/precision/fp4_quant.h: the FP4 quantiser family: E2M1 codes packed two per byte with NVFP4 scales (1x16 runs
// or 16x16 tiles, E4M3 block scales under an FP32 second-level tensor scale) or MXFP4 scales (1x32 runs, E8M0, from
// the block amax, QuEST's Gaussian rule with its trust mask, or Quartet's range-matched rule), round to nearest even or stochastic rounding, an
// optional block Hadamard transform fused in. Models and linears reach it
// through llmc/precision/quantize.h; tests call it directly. The formulas are llmc/precision/fp4_codec.cuh's (the
// exact NVFP4 and MXFP4 rules are written there), the random numbers fp4_rng.cuh's, the transforms hadamard.cuh's;
// the layouts tensor.h's. The host references (test/reference/precision_ref.h) give the same bytes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/precision/encoding.h"
#include "llmc/precision/quantize.h"
#include "llmc/precision/tensor.h"

namespace llmc {

constexpr Encoding kNvfp4Encoding{ElementFormat::E2M1, kBlock1x16, ScaleFormat::E4M3, true};        // x, dy
constexpr Encoding kNvfp4WeightEncoding{ElementFormat::E2M1, kBlock16x16, ScaleFormat::E4M3, true};  // w (2D)
constexpr Encoding kMxfp4Encoding{ElementFormat::E2M1, kBlock1x32, ScaleFormat::E8M0, false};

bool nvfp4_encoding(const Encoding& e);  // one of the two NVFP4 encodings above
bool mxfp4_encoding(const Encoding& e);  // kMxfp4Encoding
inline bool fp4_encoding(const Encoding& e) { return nvfp4_encoding(e) || mxfp4_encoding(e); }

// q from x (q.rows, q.cols) bf16, rows and cols >= 0 (any: partial blocks at the edges are scaled from the elements
// they have), all device pointers:
//   q.data (if non-null): (rows, cols) codes, blocks along cols, scales in q.scale_inv (scale_inv_bytes bytes);
//   q.data_t (if non-null): (cols, rows) codes quantised from x along rows (never from data's codes) for 1xN blocks,
//     with their own scales in q.scale_inv_t; for 16x16 tiles the same codes as data, transposed, same tile scales;
//   NVFP4: the tensor amax is *args.amax when given (device, e.g. from the producer), else measured here (one extra
//     read of x); a copy rotated by args.hadamard takes the amax of its rotated values (measured: one extra read); the
//     copies' FP32 decode scales go to q.tensor_scale_inv / q.tensor_scale_inv_t (required for the wanted copies);
//   q.values / q.values_t (NVFP4 1x16 only, if non-null): the copy's decoded values without the tensor scale, BF16,
//     the values nvfp4_to_bf16 (llmc/precision/fp4_gemm.h) would expand its codes into, written by the same pass,
//     beside the codes or (data / data_t null) instead of them; the quantised direction a multiple of 16;
//   q.amax (if non-null): overwritten with max |x|;
//   args.rounding, args.sr_key: RTN or stochastic rounding (the 16 random bits of element i of a copy are
//     random_bits16(sr_key, i, copy), i the element's index in that copy's row-major layout, copy 0 = data,
//     1 = data_t; 16x16 tiles use data's index for both copies so their codes agree);
//   args.mxfp4_scale (MXFP4): the OCP amax rule, QuEST's Gaussian scales (then the quantised directions' lengths
//     are multiples of 32) or Quartet's range-matched scales (the amax rule's codes, elements x 3/4 before rounding:
//     the codes decode to 3/4 of what they stand for); args.trust_mask (MXFP4, with data): which elements of each
//     data block were not clipped;
//   args.hadamard: size 16 or 32 along each rotated copy's quantisation direction; that direction's length must be a
//     multiple of the size and of it the block length (1x16 takes size 16; 1x32 takes 16 or 32); not with 16x16 tiles.
// An empty x (rows or cols 0) encodes nothing: only the scale arrays' padding and q.amax (0) are written, no tensor
// scale. Scale arrays' padding entries are the code of 1.0. data / data_t are written with byte stores where a row's
// bytes are not a multiple of the block's; every pointer 16-byte aligned.
void fp4_quantize(const QTensor& q, const bf16* x, const QuantizeArgs& args, cudaStream_t stream);

// out (rows, cols) FP32 = the values of q.data (transposed = true: q.data_t, (cols, rows)), fp4_codec.cuh's formula.
void fp4_dequantize(float* out, const QTensor& q, bool transposed, cudaStream_t stream);
// The same values as BF16 (MXFP4 only: e2m1 * 2^X is exact in BF16, subnormals included).
void fp4_dequantize(bf16* out, const QTensor& q, bool transposed, cudaStream_t stream);

// q from the values of src's row-wise MXFP4 codes (src.data, src.scale_inv; src and q of one shape), with
// fp4_quantize's arguments: the bytes fp4_quantize(q, x) gives for x = fp4_dequantize (bf16) of src, without writing
// x (the tiles decode the codes as they load). Quartet's backward re-quantises the forward's saved codes along
// another direction this way. MXFP4 into MXFP4 only (no tensor amax to measure), and q.amax must be null.
void fp4_requantize(const QTensor& q, const QTensor& src, const QuantizeArgs& args, cudaStream_t stream);

// Quartet's backward epilogue (arXiv 2505.14669 Alg. 1), g (rows, cols) FP32 the product of two range-matched MXFP4
// operands (cols a multiple of 32 when hadamard is 32), one thread per 32 elements of a row:
//   v = factor * g (FP32, rounded to nearest even), v = 0 where mask has bit (c % 32) of word [r * cols / 32 + c / 32]
//   clear (mask may be null: nothing masked), then, with hadamard = 32, v <- S · H32 · v per 32 consecutive elements
//   of a row (hadamard.cuh's butterflies with signs 0, then v_i negated where bit i of signs is set: the inverse of
//   the forward's rotation H32 · S, H32 being symmetric and orthogonal; signs 0 for Quartet's fixed H32), and
//   out_bf16 = v (rounded to nearest even) or out_fp32 += v (exactly one of them non-null). signs must be 0 when
//   hadamard is 0. factor is kRangeMatchProductFactor (16/9) for two range-matched operands.
void mxfp4_gradient_epilogue(bf16* out_bf16, float* out_fp32, const float* g, const uint32_t* mask, int rows, int cols,
                             float factor, int hadamard, uint32_t signs, cudaStream_t stream);

// Numerics telemetry (quantize.h's quant_stats for this family): the kQuantStatsSlots sums of x and q.data,
// deterministic (a fixed grid, fixed reduction order; as fp8_quant_stats). The saturated count counts codes +-6.
// rotation.data: q.data holds x rotated along cols; each element is compared with its rotated value (its block of
// x loaded and transformed by hadamard.cuh, as the quantiser did). The clipped count is fp4_codec.cuh's e2m1_clipped
// with the quantiser's element multiplier: MXFP4 from the stored scale code (mxfp4_element_multiplier; times 3/4
// under mxfp4_scale = RangeMatched), NVFP4 nvfp4_element_multiplier of the block code and the tensor's encode scale,
// which comes from the amax of the copy's (rotated) values: a first pass measures it (NVFP4 telemetry reads x twice).
void fp4_quant_stats(double* stats_out, const QTensor& q, const bf16* x, const HadamardOption& rotation,
                     Mxfp4Scale mxfp4_scale, cudaStream_t stream);

}  // namespace llmc
