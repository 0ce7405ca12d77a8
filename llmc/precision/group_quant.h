// llmc/precision/group_quant.h: the precision layer's view of the FP8 1x16 group copies that the non-linear layers
// save for backward (COAT; the format, the scale rule and the device codec are llmc/kernels/fp8_groups.h's): their
// encoding (e4m3 1x16, FP32 scales), the standalone quantiser that llmc/precision/quantize.h's table dispatches to (for
// a tensor whose producer does not write the copy itself), the dequantiser, Group Scaling's tensor amax from the group
// maxima, and the sizes that the model's activation carving and the memory plan share. Codes and scales are bit-exact
// with the CPU reference (test/reference/group_quant_ref.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/kernels/fp8_groups.h"
#include "llmc/precision/encoding.h"
#include "llmc/precision/quantize.h"
#include "llmc/precision/tensor.h"

namespace llmc {

// The encoding of the copies: E4M3 codes, one FP32 scale per row and 16 consecutive channels, no second level.
constexpr Encoding kFp8Groups1x16{ElementFormat::E4M3, kBlock1x16, ScaleFormat::FP32, false};
bool fp8_groups_encoding(const Encoding& e);  // e == kFp8Groups1x16

// Bytes of the copy of a (rows, cols) tensor: encoding.h's code_bytes and scale_inv_bytes of kFp8Groups1x16 (the
// scale array padded to whole columns of round_up(rows, 4) entries). The optional group maxima take the scale bytes
// again. rows, cols >= 0, else llmc::Error.
size_t fp8_groups_code_bytes(int rows, int cols);
size_t fp8_groups_scale_bytes(int rows, int cols);
size_t fp8_groups_bytes(int rows, int cols);  // codes + scale_inv

// The kernels' views of a QTensor of encoding kFp8Groups1x16 (its data and scale_inv).
Fp8GroupsOut fp8_groups_out(const QTensor& q, float* group_amax = nullptr);
Fp8Groups fp8_groups_view(const QTensor& q);

// out (the codes, scale_inv and, if set, group_amax of x) from x (rows, cols) bf16, cols a multiple of 16; the same
// bytes as a producer writing the copy. tensor_amax (optional): max |x| atomically maxed into it (the caller zeroed
// it).
void fp8_groups_quantize(const Fp8GroupsOut& out, const bf16* x, int rows, int cols, cudaStream_t stream,
                         float* tensor_amax = nullptr);
// The quantize() table's entry: q (encoding kFp8Groups1x16, q.data and q.scale_inv; q.data_t must be null: the copies
// have no transposed form) from x; q.amax, if set, receives max |x| (overwritten). args: the defaults only (block
// scales come from their own amax).
void fp8_groups_quantize(const QTensor& q, const bf16* x, const QuantizeArgs& args, cudaStream_t stream);
// The quantize() table's telemetry entry: refuses (the copies are no GEMM operand; no recipe measures them yet).
void fp8_groups_quant_stats(double* stats_out, const QTensor& q, const bf16* x, cudaStream_t stream);

// out (rows, cols) FP32 = e4m3_value(code) * its group's scale (the values the backward kernels compute with).
void fp8_groups_dequantize(float* out, const Fp8Groups& in, int rows, int cols, cudaStream_t stream);

// Group Scaling: the tensor amax as the max over the group maxima a producer wrote (group_amax of a (rows, cols) copy,
// padding excluded), atomically maxed into *amax (the caller zeroed it). Equal, bit for bit, to max |x|.
void fp8_groups_tensor_amax(float* amax, const float* group_amax, int rows, int cols, cudaStream_t stream);

}  // namespace llmc
