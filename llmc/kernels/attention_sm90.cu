// llmc/kernels/attention_sm90.cu: causal attention for head size 64 on Hopper tensor cores (wgmma, sm_90a): forward and the
// dK/dV and dQ parts of the backward. Same math, layouts, masking and determinism as the portable mma.sync kernels in
// llmc/kernels/attention.cu (whose CPU references test both); only the matrix products change instruction.
//
// Why: mma.sync reaches 130-180 TFLOP/s on these shapes; wgmma issues a 64 x 64 x 16 product per warpgroup (four
// warps) asynchronously, reading its B operand straight from shared memory, which frees the registers and the issue
// slots that ldmatrix + mma.sync spend. Measured on H100 at GPT-2 124M shapes (dev/cuda/bench_attention, T = 1024):
// B=16 forward 0.144 -> 0.102 ms, backward 0.509 -> 0.355 ms (cuDNN through PyTorch on the same GPU: 0.114 / 0.426);
// B=32 forward 0.321 -> 0.206 ms, backward 1.036 -> 0.675 ms.
//
// Structure (all three kernels): a CTA is two warpgroups (256 threads); each warpgroup owns 64 rows (queries in the
// forward and dQ, keys in dK/dV) whose operand (Q, dO, K or V) it keeps in registers as wgmma A fragments for the
// whole kernel. The other side streams through shared memory in 64-row tiles: every thread issues cp.async copies
// into a ring of four stages guarded by mbarriers (StageRing), so the two warpgroups need not meet every iteration:
//   forward  CTA = (b, h, 128 queries); streams K, V blocks 0..diagonal.  S = Q K^T, online softmax, O += P V.
//   dK/dV    CTA = (b, kv head, 128 keys); streams Q, dO (+ lse, D) of every query head of the group and every query
//            block at or after the keys.  S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.
//   dQ       CTA = (b, h, 128 queries); streams K, V.  S = Q K^T, dP = dO V^T, dQ += dS K.
// Products whose result feeds the next product (P, dS) pass through registers: a wgmma accumulator tile has the same
// per-warp layout as an A fragment (llmc/kernels/mma_ptx.cuh), so it is only rounded to bf16 and packed.
//
// Shared tiles: (64 rows, 64 bf16) = 128 bytes per row, stored with the 128-byte swizzle that wgmma descriptors
// understand: 16-byte chunk c of row r sits at r*128 + 16*(c ^ (r % 8)), tiles 1024-byte aligned. The same tile serves
// as a "K-major" operand (its 64 columns are the reduction dimension: Q and dO in S^T / dP^T, K and V in S / dP) and as
// an "MN-major" B operand (its rows are the reduction dimension: V in P V, dO in P^T dO, Q in dS^T Q, K in dS K).
#include "llmc/kernels/attention_sm90.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/mma_ptx.cuh"

// Kernel bodies exist in the sm_90a device pass (and in the host pass, which only parses them); a build for other
// architectures gets empty kernels that the host side never launches (attention_sm90_available()).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLM8_SM90_KERNEL_BODY 1
#endif

