// test/reference/fp4_gemm_ref.cpp: the CPU references of the FP4 products and their operand conversions (declared in
// test/reference/fp4_gemm_ref.h), element by element from the definitions, with the host codecs of
// llmc/core/dtypes.h.
#include "test/reference/fp4_gemm_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/scale_math.cuh"

namespace llmc {

namespace {

void check_fp4(const char* who, const Fp4CpuOperand& a) {
  if (!fp4_encoding(a.encoding)) throw_error("%s: %s is not an FP4 encoding", who, encoding_name(a.encoding).c_str());
  if (a.rows < 0 || a.K < 0) throw_error("%s: rows = %d, K = %d must be >= 0", who, a.rows, a.K);
}

uint8_t code_at(const Fp4CpuOperand& a, int r, int c) {
  return e2m1_unpack(a.codes[static_cast<size_t>(r) * ((a.K + 1) / 2) + c / 2], c);
}
uint8_t scale_at(const Fp4CpuOperand& a, int r, int c) {
  return a.scales[scale_index(a.encoding.block, r, c, scale_inv_ld(a.encoding, a.rows, a.K))];
}
double block_scale_value(const Fp4CpuOperand& a, uint8_t s) {
  return nvfp4_encoding(a.encoding) ? static_cast<double>(fp8_decode(s, ElementFormat::E4M3))
                                    : static_cast<double>(e8m0_decode(s));
}

}  // namespace

void fp4_values_cpu(double* out, const Fp4CpuOperand& a) {
  check_fp4("fp4_values_cpu", a);
  const bool nvfp4 = nvfp4_encoding(a.encoding);
  for (int r = 0; r < a.rows; r++)
    for (int c = 0; c < a.K; c++) {
      double v = static_cast<double>(e2m1_decode(code_at(a, r, c))) * block_scale_value(a, scale_at(a, r, c));
      if (nvfp4) v *= static_cast<double>(a.tensor_scale_inv);
      out[static_cast<size_t>(r) * a.K + c] = v;
    }
}

void fp4_matmul_cpu(double* D, double* absref, const Fp4CpuOperand& A, const Fp4CpuOperand& B, int m0, int m1) {
  const char* who = "fp4_matmul_cpu";
  check_fp4(who, A);
  check_fp4(who, B);
  if (A.K != B.K) throw_error("%s: A has K = %d, B has K = %d", who, A.K, B.K);
  if (m0 < 0 || m1 > A.rows || m0 > m1) throw_error("%s: rows [%d, %d) outside A's %d rows", who, m0, m1, A.rows);
  const int K = A.K, N = B.rows;
  std::vector<double> a(static_cast<size_t>(A.rows) * K), b(static_cast<size_t>(N) * K);
  fp4_values_cpu(a.data(), A);
  fp4_values_cpu(b.data(), B);
  for (int m = m0; m < m1; m++)
    for (int n = 0; n < N; n++) {
      double s = 0.0, sa = 0.0;
      for (int k = 0; k < K; k++) {
        const double p = a[static_cast<size_t>(m) * K + k] * b[static_cast<size_t>(n) * K + k];
        s += p;
        sa += std::fabs(p);
      }
      D[static_cast<size_t>(m - m0) * N + n] = s;
      absref[static_cast<size_t>(m - m0) * N + n] = sa;
    }
}

uint64_t mxfp4_to_e4m3_cpu(uint8_t* codes, float* scale_inv, const Fp4CpuOperand& src) {
  const char* who = "mxfp4_to_e4m3_cpu";
  check_fp4(who, src);
  if (!mxfp4_encoding(src.encoding)) throw_error("%s: %s is not MXFP4", who, encoding_name(src.encoding).c_str());
  constexpr int kRun = 128, kBlock = 32;
  const int rows = src.rows, K = src.K, Kp = static_cast<int>(round_up(K, kRun)), ld = static_cast<int>(round_up(rows, 4));
  std::vector<double> v(static_cast<size_t>(rows) * K);
  fp4_values_cpu(v.data(), src);
  std::fill(scale_inv, scale_inv + static_cast<size_t>(Kp / kRun) * ld, 1.0f);
  std::fill(codes, codes + static_cast<size_t>(rows) * Kp, 0);
  uint64_t inexact_blocks = 0;
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < Kp / kRun; j++) {
      const int c0 = j * kRun, c1 = std::min(K, c0 + kRun);
      int top = 0;
      bool any = false;
      for (int c = c0; c < c1; c++) {
        const double x = v[static_cast<size_t>(r) * K + c];
        if (x != 0.0 && std::isfinite(x)) {
          int e = 0;
          std::frexp(x, &e);  // |x| = f * 2^e, f in [0.5, 1): floor(log2 |x|) = e - 1
          top = any ? std::max(top, e - 1) : e - 1;
          any = true;
        }
      }
      const int R = any ? top - 8 : 0;
      scale_inv[static_cast<size_t>(j) * ld + r] = std::ldexp(1.0f, R);
      for (int b0 = c0; b0 < c1; b0 += kBlock) {
        bool exact_block = true;
        for (int c = b0; c < std::min(c1, b0 + kBlock); c++) {
          const double x = v[static_cast<size_t>(r) * K + c];
          uint8_t code = 0;
          if (std::isnan(x)) {
            code = kFp8NanCode;
          } else {
            code = fp8_encode(static_cast<float>(std::ldexp(x, -R)), ElementFormat::E4M3);
            if (std::ldexp(static_cast<double>(fp8_decode(code, ElementFormat::E4M3)), R) != x) exact_block = false;
          }
          codes[static_cast<size_t>(r) * Kp + c] = code;
        }
        inexact_blocks += exact_block ? 0 : 1;
      }
    }
  return inexact_blocks;
}

void nvfp4_to_bf16_cpu(uint16_t* out, const Fp4CpuOperand& src) {
  const char* who = "nvfp4_to_bf16_cpu";
  check_fp4(who, src);
  if (!nvfp4_encoding(src.encoding)) throw_error("%s: %s is not NVFP4", who, encoding_name(src.encoding).c_str());
  const int Kp = static_cast<int>(round_up(src.K, 8));
  for (int r = 0; r < src.rows; r++)
    for (int c = 0; c < Kp; c++) {
      float v = 0.0f;
      if (c < src.K) {
        const double x = static_cast<double>(e2m1_decode(code_at(src, r, c))) *
                         static_cast<double>(fp8_decode(scale_at(src, r, c), ElementFormat::E4M3));
        v = static_cast<float>(x);
      }
      out[static_cast<size_t>(r) * Kp + c] = bf16_encode(v);
    }
}

}  // namespace llmc
