// llmc/precision/gemm.cu: the cuBLASLt wrapper behind llmc/precision/gemm.h. One handle and one workspace per process
// (current device), BF16 A/B with FP32 accumulation (CUBLAS_COMPUTE_32F), bf16 or FP32 C/D, bias / GELU_AUX / DGELU
// epilogues, the quantised products with the GEMM mapping of the operands' encodings (the table kScaleModes: E4M3 /
// E5M2 operands with per-tensor or 1x128 / 128x128 block scales), and a cache of (matmul descriptor, layouts,
// heuristic algorithm) per problem so that the algorithm of a given GEMM never changes within a run (cuBLASLt is
// bitwise deterministic for a fixed algorithm; split-K schemes that reduce in place through atomics are excluded).
// The FP64 CPU references are test/reference/gemm_ref.cpp.
//
// Row-major ↔ column-major mapping. cuBLASLt is column-major; a row-major (R, S) matrix with leading dimension S is
// the same memory as a column-major (S, R) matrix with ld S, i.e. its transpose. So each row-major product
// Y = X · Z is computed as the column-major product Yᵀ = Zᵀ · Xᵀ with the operands swapped:
//   forward  out (M,N) = inp (M,K) · W (N,K)ᵀ    →  outᵀ (N×M) = op_T(W as col (K×N), ld K) · op_N(inpᵀ (K×M), ld K)
//                                                   cuBLAS m=N, n=M, k=K; bias is per row of outᵀ = per column of out
//   dgrad    dinp (M,K) = dout (M,N) · W (N,K)   →  dinpᵀ (K×M) = op_N(W as col (K×N), ld K) · op_N(doutᵀ (N×M), ld N)
//                                                   cuBLAS m=K, n=M, k=N; the GELU aux (pre_gelu (M,K)) has ld K
//   wgrad    dW (N,K) = dout (M,N)ᵀ · inp (M,K)  →  dWᵀ (K×N) = op_N(inpᵀ (K×M), ld K) · op_T(doutᵀ (N×M), ld N)
//                                                   cuBLAS m=K, n=N, k=M; FP32 C/D, beta = 1 to accumulate
// Leading dimensions are K or N, so K and N must be multiples of 8 (16-byte rows of bf16); M is free.
//
// FP8 (Hopper/Ada tensor cores take only "TN": both operands contiguous along K). Every FP8 product is
//   D (M,N) = A (M,K) · B (N,K)ᵀ  →  Dᵀ (N×M, ld N) = op_T(B as col (K×N), ld K) · op_N(A as col (K×M), ld K)
//                                    cuBLAS m=N, n=M, k=K: cuBLAS's "A" is our B and cuBLAS's "B" is our A,
// so our B's codes / format / scales go to CUBLASLT_MATMUL_DESC_A_* and our A's to CUBLASLT_MATMUL_DESC_B_*.
// Scale layouts as cuBLASLt reads them (cuBLAS docs, "128-element 1D and 128x128 2D block scaling"), with
// L = ceil(K / 128) blocks along K:
//   VEC128_32F      cuBLAS A: (m × L), m-major  → for our B (N, K): scale_inv[kb * N + n]
//                   cuBLAS B: (n × L), n-major  → for our A (M, K): scale_inv[kb * M + m]
//                   (i.e. contiguous along the operand's rows; tensor.h pads that stride to a multiple of 4, which
//                   is the stride itself here since M, N are multiples of 16)
//   BLK128x128_32F  (round_up(L, 4) × ceil(rows / 128)), K-major → scale_inv[rb * round_up(L, 4) + kb]
// These are exactly the GEMM-ready layouts of llmc/precision/tensor.h (1x128 and 128x128 blocks of a (rows, K)
// operand).
// D = A·Bᵀ scaled: per-tensor D = sA·sB·Σ qA·qB (SCALAR_32F, the scale pointers are the scale_inv); with blocks
// every 128-long K slice of a row of A and of B has its own factor. cuBLASLt accepts 1x128·1x128, 1x128·128x128,
// 128x128·1x128, never 128x128·128x128, and (on Hopper) only split accumulation with block scales. FP32 D with
// beta = 1 accumulates into C = D (weight gradients); bf16 D takes the bias / GELU_AUX epilogues. Not exposed:
// AMAX_D (cuBLASLt computes it only for FP8 outputs), FP8 outputs, E5M2 · E5M2 (no cuBLASLt kernel).
//
// FP4 (the route of a pair of encodings, quant_route, is the one place that tells FP4 products from FP8 ones): the
// operands are converted by llmc/precision/fp4_gemm.h into the FP4 scratch buffer (grow-only, one per process) and
// multiplied there: MXFP4 as E4M3 codes with VEC128_32F outer scales through the FP8 product above (K zero-padded to
// a multiple of 128); NVFP4 as BF16 through a TN BF16 plan with alpha and beta read from the device
// (CUBLASLT_POINTER_MODE_DEVICE: alpha = the product of the two tensor scales, computed on the device).
#include "llmc/precision/gemm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cublasLt.h>

#include "llmc/core/common.h"
#include "llmc/precision/fp4_gemm.h"
#include "llmc/precision/fp4_quant.h"

namespace llmc {

namespace {

enum class GemmOp : int { Forward = 0, Dgrad = 1, Wgrad = 2, Quantized = 3, ExpandedBf16 = 4 };

struct GemmKey {
  int M, N, K;
  GemmOp op;
  cublasLtEpilogue_t epilogue;
  bool accumulate;
  int align_a, align_b, align_c, align_aux;  // pointer alignments (bytes, capped at 256) the algorithm was chosen for
  // FP8 products only (the BF16 keys keep these defaults). Types and scale modes as cuBLASLt sees its operands
  // (its A is our B), the output type, fast accumulation and the bias alignment.
  int a_type = CUDA_R_16BF, b_type = CUDA_R_16BF, d_type = CUDA_R_16BF;
  int a_scale_mode = -1, b_scale_mode = -1;  // -1: not set (cuBLASLt's default, SCALAR_32F for FP8)
  bool fast_accum = false;
  int align_bias = 256;
  int align_src = 256;  // a separate C operand (D = ... + C, beta = 1): its alignment; 256 when C is D or unused
  bool operator<(const GemmKey& o) const {
    return std::tie(M, N, K, op, epilogue, accumulate, align_a, align_b, align_c, align_aux, a_type, b_type, d_type,
                    a_scale_mode, b_scale_mode, fast_accum, align_bias, align_src) <
           std::tie(o.M, o.N, o.K, o.op, o.epilogue, o.accumulate, o.align_a, o.align_b, o.align_c, o.align_aux,
                    o.a_type, o.b_type, o.d_type, o.a_scale_mode, o.b_scale_mode, o.fast_accum, o.align_bias,
                    o.align_src);
  }
};

// Everything cuBLASLt needs to describe one GEMM, in its column-major terms (see the mapping at the top).
struct PlanSpec {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  cudaDataType_t a_type = CUDA_R_16BF, b_type = CUDA_R_16BF, c_type = CUDA_R_16BF;  // C and D share type and layout
  const void* bias = nullptr;
  const void* aux = nullptr;  // GELU_AUX output / DGELU input
  int64_t aux_ld = 0;
  bool set_aux_type = true;   // BF16 path: aux type bf16 set explicitly; FP8: left to cuBLASLt (= D type, bf16)
  const void* a_scale = nullptr;  // FP8: cuBLASLt A / B scale pointers (our B's and our A's scale_inv)
  const void* b_scale = nullptr;
  int a_scale_mode = -1, b_scale_mode = -1;
  bool fast_accum = false;
  bool device_scalars = false;  // alpha and beta are device pointers (CUBLASLT_POINTER_MODE_DEVICE)
};

constexpr int kAlgoCandidates = 8;  // heuristic results kept per BF16 plan for the tuning below

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  // The heuristic's candidates, best first (BF16 plans); `algo` starts as candidates[0] and may be replaced once by
  // a faster candidate that writes the same bits (tune_algorithm).
  std::vector<cublasLtMatmulAlgo_t> candidates;
  bool tuned = false;
  cublasLtMatmulAlgo_t algo{};
};

struct GemmState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<GemmKey, GemmPlan> plans;
  std::map<GemmKey, std::string> unsupported;  // FP8 combinations cuBLASLt refused, with its reason
  void* fp4_scratch = nullptr;                 // the FP4 products' converted operands (grow-only)
  size_t fp4_scratch_bytes = 0;
};