namespace llmc {
namespace {

using namespace ptx;

constexpr int kHeadSize = 64;
constexpr int kRowBytes = kHeadSize * 2;                        // 128: one swizzle row
constexpr int kTileRows = 64;                                   // rows per shared tile and per warpgroup
constexpr int kTileBytes = kTileRows * kRowBytes;               // 8 KiB
constexpr int kWarpgroupThreads = 128;
constexpr int kSmemAlign = 1024;                                // swizzle atoms are 1024-byte aligned

// Kernel shape: two warpgroups per CTA (128 rows), four pipeline stages. Measured on H100 at GPT-2 124M, B=32 (the
// alternatives were slower: one warpgroup per CTA, which streams every tile to half as many rows: forward +50%,
// backward +14%; two stages: backward +4%; FlashAttention-3's ping-pong turn-taking of the two warpgroups on top of
// the stage ring: backward +5%).

constexpr int kWarpgroups = 2;
constexpr int kThreads = kWarpgroupThreads * kWarpgroups;
constexpr int kCtaRows = kTileRows * kWarpgroups;
constexpr int kStages = 4;

#ifdef LLM8_SM90_KERNEL_BODY  // the device helpers: only where the kernels have bodies
constexpr int kKSteps = kHeadSize / 16;  // 16-wide k-steps of a product over the head dim
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kSoftmaxScale = 0.125f;                         // 1/sqrt(64), exact
constexpr float kScaleLog2 = kSoftmaxScale * kLog2e;

// ---------------------------------------------------------------------------------------------------------------
// wgmma wrappers (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate")

// Shared-memory matrix descriptor for a 128-byte-swizzled operand: start address, leading byte offset (unused by
// swizzled K-major operands and by MN-major ones one swizzle atom wide, as all of ours are: 1), stride byte offset
// (1024: from one group of 8 rows to the next), swizzle mode 1 = 128 B (bits 62-63). Addresses are in 16-byte units.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t address) {
  return (uint64_t)((address & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
// k-step kk of a K-major operand (rows = M or N, the 64 columns = the reduction): 16 columns = 32 bytes along the row.
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t tile, int kk) {
  return smem_descriptor(tile + kk * 32);
}
// k-step kk of an MN-major B operand (rows = the reduction, the 64 columns = N): 16 rows further.
__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t tile, int kk) {
  return smem_descriptor(tile + kk * 16 * kRowBytes);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending of the most recently committed wgmma groups are still running (groups finish in order).
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Makes the generic-proxy writes (cp.async) to shared memory visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// mbarriers (PTX "Parallel Synchronization and Communication Instructions: mbarrier"), CTA scope.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives on `bar` once every cp.async this thread issued before has landed (the arrival is in the barrier's count).
__device__ __forceinline__ void mbarrier_arrive_after_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase with the given parity (0 for the first phase, 1 for the second, ...) has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_again;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// A ring of kStages shared-memory stages that every thread of the CTA fills with cp.async and every warpgroup reads.
// Iteration `it` uses stage it % kStages. full[s] completes when all kThreads threads' copies into the stage have
// landed; empty[s] when all warps have finished reading it. Unlike a __syncthreads per iteration, this lets the
// warpgroups drift apart by up to one iteration, so one's softmax overlaps the other's tensor-core products.
struct StageRing {
  uint32_t bars;  // shared address of full[kStages] then empty[kStages]
  __device__ uint32_t full(int stage) const { return bars + 8 * stage; }
  __device__ uint32_t empty(int stage) const { return bars + 8 * (kStages + stage); }
  // Initialises the barriers at shared address `address` (8-byte aligned). Ends with __syncthreads.
  __device__ explicit StageRing(uint32_t address) : bars(address) {
    if (threadIdx.x == 0) {
      for (int st = 0; st < kStages; st++) {
        mbarrier_init(full(st), kThreads);
        mbarrier_init(empty(st), kThreads / 32);
      }
    }
    __syncthreads();
  }
  // Before refilling the stage for iteration `it`: the readers of iteration it - kStages are done with it.
  __device__ void wait_empty(int it) const {
    if (it >= kStages) mbarrier_wait(empty(it % kStages), (uint32_t)((it / kStages - 1) & 1));
  }
  // After this thread has issued its copies for iteration `it`.
  __device__ void commit_fill(int it) const { mbarrier_arrive_after_cp_async(full(it % kStages)); }
  // Before reading the stage of iteration `it` (with wgmma: the copies become visible to the async proxy).
  __device__ void wait_full(int it) const {
    mbarrier_wait(full(it % kStages), (uint32_t)((it / kStages) & 1));
    fence_proxy_async();
  }
  // After this warp's last read of the stage of iteration `it` (its wgmma groups waited for).
  __device__ void release(int it) const {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbarrier_arrive(empty(it % kStages));
  }
};

// Keeps the compiler from moving accesses of an accumulator across a wgmma wait (the hardware writes it late).
__device__ __forceinline__ void fence_accumulator(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x 64 fp32, this warpgroup) = (accumulate ? d : 0) + A (64 x 16 bf16, registers) * B (16 x 64 bf16, shared).
// kTransB = 0: B given K-major (as an (N, K) tile); 1: MN-major (as a (K, N) tile).
// Accumulator layout: warp w of the warpgroup holds rows 16w..16w+15; d[4j + e] = row 16w + lane/4 + 8*(e/2),
// column 8j + 2*(lane%4) + e%2 (j = 0..7), i.e. per 8-column tile the mma.sync c[] layout.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc,
                                                bool accumulate) {
#ifdef LLM8_SM90_KERNEL_BODY
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(kTransB), "r"((int)accumulate));
#endif
}

// Full product over the 64-wide reduction: d = (accumulate ? d : 0) + A (64 x 64, fragments a[kk]) * B (64 x 64 tile).
template <int kTransB>
__device__ __forceinline__ void wgmma_issue_64x64x64(float (&d)[32], const uint32_t (&a)[kKSteps][4], uint32_t tile,
                                                     bool accumulate) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk++) {
    const uint64_t desc = kTransB ? mn_major_descriptor(tile, kk) : k_major_descriptor(tile, kk);
    wgmma_m64n64k16<kTransB>(d, a[kk], desc, accumulate || kk > 0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Operand staging

// Copies rows [row0, row0 + 64) of one head (64 contiguous bf16 per row, rows `row_stride` apart) into a swizzled
// shared tile at shared address `tile`; rows at or beyond T are zero-filled. All kThreads threads, asynchronous.
// Thread i copies 16-byte chunk i % 8 of rows i / 8 + k * kThreads / 8: its swizzled column is the same in every row
// it copies (kThreads / 8 is a multiple of 8), so the addresses are one base plus constant steps.
__device__ __forceinline__ void load_tile_async(uint32_t tile, const bf16* head, int row0, int T, size_t row_stride) {
  constexpr int kRowsPerPass = kThreads / 8;
  static_assert(kRowsPerPass % 8 == 0 && kTileRows % kRowsPerPass == 0, "tile rows must split into whole passes");
  const int chunk = threadIdx.x % 8, first_row = threadIdx.x / 8;
  const uint32_t dst = tile + first_row * kRowBytes + ((chunk ^ (first_row % 8)) << 4);
  const bf16* src = head + (size_t)(row0 + first_row) * row_stride + chunk * 8;
#pragma unroll
  for (int k = 0; k < kTileRows / kRowsPerPass; k++) {
    const bool valid = row0 + first_row + k * kRowsPerPass < T;
    cp_async_16(dst + k * kRowsPerPass * kRowBytes, valid ? src + (size_t)k * kRowsPerPass * row_stride : head, valid);
  }
}

// This thread's A fragments of the warpgroup's 64 rows [row0, row0 + 64) of one head, read from global memory once:
// a[kk] covers columns 16kk..16kk+15 (mma_ptx.cuh layout, warp w of the warpgroup taking rows 16w..16w+15).
// Rows at or beyond T are zero.
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[kKSteps][4], const bf16* head, int row0, int T,
                                                 size_t row_stride) {
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int r0 = row0 + warp * 16 + lane / 4, r1 = r0 + 8;
  const int c = 2 * (lane % 4);
  const uint32_t* row_lo = reinterpret_cast<const uint32_t*>(head + (size_t)(r0 < T ? r0 : 0) * row_stride + c);
  const uint32_t* row_hi = reinterpret_cast<const uint32_t*>(head + (size_t)(r1 < T ? r1 : 0) * row_stride + c);
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk++) {
    a[kk][0] = r0 < T ? row_lo[kk * 8] : 0u;  // 16kk columns = 8kk words further
    a[kk][1] = r1 < T ? row_hi[kk * 8] : 0u;
    a[kk][2] = r0 < T ? row_lo[kk * 8 + 4] : 0u;
    a[kk][3] = r1 < T ? row_hi[kk * 8 + 4] : 0u;
  }
}

