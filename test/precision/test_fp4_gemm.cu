// test/precision/test_fp4_gemm.cu: the FP4 products of llmc/precision/gemm.h (matmul_quant with MXFP4 or NVFP4
// operands) and their operand conversions (llmc/precision/fp4_gemm.h) on the GPU.
//
// Operands are quantised by the real quantisers (llmc::quantize, RTN) from model-like BF16 data (N(0,1) per element
// times a per-row factor 2^U(-3,3), 0.1% outliers times 2^U(2,4)), both as the row-major copy and as the transposed
// copy (data_t, scale_inv_t, tensor_scale_inv_t: what dgrad and wgrad multiply), plus hand-built operands for the
// inexact-remap case. Shapes: 768 x 768 x 3072 and 2048 x 4096 x 1024 (M x N x K), MXFP4 with K = 1056 (not a
// multiple of 128: zero-padded runs), NVFP4 with M = 777 and K = 1004 (odd rows, a partial 16-block, padding to 1008)
// and with K = 1032 (a multiple of 8, not of 16: the expansion's 8-column path).
//
// Checks:
//  (a) conversions byte for byte against test/reference/fp4_gemm_ref.h: the E4M3 codes and outer scales of the MXFP4
//      remap and its inexact-block count (0 on model data), the BF16 expansion of NVFP4;
//  (b) every product against the reference GEMM over the exact dequantised values (a GPU kernel here, FP64 products
//      and accumulation, itself checked against fp4_matmul_cpu on sampled rows to 1e-12 of sum |a b|), per element:
//        |gpu - ref| <= acc * absref + out * |ref|,  absref = sum_k |a_k b_k| of the exact values,
//      out = 2^-8 for a bf16 D (one rounding of the output), 2^-23 for FP32 D; and acc by path:
//        NVFP4 (BF16 tensor cores): the operands are exact, the products of two BF16 values exact in FP32; a sum of K
//          terms in FP32 in any order errs by at most (K - 1) u sum|terms| (u = 2^-24, round to nearest); tensor
//          cores align and truncate inside an MMA (error < 1 ulp = 2u per addition): 2 K u; x2 for their multi-term
//          adders: 4 K u. The tensor scales as alpha: alpha = fl(sa * sb) and fl(alpha * acc), 2u; the bias add u:
//          acc = (4 K + 8) 2^-24. (The exact values themselves: none lost.)
//        MXFP4 (FP8 tensor cores, split accumulation): the E4M3 operands are exact and so are their products in FP32,
//          but the FP8 MMA keeps about 14 bits in its partial sums before each promotion to FP32; as derived in
//          test_gemm_fp8.cu: acc = 2^-11 + 4 K 2^-24.
//      GELU_AUX: pre_gelu as above (+ bias), out = gelu_tanh of the pre-activation within 2^-8 |out| + 1.13 * 2^-8
//      |pre| + 1e-6 (the epilogue may read the rounded pre-activation; gelu' <= 1.13). Accumulate: D = D0 + product,
//      with 2^-23 |D0| more. Outputs are NaN-poisoned before each product; one product runs twice, bitwise equal.
//      NVFP4 (K a multiple of 8): the same D, bit for bit, when A, B or both bring their BF16 values instead of codes.
//  (c) a hand-built MXFP4 operand with two blocks below their run's exact range: the remap counts 2 (GPU = CPU, codes
//      equal), the product adds 2 to opt.inexact_blocks and equals the GEMM of the remapped (rounded) values.
// The argument errors (mixed families, missing counter, shapes) are CPU tests (test_fp4_gemm_ref).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/precision/encoding.h"
#include "llmc/precision/fp4_codec.cuh"
#include "llmc/precision/fp4_gemm.h"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/gemm.h"
#include "llmc/precision/quantize.h"
#include "llmc/precision/scale_math.cuh"
#include "test/reference/fp4_gemm_ref.h"
#include "test/support/gpu_test_util.cuh"