GemmState g_gemm;

int pointer_alignment(const void* p) {
  if (p == nullptr) return 256;
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 256 && (v % (2 * a)) == 0) a *= 2;
  return a;
}

struct NamedPointer {
  const void* p;
  const char* name;
};
// Every non-null pointer 16-byte aligned, or an llmc::Error naming the first that is not.
void check_aligned(const char* fn, std::initializer_list<NamedPointer> pointers) {
  for (const NamedPointer& x : pointers)
    if (x.p != nullptr && pointer_alignment(x.p) < 16)
      throw_error("%s: pointer %s (%p) is not 16-byte aligned; cuBLASLt tensor-core GEMMs need 16-byte aligned "
                  "buffers (carve activations at multiples of 8 bf16 elements)", fn, x.name, x.p);
}

void check_dims(int M, int N, int K, const char* fn) {
  if (M <= 0 || N <= 0 || K <= 0) throw_error("%s: invalid GEMM shape M=%d N=%d K=%d (all must be > 0)", fn, M, N, K);
  if (N % 8 != 0 || K % 8 != 0) {
    throw_error("%s: N=%d and K=%d must be multiples of 8 (they are leading dimensions of bf16 row-major matrices; "
                "pad the layer width, e.g. the vocabulary to a multiple of 128)", fn, N, K);
  }
}

const char* status_name(cublasStatus_t st) { return cublasGetStatusName(st); }

void destroy_plan(GemmPlan& plan) {
  if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
  plan = GemmPlan{};
}

// Creates the descriptor, layouts and the heuristic algorithm of one GEMM. Returns false (with the cuBLASLt call and
// status in *why, nothing leaked) where cuBLASLt refuses the combination or finds no algorithm for it.
bool create_plan(const GemmKey& key, const PlanSpec& s, GemmPlan* out, std::string* why) {
  GemmPlan plan;
  auto ok = [&](cublasStatus_t st, const char* call) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    *why = strformat("%s returned %s", call, status_name(st));
    return false;
  };
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size, const char* call) {
    return ok(cublasLtMatmulDescSetAttribute(plan.desc, attr, value, size), call);
  };
  bool good = ok(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  cublasLtEpilogue_t epilogue = key.epilogue;
  good = good && set(CUBLASLT_MATMUL_DESC_TRANSA, &s.trans_a, sizeof(s.trans_a), "set TRANSA") &&
         set(CUBLASLT_MATMUL_DESC_TRANSB, &s.trans_b, sizeof(s.trans_b), "set TRANSB") &&
         set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue), "set EPILOGUE");
  // Pointers are set again on every call; here they only tell the heuristic their alignment.
  if (good && s.bias != nullptr) {
    good = set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &s.bias, sizeof(s.bias), "set BIAS_POINTER");
  }
  if (good && s.aux != nullptr) {
    good = set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &s.aux, sizeof(s.aux), "set EPILOGUE_AUX_POINTER") &&
           set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &s.aux_ld, sizeof(s.aux_ld), "set EPILOGUE_AUX_LD");
    if (good && s.set_aux_type) {
      cudaDataType_t aux_type = CUDA_R_16BF;
      good = set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type),
                 "set EPILOGUE_AUX_DATA_TYPE");
    }
  }
  // FP8: scale pointers (per call as well), block scale modes, fast accumulation only when asked.
  if (good && s.a_scale != nullptr) {
    good = set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &s.a_scale, sizeof(s.a_scale), "set A_SCALE_POINTER");
  }
  if (good && s.b_scale != nullptr) {
    good = set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &s.b_scale, sizeof(s.b_scale), "set B_SCALE_POINTER");
  }
  if (good && s.a_scale_mode >= 0) {
    int32_t mode = s.a_scale_mode;
    good = set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode), "set A_SCALE_MODE");
  }
  if (good && s.b_scale_mode >= 0) {
    int32_t mode = s.b_scale_mode;
    good = set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode), "set B_SCALE_MODE");
  }
  if (good && s.fast_accum) {
    int8_t fast = 1;
    good = set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast), "set FAST_ACCUM");
  }
  if (good && s.device_scalars) {
    cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    good = set(CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode), "set POINTER_MODE");
  }
  // Operand layouts (column-major, before op).
  const int a_rows = (s.trans_a == CUBLAS_OP_N) ? s.m : s.k, a_cols = (s.trans_a == CUBLAS_OP_N) ? s.k : s.m;
  const int b_rows = (s.trans_b == CUBLAS_OP_N) ? s.k : s.n, b_cols = (s.trans_b == CUBLAS_OP_N) ? s.n : s.k;
  good = good && ok(cublasLtMatrixLayoutCreate(&plan.a, s.a_type, a_rows, a_cols, s.lda), "cublasLtMatrixLayoutCreate(A)") &&
         ok(cublasLtMatrixLayoutCreate(&plan.b, s.b_type, b_rows, b_cols, s.ldb), "cublasLtMatrixLayoutCreate(B)") &&
         ok(cublasLtMatrixLayoutCreate(&plan.c, s.c_type, s.m, s.n, s.ldc), "cublasLtMatrixLayoutCreate(C/D)");

  if (good) {
    cublasLtMatmulPreference_t pref = nullptr;
    good = ok(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    // Deterministic: no split-K reduction "in place" in the output buffer (its order of additions can vary).
    uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK & ~static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_INPLACE);
    uint32_t align_a = key.align_a, align_b = key.align_b, align_c = key.align_c;
    good = good &&
           ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &g_gemm.workspace_bytes, sizeof(g_gemm.workspace_bytes)),
              "set MAX_WORKSPACE_BYTES") &&
           ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction_mask,
                                                   sizeof(reduction_mask)),
              "set REDUCTION_SCHEME_MASK") &&
           ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, 4),
              "set MIN_ALIGNMENT_A_BYTES") &&
           ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, 4),
              "set MIN_ALIGNMENT_B_BYTES") &&
           ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, 4),
              "set MIN_ALIGNMENT_C_BYTES") &&
           ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, 4),
              "set MIN_ALIGNMENT_D_BYTES");
    std::array<cublasLtMatmulHeuristicResult_t, kAlgoCandidates> results{};
    int found = 0;
    good = good && ok(cublasLtMatmulAlgoGetHeuristic(g_gemm.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref,
                                                     kAlgoCandidates, results.data(), &found),
                      "cublasLtMatmulAlgoGetHeuristic");
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (good && found == 0) {
      *why = "cublasLtMatmulAlgoGetHeuristic found no algorithm";
      good = false;
    }
    if (good) {
      plan.algo = results[0].algo;
      for (int i = 0; i < found; i++) plan.candidates.push_back(results[i].algo);
    }
  }
  if (!good) {
    destroy_plan(plan);
    return false;
  }
  *out = plan;
  return true;
}

// The cached plan of a BF16 GEMM, created the first time it is seen; throws where cuBLASLt has no algorithm.
const GemmPlan& get_plan(const GemmKey& key, const PlanSpec& spec) {
  auto it = g_gemm.plans.find(key);
  if (it != g_gemm.plans.end()) return it->second;
  GemmPlan plan;
  std::string why;
  if (!create_plan(key, spec, &plan, &why)) {
    throw_error("gemm: cuBLASLt found no algorithm for op=%d M=%d N=%d K=%d epilogue=%d accumulate=%d (alignments "
                "%d/%d/%d bytes): %s; check the shapes and the CUDA architecture",
                static_cast<int>(key.op), key.M, key.N, key.K, static_cast<int>(key.epilogue), key.accumulate ? 1 : 0,
                key.align_a, key.align_b, key.align_c, why.c_str());
  }
  return g_gemm.plans.emplace(key, plan).first->second;
}

