// llmc/precision/group_quant.cu: the FP8 1x16 group copies of llmc/precision/group_quant.h: the standalone quantiser
// and the dequantiser (one thread per 8 elements over the codec of llmc/kernels/fp8_groups.cuh, the one the producers
// use), the tensor amax from group maxima, the sizes, and the quantize() table's entries.
#include "llmc/precision/group_quant.h"

#include "llmc/core/common.h"
#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/fp8_groups.cuh"

#if defined(__CUDACC__) && defined(__USE_FAST_MATH__)
#error "llmc/precision/group_quant.cu must be compiled without --use_fast_math: the scales must match the host"
#endif

namespace llmc {

namespace {

constexpr int kGroupQuantBlock = 256;

// Thread t quantises elements 8t .. 8t + 7 of x (rows, cols): threads 2k and 2k + 1 hold one group (cols % 16 == 0).
// tensor_amax (may be null): max |x|, one atomic per block. No early return: every thread reaches the block reduction.
__global__ void fp8_groups_quantize_kernel(const Fp8GroupsOut out, float* tensor_amax, const bf16* x, int rows,
                                           int cols) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  unsigned m = 0;
  if (i < static_cast<size_t>(rows) * cols) {
    const x128 p = load128cs(x + i);
    const int row = static_cast<int>(i / cols);
    fp8_groups_store8(out, p, row, static_cast<int>(i - static_cast<size_t>(row) * cols), rows, cols);
#pragma unroll
    for (int k = 0; k < 8; k++) m = max(m, amax_bits(fabsf(__bfloat162float(p[k]))));
  }
  if (tensor_amax) block_atomic_max_amax(tensor_amax, m);
}

__global__ void fp8_groups_dequantize_kernel(float* out, const Fp8GroupsLoader in, int rows, int cols) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (i >= static_cast<size_t>(rows) * cols) return;
  const int row = static_cast<int>(i / cols);
  float v[8];
  in.load8(v, i, row, static_cast<int>(i - static_cast<size_t>(row) * cols));
  store128(out + i, f128{{v[0], v[1], v[2], v[3]}});
  store128(out + i + 4, f128{{v[4], v[5], v[6], v[7]}});
}

// One thread per entry of the (cols / 16, ld) group maxima; the padding rows (>= rows) are skipped.
__global__ void fp8_groups_tensor_amax_kernel(float* amax, const float* group_amax, int rows, int ld, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned m = 0;
  if (i < count && static_cast<int>(i % ld) < rows) m = amax_bits(fabsf(group_amax[i]));
  block_atomic_max_amax(amax, m);
}

void check_shape(const char* kernel, int rows, int cols) {
  if (rows < 0) throw_error("%s: rows = %d must be >= 0", kernel, rows);
  if (cols <= 0 || cols % kFp8GroupSize != 0)
    throw_error("%s: cols = %d must be a positive multiple of %d (the FP8 copy's group size)", kernel, cols,
                kFp8GroupSize);
}

size_t blocks_for(size_t threads) { return ceil_div(threads, kGroupQuantBlock); }

}  // namespace

bool fp8_groups_encoding(const Encoding& e) { return e == kFp8Groups1x16; }

size_t fp8_groups_code_bytes(int rows, int cols) { return code_bytes(kFp8Groups1x16, rows, cols); }
size_t fp8_groups_scale_bytes(int rows, int cols) { return scale_inv_bytes(kFp8Groups1x16, rows, cols); }
size_t fp8_groups_bytes(int rows, int cols) {
  return fp8_groups_code_bytes(rows, cols) + fp8_groups_scale_bytes(rows, cols);
}

Fp8GroupsOut fp8_groups_out(const QTensor& q, float* group_amax) {
  if (!fp8_groups_encoding(q.encoding))
    throw_error("fp8_groups_out: q.encoding is %s, not %s", encoding_name(q.encoding).c_str(),
                encoding_name(kFp8Groups1x16).c_str());
  Fp8GroupsOut out;
  out.codes = q.data;
  out.scale_inv = q.scale_inv;
  out.group_amax = group_amax;
  return out;
}

Fp8Groups fp8_groups_view(const QTensor& q) {
  if (!fp8_groups_encoding(q.encoding))
    throw_error("fp8_groups_view: q.encoding is %s, not %s", encoding_name(q.encoding).c_str(),
                encoding_name(kFp8Groups1x16).c_str());
  return Fp8Groups{q.data, q.scale_inv};
}

void fp8_groups_quantize(const Fp8GroupsOut& out, const bf16* x, int rows, int cols, cudaStream_t stream,
                         float* tensor_amax) {
  const char* kernel = "fp8_groups_quantize";
  check_shape(kernel, rows, cols);
  require_fp8_groups(kernel, "out", out.codes, out.scale_inv, cols);
  if (rows == 0) return;
  require_aligned16(kernel, "x", x);
  const size_t threads = static_cast<size_t>(rows) * cols / 8;
  fp8_groups_quantize_kernel<<<blocks_for(threads), kGroupQuantBlock, 0, stream>>>(out, tensor_amax, x, rows, cols);
  CUDA_CHECK_LAUNCH();
}

void fp8_groups_quantize(const QTensor& q, const bf16* x, const QuantizeArgs& args, cudaStream_t stream) {
  const char* kernel = "fp8_groups_quantize";
  if (q.data_t)
    throw_error("%s: q.data_t is set; the %s copies have no transposed form (they are no GEMM operand)", kernel,
                encoding_name(q.encoding).c_str());
  if (args.amax || args.amax_out || args.margin != 0)
    throw_error("%s: the %s scales come from each group's own amax; QuantizeArgs amax, amax_out and margin are for "
                "whole-tensor scales", kernel, encoding_name(q.encoding).c_str());
  const Fp8GroupsOut out = fp8_groups_out(q);
  if (q.amax) CUDA_CHECK(cudaMemsetAsync(q.amax, 0, sizeof(float), stream));
  fp8_groups_quantize(out, x, q.rows, q.cols, stream, q.amax);
}

void fp8_groups_quant_stats(double*, const QTensor& q, const bf16*, cudaStream_t) {
  throw_error("quant_stats: %s (the FP8 copies of saved activations) has no telemetry: it is no GEMM operand and no "
              "recipe measures it", encoding_name(q.encoding).c_str());
}

void fp8_groups_dequantize(float* out, const Fp8Groups& in, int rows, int cols, cudaStream_t stream) {
  const char* kernel = "fp8_groups_dequantize";
  check_shape(kernel, rows, cols);
  require_fp8_groups(kernel, "in", in.codes, in.scale_inv, cols);
  if (rows == 0) return;
  require_aligned16(kernel, "out", out);
  const size_t threads = static_cast<size_t>(rows) * cols / 8;
  fp8_groups_dequantize_kernel<<<blocks_for(threads), kGroupQuantBlock, 0, stream>>>(out, fp8_groups_loader(in, rows),
                                                                                     rows, cols);
  CUDA_CHECK_LAUNCH();
}

void fp8_groups_tensor_amax(float* amax, const float* group_amax, int rows, int cols, cudaStream_t stream) {
  const char* kernel = "fp8_groups_tensor_amax";
  check_shape(kernel, rows, cols);
  if (!amax || !group_amax) throw_error("%s: amax and group_amax must be device pointers", kernel);
  if (rows == 0) return;
  const int ld = fp8_groups_ld(rows);
  const size_t count = static_cast<size_t>(cols / kFp8GroupSize) * ld;
  fp8_groups_tensor_amax_kernel<<<blocks_for(count), kGroupQuantBlock, 0, stream>>>(amax, group_amax, rows, ld, count);
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