namespace {

using namespace llmc;
using gpu_test::DeviceBuffer;

constexpr const char* kProgram = "test_fp4_gemm";

// ---------------------------------------------------------------------------------------------------------------
// The reference GEMM on the GPU: the exact value of every element in FP64, then a plain FP64 dot product per output.

// out = the exact values of an FP4 operand (rows, K) (e2m1 * block scale [* tensor scale], exact in FP64); row-major,
// or transposed (K, rows) when transpose_out.
__global__ void exact_values_kernel(double* out, const uint8_t* codes, const uint8_t* scales, const float* tsi,
                                    int rows, int K, BlockShape block, int ld, bool nvfp4, bool transpose_out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * K) return;
  const int r = static_cast<int>(i / K), c = static_cast<int>(i % K);
  const uint8_t code = e2m1_nibble(codes[static_cast<size_t>(r) * ((K + 1) / 2) + c / 2], c);
  const uint8_t s = scales[scale_index(block, r, c, ld)];
  double v = static_cast<double>(e2m1_value(code));
  v *= nvfp4 ? static_cast<double>(e4m3_value(s)) * static_cast<double>(tsi[0]) : static_cast<double>(e8m0_value(s));
  out[transpose_out ? static_cast<size_t>(c) * rows + r : i] = v;
}

// D (M, N) = a (M, K) · bt (K, N), absref = sum |a b|: one thread per output, k in order.
__global__ void reference_gemm_kernel(double* D, double* absref, const double* a, const double* bt, int M, int N,
                                      int K) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N) return;
  double s = 0.0, sa = 0.0;
  for (int k = 0; k < K; k++) {
    const double p = a[static_cast<size_t>(m) * K + k] * bt[static_cast<size_t>(k) * N + n];
    s += p;
    sa += fabs(p);
  }
  D[static_cast<size_t>(m) * N + n] = s;
  absref[static_cast<size_t>(m) * N + n] = sa;
}

void exact_values(double* out, const QuantOperand& op, int rows, int K, bool transpose_out) {
  const size_t n = static_cast<size_t>(rows) * K;
  exact_values_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256>>>(
      out, op.data, reinterpret_cast<const uint8_t*>(op.scale_inv), op.tensor_scale_inv, rows, K, op.encoding.block,
      scale_inv_ld(op.encoding, rows, K), nvfp4_encoding(op.encoding), transpose_out);
  CUDA_CHECK_LAUNCH();
}

struct Reference {
  std::vector<double> D, absref;  // (M, N)
};

Reference reference_gemm(const QuantOperand& A, const QuantOperand& B, int M, int N, int K) {
  DeviceBuffer<double> a(static_cast<size_t>(M) * K), bt(static_cast<size_t>(N) * K);
  DeviceBuffer<double> D(static_cast<size_t>(M) * N), absref(static_cast<size_t>(M) * N);
  exact_values(a.ptr, A, M, K, false);
  exact_values(bt.ptr, B, N, K, true);
  reference_gemm_kernel<<<dim3(static_cast<unsigned>(ceil_div(N, 256)), M), 256>>>(D.ptr, absref.ptr, a.ptr, bt.ptr,
                                                                                   M, N, K);
  CUDA_CHECK_LAUNCH();
  return {D.download(), absref.download()};
}

// ---------------------------------------------------------------------------------------------------------------
// Operands

std::vector<float> model_like(int rows, int cols, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> spread(-3.0f, 3.0f), outlier(2.0f, 4.0f), u01(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; r++) {
    const float f = std::exp2(spread(rng));
    for (int c = 0; c < cols; c++) {
      float v = normal(rng) * f;
      if (u01(rng) < 1e-3f) v *= std::exp2(outlier(rng));
      x[static_cast<size_t>(r) * cols + c] = gpu_test::round_bf16(v);
    }
  }
  return x;
}