// ---------------------------------------------------------------------------------------------------------------
// Algorithm tuning that cannot change a result. cuBLASLt's heuristic ranks algorithms by a model, not by a
// measurement, and its first choice is often not the fastest (measured on H100 at GPT-2 124M, 32K tokens, with
// dev/cuda/bench_gemm_algos: the lm_head forward 3.84 -> 3.47 ms, the GELU_AUX forward 0.305 -> 0.285 ms). Algorithms
// that keep the per-element order of the K-sum (no split-K: only tiles, clusters and schedules differ) write the same
// bits, so the first call of a plan times the candidates and keeps the fastest one whose output hashes equal to the
// first candidate's on that call's own operands: the choice depends on timing, the result does not, and runs stay
// bit-identical (train.deterministic). Only for GEMMs that do not read D (beta = 0, or C a separate input), so the
// trial runs write nothing that the real call does not overwrite.

bool g_tune_algorithms = true;

// hash (one uint64) ^= mix(word, index) over the n64 64-bit words of p: order-independent (XOR), position-aware.
__global__ void hash_words_kernel(unsigned long long* hash, const unsigned long long* p, size_t n64) {
  unsigned long long h = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n64; i += (size_t)gridDim.x * blockDim.x) {
    unsigned long long z = p[i] ^ (0x9E3779B97F4A7C15ull * (i + 1));  // splitmix64 finaliser of (word, index)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h ^= z ^ (z >> 31);
  }
  for (int offset = 16; offset > 0; offset /= 2) h ^= __shfl_xor_sync(0xffffffffu, h, offset);
  if (threadIdx.x % 32 == 0 && h != 0) atomicXor(hash, h);
}

