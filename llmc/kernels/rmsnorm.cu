// llmc/kernels/rmsnorm.cu: RMSNorm (Llama) forward (plain and fused with the residual add) and backward, FP32 statistics;
// kernels and CPU references. One warp per row; parameter gradients through deterministic per-chunk partials (the
// same two-stage column sums as layernorm_backward). The optional amax outputs take one atomic per block. The forward
// kernels optionally write the FP8 1x16 copy of their input x (template kSave), the backward kernels read x through a
// loader (BF16 or that copy; llmc/kernels/fp8_groups.cuh): one copy of each algorithm, the BF16 instantiations are
// the kernels as they were.
//   out = x * rstd * weight,  rstd = 1 / sqrt(mean_c(x^2) + eps)
#include <cmath>
#include <vector>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/fp8_groups.cuh"
#include "llmc/kernels/reduce.h"
#include "llmc/kernels/layernorm.h"
#include "llmc/kernels/rmsnorm.h"

namespace llmc {

namespace {

constexpr int kRmsRowsPerBlock = 8;  // warps per block in the row kernels (one warp per row)
constexpr int kRmsBlock = kRmsRowsPerBlock * kWarpSize;

// Normalises one row x (C) into out (C) with one warp; returns rstd (same in all lanes) and, in *amax, the max of
// |bf16 out| over this lane's channels (bits, see amax_bits). Lane l handles the 8-channel chunks l, l + 32, ...; the
// row is read twice (the second read hits L1/L2). kSave: the second pass also writes row `row` of the FP8 copy of x
// into save (N rows; C a multiple of 16, so both lanes of a group are in the loop together).
template <bool kSave>
__device__ inline float rmsnorm_row(bf16* out, const bf16* x, const bf16* weight, int C, float eps, int lane,
                                    unsigned* amax, const Fp8GroupsOut& save, int row, int N) {
  float sum_sq = 0.0f;
  for (int c = lane * 8; c < C; c += kWarpSize * 8) {
    const x128 p = load128(x + c);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float v = __bfloat162float(p[k]);
      sum_sq += v * v;
    }
  }
  const float rstd = rsqrtf(warp_sum(sum_sq) / C + eps);
  unsigned m = 0;
  for (int c = lane * 8; c < C; c += kWarpSize * 8) {
    const x128 p = load128cs(x + c);
    if constexpr (kSave) fp8_groups_store8(save, p, row, c, N, C);
    const x128 w = load128(weight + c);
    x128 y;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      y[k] = __float2bfloat16_rn(__bfloat162float(p[k]) * rstd * __bfloat162float(w[k]));
      m = max(m, amax_bits(fabsf(__bfloat162float(y[k]))));
    }
    store128(out + c, y);
  }
  *amax = m;
  return rstd;
}

// out (N, C) = RMSNorm(inp (N, C)); rstd (N) (may be null: not saved); out_amax (may be null) max |out|; kSave: the
// FP8 copy of inp into save. No early return: every thread reaches the block-wide amax reduction.
template <bool kSave>
__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C,
                                       float eps, float* out_amax, const Fp8GroupsOut save) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRmsRowsPerBlock + threadIdx.x / kWarpSize;
  unsigned m = 0;
  if (row < N) {
    const float s = rmsnorm_row<kSave>(out + static_cast<size_t>(row) * C, inp + static_cast<size_t>(row) * C, weight,
                                       C, eps, lane, &m, save, row, N);
    if (lane == 0 && rstd) rstd[row] = s;
  }
  if (out_amax) block_atomic_max_amax(out_amax, m);
}

// residual (N, C) = bf16(inp1 + inp2); out = RMSNorm(residual). Each lane re-reads only what it wrote itself.
// kSave: the FP8 copy of residual into save.
template <bool kSave>
__global__ void fused_residual_rmsnorm_kernel(bf16* residual, bf16* out, float* rstd, const bf16* inp1,
                                              const bf16* inp2, const bf16* weight, int N, int C, float eps,
                                              float* out_amax, const Fp8GroupsOut save) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRmsRowsPerBlock + threadIdx.x / kWarpSize;
  unsigned m = 0;
  if (row < N) {
    const size_t offset = static_cast<size_t>(row) * C;
    for (int c = lane * 8; c < C; c += kWarpSize * 8) {
      const x128 a = load128cs(inp1 + offset + c);
      const x128 b = load128cs(inp2 + offset + c);
      x128 r;
#pragma unroll
      for (int k = 0; k < 8; k++) r[k] = __float2bfloat16_rn(__bfloat162float(a[k]) + __bfloat162float(b[k]));
      store128(residual + offset + c, r);
    }
    const float s = rmsnorm_row<kSave>(out + offset, residual + offset, weight, C, eps, lane, &m, save, row, N);
    if (lane == 0 && rstd) rstd[row] = s;
  }
  if (out_amax) block_atomic_max_amax(out_amax, m);
}