// A fragments (k-steps over the 64 columns) from a 64 x 64 fp32 accumulator, rounded to bf16.
__device__ __forceinline__ void accumulator_to_a_fragments(uint32_t (&a)[kKSteps][4], const float (&d)[32]) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk++) {
    const float(&lo)[4] = *reinterpret_cast<const float(*)[4]>(&d[8 * kk]);
    const float(&hi)[4] = *reinterpret_cast<const float(*)[4]>(&d[8 * kk + 4]);
    accumulators_to_a_fragment(a[kk], lo, hi);
  }
}

// 1024-byte aligned start of the dynamic shared memory (the launch asks for kSmemAlign extra bytes).
__device__ __forceinline__ uint32_t aligned_smem_base(const unsigned char* smem_raw) {
  return (smem_address(smem_raw) + kSmemAlign - 1) & ~(uint32_t)(kSmemAlign - 1);
}

// Writes this thread's share of a warpgroup's 64 x 64 result (rows row0 + 16w + lane/4 (+8), scaled) as bf16 rows
// of `dst` (row stride `row_stride`); rows at or beyond T are skipped. Returns the max |value| written (amax bits).
__device__ __forceinline__ unsigned store_rows(bf16* dst, size_t row_stride, const float (&d)[32], int row0, int T,
                                               const float (&row_scale)[2]) {
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  unsigned bits = 0;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = row0 + warp * 16 + lane / 4 + r * 8;
    if (t >= T) continue;
    bf16* row = dst + (size_t)t * row_stride;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const int col = j * 8 + (lane % 4) * 2;
      const __nv_bfloat162 v =
          __floats2bfloat162_rn(d[4 * j + 2 * r] * row_scale[r], d[4 * j + 2 * r + 1] * row_scale[r]);
      *reinterpret_cast<__nv_bfloat162*>(row + col) = v;
      bits = max(bits, amax_bits(fmaxf(fabsf(__low2float(v)), fabsf(__high2float(v)))));
    }
  }
  return bits;
}

// Writes the column sums of a CTA's (kCtaRows, 64) result, exactly as store_rows stores it (scaled, rounded to bf16,
// rows at or beyond T left out), to `partial` (64 floats): the qkv bias-gradient partial of this CTA's rows. Every
// thread of the CTA calls it; `sums` is kThreads / 32 * 64 floats of shared memory that no one reads any more. Fixed
// order: the thread's two rows, a butterfly over the 8 lanes sharing its columns, then the 8 warps in order.
__device__ __forceinline__ void store_column_sums(float* partial, const float (&d)[32], int row0, int T, float scale,
                                                  float* sums) {
  const int warp_in_cta = threadIdx.x / 32, warp = warp_in_cta % 4, lane = threadIdx.x % 32;
  float col[16];  // columns 8j + 2(lane % 4) + e at col[2j + e]
#pragma unroll
  for (int i = 0; i < 16; i++) col[i] = 0.f;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (row0 + warp * 16 + lane / 4 + r * 8 >= T) continue;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) col[2 * j + e] += __bfloat162float(__float2bfloat16_rn(d[4 * j + 2 * r + e] * scale));
  }
