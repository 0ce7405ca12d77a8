// llmc/kernels/encoder.cu: token (+ position) embedding, forward and deterministic backward (kernels, the host-built
// EncoderBackwardPlan, and the CPU references). GPT-2 adds the learned position embedding wpe; Llama (RoPE) passes
// wpe = dwpe = null and gets the token rows alone.
#include <algorithm>
#include <numeric>
#include <vector>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/encoder.h"

namespace llmc {

// ---------------------------------------------------------------------------------------------------------------
// Forward: out (N, C) = wte[tokens[n]] (+ wpe[n % T] when wpe is non-null). One thread per 8 channels of one row.
__global__ void encoder_forward_kernel(bf16* out, const int* tokens, const bf16* wte, const bf16* wpe, int N, int T,
                                       int C) {
  const int C8 = C / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<size_t>(N) * C8) return;
  const int row = static_cast<int>(idx / C8);
  const int c = static_cast<int>(idx % C8) * 8;
  const int t = row % T;
  const x128 tok = load128(wte + static_cast<size_t>(tokens[row]) * C + c);
  if (wpe == nullptr) {  // token rows only (the bits of wte, no rounding)
    store128(out + static_cast<size_t>(row) * C + c, tok);
    return;
  }
  const x128 pos = load128(wpe + static_cast<size_t>(t) * C + c);
  x128 sum;
#pragma unroll
  for (int k = 0; k < x128::size; k++)
    sum[k] = __float2bfloat16_rn(__bfloat162float(tok[k]) + __bfloat162float(pos[k]));
  store128(out + static_cast<size_t>(row) * C + c, sum);
}

void encoder_forward(bf16* out, const int* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     cudaStream_t stream) {
  require_multiple_of_8("encoder_forward", "C", C);
  require_aligned16("encoder_forward", "out", out);
  require_aligned16("encoder_forward", "wte", wte);
  if (wpe) require_aligned16("encoder_forward", "wpe", wpe);
  const int N = B * T;
  const int block = 256;
  const size_t threads = static_cast<size_t>(N) * (C / 8);
  if (threads == 0) return;
  encoder_forward_kernel<<<ceil_div(threads, block), block, 0, stream>>>(out, tokens, wte, wpe, N, T, C);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------------------------
// The plan: positions grouped by token id (buckets in ascending token id), ascending position inside a bucket.
// A stable counting sort by token id gives exactly that order.
void EncoderBackwardPlan::build(const int* host_tokens, int B, int T, cudaStream_t stream) {
  const int N = B * T;
  int max_token = -1;
  for (int n = 0; n < N; n++) {
    if (host_tokens[n] < 0)
      throw_error("EncoderBackwardPlan::build: token %d at position %d is negative (the data shard or the "
                  "target/ignore handling is wrong: inputs must be valid token ids)",
                  host_tokens[n], n);
    max_token = std::max(max_token, host_tokens[n]);
  }
  std::vector<int> count(static_cast<size_t>(max_token) + 2, 0);  // count[tok + 1] = occurrences of tok
  for (int n = 0; n < N; n++) count[host_tokens[n] + 1]++;
  std::vector<int> starts_by_token(count.size(), 0);  // exclusive prefix sum: first slot of each token
  std::partial_sum(count.begin(), count.end(), starts_by_token.begin());
  std::vector<int> positions(N);
  std::vector<int> next_slot(starts_by_token.begin(), starts_by_token.end() - 1);
  for (int n = 0; n < N; n++) positions[next_slot[host_tokens[n]]++] = n;  // ascending n inside each token

  std::vector<int> bucket_starts, bucket_tokens;
  for (int tok = 0; tok <= max_token; tok++) {
    if (count[tok + 1] == 0) continue;
    bucket_tokens.push_back(tok);
    bucket_starts.push_back(starts_by_token[tok]);
  }
  bucket_starts.push_back(N);
  // Launch order: largest bucket first (ties by token id), so the few frequent tokens (thousands of rows in a batch
  // of text) start at once and the many small buckets fill the GPU around them. Results do not depend on it.
  std::vector<int> order(bucket_tokens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return bucket_starts[a + 1] - bucket_starts[a] > bucket_starts[b + 1] - bucket_starts[b];
  });

  if (capacity < static_cast<size_t>(N)) {  // one bucket per position at most, so N bounds every array
    free();
    CUDA_CHECK(cudaMalloc(&d_bucket_starts, (static_cast<size_t>(N) + 1) * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_bucket_tokens, static_cast<size_t>(N) * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_positions, static_cast<size_t>(N) * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_bucket_order, static_cast<size_t>(N) * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&h_staging, (4 * static_cast<size_t>(N) + 1) * sizeof(int)));
    CUDA_CHECK(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming));
    capacity = N;
  } else {
    CUDA_CHECK(cudaEventSynchronize(uploaded));  // the previous upload has finished reading the staging buffer
  }
  // Stage in pinned memory: an asynchronous copy may read its host source after this function returns (with
  // pageable memory some drivers do so too), so the source must outlive the call.
  int* h_starts = h_staging;
  int* h_tokens = h_starts + bucket_starts.size();
  int* h_positions = h_tokens + bucket_tokens.size();
  int* h_order = h_positions + positions.size();
  std::copy(bucket_starts.begin(), bucket_starts.end(), h_starts);
  std::copy(bucket_tokens.begin(), bucket_tokens.end(), h_tokens);
  std::copy(positions.begin(), positions.end(), h_positions);
  std::copy(order.begin(), order.end(), h_order);
  CUDA_CHECK(cudaMemcpyAsync(d_bucket_starts, h_starts, bucket_starts.size() * sizeof(int), cudaMemcpyHostToDevice,
                             stream));
  CUDA_CHECK(cudaMemcpyAsync(d_bucket_tokens, h_tokens, bucket_tokens.size() * sizeof(int), cudaMemcpyHostToDevice,
                             stream));
  CUDA_CHECK(cudaMemcpyAsync(d_positions, h_positions, positions.size() * sizeof(int), cudaMemcpyHostToDevice,
                             stream));
  CUDA_CHECK(cudaMemcpyAsync(d_bucket_order, h_order, order.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaEventRecord(uploaded, stream));
  num_buckets = static_cast<int>(bucket_tokens.size());  // after the (re)allocation above: free() resets it
}

