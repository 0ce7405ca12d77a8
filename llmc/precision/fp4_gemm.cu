// llmc/precision/fp4_gemm.cu: the kernels behind llmc/precision/fp4_gemm.h. The MXFP4 remap gives each thread one
// 32-element MXFP4 block and each group of four consecutive lanes one (row, 128-column) run: the group takes the
// maximum element exponent (its outer scale), re-encodes through a per-block table and counts; the NVFP4 expansion is
// one thread per 16-column block of a row (8 columns where K is not a multiple of 16). Element and block arithmetic:
// llmc/precision/fp4_remap.cuh.
#include "llmc/precision/fp4_gemm.h"

#include <climits>

#include "llmc/core/common.h"
#include "llmc/core/cuda_utils.cuh"
#include "llmc/precision/encoding.h"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/fp4_remap.cuh"
#include "llmc/precision/scale_math.cuh"

#if defined(__CUDACC__) && defined(__USE_FAST_MATH__)
#error "llmc/precision/fp4_gemm.cu must be compiled without --use_fast_math: host and device must agree bit for bit"
#endif

namespace llmc {

namespace {

constexpr int kThreads = 256;
constexpr int kMxfp4Block = 32;
constexpr int kRunLanes = kE4m3RemapColumns / kMxfp4Block;  // 4 threads (blocks) per outer-scale run
static_assert(kE4m3RemapColumns % kMxfp4Block == 0, "a run holds whole MXFP4 blocks");
static_assert(kRunLanes == 4 && 32 % kRunLanes == 0, "a run's threads are an aligned group of lanes");

unsigned grid_for(size_t threads, const char* who) {
  const size_t blocks = ceil_div(threads, kThreads);
  if (blocks > 0x7fffffffu) throw_error("%s: %zu threads are too many for one launch", who, threads);
  return static_cast<unsigned>(blocks);
}

// codes (rows, Kp), scale_inv [j * ld + r] (j < Kp / 128, r < ld): one thread per 32-element MXFP4 block (r, b),
// b running fastest, so the four threads of a 128-column run are four consecutive lanes (Kp / 32 is a multiple of 4):
// they take the run's largest element exponent by two shuffles, re-encode their blocks through the block's table
// (fp4_remap.cuh: mxfp4_block_to_e4m3) and store 32 code bytes each.
// `vector`: a row's code bytes are 16-byte aligned (K % 32 == 0, src aligned), so a whole block is one 16-byte load.
__global__ void __launch_bounds__(kThreads) mxfp4_to_e4m3_kernel(uint8_t* codes, float* scale_inv,
                                                                 unsigned long long* inexact_blocks,
                                                                 const uint8_t* src, const uint8_t* src_scales,
                                                                 int rows, int K, int Kp, int src_ld, int ld,
                                                                 bool vector) {
  const int blocks_per_row = Kp / kMxfp4Block;
  const size_t id = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool in_grid = id < static_cast<size_t>(ld) * blocks_per_row;  // whole runs: all four lanes or none
  const int r = in_grid ? static_cast<int>(id / blocks_per_row) : 0;
  const int b = in_grid ? static_cast<int>(id % blocks_per_row) : 0;
  const int c0 = b * kMxfp4Block;  // this block's first element
  const bool active = in_grid && r < rows;
  const bool block_in = active && c0 < K;  // a block with any element < K has its scale
  const uint8_t s = block_in ? src_scales[static_cast<size_t>(b) * src_ld + r] : kE8M0One;
  uint32_t words[kMxfp4BlockWords] = {0, 0, 0, 0};  // zero codes past K
  const size_t row_bytes = (static_cast<size_t>(K) + 1) / 2;
  const uint8_t* row = src + static_cast<size_t>(r) * row_bytes;
  if (block_in && vector) {
    const uint4 packed = *reinterpret_cast<const uint4*>(row + c0 / 2);
    words[0] = packed.x, words[1] = packed.y, words[2] = packed.z, words[3] = packed.w;
  } else if (block_in) {
#pragma unroll
    for (int i = 0; i < kMxfp4Block; i++)  // unrolled: the words stay in registers
      if (c0 + i < K) words[i / 8] |= static_cast<uint32_t>(e2m1_nibble(row[(c0 + i) / 2], c0 + i)) << (4 * (i % 8));
  }
  // the largest element exponent of this block's nonzero elements (none for a NaN block)
  const int top_p = mxfp4_block_top_p(words);
  int top = s != kE8M0NanCode && top_p != INT_MIN ? static_cast<int>(s) - kE8M0Bias + top_p : INT_MIN;
  for (int offset = 1; offset < kRunLanes; offset *= 2) top = max(top, __shfl_xor_sync(0xffffffffu, top, offset));
  const int R = top == INT_MIN ? 0 : top - kE4M3TopExponent;

  bool inexact = false;
  if (active) {
    uint32_t packed[kMxfp4Block / 4];
    inexact = mxfp4_block_to_e4m3(words, s, R, packed);
    if (!vector) {  // elements past K are code 0 (the NaN scale's table would give them the NaN code)
#pragma unroll
      for (int i = 0; i < kMxfp4Block; i++)
        if (c0 + i >= K) packed[i / 4] &= ~(0xFFu << (8 * (i % 4)));
    }
    uint4* dst = reinterpret_cast<uint4*>(codes + static_cast<size_t>(r) * Kp + c0);  // Kp % 128 == 0: aligned
    dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  }
  if (in_grid && b % kRunLanes == 0)  // the run's outer scale; padding rows of the layout get 1
    scale_inv[static_cast<size_t>(b / kRunLanes) * ld + r] = r < rows ? pow2_float(R) : 1.0f;
  const unsigned count = __popc(__ballot_sync(0xffffffffu, inexact));  // each inexact block once
  if (count != 0 && threadIdx.x % 32 == 0) atomicAdd(inexact_blocks, static_cast<unsigned long long>(count));
}

// One thread per C output columns of a row (C = 8 or 16; Kp is a multiple of C, and C columns never straddle a
// 16-column NVFP4 block: one scale code). `vector`: the row's code bytes are C / 2-byte aligned (K % C == 0, src
// aligned) and out is 16-byte aligned, so the C codes are one 32- or 64-bit load and the values one or two 128-bit
// stores; otherwise the codes are gathered byte by byte and the values stored element by element, zeros past K
// (C = 8 only). The values come from the block's table (nvfp4_block_values: nvfp4_element_value's, exact in BF16).
template <int C>
__global__ void __launch_bounds__(kThreads) nvfp4_to_bf16_kernel(bf16* out, const uint8_t* src,
                                                                 const uint8_t* src_scales, int rows, int K, int Kp,
                                                                 BlockShape block, int src_ld, bool vector) {
  static_assert(C == 8 || C == 16, "8 or 16 columns per thread");
  const int chunks = Kp / C;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * chunks) return;
  const int r = static_cast<int>(i / chunks), c0 = static_cast<int>(i % chunks) * C;
  const size_t row_bytes = (static_cast<size_t>(K) + 1) / 2;
  const uint8_t* codes = src + r * row_bytes;
  uint32_t values[C / 8][4] = {};  // two BF16 per word
  if (c0 < K) {
    uint32_t words[C / 8] = {};
    if (vector) {
      if constexpr (C == 16) {
        const uint2 pair = *reinterpret_cast<const uint2*>(codes + c0 / 2);
        words[0] = pair.x, words[C / 8 - 1] = pair.y;
      } else {
        words[0] = *reinterpret_cast<const uint32_t*>(codes + c0 / 2);
      }
    } else {
#pragma unroll
      for (int k = 0; k < C; k++)  // unrolled: words stays in registers
        if (c0 + k < K)
          words[k / 8] |= static_cast<uint32_t>(e2m1_nibble(codes[(c0 + k) / 2], c0 + k)) << (4 * (k % 8));
    }
    const Nvfp4BlockValues table = nvfp4_block_values(src_scales[scale_index(block, r, c0, src_ld)]);
#pragma unroll
    for (int h = 0; h < C / 8; h++) nvfp4_values_word(table, words[h], values[h]);
  }
  bf16* dst = out + static_cast<size_t>(r) * Kp + c0;
  if (vector) {
#pragma unroll
    for (int h = 0; h < C / 8; h++)
      reinterpret_cast<uint4*>(dst)[h] = make_uint4(values[h][0], values[h][1], values[h][2], values[h][3]);
  } else {
    for (int k = 0; k < C; k++)  // zeros past K (a gathered zero code is +-0, or NaN in a NaN-scale block)
      dst[k] = __ushort_as_bfloat16(
          c0 + k < K ? static_cast<unsigned short>(values[k / 8][(k % 8) / 2] >> (16 * (k % 2))) : 0);
  }
}

__global__ void nvfp4_gemm_alpha_kernel(float* alpha_beta, const float* a_tsi, const float* b_tsi, float beta) {
  alpha_beta[0] = mul_rn(a_tsi[0], b_tsi[0]);
  alpha_beta[1] = beta;
}

void check_operand(const char* who, const QuantOperand& src, int rows, int K, bool want_mxfp4) {
  if (want_mxfp4 ? !mxfp4_encoding(src.encoding) : !nvfp4_encoding(src.encoding))
    throw_error("%s: src is %s; it takes %s", who, encoding_name(src.encoding).c_str(),
                want_mxfp4 ? "e2m1 1x32 e8m0 scales (MXFP4)" : "e2m1 1x16 or 16x16 e4m3 scales + fp32 tensor scale (NVFP4)");
  if (rows < 1 || K < 1) throw_error("%s: rows = %d, K = %d must be >= 1", who, rows, K);
  if (src.data == nullptr || src.scale_inv == nullptr)
    throw_error("%s: src.data and src.scale_inv must be device pointers", who);
}

}  // namespace

