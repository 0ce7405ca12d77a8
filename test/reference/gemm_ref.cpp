// test/reference/gemm_ref.cpp: the FP64 CPU references of the GEMMs of llmc/precision/gemm.h (declared in
// test/reference/precision_ref.h): the BF16 products of a linear layer on float inputs, and the quantised product
// D = A·Bᵀ from the codes and the GEMM-ready scales (llmc/precision/tensor.h), dequantised element by element.
#include <algorithm>
#include <array>
#include <thread>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "llmc/core/common.h"
#include "llmc/precision/scale_math.cuh"
#include "test/reference/precision_ref.h"

namespace llmc {

namespace {

// The exact value of every FP8 code: CUDA's host conversion to half holds every E4M3 / E5M2 value (NaN stays NaN).
const float* fp8_values(ElementFormat f) {
  static const std::array<std::array<float, 256>, 2> tables = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (int c = 0; c < 256; c++) {
      const __nv_fp8_storage_t code = static_cast<__nv_fp8_storage_t>(c);
      t[0][c] = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
      t[1][c] = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E5M2)));
    }
    return t;
  }();
  return tables[f == ElementFormat::E4M3 ? 0 : 1].data();
}

// out (rows, K) = the dequantised operand in FP64.
std::vector<double> dequantize_operand(const uint8_t* codes, const float* scale_inv, const Encoding& e, int rows,
                                       int K) {
  if (!is_fp8(e.element)) throw_error("matmul_quant_cpu: %s is not an FP8 encoding", encoding_name(e).c_str());
  const float* values = fp8_values(e.element);
  const int ld = scale_inv_ld(e, rows, K);
  std::vector<double> out((size_t)rows * K);
  for (int r = 0; r < rows; r++) {
    for (int k = 0; k < K; k++) {
      const size_t i = (size_t)r * K + k;
      out[i] = (double)values[codes[i]] * (double)scale_inv[scale_index(e.block, r, k, ld)];
    }
  }
  return out;
}

// fn(row_begin, row_end) over [0, rows) on the machine's cores (the FP64 references run at GPT-2 sizes).
template <typename F>
void parallel_rows(int rows, F&& fn) {
  const int threads = std::max(1, std::min<int>({(int)std::thread::hardware_concurrency(), 64, rows}));
  std::vector<std::thread> pool;
  const int chunk = (rows + threads - 1) / threads;
  for (int t = 0; t < threads; t++) {
    const int begin = t * chunk, end = std::min(rows, begin + chunk);
    if (begin < end) pool.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  for (auto& th : pool) th.join();
}

}  // namespace

void matmul_quant_cpu(double* D, const uint8_t* A, const float* a_scale_inv, const Encoding& ae, const uint8_t* B,
                      const float* b_scale_inv, const Encoding& be, int M, int N, int K, const float* bias) {
  if (D == nullptr || A == nullptr || B == nullptr || a_scale_inv == nullptr || b_scale_inv == nullptr) {
    throw_error("matmul_quant_cpu: D, A, B, a_scale_inv and b_scale_inv must all be non-null");
  }
  if (M <= 0 || N <= 0 || K <= 0) throw_error("matmul_quant_cpu: invalid shape M=%d N=%d K=%d", M, N, K);
  const std::vector<double> a = dequantize_operand(A, a_scale_inv, ae, M, K);  // (M, K)
  const std::vector<double> b = dequantize_operand(B, b_scale_inv, be, N, K);  // (N, K)
  parallel_rows(M, [&](int begin, int end) {
    for (int i = begin; i < end; i++) {
      const double* x = a.data() + (size_t)i * K;  // (K)
      for (int j = 0; j < N; j++) {
        const double* w = b.data() + (size_t)j * K;  // (K)
        double acc = bias ? (double)bias[j] : 0.0;
        for (int k = 0; k < K; k++) acc += x[k] * w[k];
        D[(size_t)i * N + j] = acc;
      }
    }
  });
}

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