void EncoderBackwardPlan::free() {
  if (d_bucket_starts) CUDA_CHECK(cudaFree(d_bucket_starts));
  if (d_bucket_tokens) CUDA_CHECK(cudaFree(d_bucket_tokens));
  if (d_positions) CUDA_CHECK(cudaFree(d_positions));
  if (d_bucket_order) CUDA_CHECK(cudaFree(d_bucket_order));
  if (uploaded) CUDA_CHECK(cudaEventSynchronize(uploaded));
  if (h_staging) CUDA_CHECK(cudaFreeHost(h_staging));
  if (uploaded) CUDA_CHECK(cudaEventDestroy(uploaded));
  d_bucket_starts = d_bucket_tokens = d_positions = d_bucket_order = nullptr;
  h_staging = nullptr;
  uploaded = nullptr;
  num_buckets = 0;
  capacity = 0;
}

// dwte: one block per bucket (token), blocks in the plan's launch order. The block is kWteRowGroups groups of
// threads; in a group each thread owns 8 channels. Group g sums the bucket's rows g, g + kWteRowGroups, ... (in the
// plan's order) in FP32, then thread (0, c) adds the groups' sums in group order into dwte[token] (exactly one block
// touches each dwte row: no atomics, a fixed order). The groups keep a frequent token's thousands of rows from being
// one thread's serial loop, which made this kernel the tail of the backward (0.86 ms at GPT-2 124M, B = 32).
constexpr int kWteRowGroups = 8;