struct TuneScratch {
  unsigned long long* hash = nullptr;  // device
  cudaEvent_t start = nullptr, stop = nullptr;
  TuneScratch() {
    CUDA_CHECK(cudaMalloc(&hash, sizeof(unsigned long long)));
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~TuneScratch() {
    cudaFree(hash);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  // Hash of the bytes of D and (if not null) of the aux output; synchronises the stream.
  unsigned long long digest(const void* D, size_t d_bytes, const void* aux, size_t aux_bytes, cudaStream_t s) {
    CUDA_CHECK(cudaMemsetAsync(hash, 0, sizeof(unsigned long long), s));
    for (auto [p, bytes] : {std::pair<const void*, size_t>{D, d_bytes}, {aux, aux_bytes}}) {
      if (p == nullptr || bytes == 0) continue;
      hash_words_kernel<<<1024, 256, 0, s>>>(hash, static_cast<const unsigned long long*>(p), bytes / 8);
      CUDA_CHECK(cudaGetLastError());
    }
    unsigned long long h = 0;
    CUDA_CHECK(cudaMemcpyAsync(&h, hash, sizeof(h), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return h;
  }
};

// `call(algo)` runs the plan's product with that algorithm (false if cuBLASLt refused it). d_bytes / aux_bytes: the
// outputs compared (aux only when the epilogue writes it).
template <typename Call>
void tune_algorithm(GemmPlan& plan, const void* D, size_t d_bytes, const void* aux_out, size_t aux_bytes,
                    cudaStream_t s, Call&& call) {
  plan.tuned = true;
  if (plan.candidates.size() < 2) return;
  static TuneScratch scratch;
  constexpr int kTimed = 3;
  unsigned long long reference = 0;
  float best_ms = 0.f;
  for (size_t i = 0; i < plan.candidates.size(); i++) {
    const cublasLtMatmulAlgo_t& algo = plan.candidates[i];
    if (!call(algo)) continue;  // also the warm-up of the timing below
    const unsigned long long h = scratch.digest(D, d_bytes, aux_out, aux_bytes, s);
    if (i == 0) reference = h;
    else if (h != reference) continue;  // a different order of additions (split-K): not interchangeable
    std::array<float, kTimed> ms{};
    for (int r = 0; r < kTimed; r++) {
      CUDA_CHECK(cudaEventRecord(scratch.start, s));
      call(algo);
      CUDA_CHECK(cudaEventRecord(scratch.stop, s));
      CUDA_CHECK(cudaEventSynchronize(scratch.stop));
      CUDA_CHECK(cudaEventElapsedTime(&ms[r], scratch.start, scratch.stop));
    }
    std::sort(ms.begin(), ms.end());
    const float median = ms[kTimed / 2];
    if (i == 0 || median < best_ms) {
      best_ms = median;
      plan.algo = algo;
    }
  }
}

// Runs D = alpha · op(A) · op(B) + beta · C (C = D, or the separate input C), using the cached plan (its algorithm
// tuned on the first call where that cannot change a result).
void run_gemm(const GemmKey& key, cublasOperation_t trans_a, cublasOperation_t trans_b, int m, int n, int k,
              const bf16* A, int64_t lda, const bf16* B, int64_t ldb, void* D, int64_t ldd, cudaDataType_t d_type,
              const void* bias, const void* aux, int64_t aux_ld, cudaStream_t stream, const void* C = nullptr) {
  if (g_gemm.handle == nullptr) gemm_init();
  const PlanSpec spec{trans_a, trans_b, m, n, k, lda, ldb, ldd, CUDA_R_16BF, CUDA_R_16BF, d_type, bias, aux, aux_ld};
  GemmPlan& plan = const_cast<GemmPlan&>(get_plan(key, spec));
  if (bias != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  // C: D itself (accumulate) or a separate matrix of D's layout (key.accumulate is set for both: beta = 1)
  const float alpha = 1.0f, beta = key.accumulate ? 1.0f : 0.0f;
  const void* c_operand = C != nullptr ? C : D;
  const bool reads_d = key.accumulate && C == nullptr;
  if (!plan.tuned && g_tune_algorithms && !reads_d) {
    const size_t elem = d_type == CUDA_R_32F ? 4 : 2;
    const bool aux_is_output = key.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || key.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    tune_algorithm(plan, D, (size_t)m * n * elem, aux_is_output ? aux : nullptr, (size_t)m * n * 2, stream,
                   [&](const cublasLtMatmulAlgo_t& algo) {
                     return cublasLtMatmul(g_gemm.handle, plan.desc, &alpha, A, plan.a, B, plan.b, &beta, c_operand,
                                           plan.c, D, plan.c, &algo, g_gemm.workspace, g_gemm.workspace_bytes,
                                           stream) == CUBLAS_STATUS_SUCCESS;
                   });
  }
  plan.tuned = true;
  CUBLAS_CHECK(cublasLtMatmul(g_gemm.handle, plan.desc, &alpha, A, plan.a, B, plan.b, &beta, c_operand, plan.c, D,
                              plan.c, &plan.algo, g_gemm.workspace, g_gemm.workspace_bytes, stream));
}

// ---------------------------------------------------------------------------------------------------------------
// The GEMM mapping of the encodings: how cuBLASLt reads a quantised operand. An operand is an FP8 element type with
// FP32 scales (pow2 scales are FP32 values) whose blocks are one of the rows below; anything else has no cuBLASLt
// product. The pairing rules of two operands are in quant_gemm_operands_error.
struct ScaleModeRow {
  BlockShape block;
  int mode;                // CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE; -1: left at cuBLASLt's default, SCALAR_32F
  const char* mode_name;
  int min_cc;              // the compute capability of cuBLASLt's kernels for it
  const char* needs;       // what that capability brings, for errors
};
const ScaleModeRow kScaleModes[] = {
    {kWholeTensor, -1, "SCALAR_32F", 89, "FP8 tensor cores"},
    // cuBLASLt documents the block-scaled modes for 9.0; its heuristic decides on newer GPUs.
    {kBlock1x128, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, "VEC128_32F", 90, "block-scaled FP8 GEMMs, Hopper"},
    {kBlock128x128, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, "BLK128x128_32F", 90,
     "block-scaled FP8 GEMMs, Hopper"},
};

// The row of an operand's encoding, or null where cuBLASLt has no product for it.
const ScaleModeRow* scale_mode_row(const Encoding& e) {
  if (!is_fp8(e.element) || e.tensor_scale || (e.scale != ScaleFormat::FP32 && e.scale != ScaleFormat::Pow2FP32))
    return nullptr;
  for (const ScaleModeRow& row : kScaleModes)
    if (row.block == e.block) return &row;
  return nullptr;
}
const ScaleModeRow& scale_mode_of(const Encoding& e) {
  const ScaleModeRow* row = scale_mode_row(e);
  if (!row) throw_error("gemm: no cuBLASLt scale mode for %s", encoding_name(e).c_str());
  return *row;
}
cudaDataType_t element_cuda_type(ElementFormat f) {
  return f == ElementFormat::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;  // scale_mode_row admits only the FP8 formats
}

cublasLtEpilogue_t quant_epilogue(const QuantGemmOptions& opt) {
  if (opt.pre_gelu != nullptr) return opt.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  return opt.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}
const char* epilogue_str(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    default: return "other";
  }
}

// "D (1024x768 bf16) = A (1024x2304 e5m2 1x128) * B (768x2304 e4m3 128x128)^T, epilogue none, fast_accum 0,
// accumulate 0": the combination, for error messages and the test's support report.
std::string describe_quant(bool d_fp32, const QuantOperand& A, const QuantOperand& B, int M, int N, int K,
                           const QuantGemmOptions& opt) {
  return strformat("D (%dx%d %s) = A (%dx%d %s) * B (%dx%d %s)^T, epilogue %s, fast_accum %d, accumulate %d", M, N,
                   d_fp32 ? "fp32" : "bf16", M, K, encoding_name(A.encoding).c_str(), N, K,
                   encoding_name(B.encoding).c_str(), epilogue_str(quant_epilogue(opt)), opt.fast_accum ? 1 : 0,
                   opt.accumulate ? 1 : 0);
}

// Empty when the arguments describe a product cuBLASLt can be asked for; otherwise why not, naming the argument.
// require_pointers: matmul_quant needs every pointer; matmul_quant_supported checks only the alignment of those given.
std::string quant_argument_error(const void* D, bool d_fp32, const QuantOperand& A, const QuantOperand& B, int M,
                                 int N, int K, const QuantGemmOptions& opt, bool require_pointers) {
  if (M <= 0 || N <= 0 || K <= 0) return strformat("invalid GEMM shape M=%d N=%d K=%d (all must be > 0)", M, N, K);
  if (A.values != nullptr || B.values != nullptr) return "values: only NVFP4 operands bring their decoded values";
  if (K % kQuantGemmAlign != 0) {
    return strformat("K=%d must be a multiple of %d (the FP8 rows are 16-byte aligned leading dimensions)", K,
                     kQuantGemmAlign);
  }
  if (M % kQuantGemmAlign != 0 || N % kQuantGemmAlign != 0)
    return strformat("M=%d and N=%d must be multiples of %d", M, N, kQuantGemmAlign);
  const std::string pair = quant_gemm_operands_error(A.encoding, "A", B.encoding, "B");
  if (!pair.empty()) return pair;
  const bool blocks = !A.encoding.per_tensor();
  const int k_multiple = quant_gemm_dim_multiple(A.encoding);
  if (K % k_multiple != 0) {
    return strformat("K=%d must be a multiple of %d with %s block scales (one scale per %d elements along K)", K,
                     k_multiple, block_shape_name(A.encoding.block).c_str(), A.encoding.block.cols);
  }
  if (opt.fast_accum && blocks) {
    return "fast_accum with block scales: cuBLASLt's block-scaled FP8 kernels always promote partial sums to FP32 "
           "(split accumulation); fast accumulation is for per-tensor scales only";
  }
  if (d_fp32 && (opt.bias != nullptr || opt.pre_gelu != nullptr)) {
    return "bias / pre_gelu (the BIAS and GELU_AUX epilogues) are for a bf16 D (the forward product), not FP32 D";
  }
  if (!d_fp32 && opt.accumulate) return "accumulate (D += A*B^T) is for an FP32 D (weight gradients), not bf16 D";
  std::string err;
  auto check = [&](const void* p, const char* name, int align, bool needed) {
    if (!err.empty()) return;
    if (p == nullptr) {
      if (needed && require_pointers) err = strformat("%s is null", name);
      return;
    }
    if (pointer_alignment(p) < align) {
      err = strformat("%s (%p) is not %d-byte aligned (cuBLASLt FP8 GEMMs need 16-byte aligned matrices, "
                      "block-scale arrays and per-tensor scales: an H100 returned CUBLAS_STATUS_NOT_SUPPORTED for a "
                      "4-byte aligned per-tensor scale)",
                      name, p, align);
    }
  };
  check(D, "D", 16, true);
  check(A.data, "A.data", 16, true);
  check(B.data, "B.data", 16, true);
  check(A.scale_inv, "A.scale_inv", 16, true);
  check(B.scale_inv, "B.scale_inv", 16, true);
  check(opt.bias, "opt.bias", 16, false);
  check(opt.pre_gelu, "opt.pre_gelu", 16, false);
  return err;
}

// Compute capability of the current device as major * 10 + minor (89 = Ada, 90 = Hopper); cached per device.
int current_compute_capability() {
  static std::map<int, int> cache;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return cache[dev] = major * 10 + minor;
}

// Empty when the device has what the product of A and B needs (the capability of both operands' scale modes).
std::string quant_device_error(const QuantOperand& A, const QuantOperand& B) {
  const int cc = current_compute_capability();
  for (const ScaleModeRow* row : {&scale_mode_of(A.encoding), &scale_mode_of(B.encoding)}) {
    if (cc < row->min_cc) {
      return strformat("%s scales need compute capability %d.%d or newer (%s); this device is %d.%d", row->mode_name,
                       row->min_cc / 10, row->min_cc % 10, row->needs, cc / 10, cc % 10);
    }
  }
  return "";
}

// The cache key and the cuBLASLt description of D (M,N) = A (M,K) · B (N,K)ᵀ (see the mapping at the top).
void quant_key_and_spec(const void* D, bool d_fp32, const QuantOperand& A, const QuantOperand& B, int M, int N, int K,
                        const QuantGemmOptions& opt, GemmKey* key, PlanSpec* spec) {
  *key = GemmKey{M, N, K, GemmOp::Quantized, quant_epilogue(opt), opt.accumulate, pointer_alignment(B.data),
                 pointer_alignment(A.data), pointer_alignment(D), pointer_alignment(opt.pre_gelu)};
  key->a_type = element_cuda_type(B.encoding.element);
  key->b_type = element_cuda_type(A.encoding.element);
  key->d_type = d_fp32 ? CUDA_R_32F : CUDA_R_16BF;
  key->a_scale_mode = scale_mode_of(B.encoding).mode;
  key->b_scale_mode = scale_mode_of(A.encoding).mode;
  key->fast_accum = opt.fast_accum;
  key->align_bias = pointer_alignment(opt.bias);

  // cuBLASLt's A is our B (N,K) row-major = column-major (K×N), ld K, op T → (N×K); its B is our A (M,K) row-major =
  // column-major (K×M), ld K; Dᵀ (N×M) column-major, ld N = D (M,N) row-major. The bias (N) is per row of Dᵀ = per
  // column of D; the aux pre_gelu (M,N) row-major = (N×M) column-major, ld N, its type left to cuBLASLt (= D's,
  // bf16: setting it is reserved for FP8 D).
  *spec = PlanSpec{CUBLAS_OP_T,
                   CUBLAS_OP_N,
                   /*m=*/N,
                   /*n=*/M,
                   /*k=*/K,
                   /*lda=*/K,
                   /*ldb=*/K,
                   /*ldc=*/N,
                   static_cast<cudaDataType_t>(key->a_type),
                   static_cast<cudaDataType_t>(key->b_type),
                   static_cast<cudaDataType_t>(key->d_type),
                   opt.bias,
                   opt.pre_gelu,
                   /*aux_ld=*/N,
                   /*set_aux_type=*/false,
                   /*a_scale=*/B.scale_inv,
                   /*b_scale=*/A.scale_inv,
                   key->a_scale_mode,
                   key->b_scale_mode,
                   opt.fast_accum};
}

// The cached plan of a quantised GEMM, or null (with cuBLASLt's reason in *why) where cuBLASLt does not run it; both
// answers are cached.
const GemmPlan* find_quant_plan(const GemmKey& key, const PlanSpec& spec, std::string* why) {
  auto it = g_gemm.plans.find(key);
  if (it != g_gemm.plans.end()) return &it->second;
  auto bad = g_gemm.unsupported.find(key);
  if (bad != g_gemm.unsupported.end()) {
    if (why) *why = bad->second;
    return nullptr;
  }
  GemmPlan plan;
  std::string reason;
  if (!create_plan(key, spec, &plan, &reason)) {
    g_gemm.unsupported.emplace(key, reason);
    if (why) *why = reason;
    return nullptr;
  }
  return &g_gemm.plans.emplace(key, plan).first->second;
}

void matmul_quant_impl(void* D, bool d_fp32, const QuantOperand& A, const QuantOperand& B, int M, int N, int K,
                       const QuantGemmOptions& opt, cudaStream_t stream) {
  const std::string arg_error = quant_argument_error(D, d_fp32, A, B, M, N, K, opt, true);
  if (!arg_error.empty()) {
    throw_error("matmul_quant: %s [%s]", arg_error.c_str(), describe_quant(d_fp32, A, B, M, N, K, opt).c_str());
  }
  const std::string device_error = quant_device_error(A, B);
  if (!device_error.empty()) {
    throw_error("matmul_quant: %s [%s]", device_error.c_str(), describe_quant(d_fp32, A, B, M, N, K, opt).c_str());
  }
  if (g_gemm.handle == nullptr) gemm_init();
  GemmKey key{};
  PlanSpec spec;
  quant_key_and_spec(D, d_fp32, A, B, M, N, K, opt, &key, &spec);
  std::string why;
  const GemmPlan* plan = find_quant_plan(key, spec, &why);
  if (plan == nullptr) {
    throw_error("matmul_quant: cuBLASLt does not run %s on this device (compute capability %d, alignments A/B/D "
                "%d/%d/%d bytes): %s; check matmul_quant_supported() first and fall back (e.g. bias / GELU in "
                "separate kernels)",
                describe_quant(d_fp32, A, B, M, N, K, opt).c_str(), current_compute_capability(), key.align_b,
                key.align_a, key.align_c, why.c_str());
  }
  // The per-call pointers (the plan was built with those of its first call).
  auto set_ptr = [&](cublasLtMatmulDescAttributes_t attr, const void* p) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, attr, &p, sizeof(p)));
  };
  set_ptr(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, B.scale_inv);  // cuBLASLt's A is our B
  set_ptr(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, A.scale_inv);
  if (opt.bias != nullptr) set_ptr(CUBLASLT_MATMUL_DESC_BIAS_POINTER, opt.bias);
  if (opt.pre_gelu != nullptr) set_ptr(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, opt.pre_gelu);
  const float alpha = 1.0f, beta = opt.accumulate ? 1.0f : 0.0f;
  const cublasStatus_t st = cublasLtMatmul(g_gemm.handle, plan->desc, &alpha, B.data, plan->a, A.data, plan->b, &beta,
                                           D, plan->c, D, plan->c, &plan->algo, g_gemm.workspace,
                                           g_gemm.workspace_bytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw_error("matmul_quant: cublasLtMatmul returned %s for %s", status_name(st),
                describe_quant(d_fp32, A, B, M, N, K, opt).c_str());
  }
}

// ---------------------------------------------------------------------------------------------------------------
// FP4 products: the route of a pair of encodings, the scratch layout, the argument rules and the two products.

enum class QuantRoute { Fp8, Mxfp4AsE4m3, Nvfp4AsBf16, None };

// Which product multiplies operands encoded a and b: FP8 (its own pairing rules in quant_gemm_operands_error), one
// of the two FP4 families on both sides, or none (an FP4 operand with anything else).
QuantRoute quant_route(const Encoding& a, const Encoding& b) {
  if (a.element != ElementFormat::E2M1 && b.element != ElementFormat::E2M1) return QuantRoute::Fp8;
  if (mxfp4_encoding(a) && mxfp4_encoding(b)) return QuantRoute::Mxfp4AsE4m3;
  if (nvfp4_encoding(a) && nvfp4_encoding(b)) return QuantRoute::Nvfp4AsBf16;
  return QuantRoute::None;
}

// The E4M3 operands an MXFP4 product runs on (fp4_gemm.h: 1x128 power-of-two outer scales).
constexpr Encoding kRemappedMxfp4Encoding{ElementFormat::E4M3, kBlock1x128, ScaleFormat::Pow2FP32};

// Byte offsets in the FP4 scratch buffer (each part 256-byte aligned).
struct Fp4ScratchLayout {
  int Kp = 0;                                  // the converted operands' K (zero-padded)
  size_t a = 0, b = 0, a_scale = 0, b_scale = 0;  // MXFP4: E4M3 codes and outer scales; NVFP4: BF16 (no scales)
  size_t scalars = 0;                          // NVFP4: alpha, beta
  size_t total = 0;
};
// a_values / b_values: that NVFP4 operand brings its BF16 values (QuantOperand::values), so it gets no part.
Fp4ScratchLayout fp4_scratch_layout(QuantRoute route, int M, int N, int K, bool a_values = false,
                                    bool b_values = false) {
  auto part = [](size_t bytes) { return round_up(bytes, 256); };
  Fp4ScratchLayout l;
  if (route == QuantRoute::Mxfp4AsE4m3) {
    l.Kp = mxfp4_remap_cols(K);
    l.b = l.a + part(static_cast<size_t>(M) * l.Kp);
    l.a_scale = l.b + part(static_cast<size_t>(N) * l.Kp);
    l.b_scale = l.a_scale + part(scale_inv_bytes(kRemappedMxfp4Encoding, M, l.Kp));
    l.total = l.b_scale + part(scale_inv_bytes(kRemappedMxfp4Encoding, N, l.Kp));
  } else {
    l.Kp = nvfp4_expand_cols(K);
    l.b = l.a + (a_values ? 0 : part(static_cast<size_t>(M) * l.Kp * sizeof(bf16)));
    l.scalars = l.b + (b_values ? 0 : part(static_cast<size_t>(N) * l.Kp * sizeof(bf16)));
    l.total = l.scalars + part(2 * sizeof(float));
  }
  return l;
}

// The scratch buffer, at least `bytes` (grown by reallocation after the device finished its work on the old one).
uint8_t* fp4_scratch(size_t bytes) {
  if (bytes > g_gemm.fp4_scratch_bytes) {
    if (g_gemm.fp4_scratch != nullptr) {
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaFree(g_gemm.fp4_scratch));
      g_gemm.fp4_scratch = nullptr;
      g_gemm.fp4_scratch_bytes = 0;
    }
    CUDA_CHECK(cudaMalloc(&g_gemm.fp4_scratch, bytes));
    g_gemm.fp4_scratch_bytes = bytes;
  }
  return static_cast<uint8_t*>(g_gemm.fp4_scratch);
}