// An FP4 QTensor (rows, cols) quantised by llmc::quantize from x, both copies kept; host copies for the references.
struct Fp4Tensor {
  Encoding e;
  int rows, cols;
  DeviceBuffer<uint8_t> data, data_t, s, s_t;
  DeviceBuffer<float> tsi, tsi_t;
  QTensor q;
  Fp4Tensor(const Encoding& enc, int r, int c, const std::vector<float>& x)
      : e(enc), rows(r), cols(c), data(code_bytes(enc, r, c)), data_t(code_bytes(enc, c, r)),
        s(scale_inv_bytes(enc, r, c)), s_t(scale_inv_bytes(enc, c, r)), tsi(1), tsi_t(1) {
    q.rows = r, q.cols = c, q.encoding = enc;
    q.data = data.ptr, q.data_t = data_t.ptr;
    q.scale_inv = reinterpret_cast<float*>(s.ptr), q.scale_inv_t = reinterpret_cast<float*>(s_t.ptr);
    q.tensor_scale_inv = tsi.ptr, q.tensor_scale_inv_t = tsi_t.ptr;
    DeviceBuffer<bf16> dx(gpu_test::to_bf16(x));
    quantize(q, dx.ptr, QuantizeArgs{}, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  // The operand (rows, K) of a product: data (rows, cols) or data_t (cols, rows).
  QuantOperand op(bool transposed) const { return quant_operand(q, transposed); }
};

// Host copies of an operand for the CPU references.
struct HostOperand {
  std::vector<uint8_t> codes, scales;
  Fp4CpuOperand op;
  HostOperand(const QuantOperand& d, int rows, int K) {
    codes.resize(code_bytes(d.encoding, rows, K));
    scales.resize(scale_inv_bytes(d.encoding, rows, K));
    CUDA_CHECK(cudaMemcpy(codes.data(), d.data, codes.size(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(scales.data(), d.scale_inv, scales.size(), cudaMemcpyDeviceToHost));
    op.codes = codes.data(), op.scales = scales.data(), op.encoding = d.encoding, op.rows = rows, op.K = K;
    if (d.tensor_scale_inv != nullptr)
      CUDA_CHECK(cudaMemcpy(&op.tensor_scale_inv, d.tensor_scale_inv, sizeof(float), cudaMemcpyDeviceToHost));
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Checks

double acc_coefficient(const Encoding& e, int K) {
  const double u = std::ldexp(1.0, -24);
  return mxfp4_encoding(e) ? std::ldexp(1.0, -11) + 4.0 * K * u : (4.0 * K + 8.0) * u;
}

// Every element of got within tol; reports the first mismatches and the worst err/tol (NaN fails).
void expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& tol,
                   int N, const std::string& what) {
  size_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, err / std::max(tol[i], 1e-300));
    if (!(err <= tol[i]) && bad++ < 6)
      ADD_FAILURE() << what << ": (" << i / N << ", " << i % N << ") got " << got[i] << " want " << want[i]
                    << " tol " << tol[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " out of tolerance";
  std::printf("    %-60s worst err/tol %.3f\n", what.c_str(), worst);
}

// The GPU reference against fp4_matmul_cpu on sampled rows (first, last, middle, random).
void expect_reference_matches_cpu(const Reference& ref, const QuantOperand& A, const QuantOperand& B, int M, int N,
                                  int K, std::mt19937_64& rng) {
  const HostOperand ha(A, M, K), hb(B, N, K);
  std::vector<int> rows = {0, M / 2, M - 1};
  for (int i = 0; i < 3; i++) rows.push_back(static_cast<int>(rng() % M));
  size_t bad = 0;
  for (int m : rows) {
    std::vector<double> d(N), absref(N);
    fp4_matmul_cpu(d.data(), absref.data(), ha.op, hb.op, m, m + 1);
    for (int n = 0; n < N; n++) {
      const size_t i = static_cast<size_t>(m) * N + n;
      const bool ok = std::fabs(d[n] - ref.D[i]) <= 1e-12 * absref[n] &&
                      std::fabs(absref[n] - ref.absref[i]) <= 1e-12 * absref[n];
      if (!ok && bad++ < 5)
        ADD_FAILURE() << "GPU reference (" << m << ", " << n << ") " << ref.D[i] << " (sum |ab| " << ref.absref[i]
                      << ") vs CPU " << d[n] << " (" << absref[n] << ")";
    }
  }
  EXPECT_EQ(bad, 0u);
}

struct Variant {
  const char* name;
  bool d_fp32 = false, bias = false, gelu = false, accumulate = false;
};

// One product D = A·Bᵀ with the variant's options, against ref.
void run_variant(const QuantOperand& A, const QuantOperand& B, int M, int N, int K, const Reference& ref,
                 const Variant& v, std::mt19937_64& rng, bool twice) {
  const size_t n_out = static_cast<size_t>(M) * N;
  const std::string what = strformat("%s %dx%dx%d %s", mxfp4_encoding(A.encoding) ? "mxfp4" : "nvfp4", M, N, K, v.name);
  QuantGemmOptions opt;
  std::vector<float> bias_host(N, 0.0f);
  DeviceBuffer<bf16> bias(N), pre_gelu(v.gelu ? n_out : 1);
  DeviceBuffer<unsigned long long> counter(1);
  CUDA_CHECK(cudaMemset(counter.ptr, 0, sizeof(unsigned long long)));
  opt.inexact_blocks = counter.ptr;
  if (v.bias) {
    bias_host = gpu_test::random_bf16_values(N, rng, -2.0f, 2.0f);
    bias.upload(gpu_test::to_bf16(bias_host));
    opt.bias = bias.ptr;
  }
  if (v.gelu) {
    pre_gelu.poison();
    opt.pre_gelu = pre_gelu.ptr;
  }
  opt.accumulate = v.accumulate;
  const bool supported = matmul_quant_supported(v.d_fp32, A, B, M, N, K, opt);
  std::printf("  %-64s %s\n", what.c_str(), supported ? "supported" : "UNSUPPORTED");
  if (!supported) {
    // Without an epilogue both FP4 products must run on Hopper (the recipes need them); GELU_AUX may fall back.
    if (!v.gelu && !v.bias) ADD_FAILURE() << what << " is not supported on this GPU";
    return;
  }
  const double acc = acc_coefficient(A.encoding, K);
  std::vector<double> want(n_out), tol(n_out);
  std::vector<float> got, init;
  if (v.d_fp32) {
    DeviceBuffer<float> D(n_out);
    if (v.accumulate) {
      init = gpu_test::random_floats(n_out, rng, -50.0f, 50.0f);
      D.upload(init);
    } else {
      D.poison();
    }
    matmul_quant(D.ptr, A, B, M, N, K, opt, 0);
    got = D.download();
    if (twice) {  // bitwise equal on a second run
      D.poison();
      matmul_quant(D.ptr, A, B, M, N, K, opt, 0);
      const std::vector<float> again = D.download();
      EXPECT_EQ(0, std::memcmp(again.data(), got.data(), n_out * sizeof(float))) << what << ": not deterministic";
    }
  } else {
    DeviceBuffer<bf16> D(n_out);
    D.poison();
    matmul_quant(D.ptr, A, B, M, N, K, opt, 0);
    got = gpu_test::download_bf16(D);
  }
  // NVFP4 operands that bring their values (QuantOperand::values, as the quantiser writes them for the products that
  // consume a copy at once): the same D, bit for bit, whichever side carries them.
  if (nvfp4_encoding(A.encoding) && K % kBf16ExpandColumns == 0) {
    DeviceBuffer<bf16> a_values(static_cast<size_t>(M) * K), b_values(static_cast<size_t>(N) * K);
    nvfp4_to_bf16(a_values.ptr, A, M, K, 0);
    nvfp4_to_bf16(b_values.ptr, B, N, K, 0);
    for (int sides = 1; sides <= 3; sides++) {
      QuantOperand a = A, b = B;
      if (sides & 1) a.values = a_values.ptr, a.data = nullptr, a.scale_inv = nullptr;
      if (sides & 2) b.values = b_values.ptr, b.data = nullptr, b.scale_inv = nullptr;
      const std::string which = what + (sides == 1 ? ", A as values" : sides == 2 ? ", B as values" : ", both as values");
      std::vector<float> again;
      if (v.d_fp32) {
        DeviceBuffer<float> D(n_out);
        if (v.accumulate) D.upload(init); else D.poison();
        matmul_quant(D.ptr, a, b, M, N, K, opt, 0);
        again = D.download();
      } else {
        DeviceBuffer<bf16> D(n_out);
        D.poison();
        matmul_quant(D.ptr, a, b, M, N, K, opt, 0);
        again = gpu_test::download_bf16(D);
      }
      EXPECT_EQ(0, std::memcmp(again.data(), got.data(), n_out * sizeof(float))) << which << ": D differs";
    }
  }
  const double out = v.d_fp32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -8);
  for (size_t i = 0; i < n_out; i++) {
    const double d0 = v.accumulate ? static_cast<double>(init[i]) : 0.0, b = bias_host[i % N];
    want[i] = ref.D[i] + b + d0;
    tol[i] = acc * (ref.absref[i] + std::fabs(b)) + out * (std::fabs(want[i]) + std::fabs(d0));
  }
  if (v.gelu) {
    const std::vector<float> pre = gpu_test::download_bf16(pre_gelu);
    expect_within(pre, want, tol, N, what + " pre_gelu");
    std::vector<double> gelu_want(n_out), gelu_tol(n_out);
    for (size_t i = 0; i < n_out; i++) {
      const double x = pre[i], k = std::sqrt(2.0 / M_PI);
      gelu_want[i] = 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
      gelu_tol[i] = std::ldexp(1.0, -8) * (std::fabs(gelu_want[i]) + 1.13 * std::fabs(x)) + 1e-6;
    }
    expect_within(got, gelu_want, gelu_tol, N, what + " gelu(pre_gelu)");
  } else {
    expect_within(got, want, tol, N, what);
  }
  unsigned long long count = ~0ull;
  CUDA_CHECK(cudaMemcpy(&count, counter.ptr, sizeof(count), cudaMemcpyDeviceToHost));
  EXPECT_EQ(count, 0u) << what << ": model-like data must remap exactly";
}

// The number of differing bytes (the first few reported).
template <class T>
size_t bytes_differing(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  const auto* g = reinterpret_cast<const uint8_t*>(got.data());
  const auto* w = reinterpret_cast<const uint8_t*>(want.data());
  size_t bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()) * sizeof(T); i++)
    if (g[i] != w[i] && bad++ < 5) ADD_FAILURE() << what << " byte " << i << ": got " << +g[i] << " want " << +w[i];
  return bad;
}

// The conversions of one operand against the CPU references, byte for byte.
void expect_conversion_matches_cpu(const QuantOperand& op, int rows, int K) {
  const HostOperand h(op, rows, K);
  if (mxfp4_encoding(op.encoding)) {
    const int Kp = mxfp4_remap_cols(K), ld = static_cast<int>(round_up(rows, 4));
    DeviceBuffer<uint8_t> codes(static_cast<size_t>(rows) * Kp);
    DeviceBuffer<float> scale(static_cast<size_t>(Kp / 128) * ld);
    DeviceBuffer<unsigned long long> counter(1);
    codes.poison(), scale.poison();
    CUDA_CHECK(cudaMemset(counter.ptr, 0, sizeof(unsigned long long)));
    mxfp4_to_e4m3(codes.ptr, scale.ptr, counter.ptr, op, rows, K, 0);
    std::vector<uint8_t> want_codes(codes.n);
    std::vector<float> want_scale(scale.n);
    const uint64_t want_count = mxfp4_to_e4m3_cpu(want_codes.data(), want_scale.data(), h.op);
    EXPECT_EQ(bytes_differing(codes.download(), want_codes, "E4M3 codes of the remap"), 0u);
    EXPECT_EQ(bytes_differing(scale.download(), want_scale, "outer scales of the remap"), 0u);
    EXPECT_EQ(counter.download()[0], want_count);
    EXPECT_EQ(want_count, 0u) << "model-like data remaps exactly";
  } else {
    const int Kp = nvfp4_expand_cols(K);
    DeviceBuffer<bf16> out(static_cast<size_t>(rows) * Kp);
    out.poison();
    nvfp4_to_bf16(out.ptr, op, rows, K, 0);
    std::vector<uint16_t> want(out.n);
    nvfp4_to_bf16_cpu(want.data(), h.op);
    const std::vector<bf16> got = out.download();
    std::vector<uint16_t> got_bits(got.size());
    std::memcpy(got_bits.data(), got.data(), got.size() * sizeof(uint16_t));
    EXPECT_EQ(bytes_differing(got_bits, want, "BF16 expansion"), 0u);
  }
}

struct ProductCase {
  const char* name;
  Encoding a, b;
  int M, N, K;
  bool b_transposed;  // B = the data_t of a (K, N) tensor (dgrad / wgrad operands), else the data of (N, K)
  std::vector<Variant> variants;
};

void run_case(const ProductCase& c) {
  SCOPED_TRACE(c.name);
  std::mt19937_64 rng = gpu_test::make_rng(kProgram);
  const Fp4Tensor ta(c.a, c.M, c.K, model_like(c.M, c.K, rng));
  const int b_rows = c.b_transposed ? c.K : c.N, b_cols = c.b_transposed ? c.N : c.K;
  const Fp4Tensor tb(c.b, b_rows, b_cols, model_like(b_rows, b_cols, rng));
  const QuantOperand A = ta.op(false), B = tb.op(c.b_transposed);
  expect_conversion_matches_cpu(A, c.M, c.K);
  expect_conversion_matches_cpu(B, c.N, c.K);
  const Reference ref = reference_gemm(A, B, c.M, c.N, c.K);
  expect_reference_matches_cpu(ref, A, B, c.M, c.N, c.K, rng);
  bool first = true;
  for (const Variant& v : c.variants) {
    run_variant(A, B, c.M, c.N, c.K, ref, v, rng, first && v.d_fp32 && !v.accumulate);
    first = false;
  }
}

const Variant kBf16{"bf16 D"};
const Variant kBf16BiasGelu{"bf16 D +bias +GELU_AUX", false, true, true, false};
const Variant kFp32{"fp32 D", true};
const Variant kFp32Accumulate{"fp32 D accumulate", true, false, false, true};

TEST(Fp4Gemm, Mxfp4Products) {
  run_case({"mxfp4 768x768x3072", kMxfp4Encoding, kMxfp4Encoding, 768, 768, 3072, false, {kBf16, kBf16BiasGelu}});
  run_case({"mxfp4 2048x4096x1024, B transposed", kMxfp4Encoding, kMxfp4Encoding, 2048, 4096, 1024, true,
            {kFp32, kFp32Accumulate}});
  run_case({"mxfp4 208x272x1056 (K padded)", kMxfp4Encoding, kMxfp4Encoding, 208, 272, 1056, false, {kBf16, kFp32}});
}

TEST(Fp4Gemm, Nvfp4Products) {
  run_case({"nvfp4 768x768x3072 (x 1x16, w 16x16)", kNvfp4Encoding, kNvfp4WeightEncoding, 768, 768, 3072, false,
            {kBf16, kBf16BiasGelu}});
  run_case({"nvfp4 2048x4096x1024 (w 16x16 transposed)", kNvfp4Encoding, kNvfp4WeightEncoding, 2048, 4096, 1024,
            true, {kFp32, kFp32Accumulate}});
  run_case({"nvfp4 777x256x1004 (odd M, partial block)", kNvfp4Encoding, kNvfp4Encoding, 777, 256, 1004, true,
            {kBf16, kFp32}});
  run_case({"nvfp4 96x264x1032 (K an odd multiple of 8: 8 columns per thread)", kNvfp4Encoding, kNvfp4WeightEncoding,
            96, 264, 1032, false, {kBf16}});
}

// Two blocks of A below their run's exact range (test_fp4_gemm_ref's hand-built case, in a 64 x 256 operand): counted
// on the GPU as on the CPU, and the product is that of the remapped values.
TEST(Fp4Gemm, Mxfp4InexactBlocksAreCounted) {
  std::mt19937_64 rng = gpu_test::make_rng(kProgram);
  const int M = 64, N = 32, K = 256;
  std::vector<uint8_t> codes(code_bytes(kMxfp4Encoding, M, K)), scales(scale_inv_bytes(kMxfp4Encoding, M, K), 127);
  auto set = [&](int r, int c, uint8_t code) {
    uint8_t& b = codes[static_cast<size_t>(r) * (K / 2) + c / 2];
    b = (c & 1) ? e2m1_pack(e2m1_unpack(b, 0), code) : e2m1_pack(code, e2m1_unpack(b, 1));
  };
  const int ld = scale_inv_ld(kMxfp4Encoding, M, K);
  for (int r = 0; r < M; r++)
    for (int c = 0; c < K; c++) set(r, c, static_cast<uint8_t>(rng() % 16));
  for (int c = 0; c < 128; c++) set(3, c, 0);
  set(3, 0, 7), set(3, 32, 2), set(3, 64, 3), set(3, 96, 2);
  scales[0 * ld + 3] = 147, scales[1 * ld + 3] = 127, scales[2 * ld + 3] = 132, scales[3 * ld + 3] = 132;
  DeviceBuffer<uint8_t> d_codes(codes), d_scales(scales);
  QuantOperand A;
  A.data = d_codes.ptr, A.scale_inv = reinterpret_cast<const float*>(d_scales.ptr), A.encoding = kMxfp4Encoding;
  const Fp4Tensor tb(kMxfp4Encoding, N, K, model_like(N, K, rng));
  const QuantOperand B = tb.op(false);

  Fp4CpuOperand ha;
  ha.codes = codes.data(), ha.scales = scales.data(), ha.encoding = kMxfp4Encoding, ha.rows = M, ha.K = K;
  std::vector<uint8_t> want_codes(static_cast<size_t>(M) * K);
  std::vector<float> want_scale(2 * M);
  ASSERT_EQ(mxfp4_to_e4m3_cpu(want_codes.data(), want_scale.data(), ha), 2u);
  DeviceBuffer<uint8_t> e4m3_codes(want_codes.size());
  DeviceBuffer<float> e4m3_scale(want_scale.size());
  DeviceBuffer<unsigned long long> counter(1);
  CUDA_CHECK(cudaMemset(counter.ptr, 0, sizeof(unsigned long long)));
  mxfp4_to_e4m3(e4m3_codes.ptr, e4m3_scale.ptr, counter.ptr, A, M, K, 0);
  EXPECT_EQ(counter.download()[0], 2u);
  EXPECT_EQ(bytes_differing(e4m3_codes.download(), want_codes, "E4M3 codes of the remap"), 0u);
  EXPECT_EQ(bytes_differing(e4m3_scale.download(), want_scale, "outer scales of the remap"), 0u);

  // The product counts A's 2 blocks (B's are exact) and equals the GEMM of the remapped values.
  CUDA_CHECK(cudaMemset(counter.ptr, 0, sizeof(unsigned long long)));
  QuantGemmOptions opt;
  opt.inexact_blocks = counter.ptr;
  DeviceBuffer<float> D(static_cast<size_t>(M) * N);
  D.poison();
  matmul_quant(D.ptr, A, B, M, N, K, opt, 0);
  const std::vector<float> got = D.download();
  EXPECT_EQ(counter.download()[0], 2u);
  const HostOperand hb(B, N, K);
  std::vector<double> b(static_cast<size_t>(N) * K);
  fp4_values_cpu(b.data(), hb.op);
  std::vector<double> want(static_cast<size_t>(M) * N), tol(want.size());
  const double acc = acc_coefficient(kMxfp4Encoding, K);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double s = 0.0, sa = 0.0;
      for (int k = 0; k < K; k++) {
        const double a = static_cast<double>(fp8_decode(want_codes[static_cast<size_t>(m) * K + k], ElementFormat::E4M3)) *
                         static_cast<double>(want_scale[static_cast<size_t>(k / 128) * M + m]);
        s += a * b[static_cast<size_t>(n) * K + k];
        sa += std::fabs(a * b[static_cast<size_t>(n) * K + k]);
      }
      want[static_cast<size_t>(m) * N + n] = s;
      tol[static_cast<size_t>(m) * N + n] = acc * sa + std::ldexp(1.0, -23) * std::fabs(s);
    }
  expect_within(got, want, tol, N, "mxfp4 product of a remap with 2 inexact blocks");
}

}  // namespace