__global__ void wte_backward_kernel(float* dwte, const bf16* dout, const int* bucket_starts, const int* bucket_tokens,
                                    const int* positions, const int* bucket_order, int C) {
  extern __shared__ float group_sums[];  // (kWteRowGroups, blockDim.x * 8)
  const int bucket = bucket_order[blockIdx.x];
  const int begin = bucket_starts[bucket], end = bucket_starts[bucket + 1];
  const int group = threadIdx.y;
  float* dwte_row = dwte + static_cast<size_t>(bucket_tokens[bucket]) * C;
  for (int c0 = 0; c0 < C; c0 += blockDim.x * 8) {
    const int c = c0 + threadIdx.x * 8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c < C) {
#pragma unroll 4
      for (int i = begin + group; i < end; i += kWteRowGroups) {
        const x128 d = load128(dout + static_cast<size_t>(positions[i]) * C + c);
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] += __bfloat162float(d[k]);
      }
    }
    float* mine = group_sums + (static_cast<size_t>(group) * blockDim.x + threadIdx.x) * 8;
#pragma unroll
    for (int k = 0; k < 8; k++) mine[k] = acc[k];
    __syncthreads();
    if (group == 0 && c < C) {
      for (int g = 1; g < kWteRowGroups; g++) {
        const float* theirs = group_sums + (static_cast<size_t>(g) * blockDim.x + threadIdx.x) * 8;
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] += theirs[k];
      }
#pragma unroll
      for (int half = 0; half < 2; half++) {
        f128 w = load128(dwte_row + c + 4 * half);
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] += acc[4 * half + k];
        store128(dwte_row + c + 4 * half, w);
      }
    }
    __syncthreads();  // group_sums is rewritten by the next column chunk
  }
}

// dwpe (T, C) += sum over b (in order b = 0 .. B-1) of dout[b, t]. One thread per (t, 8 channels).
__global__ void wpe_backward_kernel(float* dwpe, const bf16* dout, int B, int T, int C) {
  const int C8 = C / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<size_t>(T) * C8) return;
  const int t = static_cast<int>(idx / C8);
  const int c = static_cast<int>(idx % C8) * 8;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int b = 0; b < B; b++) {
    const x128 d = load128(dout + (static_cast<size_t>(b) * T + t) * C + c);
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] += __bfloat162float(d[k]);
  }
  float* dwpe_row = dwpe + static_cast<size_t>(t) * C + c;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    f128 w = load128(dwpe_row + 4 * half);
#pragma unroll
    for (int k = 0; k < 4; k++) w[k] += acc[4 * half + k];
    store128(dwpe_row + 4 * half, w);
  }
}

void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const EncoderBackwardPlan& plan, int B, int T,
                      int C, cudaStream_t stream) {
  require_multiple_of_8("encoder_backward", "C", C);
  require_aligned16("encoder_backward", "dwte", dwte);
  if (dwpe) require_aligned16("encoder_backward", "dwpe", dwpe);
  require_aligned16("encoder_backward", "dout", dout);
  if (plan.capacity < static_cast<size_t>(B) * T)
    throw_error("encoder_backward: the plan holds %zu positions but B*T = %d (call plan.build with this "
                "micro-batch's tokens first)",
                plan.capacity, B * T);
  if (plan.num_buckets > 0) {
    // threads per group: C / 8 rounded up to whole warps, at most 1024 / kWteRowGroups (wider rows loop)
    const int width = std::min(1024 / kWteRowGroups, static_cast<int>(round_up(C / 8, kWarpSize)));
    const dim3 block(width, kWteRowGroups);
    const size_t smem = static_cast<size_t>(kWteRowGroups) * width * 8 * sizeof(float);
    wte_backward_kernel<<<plan.num_buckets, block, smem, stream>>>(dwte, dout, plan.d_bucket_starts,
                                                                   plan.d_bucket_tokens, plan.d_positions,
                                                                   plan.d_bucket_order, C);
    CUDA_CHECK_LAUNCH();
  }
  const int block = 256;
  const size_t threads = static_cast<size_t>(T) * (C / 8);
  if (threads == 0 || dwpe == nullptr) return;
  wpe_backward_kernel<<<ceil_div(threads, block), block, 0, stream>>>(dwpe, dout, B, T, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