#pragma unroll
  for (int i = 0; i < 16; i++)
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) col[i] += __shfl_xor_sync(0xffffffffu, col[i], offset);
  __syncthreads();  // the other warpgroup may still read the shared memory that `sums` reuses
  if (lane < 4) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) sums[warp_in_cta * kHeadSize + 8 * j + 2 * lane + e] = col[2 * j + e];
  }
  __syncthreads();
  if (threadIdx.x < kHeadSize) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; w++) total += sums[w * kHeadSize + threadIdx.x];
    partial[threadIdx.x] = total;
  }
}

__device__ __forceinline__ void reduce_amax(float* amax, unsigned bits) {
  if (amax == nullptr) return;
  bits = warp_max_bits(bits);
  if (threadIdx.x % 32 == 0) atomic_max_amax(amax, bits);
}

#endif  // LLM8_SM90_KERNEL_BODY

// ---------------------------------------------------------------------------------------------------------------
// Forward

// Shared memory of a kernel streaming K and V tiles (forward, dQ) through kStages buffers.
constexpr size_t kv_stream_tiles_bytes() { return (size_t)2 * kStages * kTileBytes; }
constexpr size_t kv_stream_smem() { return kv_stream_tiles_bytes() + 2 * kStages * 8 + kSmemAlign; }

// grid (B*NH, ceil(T/128)); blockIdx.y = 0 is the last (most expensive) query block.
__global__ void __launch_bounds__(kThreads, 2)  // <= 128 registers: two CTAs per SM
    attention_forward_sm90_kernel(bf16* out, float* lse, float* amax, const bf16* qkv, int T, int NH, int NKV) {
#ifdef LLM8_SM90_KERNEL_BODY
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem = aligned_smem_base(smem_raw);
  auto k_tile = [&](int stage) { return smem + stage * kTileBytes; };        // (64 keys, 64)
  auto v_tile = [&](int stage) { return smem + (kStages + stage) * kTileBytes; };  // (64 keys, 64)

  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int kv_head = h / (NH / NKV);
  const int q_block = (T + kCtaRows - 1) / kCtaRows - 1 - blockIdx.y;
  const int wg_q0 = q_block * kCtaRows + wg * kTileRows;  // this warpgroup's first query row
  const size_t qkv_stride = (size_t)(NH + 2 * NKV) * kHeadSize;
  const bf16* qkv_b = qkv + (size_t)b * T * qkv_stride;
  const bf16* k_head = qkv_b + (NH + kv_head) * kHeadSize;
  const bf16* v_head = qkv_b + (NH + NKV + kv_head) * kHeadSize;

  // key blocks 0 .. the CTA's last diagonal block (keys beyond T are zero rows, masked by causality)
  const int num_k_blocks = min((q_block + 1) * kWarpgroups, (T + kTileRows - 1) / kTileRows);
  const StageRing ring(smem + kv_stream_tiles_bytes());
  auto fill = [&](int kb) {  // K and V of key block kb into its stage
    ring.wait_empty(kb);
    load_tile_async(k_tile(kb % kStages), k_head, kb * kTileRows, T, qkv_stride);
    load_tile_async(v_tile(kb % kStages), v_head, kb * kTileRows, T, qkv_stride);
    ring.commit_fill(kb);
  };
  for (int kb = 0; kb < kStages - 1 && kb < num_k_blocks; kb++) fill(kb);  // prologue
  uint32_t q_frag[kKSteps][4];
  load_a_fragments(q_frag, qkv_b + h * kHeadSize, wg_q0, T, qkv_stride);

  const int wg_last_k_block = q_block * kWarpgroups + wg;  // this warpgroup's diagonal block
  const int row_in_wg = warp * 16 + lane / 4;               // + 8 for accumulator elements 2, 3
  float o[32] = {};                                         // (64, 64) unnormalised output of this warpgroup
  float row_max[2] = {-INFINITY, -INFINITY};                // running max of the log2-scaled scores
  float row_sum[2] = {0.f, 0.f};                            // this thread's share of the running sum of exp2(s - max)

  for (int kb = 0; kb < num_k_blocks; kb++) {
    const int stage = kb % kStages;
    if (kb + kStages - 1 < num_k_blocks) fill(kb + kStages - 1);  // into the stage iteration kb - 1 read
    ring.wait_full(kb);
    if (kb <= wg_last_k_block) {
      float s[32];  // (64, 64) scores of this warpgroup's rows
      wgmma_fence();
      wgmma_issue_64x64x64<0>(s, q_frag, k_tile(stage), false);  // S = Q K^T
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulator(s);

      float tile_max[2] = {-INFINITY, -INFINITY};
      auto scale_scores = [&](auto masked) {  // the masked variant only on the diagonal block
#pragma unroll
        for (int i = 0; i < 32; i++) {
          float x = s[i] * kScaleLog2;
          if constexpr (decltype(masked)::value) {
            const int key = (i / 4) * 8 + (lane % 4) * 2 + i % 2;  // within the block, which starts at wg_q0
            const int query = row_in_wg + ((i / 2) % 2) * 8;
            if (key > query) x = -INFINITY;
          }
          s[i] = x;
          tile_max[(i / 2) % 2] = fmaxf(tile_max[(i / 2) % 2], x);
        }
      };
      if (kb == wg_last_k_block) scale_scores(std::true_type{});
      else scale_scores(std::false_type{});
      float max_used[2], correction[2];
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const float new_max = fmaxf(row_max[r], quad_max(tile_max[r]));
        max_used[r] = new_max == -INFINITY ? 0.f : new_max;  // a fully masked row so far: keep exp2 finite
        correction[r] = fast_exp2(row_max[r] - max_used[r]);      // 0 on the first visit (row_max = -inf)
        row_max[r] = new_max;
      }
      float tile_sum[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 32; i++) {
        s[i] = fast_exp2(s[i] - max_used[(i / 2) % 2]);  // s now holds P (unnormalised)
        tile_sum[(i / 2) % 2] += s[i];
        o[i] *= correction[(i / 2) % 2];
      }
#pragma unroll
      for (int r = 0; r < 2; r++) row_sum[r] = row_sum[r] * correction[r] + tile_sum[r];

      uint32_t p_frag[kKSteps][4];
      accumulator_to_a_fragments(p_frag, s);
      wgmma_fence();
      wgmma_issue_64x64x64<1>(o, p_frag, v_tile(stage), true);  // O += P V
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulator(o);
    }
    ring.release(kb);
  }

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float total = quad_sum(row_sum[r]);
    inv[r] = 1.f / total;
    const int t = wg_q0 + row_in_wg + r * 8;
    if (t < T && lane % 4 == 0) lse[((size_t)b * NH + h) * T + t] = (row_max[r] + log2f(total)) * kLn2;
  }
  const unsigned bits = store_rows(out + (size_t)b * T * NH * kHeadSize + h * kHeadSize, (size_t)NH * kHeadSize, o,
                                   wg_q0, T, inv);
  reduce_amax(amax, bits);
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// Backward: dK, dV

