// dev/cuda/bench_gemm_algos.cu: how much the choice of cuBLASLt algorithm matters for the BF16 products of GPT-2 training,
// and whether the alternatives give the same bits as the heuristic's first choice.
//
//   ./build/dev/cuda/bench_gemm_algos [M] [C] [candidates]      (default M = 32768 tokens, C = 768, 8 candidates)
//
// For each product of a GPT-2 block (and the tied lm_head) with the epilogue the trainer uses, asks cuBLASLt's
// heuristic for up to `candidates` algorithms, times each (median of 9 timings of 5 back-to-back calls, after a
// warm-up) on random bf16 inputs, and compares its output bitwise with the first candidate's. Prints one line per
// candidate: time, TFLOP/s, speedup over candidate 0, "same bits" or the number of differing elements.
// The layouts are llmc/precision/gemm.cu's (row-major tensors seen as column-major by cuBLASLt).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CHECK_CUDA(x)                                                                               \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)
#define CHECK_BLAS(x)                                                                               \
  do {                                                                                              \
    cublasStatus_t s_ = (x);                                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                              \
      std::fprintf(stderr, "cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__);              \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

namespace {

using bf16 = __nv_bfloat16;

struct Product {
  std::string name;
  cublasOperation_t ta, tb;
  int m, n, k;  // column-major D (m x n) = op(A) (m x k) * op(B) (k x n)
  int lda, ldb, ldd;
  bool d_fp32, accumulate;
  cublasLtEpilogue_t epilogue;
  bool bias, aux;
};

void* device_random(size_t bytes, std::mt19937& rng, bool fp32) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  if (fp32) {
    std::vector<float> h(bytes / 4);
    for (float& v : h) v = dist(rng);
    CHECK_CUDA(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
  } else {
    std::vector<bf16> h(bytes / 2);
    for (bf16& v : h) v = __float2bfloat16(dist(rng));
    CHECK_CUDA(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
  }
  return p;
}

void run(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes, const Product& p, int candidates,
         std::mt19937& rng) {
  const size_t a_elems = (size_t)p.m * p.k, b_elems = (size_t)p.k * p.n, d_elems = (size_t)p.m * p.n;
  const size_t d_bytes = d_elems * (p.d_fp32 ? 4 : 2);
  void* A = device_random(a_elems * 2, rng, false);
  void* B = device_random(b_elems * 2, rng, false);
  void* D0 = device_random(d_bytes, rng, p.d_fp32);  // the accumulate products start from the same D
  void* D = nullptr;
  CHECK_CUDA(cudaMalloc(&D, d_bytes));
  void* ref = nullptr;
  CHECK_CUDA(cudaMalloc(&ref, d_bytes));
  void* bias = p.bias ? device_random((size_t)p.m * 2, rng, false) : nullptr;
  void* aux = p.aux ? device_random(d_elems * 2, rng, false) : nullptr;

  cublasLtMatmulDesc_t desc;
  CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &p.ta, sizeof(p.ta)));
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &p.tb, sizeof(p.tb)));
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue)));
  if (bias) CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (aux) {
    const int64_t ld = p.m;
    const cudaDataType_t t = CUDA_R_16BF;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof(t)));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  const bool a_n = p.ta == CUBLAS_OP_N, b_n = p.tb == CUBLAS_OP_N;
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, a_n ? p.m : p.k, a_n ? p.k : p.m, p.lda));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, b_n ? p.k : p.n, b_n ? p.n : p.k, p.ldb));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&ld, p.d_fp32 ? CUDA_R_32F : CUDA_R_16BF, p.m, p.n, p.ldd));
  cublasLtMatmulPreference_t pref;
  CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(candidates);
  int found = 0;
  CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, candidates, results.data(), &found));
  const double flops = 2.0 * p.m * p.n * p.k;
  std::printf("%s  (m %d n %d k %d): %d candidates\n", p.name.c_str(), p.m, p.n, p.k, found);
  const float alpha = 1.f, beta = p.accumulate ? 1.f : 0.f;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  double t0 = 0;
  std::vector<unsigned char> ref_host(d_bytes), got_host(d_bytes);
  for (int i = 0; i < found; i++) {
    auto call = [&]() {
      return cublasLtMatmul(handle, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &results[i].algo, workspace,
                            workspace_bytes, 0);
    };
    // correctness / bits: from the same starting D
    CHECK_CUDA(cudaMemcpy(D, D0, d_bytes, cudaMemcpyDeviceToDevice));
    if (call() != CUBLAS_STATUS_SUCCESS) {
      std::printf("  [%d] failed to run\n", i);
      continue;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(got_host.data(), D, d_bytes, cudaMemcpyDeviceToHost));
    if (i == 0) ref_host = got_host;
    size_t differ = 0;
    const size_t elem = p.d_fp32 ? 4 : 2;
    for (size_t e = 0; e < d_elems; e++) differ += std::memcmp(&got_host[e * elem], &ref_host[e * elem], elem) != 0;
    // timing (D keeps accumulating for the += products: same work)
    std::vector<float> times;
    for (int w = 0; w < 3; w++) CHECK_BLAS(call());
    for (int r = 0; r < 9; r++) {
      CHECK_CUDA(cudaEventRecord(start));
      for (int c = 0; c < 5; c++) CHECK_BLAS(call());
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      times.push_back(ms / 5);
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    if (i == 0) t0 = t;
    int tile = -1, splitk = -1, stages = -1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                         &written);
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages),
                                         &written);
    std::printf("  [%d] %.4f ms  %6.1f TFLOP/s  x%.3f  tile %d splitk %d stages %d  ws %zu  %s\n", i, t,
                flops / t / 1e9, t0 / t, tile, splitk, stages, results[i].workspaceSize,
                differ == 0 ? "same bits" : (std::to_string(differ) + " elements differ").c_str());
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  for (void* q : {A, B, D0, D, ref, bias, aux}) cudaFree(q);
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
}

}  // namespace