int mxfp4_remap_cols(int K) { return static_cast<int>(round_up(static_cast<size_t>(K), kE4m3RemapColumns)); }
int nvfp4_expand_cols(int K) { return static_cast<int>(round_up(static_cast<size_t>(K), kBf16ExpandColumns)); }

void mxfp4_to_e4m3(uint8_t* codes, float* scale_inv, unsigned long long* inexact_blocks, const QuantOperand& src,
                   int rows, int K, cudaStream_t stream) {
  const char* who = "mxfp4_to_e4m3";
  check_operand(who, src, rows, K, true);
  if (codes == nullptr || scale_inv == nullptr || inexact_blocks == nullptr)
    throw_error("%s: codes, scale_inv and inexact_blocks must be device pointers", who);
  if (reinterpret_cast<uintptr_t>(codes) % 16 != 0) throw_error("%s: codes (%p) must be 16-byte aligned", who, codes);
  const int Kp = mxfp4_remap_cols(K);
  const Encoding out_encoding{ElementFormat::E4M3, kBlock1x128, ScaleFormat::Pow2FP32};
  const int ld = scale_inv_ld(out_encoding, rows, Kp);
  const size_t threads = static_cast<size_t>(ld) * (Kp / kMxfp4Block);
  const bool vector = K % kMxfp4Block == 0 && reinterpret_cast<uintptr_t>(src.data) % 16 == 0;
  mxfp4_to_e4m3_kernel<<<grid_for(threads, who), kThreads, 0, stream>>>(
      codes, scale_inv, inexact_blocks, src.data, reinterpret_cast<const uint8_t*>(src.scale_inv), rows, K, Kp,
      scale_inv_ld(src.encoding, rows, K), ld, vector);
  CUDA_CHECK_LAUNCH();
}