// Shared memory of the dK/dV kernel: kStages buffers of (Q tile, dO tile, lse and D of the 64 queries).
constexpr size_t dkdv_ring_offset() {
  return (size_t)2 * kStages * kTileBytes + (size_t)2 * kStages * kTileRows * sizeof(float);
}
constexpr size_t dkdv_smem() { return dkdv_ring_offset() + 2 * kStages * 8 + kSmemAlign; }

// grid (B*NKV, ceil(T/128)); blockIdx.y = key block (block 0 has the most queries after it: it starts first).
// Per query block, the products are issued as four wgmma groups so the exponentials overlap the tensor cores:
// [S^T] [dP^T] -> wait S^T, P^T = exp2(...) -> [dV += P^T dO] -> wait dP^T, dS^T -> [dK += dS^T Q] -> wait all.
__global__ void __launch_bounds__(kThreads, 1)
    attention_backward_dkdv_sm90_kernel(bf16* dqkv, float* amax, float* bias_partials, const bf16* dout,
                                        const bf16* qkv, const float* lse, const float* dsum, int T, int NH, int NKV) {
#ifdef LLM8_SM90_KERNEL_BODY
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem = aligned_smem_base(smem_raw);
  auto q_tile = [&](int stage) { return smem + stage * kTileBytes; };                    // (64 queries, 64)
  auto do_tile = [&](int stage) { return smem + (kStages + stage) * kTileBytes; };  // (64 queries, 64)
  float* row_stats = reinterpret_cast<float*>(smem_raw + (smem - smem_address(smem_raw)) +
                                              2 * kStages * kTileBytes);
  auto lse_rows = [&](int stage) { return row_stats + stage * 2 * kTileRows; };  // lse; 0 beyond T
  auto dsum_rows = [&](int stage) { return row_stats + stage * 2 * kTileRows + kTileRows; };  // D; 0 beyond T

  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int b = blockIdx.x / NKV, kv_head = blockIdx.x % NKV;
  const int group = NH / NKV;
  const int k0 = blockIdx.y * kCtaRows;
  const int wg_k0 = k0 + wg * kTileRows;  // this warpgroup's first key
  const size_t qkv_stride = (size_t)(NH + 2 * NKV) * kHeadSize;
  const size_t out_stride = (size_t)NH * kHeadSize;
  const bf16* qkv_b = qkv + (size_t)b * T * qkv_stride;
  const bf16* dout_b = dout + (size_t)b * T * out_stride;

  // iterations: every (query head of the group, query block at or after the CTA's first key), head-major
  const int first_q_block = k0 / kTileRows;
  const int q_blocks_per_head = (T + kTileRows - 1) / kTileRows - first_q_block;
  const int num_iters = group * q_blocks_per_head;
  auto issue_loads = [&](int it, int stage) {
    const int h = kv_head * group + it / q_blocks_per_head;
    const int qr0 = (first_q_block + it % q_blocks_per_head) * kTileRows;
    load_tile_async(q_tile(stage), qkv_b + h * kHeadSize, qr0, T, qkv_stride);
    load_tile_async(do_tile(stage), dout_b + h * kHeadSize, qr0, T, out_stride);
    if (threadIdx.x < kTileRows) {
      const int t = qr0 + threadIdx.x;
      const size_t row = ((size_t)b * NH + h) * T + t;
      // asynchronous like the tiles: a plain load here would stall the CTA for a memory latency every iteration
      cp_async_4(smem_address(lse_rows(stage) + threadIdx.x), lse + (t < T ? row : 0), t < T);
      cp_async_4(smem_address(dsum_rows(stage) + threadIdx.x), dsum + (t < T ? row : 0), t < T);
    }
  };
  const StageRing ring(smem + dkdv_ring_offset());
  auto fill = [&](int it) {
    ring.wait_empty(it);
    issue_loads(it, it % kStages);
    ring.commit_fill(it);
  };
  for (int it = 0; it < kStages - 1 && it < num_iters; it++) fill(it);  // prologue
  uint32_t k_frag[kKSteps][4], v_frag[kKSteps][4];
  load_a_fragments(k_frag, qkv_b + (NH + kv_head) * kHeadSize, wg_k0, T, qkv_stride);
  load_a_fragments(v_frag, qkv_b + (NH + NKV + kv_head) * kHeadSize, wg_k0, T, qkv_stride);

  const int key_in_wg = warp * 16 + lane / 4;  // + 8 for accumulator elements 2, 3
  float dk[32] = {}, dv[32] = {};              // (64 keys, 64) of this warpgroup, dK unscaled

  for (int it = 0; it < num_iters; it++) {
    const int stage = it % kStages;
    if (it + kStages - 1 < num_iters) fill(it + kStages - 1);  // into the stage iteration it - 1 read
    ring.wait_full(it);
    const int qr0 = (first_q_block + it % q_blocks_per_head) * kTileRows;

    if (qr0 + kTileRows > wg_k0) {  // some query of the block is at or after some key of this warpgroup
      float st[32], dpt[32];  // (64 keys, 64 queries): S^T then P^T; dP^T then dS^T
      wgmma_fence();
      wgmma_issue_64x64x64<0>(st, k_frag, q_tile(stage), false);  // S^T = K Q^T
      wgmma_commit();
      wgmma_issue_64x64x64<0>(dpt, v_frag, do_tile(stage), false);  // dP^T = V dO^T
      wgmma_commit();

      const float* lse_s = lse_rows(stage);
      const float* dsum_s = dsum_rows(stage);
      // some query of the block precedes some key, or lies beyond T (P = 0 there)
      const bool needs_mask = qr0 < wg_k0 + kTileRows || qr0 + kTileRows > T;
      // this thread's query columns: 8j + 2(lane % 4) + {0, 1}, j = 0..7 (accumulator elements 4j + {0,1,2,3})
      float2 lse_log2[8];
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float2 v = *reinterpret_cast<const float2*>(lse_s + j * 8 + (lane % 4) * 2);
        lse_log2[j] = make_float2(v.x * kLog2e, v.y * kLog2e);
      }
      wgmma_wait<1>();  // S^T
      fence_accumulator(st);
      auto probabilities = [&](auto masked) {  // st = P^T; the masked variant only on diagonal / boundary blocks
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const float2 l = lse_log2[i / 4];
          float p = fast_exp2(st[i] * kScaleLog2 - (i % 2 ? l.y : l.x));
          if constexpr (decltype(masked)::value) {
            const int col = (i / 4) * 8 + (lane % 4) * 2 + i % 2;  // query within the block
            if (wg_k0 + key_in_wg + ((i / 2) % 2) * 8 > qr0 + col || qr0 + col >= T) p = 0.f;
          }
          st[i] = p;
        }
      };
      if (needs_mask) probabilities(std::true_type{});
      else probabilities(std::false_type{});
      uint32_t p_frag[kKSteps][4];
      accumulator_to_a_fragments(p_frag, st);
      wgmma_fence();
      wgmma_issue_64x64x64<1>(dv, p_frag, do_tile(stage), true);  // dV += P^T dO
      wgmma_commit();

      wgmma_wait<1>();  // dP^T
      fence_accumulator(dpt);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float2 d = *reinterpret_cast<const float2*>(dsum_s + j * 8 + (lane % 4) * 2);
#pragma unroll
        for (int e = 0; e < 4; e++) dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - (e % 2 ? d.y : d.x));
      }
      uint32_t ds_frag[kKSteps][4];
      accumulator_to_a_fragments(ds_frag, dpt);
      wgmma_fence();
      wgmma_issue_64x64x64<1>(dk, ds_frag, q_tile(stage), true);  // dK += dS^T Q
      wgmma_commit();
      wgmma_wait<0>();  // both tiles of this stage are read before the stage is released
      fence_accumulator(dv);
      fence_accumulator(dk);
    }
    ring.release(it);
  }

  bf16* dqkv_b = dqkv + (size_t)b * T * qkv_stride;
  const float dk_scale[2] = {kSoftmaxScale, kSoftmaxScale}, dv_scale[2] = {1.f, 1.f};
  unsigned bits = store_rows(dqkv_b + (NH + kv_head) * kHeadSize, qkv_stride, dk, wg_k0, T, dk_scale);
  bits = max(bits, store_rows(dqkv_b + (NH + NKV + kv_head) * kHeadSize, qkv_stride, dv, wg_k0, T, dv_scale));
  reduce_amax(amax, bits);
  if (bias_partials != nullptr) {  // partial row (b, key block): the dK and dV columns of this kv head
    float* sums = reinterpret_cast<float*>(smem_raw + (smem - smem_address(smem_raw)));  // the ring's first tile
    float* partial = bias_partials + ((size_t)b * gridDim.y + blockIdx.y) * qkv_stride;
    store_column_sums(partial + (NH + kv_head) * kHeadSize, dk, wg_k0, T, kSoftmaxScale, sums);
    __syncthreads();  // `sums` is reused
    store_column_sums(partial + (NH + NKV + kv_head) * kHeadSize, dv, wg_k0, T, 1.f, sums);
  }
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// Backward: dQ