// Backward. With xhat = x * rstd and g = weight * dout:
//   dinp = rstd * (g - xhat * mean_c(g * xhat)) = rstd * g - x * rstd^3 * mean_c(g * x);  dweight = sum_rows dout * xhat
// dinp (N, C) += the row gradient. One warp per row; two passes over the row. dinp_amax: max |dinp| after the add.
// inp: the loader of x (N, C).
template <class Loader>
__global__ void rmsnorm_backward_dinp_kernel(bf16* dinp, const bf16* dout, const Loader inp, const bf16* weight,
                                             const float* rstd, int N, int C, float* dinp_amax) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRmsRowsPerBlock + threadIdx.x / kWarpSize;
  unsigned m = 0;
  if (row < N) {
    const size_t offset = static_cast<size_t>(row) * C;
    const float s = rstd[row];
    float sum_gx = 0.0f;
    for (int c = lane * 8; c < C; c += kWarpSize * 8) {
      const x128 d = load128(dout + offset + c);
      float x[8];
      inp.load8(x, offset + c, row, c);
      const x128 w = load128(weight + c);
#pragma unroll
      for (int k = 0; k < 8; k++) sum_gx += __bfloat162float(w[k]) * __bfloat162float(d[k]) * x[k];
    }
    // coefficient of x in dinp: rstd^3 * mean_c(g * x)
    const float x_coef = s * s * s * (warp_sum(sum_gx) / C);
    for (int c = lane * 8; c < C; c += kWarpSize * 8) {
      const x128 d = load128(dout + offset + c);  // plain loads: the param-partials kernel reads dout, inp next
      float x[8];
      inp.load8(x, offset + c, row, c);
      const x128 w = load128(weight + c);
      x128 di = load128(dinp + offset + c);
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const float g = __bfloat162float(w[k]) * __bfloat162float(d[k]);
        di[k] = __float2bfloat16_rn(__bfloat162float(di[k]) + (s * g - x[k] * x_coef));
        m = max(m, amax_bits(fabsf(__bfloat162float(di[k]))));
      }
      store128(dinp + offset + c, di);
    }
  }
  if (dinp_amax) block_atomic_max_amax(dinp_amax, m);
}

// Stage 1 of dweight: one thread per (row chunk, 8 channels) sums dout * x * rstd over the chunk's rows in row order.
// dweight_partials (num_row_chunks(N), C), overwritten. inp: the loader of x (N, C).
template <class Loader>
__global__ void rmsnorm_param_partials_kernel(float* dweight_partials, const bf16* dout, const Loader inp,
                                              const float* rstd, int N, int C, int num_chunks) {
  const int C8 = C / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<size_t>(num_chunks) * C8) return;
  const int chunk = static_cast<int>(idx / C8);
  const int c = static_cast<int>(idx % C8) * 8;
  float dw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int row_end = min(N, (chunk + 1) * kRowsPerChunk);
#pragma unroll 4
  for (int row = chunk * kRowsPerChunk; row < row_end; row++) {
    const x128 d = load128(dout + static_cast<size_t>(row) * C + c);
    float x[8];
    inp.load8(x, static_cast<size_t>(row) * C + c, row, c);
    const float s = rstd[row];
#pragma unroll
    for (int k = 0; k < 8; k++) dw[k] += __bfloat162float(d[k]) * (x[k] * s);
  }
  float* out = dweight_partials + static_cast<size_t>(chunk) * C + c;
  store128(out, f128{{dw[0], dw[1], dw[2], dw[3]}});
  store128(out + 4, f128{{dw[4], dw[5], dw[6], dw[7]}});
}

void check_rmsnorm_args(const char* kernel, const void* out, const void* inp, const void* weight, int C, float eps) {
  require_multiple_of_8(kernel, "C", C);
  require_aligned16(kernel, "out", out);
  require_aligned16(kernel, "inp", inp);
  require_aligned16(kernel, "weight", weight);
  if (!(eps > 0.0f)) throw_error("%s: eps = %g must be positive (model.norm_eps)", kernel, static_cast<double>(eps));
}

// The FP8 copy of a forward's input: C a multiple of 16 and the copy's pointers, when one is wanted.
void check_rmsnorm_save(const char* kernel, const Fp8GroupsOut& save, int C) {
  if (save.wanted()) require_fp8_groups(kernel, "save_inp", save.codes, save.scale_inv, C);
}