// The E4M3 operands an MXFP4 product runs on: the remapped codes and outer scales at their places in the scratch.
void remapped_mxfp4_operands(uint8_t* scratch, const Fp4ScratchLayout& l, QuantOperand* a8, QuantOperand* b8) {
  a8->encoding = b8->encoding = kRemappedMxfp4Encoding;
  a8->data = scratch + l.a;
  b8->data = scratch + l.b;
  a8->scale_inv = reinterpret_cast<const float*>(scratch + l.a_scale);
  b8->scale_inv = reinterpret_cast<const float*>(scratch + l.b_scale);
}

// Empty when the arguments describe an FP4 product; otherwise why not, naming the argument (as quant_argument_error).
std::string fp4_argument_error(QuantRoute route, const void* D, bool d_fp32, const QuantOperand& A,
                               const QuantOperand& B, int M, int N, int K, const QuantGemmOptions& opt,
                               bool require_pointers) {
  if (M <= 0 || N <= 0 || K <= 0) return strformat("invalid GEMM shape M=%d N=%d K=%d (all must be > 0)", M, N, K);
  const std::string pair = quant_gemm_operands_error(A.encoding, "A", B.encoding, "B");
  if (!pair.empty()) return pair;
  const bool mx = route == QuantRoute::Mxfp4AsE4m3;
  if (mx && (M % kQuantGemmAlign != 0 || N % kQuantGemmAlign != 0)) {
    return strformat("M=%d and N=%d must be multiples of %d: the MXFP4 product runs as an FP8 GEMM of E4M3 copies "
                     "(K is free: the copies are zero-padded)", M, N, kQuantGemmAlign);
  }
  if (!mx && N % kBf16ExpandColumns != 0) {
    return strformat("N=%d must be a multiple of %d: the NVFP4 product runs as a BF16 GEMM and N is the leading "
                     "dimension of D (M and K are free)", N, kBf16ExpandColumns);
  }
  if (opt.fast_accum) {
    return "fast_accum with FP4 operands: the MXFP4 product runs on block-scaled FP8 kernels (split accumulation) and "
           "the NVFP4 product in BF16; fast accumulation is for per-tensor FP8 scales only";
  }
  if (d_fp32 && (opt.bias != nullptr || opt.pre_gelu != nullptr)) {
    return "bias / pre_gelu (the BIAS and GELU_AUX epilogues) are for a bf16 D (the forward product), not FP32 D";
  }
  if (!d_fp32 && opt.accumulate) return "accumulate (D += A*B^T) is for an FP32 D (weight gradients), not bf16 D";
  for (auto [op, name] : {std::pair<const QuantOperand&, const char*>{A, "A"}, {B, "B"}}) {
    if (op.values == nullptr) continue;
    if (mx) return strformat("%s.values: only NVFP4 operands bring their decoded values", name);
    if (K % kBf16ExpandColumns != 0)
      return strformat("%s.values with K=%d: an operand's values are rows of K, a multiple of %d", name, K,
                       kBf16ExpandColumns);
    if (pointer_alignment(op.values) < 16) return strformat("%s.values (%p) is not 16-byte aligned", name, op.values);
  }
  if (require_pointers) {
    if (D == nullptr) return "D is null";
    for (auto [op, name] : {std::pair<const QuantOperand&, const char*>{A, "A"}, {B, "B"}}) {
      if (op.values == nullptr && (op.data == nullptr || op.scale_inv == nullptr))
        return strformat("%s.data or %s.scale_inv is null (and %s.values too)", name, name, name);
      if (!mx && op.tensor_scale_inv == nullptr) {
        return strformat("%s.tensor_scale_inv is null: NVFP4 operands carry their FP32 tensor scale (quant_operand "
                         "of the QTensor sets it)", name);
      }
    }
    if (mx && opt.inexact_blocks == nullptr) {
      return "opt.inexact_blocks is null: an MXFP4 product counts the blocks its E4M3 remap could not keep exactly "
             "and must be given a device counter for them (zero it and report it)";
    }
  }
  for (auto [p, name] : {std::pair<const void*, const char*>{D, "D"}, {opt.bias, "opt.bias"},
                         {opt.pre_gelu, "opt.pre_gelu"}}) {
    if (p != nullptr && pointer_alignment(p) < 16) {
      return strformat("%s (%p) is not 16-byte aligned (cuBLASLt tensor-core GEMMs need 16-byte aligned buffers)",
                       name, p);
    }
  }
  return "";
}

