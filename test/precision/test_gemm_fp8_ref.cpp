// test/precision/test_gemm_fp8_ref.cpp: the FP64 reference of the FP8 GEMMs (matmul_quant_cpu), on the host: every FP8
// code decodes to its exact value (against a bit-level decoder written here), per-tensor scales multiply, and the block
// scales are read from the GEMM-ready layouts of llmc/precision/tensor.h at the right index (padding entries are NaN
// here, so reading one shows up). The GPU test compares cuBLASLt against this reference.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/precision/encoding.h"
#include "test/reference/precision_ref.h"

using namespace llmc;

namespace {

constexpr uint8_t kOneE4M3 = 0x38;  // 1.0 = 0 0111 000
constexpr uint8_t kOneE5M2 = 0x3C;  // 1.0 = 0 01111 00
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// OCP FP8 decoding from the bits: E4M3 bias 7 (exponent 15 with mantissa 7 is NaN, no infinities), E5M2 bias 15
// (exponent 31: infinities and NaN).
double decode_e4m3(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  double v;
  if (e == 15 && m == 7) return std::nan("");
  if (e == 0) v = m * std::ldexp(1.0, -9);
  else v = (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return s ? -v : v;
}
double decode_e5m2(uint8_t b) {
  const int s = b >> 7, e = (b >> 2) & 31, m = b & 3;
  double v;
  if (e == 31) v = (m == 0) ? INFINITY : std::nan("");
  else if (e == 0) v = m * std::ldexp(1.0, -16);
  else v = (1.0 + m / 4.0) * std::ldexp(1.0, e - 15);
  return s ? -v : v;
}

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

}  // namespace

// A (256, 16) holds code r in column 0 of row r, B (1, 16) = 1.0 in column 0: D[r] = value(code r), exactly.
TEST(GemmFp8Reference, DecodesEveryCode) {
  for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2}) {
    const int M = 256, N = 1, K = 16;
    std::vector<uint8_t> a((size_t)M * K, 0), b((size_t)N * K, 0);
    for (int r = 0; r < M; r++) a[(size_t)r * K] = (uint8_t)r;
    b[0] = kOneE4M3;
    const float one = 1.0f;
    std::vector<double> d(M * N);
    matmul_quant_cpu(d.data(), a.data(), &one, Encoding{f, kWholeTensor}, b.data(), &one,
                     Encoding{ElementFormat::E4M3, kWholeTensor}, M, N, K, nullptr);
    for (int r = 0; r < M; r++) {
      const double want = f == ElementFormat::E4M3 ? decode_e4m3((uint8_t)r) : decode_e5m2((uint8_t)r);
      EXPECT_TRUE(same_value(d[r], want)) << (f == ElementFormat::E4M3 ? "e4m3" : "e5m2") << " code 0x" << std::hex << r
                                          << std::dec << ": got " << d[r] << " want " << want;
    }
  }
  // anchors: the format maxima and the smallest subnormals
  EXPECT_EQ(decode_e4m3(0x7E), 448.0);
  EXPECT_EQ(decode_e4m3(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(decode_e5m2(0x7B), 57344.0);
  EXPECT_EQ(decode_e5m2(0x01), std::ldexp(1.0, -16));
}

// Per-tensor: D = sA * sB * sum qA qB (+ bias), random codes, e5m2 x e4m3.
TEST(GemmFp8Reference, PerTensorScalesAndBias) {
  const int M = 5, N = 7, K = 48;
  std::mt19937 rng(3);
  std::vector<uint8_t> a((size_t)M * K), b((size_t)N * K);
  // finite codes only: clearing bit 6 keeps both formats' exponents below their top (NaN / inf) value
  for (auto& x : a) x = (uint8_t)(rng() & 0xB7);
  for (auto& x : b) x = (uint8_t)(rng() & 0xB7);
  const float sa = 0.37f, sb = 3.0f;
  std::vector<float> bias(N);
  for (int j = 0; j < N; j++) bias[j] = 0.25f * j - 1.0f;
  std::vector<double> d((size_t)M * N);
  matmul_quant_cpu(d.data(), a.data(), &sa, Encoding{ElementFormat::E5M2, kWholeTensor}, b.data(), &sb,
                   Encoding{ElementFormat::E4M3, kWholeTensor}, M, N, K, bias.data());
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double want = 0;
      for (int k = 0; k < K; k++) want += decode_e5m2(a[(size_t)i * K + k]) * decode_e4m3(b[(size_t)j * K + k]);
      want = want * (double)sa * (double)sb + bias[j];
      EXPECT_NEAR(d[(size_t)i * N + j], want, 1e-12 * (1 + std::fabs(want))) << "i=" << i << " j=" << j;
    }
  }
}

