// llmc/gemm.cu: the cuBLASLt wrapper behind llmc/gemm.h. One handle and one workspace per process (current device),
// BF16 A/B with FP32 accumulation (CUBLAS_COMPUTE_32F), bf16 or FP32 C/D, bias / GELU_AUX / DGELU epilogues, and a
// cache of (matmul descriptor, layouts, heuristic algorithm) per problem so that the algorithm of a given GEMM never
// changes within a run (cuBLASLt is bitwise deterministic for a fixed algorithm; split-K schemes that reduce in place
// through atomics are excluded). Also the FP64 CPU references.
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
#include "llmc/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include <cublasLt.h>

#include "llmc/common.h"

namespace llmc {

namespace {

enum class GemmOp : int { Forward = 0, Dgrad = 1, Wgrad = 2 };

struct GemmKey {
  int M, N, K;
  GemmOp op;
  cublasLtEpilogue_t epilogue;
  bool accumulate;
  int align_a, align_b, align_c, align_aux;  // pointer alignments (bytes, capped at 256) the algorithm was chosen for
  bool operator<(const GemmKey& o) const {
    return std::tie(M, N, K, op, epilogue, accumulate, align_a, align_b, align_c, align_aux) <
           std::tie(o.M, o.N, o.K, o.op, o.epilogue, o.accumulate, o.align_a, o.align_b, o.align_c, o.align_aux);
  }
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct GemmState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<GemmKey, GemmPlan> plans;
};

GemmState g_gemm;

int pointer_alignment(const void* p) {
  if (p == nullptr) return 256;
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 256 && (v % (2 * a)) == 0) a *= 2;
  return a;
}

void check_aligned(const void* p, const char* what, const char* fn) {
  if (p != nullptr && pointer_alignment(p) < 16) {
    throw_error("%s: pointer %s (%p) is not 16-byte aligned; cuBLASLt tensor-core GEMMs need 16-byte aligned "
                "buffers (carve activations at multiples of 8 bf16 elements)", fn, what, p);
  }
}

void check_dims(int M, int N, int K, const char* fn) {
  if (M <= 0 || N <= 0 || K <= 0) throw_error("%s: invalid GEMM shape M=%d N=%d K=%d (all must be > 0)", fn, M, N, K);
  if (N % 8 != 0 || K % 8 != 0) {
    throw_error("%s: N=%d and K=%d must be multiples of 8 (they are leading dimensions of bf16 row-major matrices; "
                "pad the layer width, e.g. the vocabulary to a multiple of 128)", fn, N, K);
  }
}

// Creates the descriptor, layouts and the heuristic algorithm of one GEMM the first time it is seen.
// a_rows/a_cols/lda etc. describe the column-major operands as cuBLASLt sees them (before op).
const GemmPlan& get_plan(const GemmKey& key, cublasOperation_t trans_a, cublasOperation_t trans_b, int m, int n,
                         int k, int64_t lda, int64_t ldb, int64_t ldc, cudaDataType_t c_type, const void* bias,
                         const void* aux, int64_t aux_ld) {
  auto it = g_gemm.plans.find(key);
  if (it != g_gemm.plans.end()) return it->second;

  GemmPlan plan;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  cublasLtEpilogue_t epilogue = key.epilogue;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  // Pointers are set again on every call; here they only tell the heuristic their alignment.
  if (bias != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    cudaDataType_t aux_type = CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                                sizeof(aux_type)));
  }
  // Operand layouts (column-major, before op): A is (lda-rows × cols) etc.
  const int a_rows = (trans_a == CUBLAS_OP_N) ? m : k, a_cols = (trans_a == CUBLAS_OP_N) ? k : m;
  const int b_rows = (trans_b == CUBLAS_OP_N) ? k : n, b_cols = (trans_b == CUBLAS_OP_N) ? n : k;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, a_rows, a_cols, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, b_rows, b_cols, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, c_type, m, n, ldc));

  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &g_gemm.workspace_bytes, sizeof(g_gemm.workspace_bytes)));
  // Deterministic: no split-K reduction "in place" in the output buffer (its order of additions can vary).
  uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK & ~static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_INPLACE);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction_mask,
                                                    sizeof(reduction_mask)));
  uint32_t align_a = key.align_a, align_b = key.align_b, align_c = key.align_c;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, 4));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, 4));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, 4));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, 4));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g_gemm.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1,
                                              &result, &found));
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (found == 0) {
    throw_error("gemm: cuBLASLt found no algorithm for op=%d M=%d N=%d K=%d epilogue=%d accumulate=%d (alignments "
                "%d/%d/%d bytes); check the shapes and the CUDA architecture",
                static_cast<int>(key.op), key.M, key.N, key.K, static_cast<int>(key.epilogue), key.accumulate ? 1 : 0,
                key.align_a, key.align_b, key.align_c);
  }
  plan.algo = result.algo;
  return g_gemm.plans.emplace(key, plan).first->second;
}

// Runs D = alpha · op(A) · op(B) + beta · C with C = D, using the cached plan.
void run_gemm(const GemmKey& key, cublasOperation_t trans_a, cublasOperation_t trans_b, int m, int n, int k,
              const bf16* A, int64_t lda, const bf16* B, int64_t ldb, void* D, int64_t ldd, cudaDataType_t d_type,
              const void* bias, const void* aux, int64_t aux_ld, cudaStream_t stream) {
  if (g_gemm.handle == nullptr) gemm_init();
  const GemmPlan& plan = get_plan(key, trans_a, trans_b, m, n, k, lda, ldb, ldd, d_type, bias, aux, aux_ld);
  if (bias != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  const float alpha = 1.0f, beta = key.accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(g_gemm.handle, plan.desc, &alpha, A, plan.a, B, plan.b, &beta, D, plan.c, D, plan.c,
                              &plan.algo, g_gemm.workspace, g_gemm.workspace_bytes, stream));
}

}  // namespace