// The cache key and the cuBLASLt description of the expanded NVFP4 product D (M,N) = alpha · A (M,Kp) · B (N,Kp)ᵀ
// in BF16: the FP8 mapping at the top with BF16 operands and device alpha / beta.
void expanded_bf16_key_and_spec(const void* D, bool d_fp32, const bf16* A, const bf16* B, int M, int N, int Kp,
                                const QuantGemmOptions& opt, GemmKey* key, PlanSpec* spec) {
  *key = GemmKey{M, N, Kp, GemmOp::ExpandedBf16, quant_epilogue(opt), opt.accumulate, pointer_alignment(B),
                 pointer_alignment(A), pointer_alignment(D), pointer_alignment(opt.pre_gelu)};
  key->d_type = d_fp32 ? CUDA_R_32F : CUDA_R_16BF;
  key->align_bias = pointer_alignment(opt.bias);
  *spec = PlanSpec{CUBLAS_OP_T, CUBLAS_OP_N, /*m=*/N, /*n=*/M, /*k=*/Kp, /*lda=*/Kp, /*ldb=*/Kp, /*ldc=*/N,
                   CUDA_R_16BF, CUDA_R_16BF, static_cast<cudaDataType_t>(key->d_type), opt.bias, opt.pre_gelu,
                   /*aux_ld=*/N};
  spec->device_scalars = true;
}

void matmul_fp4_impl(QuantRoute route, void* D, bool d_fp32, const QuantOperand& A, const QuantOperand& B, int M,
                     int N, int K, const QuantGemmOptions& opt, cudaStream_t stream) {
  const std::string arg_error = fp4_argument_error(route, D, d_fp32, A, B, M, N, K, opt, true);
  if (!arg_error.empty()) {
    throw_error("matmul_quant: %s [%s]", arg_error.c_str(), describe_quant(d_fp32, A, B, M, N, K, opt).c_str());
  }
  const Fp4ScratchLayout l = fp4_scratch_layout(route, M, N, K, A.values != nullptr, B.values != nullptr);
  uint8_t* scratch = fp4_scratch(l.total);
  if (route == QuantRoute::Mxfp4AsE4m3) {
    QuantOperand a8, b8;
    remapped_mxfp4_operands(scratch, l, &a8, &b8);
    mxfp4_to_e4m3(scratch + l.a, reinterpret_cast<float*>(scratch + l.a_scale), opt.inexact_blocks, A, M, K, stream);
    mxfp4_to_e4m3(scratch + l.b, reinterpret_cast<float*>(scratch + l.b_scale), opt.inexact_blocks, B, N, K, stream);
    matmul_quant_impl(D, d_fp32, a8, b8, M, N, l.Kp, opt, stream);
    return;
  }
  if (current_compute_capability() < kBf16GemmMinComputeCapability) {
    throw_error("matmul_quant: the NVFP4 product runs in BF16 and needs compute capability %d.%d or newer; this "
                "device is %d.%d [%s]", kBf16GemmMinComputeCapability / 10, kBf16GemmMinComputeCapability % 10,
                current_compute_capability() / 10, current_compute_capability() % 10,
                describe_quant(d_fp32, A, B, M, N, K, opt).c_str());
  }
  if (g_gemm.handle == nullptr) gemm_init();
  const bf16* a16 = A.values;
  const bf16* b16 = B.values;
  if (a16 == nullptr) {
    bf16* expanded = reinterpret_cast<bf16*>(scratch + l.a);
    nvfp4_to_bf16(expanded, A, M, K, stream);
    a16 = expanded;
  }
  if (b16 == nullptr) {
    bf16* expanded = reinterpret_cast<bf16*>(scratch + l.b);
    nvfp4_to_bf16(expanded, B, N, K, stream);
    b16 = expanded;
  }
  float* alpha_beta = reinterpret_cast<float*>(scratch + l.scalars);
  nvfp4_gemm_alpha(alpha_beta, A.tensor_scale_inv, B.tensor_scale_inv, opt.accumulate ? 1.0f : 0.0f, stream);
  GemmKey key{};
  PlanSpec spec;
  expanded_bf16_key_and_spec(D, d_fp32, a16, b16, M, N, l.Kp, opt, &key, &spec);
  std::string why;
  const GemmPlan* plan = find_quant_plan(key, spec, &why);
  if (plan == nullptr) {
    throw_error("matmul_quant: cuBLASLt does not run the BF16 GEMM of the expanded NVFP4 operands of %s on this "
                "device (compute capability %d): %s; check matmul_quant_supported() first and fall back (e.g. bias / "
                "GELU in separate kernels)", describe_quant(d_fp32, A, B, M, N, K, opt).c_str(),
                current_compute_capability(), why.c_str());
  }
  auto set_ptr = [&](cublasLtMatmulDescAttributes_t attr, const void* p) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, attr, &p, sizeof(p)));
  };
  if (opt.bias != nullptr) set_ptr(CUBLASLT_MATMUL_DESC_BIAS_POINTER, opt.bias);
  if (opt.pre_gelu != nullptr) set_ptr(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, opt.pre_gelu);
  const cublasStatus_t st = cublasLtMatmul(g_gemm.handle, plan->desc, alpha_beta, b16, plan->a, a16, plan->b,
                                           alpha_beta + 1, D, plan->c, D, plan->c, &plan->algo, g_gemm.workspace,
                                           g_gemm.workspace_bytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw_error("matmul_quant: cublasLtMatmul returned %s for the expanded NVFP4 operands of %s", status_name(st),
                describe_quant(d_fp32, A, B, M, N, K, opt).c_str());
  }
}