// grid (B*NH, ceil(T/128)); blockIdx.y = 0 is the last query block. Writes dQ (bf16) of head h into dqkv.
// [S] [dP] -> wait S, P = exp2(...) -> wait dP, dS -> [dQ += dS K] -> wait all.
__global__ void __launch_bounds__(kThreads, 1)
    attention_backward_dq_sm90_kernel(bf16* dqkv, float* amax, float* bias_partials, const bf16* dout,
                                      const bf16* qkv, const float* lse, const float* dsum, int T, int NH, int NKV) {
#ifdef LLM8_SM90_KERNEL_BODY
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem = aligned_smem_base(smem_raw);
  auto k_tile = [&](int stage) { return smem + stage * kTileBytes; };
  auto v_tile = [&](int stage) { return smem + (kStages + stage) * kTileBytes; };

  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int kv_head = h / (NH / NKV);
  const int q_block = (T + kCtaRows - 1) / kCtaRows - 1 - blockIdx.y;
  const int wg_q0 = q_block * kCtaRows + wg * kTileRows;
  const size_t qkv_stride = (size_t)(NH + 2 * NKV) * kHeadSize;
  const size_t out_stride = (size_t)NH * kHeadSize;
  const bf16* qkv_b = qkv + (size_t)b * T * qkv_stride;
  const bf16* k_head = qkv_b + (NH + kv_head) * kHeadSize;
  const bf16* v_head = qkv_b + (NH + NKV + kv_head) * kHeadSize;

  const int num_k_blocks = min((q_block + 1) * kWarpgroups, (T + kTileRows - 1) / kTileRows);
  const StageRing ring(smem + kv_stream_tiles_bytes());
  auto fill = [&](int kb) {  // K and V of key block kb into its stage
    ring.wait_empty(kb);
    load_tile_async(k_tile(kb % kStages), k_head, kb * kTileRows, T, qkv_stride);
    load_tile_async(v_tile(kb % kStages), v_head, kb * kTileRows, T, qkv_stride);
    ring.commit_fill(kb);
  };
  for (int kb = 0; kb < kStages - 1 && kb < num_k_blocks; kb++) fill(kb);  // prologue
  uint32_t q_frag[kKSteps][4], do_frag[kKSteps][4];
  load_a_fragments(q_frag, qkv_b + h * kHeadSize, wg_q0, T, qkv_stride);
  load_a_fragments(do_frag, dout + (size_t)b * T * out_stride + h * kHeadSize, wg_q0, T, out_stride);
  const int row_in_wg = warp * 16 + lane / 4;
  float lse_log2[2], row_dsum[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = wg_q0 + row_in_wg + r * 8;
    const size_t row = ((size_t)b * NH + h) * T + t;
    lse_log2[r] = t < T ? lse[row] * kLog2e : 0.f;  // padding rows compute finite garbage that is never written
    row_dsum[r] = t < T ? dsum[row] : 0.f;
  }

  const int wg_last_k_block = q_block * kWarpgroups + wg;
  float dq[32] = {};  // (64 queries, 64) of this warpgroup, unscaled

  for (int kb = 0; kb < num_k_blocks; kb++) {
    const int stage = kb % kStages;
    if (kb + kStages - 1 < num_k_blocks) fill(kb + kStages - 1);  // into the stage iteration kb - 1 read
    ring.wait_full(kb);

    if (kb <= wg_last_k_block) {
      float s[32], dp[32];  // (64 queries, 64 keys): S then P then dS; dP
      wgmma_fence();
      wgmma_issue_64x64x64<0>(s, q_frag, k_tile(stage), false);  // S = Q K^T
      wgmma_commit();
      wgmma_issue_64x64x64<0>(dp, do_frag, v_tile(stage), false);  // dP = dO V^T
      wgmma_commit();

      wgmma_wait<1>();  // S
      fence_accumulator(s);
      auto probabilities = [&](auto masked) {  // s = P; the masked variant only on the diagonal block
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int r = (i / 2) % 2;
          float p = fast_exp2(s[i] * kScaleLog2 - lse_log2[r]);
          if constexpr (decltype(masked)::value) {
            if ((i / 4) * 8 + (lane % 4) * 2 + i % 2 > row_in_wg + r * 8) p = 0.f;
          }
          s[i] = p;
        }
      };
      if (kb == wg_last_k_block) probabilities(std::true_type{});
      else probabilities(std::false_type{});
      wgmma_wait<0>();  // dP
      fence_accumulator(dp);
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] *= dp[i] - row_dsum[(i / 2) % 2];
      uint32_t ds_frag[kKSteps][4];
      accumulator_to_a_fragments(ds_frag, s);
      wgmma_fence();
      wgmma_issue_64x64x64<1>(dq, ds_frag, k_tile(stage), true);  // dQ += dS K
      wgmma_commit();
      wgmma_wait<0>();  // the K tile of this stage is read before the stage is released
      fence_accumulator(dq);
    }
    ring.release(kb);
  }

  const float dq_scale[2] = {kSoftmaxScale, kSoftmaxScale};
  const unsigned bits = store_rows(dqkv + (size_t)b * T * qkv_stride + h * kHeadSize, qkv_stride, dq, wg_q0, T,
                                   dq_scale);
  reduce_amax(amax, bits);
  if (bias_partials != nullptr) {  // partial row (b, query block): the dQ columns of head h
    float* sums = reinterpret_cast<float*>(smem_raw + (smem - smem_address(smem_raw)));  // the ring's first tile
    float* partial = bias_partials + ((size_t)b * gridDim.y + q_block) * qkv_stride;
    store_column_sums(partial + h * kHeadSize, dq, wg_q0, T, kSoftmaxScale, sums);
  }