int main(int argc, char** argv) {
  const int M = argc > 1 ? std::atoi(argv[1]) : 32768;
  const int C = argc > 2 ? std::atoi(argv[2]) : 768;
  const int candidates = argc > 3 ? std::atoi(argv[3]) : 8;
  const int H = 4 * C, Vp = 50304;
  cublasLtHandle_t handle;
  CHECK_BLAS(cublasLtCreate(&handle));
  const size_t workspace_bytes = 32u << 20;
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  std::mt19937 rng(1234);
  const auto T = CUBLAS_OP_T, N = CUBLAS_OP_N;
  // forward: D (out x M) = Wᵀ(out x in) · X (in x M); dgrad: D (in x M) = W (in x out) · dY (out x M);
  // wgrad: D (in x out) += X (in x M) · dYᵀ (M x out), FP32.
  auto fwd = [&](const char* name, int out, int in, cublasLtEpilogue_t e, bool bias, bool aux) {
    return Product{name, T, N, out, M, in, in, in, out, false, false, e, bias, aux};
  };
  auto dgrad = [&](const char* name, int out, int in, cublasLtEpilogue_t e, bool aux) {
    return Product{name, N, N, in, M, out, in, out, in, false, false, e, false, aux};
  };
  auto wgrad = [&](const char* name, int out, int in) {
    return Product{name, N, T, in, out, M, in, out, in, true, true, CUBLASLT_EPILOGUE_DEFAULT, false, false};
  };
  const std::vector<Product> products = {
      fwd("qkv fwd (bias)", 3 * C, C, CUBLASLT_EPILOGUE_BIAS, true, false),
      fwd("attproj fwd (bias)", C, C, CUBLASLT_EPILOGUE_BIAS, true, false),
      fwd("fc fwd (gelu_aux + bias)", H, C, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, true, true),
      fwd("fcproj fwd (bias)", C, H, CUBLASLT_EPILOGUE_BIAS, true, false),
      fwd("lm_head fwd", Vp, C, CUBLASLT_EPILOGUE_DEFAULT, false, false),
      dgrad("qkv dgrad", 3 * C, C, CUBLASLT_EPILOGUE_DEFAULT, false),
      dgrad("attproj dgrad", C, C, CUBLASLT_EPILOGUE_DEFAULT, false),
      dgrad("fc dgrad", H, C, CUBLASLT_EPILOGUE_DEFAULT, false),
      dgrad("fcproj dgrad (dgelu)", C, H, CUBLASLT_EPILOGUE_DGELU, true),
      dgrad("lm_head dgrad", Vp, C, CUBLASLT_EPILOGUE_DEFAULT, false),
      wgrad("qkv wgrad", 3 * C, C),
      wgrad("attproj wgrad", C, C),
      wgrad("fc wgrad", H, C),
      wgrad("fcproj wgrad", C, H),
      wgrad("lm_head wgrad", Vp, C),
  };
  for (const Product& p : products) run(handle, workspace, workspace_bytes, p, candidates, rng);
  cudaFree(workspace);
  cublasLtDestroy(handle);
  return 0;
}