bool matmul_fp4_supported(QuantRoute route, bool d_fp32, const QuantOperand& A, const QuantOperand& B, int M, int N,
                          int K, const QuantGemmOptions& opt) {
  if (!fp4_argument_error(route, nullptr, d_fp32, A, B, M, N, K, opt, false).empty()) return false;
  if (cuda_device_count() == 0) return false;
  const int Kp = fp4_scratch_layout(route, M, N, K).Kp;
  if (route == QuantRoute::Mxfp4AsE4m3) {
    // The FP8 plan of the real call: its operands and scales at their places in the scratch buffer (a block-scaled
    // plan asked for without scale pointers is not the one the call makes).
    const Fp4ScratchLayout l = fp4_scratch_layout(route, M, N, K);
    uint8_t* scratch = fp4_scratch(l.total);
    QuantOperand a8, b8;
    remapped_mxfp4_operands(scratch, l, &a8, &b8);
    return matmul_quant_supported(d_fp32, a8, b8, M, N, l.Kp, opt);
  }
  if (current_compute_capability() < kBf16GemmMinComputeCapability) return false;
  if (g_gemm.handle == nullptr) gemm_init();
  GemmKey key{};
  PlanSpec spec;
  // Null pointers count as 256-byte aligned: the converted operands sit at 256-byte aligned offsets of the scratch
  // buffer, and D is taken as matmul_quant_supported says.
  expanded_bf16_key_and_spec(nullptr, d_fp32, nullptr, nullptr, M, N, Kp, opt, &key, &spec);
  return find_quant_plan(key, spec, nullptr) != nullptr;
}

}  // namespace

void gemm_init(size_t workspace_bytes) {
  if (g_gemm.handle != nullptr) return;
  CUBLAS_CHECK(cublasLtCreate(&g_gemm.handle));
  g_gemm.workspace_bytes = workspace_bytes;
  CUDA_CHECK(cudaMalloc(&g_gemm.workspace, workspace_bytes));
}

void gemm_set_algorithm_tuning(bool on) { g_tune_algorithms = on; }

void gemm_shutdown() {
  if (g_gemm.handle == nullptr) return;
  for (auto& kv : g_gemm.plans) destroy_plan(kv.second);
  g_gemm.plans.clear();
  g_gemm.unsupported.clear();
  cudaFree(g_gemm.fp4_scratch);
  g_gemm.fp4_scratch = nullptr;
  g_gemm.fp4_scratch_bytes = 0;
  cudaFree(g_gemm.workspace);
  g_gemm.workspace = nullptr;
  cublasLtDestroy(g_gemm.handle);
  g_gemm.handle = nullptr;
}