// Block1x128 on A (rows = 6, so the stride round_up(6, 4) = 8 has 2 padding entries per K block), per-tensor B of
// ones: D[r][n] = 128 * sum_kb scale_inv[kb * 8 + r].
TEST(GemmFp8Reference, Block1x128Layout) {
  const int M = 6, N = 3, K = 256, ld = 8, L = K / 128;
  std::vector<uint8_t> a((size_t)M * K, kOneE4M3), b((size_t)N * K, kOneE4M3);
  std::vector<float> sa((size_t)L * ld, kNaN);
  for (int kb = 0; kb < L; kb++) {
    for (int r = 0; r < M; r++) sa[(size_t)kb * ld + r] = 1.0f + r + 10.0f * kb;
  }
  const float one = 1.0f;
  std::vector<double> d((size_t)M * N);
  matmul_quant_cpu(d.data(), a.data(), sa.data(), Encoding{ElementFormat::E4M3, kBlock1x128}, b.data(), &one,
                   Encoding{ElementFormat::E4M3, kWholeTensor}, M, N, K, nullptr);
  for (int r = 0; r < M; r++) {
    const double want = 128.0 * ((1.0 + r) + (1.0 + r + 10.0));
    for (int n = 0; n < N; n++) EXPECT_EQ(d[(size_t)r * N + n], want) << "r=" << r << " n=" << n;
  }
}

// Block128x128 on B (rows = 130: a full and a partial row block; K = 384: 3 K blocks, stride round_up(3, 4) = 4 with
// one padding entry), 1x128 ones on A: D[m][n] = 128 * sum_kb scale_inv[(n / 128) * 4 + kb].
TEST(GemmFp8Reference, Block128x128Layout) {
  const int M = 4, N = 130, K = 384, L = 3, ld = 4, RB = 2;
  std::vector<uint8_t> a((size_t)M * K, kOneE5M2), b((size_t)N * K, kOneE4M3);
  std::vector<float> sa((size_t)L * 4, 1.0f);  // A: 1x128 scales (stride round_up(4, 4) = 4), all one
  std::vector<float> sb((size_t)RB * ld, kNaN);
  for (int rb = 0; rb < RB; rb++) {
    for (int kb = 0; kb < L; kb++) sb[(size_t)rb * ld + kb] = std::ldexp(1.0f, rb - kb) * (kb == 1 ? 0.75f : 1.0f);
  }
  std::vector<double> d((size_t)M * N);
  matmul_quant_cpu(d.data(), a.data(), sa.data(), Encoding{ElementFormat::E5M2, kBlock1x128}, b.data(), sb.data(),
                   Encoding{ElementFormat::E4M3, kBlock128x128}, M, N, K, nullptr);
  for (int m = 0; m < M; m++) {
    for (int n = 0; n < N; n++) {
      const int rb = n / 128;
      double want = 0;
      for (int kb = 0; kb < L; kb++) want += 128.0 * sb[(size_t)rb * ld + kb];
      EXPECT_EQ(d[(size_t)m * N + n], want) << "m=" << m << " n=" << n;
    }
  }
}

TEST(GemmFp8Reference, RejectsNullAndBadShape) {
  std::vector<uint8_t> a(16, 0);
  const float one = 1.0f;
  double d = 0;
  EXPECT_THROW(matmul_quant_cpu(&d, a.data(), nullptr, Encoding{ElementFormat::E4M3, kWholeTensor}, a.data(), &one,
                                Encoding{ElementFormat::E4M3, kWholeTensor}, 1, 1, 16, nullptr),
               llmc::Error);
  EXPECT_THROW(matmul_quant_cpu(&d, a.data(), &one, Encoding{ElementFormat::E4M3, kWholeTensor}, a.data(), &one,
                                Encoding{ElementFormat::E4M3, kWholeTensor}, 1, 1, 0, nullptr),
               llmc::Error);
}