void nvfp4_to_bf16(bf16* out, const QuantOperand& src, int rows, int K, cudaStream_t stream) {
  const char* who = "nvfp4_to_bf16";
  check_operand(who, src, rows, K, false);
  if (out == nullptr) throw_error("%s: out must be a device pointer", who);
  const int Kp = nvfp4_expand_cols(K);
  const uintptr_t src_at = reinterpret_cast<uintptr_t>(src.data);
  const bool out_aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const uint8_t* scales = reinterpret_cast<const uint8_t*>(src.scale_inv);
  const int src_ld = scale_inv_ld(src.encoding, rows, K);
  if (K % 16 == 0 && src_at % 8 == 0 && out_aligned) {  // whole 16-column blocks: one scale load per thread
    const size_t threads = static_cast<size_t>(rows) * (Kp / 16);
    nvfp4_to_bf16_kernel<16><<<grid_for(threads, who), kThreads, 0, stream>>>(out, src.data, scales, rows, K, Kp,
                                                                              src.encoding.block, src_ld, true);
  } else {
    const size_t threads = static_cast<size_t>(rows) * (Kp / kBf16ExpandColumns);
    const bool vector = K % kBf16ExpandColumns == 0 && src_at % 4 == 0 && out_aligned;
    nvfp4_to_bf16_kernel<kBf16ExpandColumns><<<grid_for(threads, who), kThreads, 0, stream>>>(
        out, src.data, scales, rows, K, Kp, src.encoding.block, src_ld, vector);
  }
  CUDA_CHECK_LAUNCH();
}

void nvfp4_gemm_alpha(float* alpha_beta, const float* a_tensor_scale_inv, const float* b_tensor_scale_inv, float beta,
                      cudaStream_t stream) {
  if (alpha_beta == nullptr || a_tensor_scale_inv == nullptr || b_tensor_scale_inv == nullptr)
    throw_error("nvfp4_gemm_alpha: alpha_beta and both operands' tensor_scale_inv must be device pointers");
  nvfp4_gemm_alpha_kernel<<<1, 1, 0, stream>>>(alpha_beta, a_tensor_scale_inv, b_tensor_scale_inv, beta);
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