void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int M, int N, int K,
                    cudaStream_t stream, bf16* pre_gelu, const bf16* residual) {
  const char* fn = "matmul_forward";
  check_dims(M, N, K, fn);
  check_aligned(fn, {{out, "out"}, {inp, "inp"}, {weight, "weight"}, {bias, "bias"}, {pre_gelu, "pre_gelu"},
                     {residual, "residual"}});
  if (residual != nullptr && pre_gelu != nullptr)
    throw_error("%s: a residual cannot be added with the GELU_AUX epilogue (the GELU input would include it)", fn);
  if (residual != nullptr && residual == out)
    throw_error("%s: residual and out are the same buffer (pass distinct buffers)", fn);
  cublasLtEpilogue_t epilogue;
  if (pre_gelu != nullptr) {
    epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  } else {
    epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  GemmKey key{M, N, K, GemmOp::Forward, epilogue, residual != nullptr, pointer_alignment(weight),
              pointer_alignment(inp), pointer_alignment(out), pointer_alignment(pre_gelu)};
  key.align_src = pointer_alignment(residual);
  // outᵀ (N×M, ld N) = Wᵀ... : A = weight as column-major (K×N, ld K) with op T; B = inp as column-major (K×M, ld K).
  // The aux matrix pre_gelu and the residual have the shape of D: (N×M) column-major, ld N (N % 8 == 0 checked).
  run_gemm(key, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, weight, K, inp, K, out, N, CUDA_R_16BF, bias, pre_gelu, N, stream,
           residual);
}

void matmul_dgrad(bf16* dinp, const bf16* dout, const bf16* weight, int M, int N, int K, bool accumulate,
                  cudaStream_t stream, const bf16* pre_gelu) {
  const char* fn = "matmul_dgrad";
  check_dims(M, N, K, fn);
  check_aligned(fn, {{dinp, "dinp"}, {dout, "dout"}, {weight, "weight"}, {pre_gelu, "pre_gelu"}});
  if (pre_gelu != nullptr && accumulate) {
    throw_error("matmul_dgrad: the DGELU epilogue cannot accumulate (pass accumulate=false with pre_gelu)");
  }
  cublasLtEpilogue_t epilogue = pre_gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
  GemmKey key{M, N, K, GemmOp::Dgrad, epilogue, accumulate, pointer_alignment(weight), pointer_alignment(dout),
              pointer_alignment(dinp), pointer_alignment(pre_gelu)};
  // dinpᵀ (K×M, ld K) = A (weight as column-major K×N, ld K, op N) · B (doutᵀ as column-major N×M, ld N, op N).
  // aux = pre_gelu (M, K) row-major = (K×M) column-major, ld K (K % 8 == 0 checked above).
  run_gemm(key, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, weight, K, dout, N, dinp, K, CUDA_R_16BF, nullptr, pre_gelu, K,
           stream);
}

void matmul_wgrad(float* dweight, const bf16* dout, const bf16* inp, int M, int N, int K, bool accumulate,
                  cudaStream_t stream) {
  const char* fn = "matmul_wgrad";
  check_dims(M, N, K, fn);
  check_aligned(fn, {{dweight, "dweight"}, {dout, "dout"}, {inp, "inp"}});
  GemmKey key{M, N, K, GemmOp::Wgrad, CUBLASLT_EPILOGUE_DEFAULT, accumulate, pointer_alignment(inp), pointer_alignment(dout),
              pointer_alignment(dweight), 256};
  // dWᵀ (K×N, ld K) = A (inpᵀ as column-major K×M, ld K, op N) · B (doutᵀ as column-major N×M, ld N, op T).
  run_gemm(key, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, inp, K, dout, N, dweight, K, CUDA_R_32F, nullptr, nullptr, 0,
           stream);
}

// ---------------------------------------------------------------------------------------------------------------
// Quantised products

std::string quant_gemm_operands_error(const Encoding& a, const char* a_name, const Encoding& b, const char* b_name) {
  switch (quant_route(a, b)) {
    case QuantRoute::Mxfp4AsE4m3:
    case QuantRoute::Nvfp4AsBf16:
      return "";
    case QuantRoute::None:
      return strformat("%s is %s and %s is %s: an FP4 operand multiplies only an operand of its own FP4 family "
                       "(mxfp4 * mxfp4, e2m1 1x32 e8m0 scales, remapped exactly into E4M3; nvfp4 * nvfp4, e2m1 1x16 "
                       "or 16x16 e4m3 scales + fp32 tensor scale, expanded exactly into BF16)",
                       a_name, encoding_name(a).c_str(), b_name, encoding_name(b).c_str());
    case QuantRoute::Fp8:
      break;
  }
  for (auto [e, name] : {std::pair<const Encoding&, const char*>{a, a_name}, {b, b_name}}) {
    if (!scale_mode_row(e)) {
      return strformat("%s is %s: cuBLASLt multiplies e4m3 / e5m2 codes with fp32 (or pow2) scales per tensor, per "
                       "1x128 or per 128x128 block",
                       name, encoding_name(e).c_str());
    }
  }
  if (a.per_tensor() != b.per_tensor()) {
    return strformat("%s is scaled per %s and %s per %s: cuBLASLt cannot mix per-tensor and block scales in one GEMM "
                     "(SCALAR_32F with VEC128_32F / BLK128x128_32F); use per-tensor scales on both operands or block "
                     "scales on both",
                     a_name, block_shape_name(a.block).c_str(), b_name, block_shape_name(b.block).c_str());
  }
  if (a.block == kBlock128x128 && b.block == kBlock128x128) {
    return strformat("%s and %s are both 128x128 block-scaled; cuBLASLt supports 1x128*1x128, 1x128*128x128 and "
                     "128x128*1x128, never 128x128*128x128 (quantise one operand with 1x128 blocks)",
                     a_name, b_name);
  }
  if (a.element == ElementFormat::E5M2 && b.element == ElementFormat::E5M2)
    return strformat("%s and %s are both e5m2; cuBLASLt has no e5m2*e5m2 kernel (use e4m3 for one operand)", a_name,
                     b_name);
  return "";
}

int quant_gemm_min_compute_capability(const Encoding& a, const Encoding& b) {
  switch (quant_route(a, b)) {
    case QuantRoute::Mxfp4AsE4m3: return scale_mode_of(kRemappedMxfp4Encoding).min_cc;
    case QuantRoute::Nvfp4AsBf16: return kBf16GemmMinComputeCapability;
    case QuantRoute::None: throw_error("gemm: %s", quant_gemm_operands_error(a, "a", b, "b").c_str());
    case QuantRoute::Fp8: break;
  }
  return std::max(scale_mode_of(a).min_cc, scale_mode_of(b).min_cc);
}

int quant_gemm_dim_multiple(const Encoding& e) {
  if (mxfp4_encoding(e)) return kQuantGemmAlign;
  if (nvfp4_encoding(e)) return kBf16ExpandColumns;
  scale_mode_of(e);  // an encoding with a product
  return std::max(kQuantGemmAlign, e.block.cols);
}

size_t quant_gemm_scratch_bytes(const Encoding& a, const Encoding& b, int M, int N, int K, bool a_values,
                                bool b_values) {
  const QuantRoute route = quant_route(a, b);
  if (route == QuantRoute::None) throw_error("gemm: %s", quant_gemm_operands_error(a, "a", b, "b").c_str());
  if (route == QuantRoute::Fp8) return 0;
  if (M <= 0 || N <= 0 || K <= 0) throw_error("quant_gemm_scratch_bytes: M=%d N=%d K=%d must be > 0", M, N, K);
  if ((a_values && !nvfp4_encoding(a)) || (b_values && !nvfp4_encoding(b)))
    throw_error("quant_gemm_scratch_bytes: only NVFP4 operands bring their decoded values");
  return fp4_scratch_layout(route, M, N, K, a_values, b_values).total;
}

QuantOperand quant_operand(const QTensor& q, bool transposed) {
  QuantOperand op;
  op.encoding = q.encoding;
  // a whole-tensor scale is shared by the transposed copy; block scales: the copy has its own GEMM-ready scales
  const bool own_scales_t = transposed && !q.encoding.per_tensor();
  op.data = transposed ? q.data_t : q.data;
  op.scale_inv = own_scales_t ? q.scale_inv_t : q.scale_inv;
  if (q.encoding.tensor_scale) op.tensor_scale_inv = transposed ? q.tensor_scale_inv_t : q.tensor_scale_inv;
  op.values = transposed ? q.values_t : q.values;
  if (op.data == nullptr && op.values == nullptr) {
    throw_error("quant_operand: the QTensor (%d x %d, %s) has no %s copy (its %s is null); quantise it with that "
                "copy kept", q.rows, q.cols, encoding_name(q.encoding).c_str(),
                transposed ? "transposed" : "row-major", transposed ? "data_t and values_t" : "data and values");
  }
  if (op.scale_inv == nullptr) {
    throw_error("quant_operand: the QTensor (%d x %d, %s) has no %s", q.rows, q.cols,
                encoding_name(q.encoding).c_str(), own_scales_t ? "scale_inv_t" : "scale_inv");
  }
  return op;
}

void matmul_quant(bf16* D, const QuantOperand& A, const QuantOperand& B, int M, int N, int K,
                  const QuantGemmOptions& opt, cudaStream_t stream) {
  const QuantRoute route = quant_route(A.encoding, B.encoding);
  if (route == QuantRoute::Fp8) matmul_quant_impl(D, false, A, B, M, N, K, opt, stream);
  else matmul_fp4_impl(route, D, false, A, B, M, N, K, opt, stream);
}

void matmul_quant(float* D, const QuantOperand& A, const QuantOperand& B, int M, int N, int K,
                  const QuantGemmOptions& opt, cudaStream_t stream) {
  const QuantRoute route = quant_route(A.encoding, B.encoding);
  if (route == QuantRoute::Fp8) matmul_quant_impl(D, true, A, B, M, N, K, opt, stream);
  else matmul_fp4_impl(route, D, true, A, B, M, N, K, opt, stream);
}

bool matmul_quant_supported(bool d_fp32, const QuantOperand& A, const QuantOperand& B, int M, int N, int K,
                            const QuantGemmOptions& opt) {
  const QuantRoute route = quant_route(A.encoding, B.encoding);
  if (route != QuantRoute::Fp8) return matmul_fp4_supported(route, d_fp32, A, B, M, N, K, opt);
  if (!quant_argument_error(nullptr, d_fp32, A, B, M, N, K, opt, false).empty()) return false;
  if (cuda_device_count() == 0) return false;
  if (!quant_device_error(A, B).empty()) return false;
  if (g_gemm.handle == nullptr) gemm_init();
  GemmKey key{};
  PlanSpec spec;
  // D is not known here: asked for a 256-byte aligned D (what cudaMalloc returns); a call with a less aligned D asks
  // the heuristic again.
  quant_key_and_spec(nullptr, d_fp32, A, B, M, N, K, opt, &key, &spec);
  return find_quant_plan(key, spec, nullptr) != nullptr;
}

}  // namespace llmc