#endif
}

template <typename Kernel>
void set_dynamic_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

}  // namespace

bool attention_sm90_available() {
#ifdef LLM8_HAVE_SM90A
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  static int cached_device = -1;
  static bool cached = false;
  if (device != cached_device) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    cached = prop.major == 9 && prop.minor == 0;
    cached_device = device;
  }
  return cached;
#else
  return false;
#endif
}

void attention_forward_sm90(bf16* out, float* lse, float* out_amax, const bf16* qkv, int B, int T, int NH, int NKV,
                            cudaStream_t stream) {
  set_dynamic_smem(attention_forward_sm90_kernel, kv_stream_smem());
  const dim3 grid(B * NH, (T + kCtaRows - 1) / kCtaRows);
  attention_forward_sm90_kernel<<<grid, kThreads, kv_stream_smem(), stream>>>(out, lse, out_amax, qkv, T, NH, NKV);
  CUDA_CHECK_LAUNCH();
}

int attention_sm90_bias_partial_rows(int B, int T) { return B * ((T + kCtaRows - 1) / kCtaRows); }

void attention_backward_sm90(bf16* dqkv, float* dqkv_amax, float* bias_partials, const float* dsum, const bf16* dout,
                             const bf16* qkv, const float* lse, int B, int T, int NH, int NKV, cudaStream_t stream) {
  const int num_blocks = (T + kCtaRows - 1) / kCtaRows;
  set_dynamic_smem(attention_backward_dkdv_sm90_kernel, dkdv_smem());
  attention_backward_dkdv_sm90_kernel<<<dim3(B * NKV, num_blocks), kThreads, dkdv_smem(), stream>>>(
      dqkv, dqkv_amax, bias_partials, dout, qkv, lse, dsum, T, NH, NKV);
  CUDA_CHECK_LAUNCH();
  set_dynamic_smem(attention_backward_dq_sm90_kernel, kv_stream_smem());
  attention_backward_dq_sm90_kernel<<<dim3(B * NH, num_blocks), kThreads, kv_stream_smem(), stream>>>(
      dqkv, dqkv_amax, bias_partials, dout, qkv, lse, dsum, T, NH, NKV);
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