void gemm_init(size_t workspace_bytes) {
  if (g_gemm.handle != nullptr) return;
  CUBLAS_CHECK(cublasLtCreate(&g_gemm.handle));
  g_gemm.workspace_bytes = workspace_bytes;
  CUDA_CHECK(cudaMalloc(&g_gemm.workspace, workspace_bytes));
}

void gemm_shutdown() {
  if (g_gemm.handle == nullptr) return;
  for (auto& kv : g_gemm.plans) {
    cublasLtMatrixLayoutDestroy(kv.second.a);
    cublasLtMatrixLayoutDestroy(kv.second.b);
    cublasLtMatrixLayoutDestroy(kv.second.c);
    cublasLtMatmulDescDestroy(kv.second.desc);
  }
  g_gemm.plans.clear();
  cudaFree(g_gemm.workspace);
  g_gemm.workspace = nullptr;
  cublasLtDestroy(g_gemm.handle);
  g_gemm.handle = nullptr;
}

void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int M, int N, int K,
                    cudaStream_t stream, bf16* pre_gelu) {
  const char* fn = "matmul_forward";
  check_dims(M, N, K, fn);
  check_aligned(out, "out", fn);
  check_aligned(inp, "inp", fn);
  check_aligned(weight, "weight", fn);
  check_aligned(bias, "bias", fn);
  check_aligned(pre_gelu, "pre_gelu", fn);
  cublasLtEpilogue_t epilogue;
  if (pre_gelu != nullptr) {
    epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  } else {
    epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  GemmKey key{M, N, K, GemmOp::Forward, epilogue, false, pointer_alignment(weight), pointer_alignment(inp),
              pointer_alignment(out), pointer_alignment(pre_gelu)};
  // outᵀ (N×M, ld N) = Wᵀ... : A = weight as column-major (K×N, ld K) with op T; B = inp as column-major (K×M, ld K).
  // The aux matrix pre_gelu has the shape of D: (N×M) column-major, ld N (N % 8 == 0 checked above).
  run_gemm(key, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, weight, K, inp, K, out, N, CUDA_R_16BF, bias, pre_gelu, N, stream);
}

void matmul_dgrad(bf16* dinp, const bf16* dout, const bf16* weight, int M, int N, int K, bool accumulate,
                  cudaStream_t stream, const bf16* pre_gelu) {
  const char* fn = "matmul_dgrad";
  check_dims(M, N, K, fn);
  check_aligned(dinp, "dinp", fn);
  check_aligned(dout, "dout", fn);
  check_aligned(weight, "weight", fn);
  check_aligned(pre_gelu, "pre_gelu", fn);
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
  check_aligned(dweight, "dweight", fn);
  check_aligned(dout, "dout", fn);
  check_aligned(inp, "inp", fn);
  GemmKey key{M, N, K, GemmOp::Wgrad, CUBLASLT_EPILOGUE_DEFAULT, accumulate, pointer_alignment(inp), pointer_alignment(dout),
              pointer_alignment(dweight), 256};
  // dWᵀ (K×N, ld K) = A (inpᵀ as column-major K×M, ld K, op N) · B (doutᵀ as column-major N×M, ld N, op T).
  run_gemm(key, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, inp, K, dout, N, dweight, K, CUDA_R_32F, nullptr, nullptr, 0,
           stream);
}

// ---------------------------------------------------------------------------------------------------------------
// CPU references (FP64 accumulation), row-major as in the header.

void matmul_forward_cpu(float* out, const float* inp, const float* weight, const float* bias, int M, int N, int K) {
  for (int i = 0; i < M; i++) {
    const float* x = inp + (size_t)i * K;  // (K)
    for (int j = 0; j < N; j++) {
      const float* w = weight + (size_t)j * K;  // (K)
      double acc = bias ? (double)bias[j] : 0.0;
      for (int k = 0; k < K; k++) acc += (double)x[k] * (double)w[k];
      out[(size_t)i * N + j] = (float)acc;
    }
  }
}

void matmul_dgrad_cpu(float* dinp, const float* dout, const float* weight, int M, int N, int K) {
  std::vector<double> row(K);
  for (int i = 0; i < M; i++) {
    std::fill(row.begin(), row.end(), 0.0);
    const float* dy = dout + (size_t)i * N;  // (N)
    for (int j = 0; j < N; j++) {
      const double g = dy[j];
      const float* w = weight + (size_t)j * K;  // (K)
      for (int k = 0; k < K; k++) row[k] += g * (double)w[k];
    }
    for (int k = 0; k < K; k++) dinp[(size_t)i * K + k] = (float)row[k];
  }
}

void matmul_wgrad_cpu(float* dweight, const float* dout, const float* inp, int M, int N, int K) {
  std::vector<double> acc((size_t)N * K, 0.0);  // (N, K)
  for (int i = 0; i < M; i++) {
    const float* dy = dout + (size_t)i * N;  // (N)
    const float* x = inp + (size_t)i * K;    // (K)
    for (int j = 0; j < N; j++) {
      const double g = dy[j];
      double* a = acc.data() + (size_t)j * K;
      for (int k = 0; k < K; k++) a[k] += g * (double)x[k];
    }
  }
  for (size_t idx = 0; idx < acc.size(); idx++) dweight[idx] = (float)acc[idx];
}

}  // namespace llmc