// dinp, then the dweight partials and their column sums; inp: the loader of x.
template <class Loader>
void launch_rmsnorm_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout, const Loader inp,
                             const bf16* weight, const float* rstd, int N, int C, cudaStream_t stream,
                             float* dinp_amax) {
  rmsnorm_backward_dinp_kernel<<<static_cast<int>(ceil_div(N, kRmsRowsPerBlock)), kRmsBlock, 0, stream>>>(
      dinp, dout, inp, weight, rstd, N, C, dinp_amax);
  CUDA_CHECK_LAUNCH();

  const int num_chunks = num_row_chunks(N);
  const int block = 256;
  const size_t threads = static_cast<size_t>(num_chunks) * (C / 8);
  rmsnorm_param_partials_kernel<<<ceil_div(threads, block), block, 0, stream>>>(scratch, dout, inp, rstd, N, C,
                                                                                num_chunks);
  CUDA_CHECK_LAUNCH();
  sum_column_partials(dweight, scratch, num_chunks, C, stream);
}

void check_rmsnorm_backward_args(const char* kernel, const bf16* dinp, const float* scratch, const bf16* dout,
                                 const bf16* weight, int C) {
  require_multiple_of_8(kernel, "C", C);
  require_aligned16(kernel, "dinp", dinp);
  require_aligned16(kernel, "scratch", scratch);
  require_aligned16(kernel, "dout", dout);
  require_aligned16(kernel, "weight", weight);
}

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C, float eps,
                     cudaStream_t stream, float* out_amax, const Fp8GroupsOut& save_inp) {
  check_rmsnorm_args("rmsnorm_forward", out, inp, weight, C, eps);
  check_rmsnorm_save("rmsnorm_forward", save_inp, C);
  if (N <= 0) return;
  const int grid = static_cast<int>(ceil_div(N, kRmsRowsPerBlock));
  if (save_inp.wanted())
    rmsnorm_forward_kernel<true><<<grid, kRmsBlock, 0, stream>>>(out, rstd, inp, weight, N, C, eps, out_amax,
                                                                 save_inp);
  else
    rmsnorm_forward_kernel<false><<<grid, kRmsBlock, 0, stream>>>(out, rstd, inp, weight, N, C, eps, out_amax,
                                                                  save_inp);
  CUDA_CHECK_LAUNCH();
}

void fused_residual_rmsnorm_forward(bf16* residual, bf16* out, float* rstd, const bf16* inp1, const bf16* inp2,
                                    const bf16* weight, int N, int C, float eps, cudaStream_t stream,
                                    float* out_amax, const Fp8GroupsOut& save_residual) {
  check_rmsnorm_args("fused_residual_rmsnorm_forward", out, inp1, weight, C, eps);
  require_aligned16("fused_residual_rmsnorm_forward", "inp2", inp2);
  require_aligned16("fused_residual_rmsnorm_forward", "residual", residual);
  check_rmsnorm_save("fused_residual_rmsnorm_forward", save_residual, C);
  if (N <= 0) return;
  const int grid = static_cast<int>(ceil_div(N, kRmsRowsPerBlock));
  if (save_residual.wanted())
    fused_residual_rmsnorm_kernel<true><<<grid, kRmsBlock, 0, stream>>>(residual, out, rstd, inp1, inp2, weight, N, C,
                                                                        eps, out_amax, save_residual);
  else
    fused_residual_rmsnorm_kernel<false><<<grid, kRmsBlock, 0, stream>>>(residual, out, rstd, inp1, inp2, weight, N,
                                                                         C, eps, out_amax, save_residual);
  CUDA_CHECK_LAUNCH();
}

size_t rmsnorm_backward_scratch_floats(int N, int C) {
  return static_cast<size_t>(num_row_chunks(N)) * static_cast<size_t>(C);
}

void rmsnorm_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout, const bf16* inp,
                      const bf16* weight, const float* rstd, int N, int C, cudaStream_t stream, float* dinp_amax) {
  const char* kernel = "rmsnorm_backward";
  check_rmsnorm_backward_args(kernel, dinp, scratch, dout, weight, C);
  require_aligned16(kernel, "inp", inp);
  if (N <= 0) return;
  launch_rmsnorm_backward(dinp, dweight, scratch, dout, Bf16Loader{inp}, weight, rstd, N, C, stream, dinp_amax);
}

void rmsnorm_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout, const Fp8Groups& inp,
                      const bf16* weight, const float* rstd, int N, int C, cudaStream_t stream, float* dinp_amax) {
  const char* kernel = "rmsnorm_backward (fp8 input)";
  check_rmsnorm_backward_args(kernel, dinp, scratch, dout, weight, C);
  require_fp8_groups(kernel, "inp", inp.codes, inp.scale_inv, C);
  if (N <= 0) return;
  launch_rmsnorm_backward(dinp, dweight, scratch, dout, fp8_groups_loader(inp, N), weight, rstd, N, C, stream,
                          dinp_amax);
}

}  // namespace llmc
