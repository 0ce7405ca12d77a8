// test/precision/test_gemm_fp8.cu: the FP8 products of llmc/precision/gemm.h (matmul_quant, matmul_quant_supported) for
// both FP8 recipes.
//
// Operands are built on the host: random data with per-row and per-128-column-block magnitudes spread over 2^±1.5 (so
// a scale read from the wrong block is a gross error) and 0.1% outliers of 4-16x, quantised here (CUDA's saturating
// host conversion, round to nearest even) into codes and scale_inv in the GEMM-ready layouts of
// llmc/precision/tensor.h, with power-of-two and non-power-of-two scales. The test also keeps each element's scale_inv
// in a plain (rows, K) array, so its own dequantisation does not depend on the layout formulas. Every product runs into
// a NaN-poisoned output, twice (the two results must be bitwise equal), and is compared:
//  (a) element by element against matmul_quant_cpu (FP64 of the dequantised codes), itself checked against the test's
//      layout-free dequantisation. Tolerance, with absref = sum_k |a_k b_k| of the dequantised operands:
//        |gpu - ref| <= acc * absref  [+ 2^-8 |ref| for a bf16 D]  [+ 2^-23 |ref| for an FP32 D]
//      acc (split accumulation, the default) = 2^-11 + 4 K 2^-24: FP32 accumulation (K eps32, x4) plus the tensor
//        cores' ~14-bit accumulator: each partial sum promoted to FP32 can lose ~2^-13 of its own sum |a b| per
//        32-long MMA step; summed over the promoted slices that is bounded by a few 2^-13 absref (x4 margin).
//      acc (fast accumulation) = 2^-12 (K / 128) + 4 K 2^-24: partial sums are never promoted, so the loss can
//        recur with every slice of K. This bound is loose (at K = 3072 about a third of a typical |ref|), so fast
//        accumulation also has to meet ||gpu - ref||_F <= 2^-6 ||ref||_F (DeepSeek-V3 reports ~2% worst-case
//        relative error at K = 4096).
//      Checked on the host with an emulated accumulator that truncates to 14 (13, 12) significant bits every 32
//      products and promotes every 128 (split) or never (fast), bf16 output: worst err/tol 0.3-0.8 (split, at 14, 13
//      or 12 bits; mostly the bf16 rounding, whose unit roundoff 2^-8 is the |ref| term) and <= 0.8 (fast at
//      13 bits, 1.0 at 12 bits), Frobenius error of fast accumulation 2e-3 (14 bits) to 1e-2 (12 bits).
//      GELU_AUX: pre_gelu as above (+ bias); gelu(out) with 1.2x the accumulation term (gelu' <= 1.13), one bf16
//        rounding of the output and of the input (the epilogue may read the rounded pre-activation), 1e-6 absolute.
//  (b) against the FP64 product of the ORIGINAL unquantised operands, in relative Frobenius norm: e4m3 has 3
//      mantissa bits (relative rounding error up to 2^-4, rms about 2.7%), e5m2 2 bits (2^-3, rms about 5.4%); for
//      independent operands the product's relative error is about the root sum of squares, 3.8% for e4m3 * e4m3 and
//      6% with an e5m2 operand (this data, on the host: 3.7-3.8% and 5.7-6.0%). Bounds: 6% and 10%. A scale applied
//      to the wrong block or not at all is off by tens of percent or more (a 1x128 layout read K-major instead of
//      rows-major, emulated on the host: 99% of the elements out of tolerance, 171% off the original product).
// Printed for every combination: whether cuBLASLt supports it on this GPU (so unsupported epilogues are visible), the
// worst err/tol, and both Frobenius errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/precision/encoding.h"
#include "llmc/precision/gemm.h"
#include "test/reference/precision_ref.h"

using namespace llmc;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Host FP8 codecs (CUDA's host-callable conversions) and names

uint8_t encode_fp8(float x, ElementFormat f) {
  return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, f == ElementFormat::E4M3 ? __NV_E4M3 : __NV_E5M2);
}
double decode_fp8(uint8_t code, ElementFormat f) {
  return (double)__half2float(__half(__nv_cvt_fp8_to_halfraw(code, f == ElementFormat::E4M3 ? __NV_E4M3 : __NV_E5M2)));
}
const char* fmt_name(ElementFormat f) { return f == ElementFormat::E4M3 ? "e4m3" : "e5m2"; }
std::string gran_name(BlockShape g) { return block_shape_name(g); }

int compute_capability() {
  int dev = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major * 10 + minor;
}
bool block_scales_expected(int cc) { return cc >= 90 && cc < 100; }  // cuBLASLt documents them for Hopper (9.0)

template <typename T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}
template <typename T>
T* dev_upload(const std::vector<T>& v) {
  T* p = dev_alloc<T>(v.size());
  CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
T* dev_poisoned(size_t n) {
  T* p = dev_alloc<T>(n);
  CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(T)));  // NaN in bf16 and FP32
  return p;
}
std::vector<float> download_bf16(const bf16* d, size_t n) {
  std::vector<bf16> tmp(n);
  CUDA_CHECK(cudaMemcpy(tmp.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(tmp[i]);
  return out;
}
std::vector<float> download_f32(const float* d, size_t n) {
  std::vector<float> out(n);
  CUDA_CHECK(cudaMemcpy(out.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}
template <typename T>
std::vector<uint8_t> download_bytes(const T* d, size_t n) {
  std::vector<uint8_t> out(n * sizeof(T));
  CUDA_CHECK(cudaMemcpy(out.data(), d, out.size(), cudaMemcpyDeviceToHost));
  return out;
}

// fn(row_begin, row_end) on all cores.
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

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// ---------------------------------------------------------------------------------------------------------------
// Operands

// Random (rows, K) values: N(0,1) x row factor x 128-column-block factor (each 2^U(-1.5, 1.5)), and 0.1% outliers
// multiplied by 2^U(2, 4).
std::vector<float> make_values(int rows, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> spread(-1.5f, 1.5f), outlier(2.0f, 4.0f), u01(0.0f, 1.0f);
  std::vector<float> row_f(rows), blk_f((K + 127) / 128);
  for (auto& f : row_f) f = std::exp2(spread(rng));
  for (auto& f : blk_f) f = std::exp2(spread(rng));
  std::vector<float> x((size_t)rows * K);
  for (int r = 0; r < rows; r++) {
    for (int k = 0; k < K; k++) {
      float v = normal(rng) * row_f[r] * blk_f[k / 128];
      if (u01(rng) < 1e-3f) v *= std::exp2(outlier(rng));
      x[(size_t)r * K + k] = v;
    }
  }
  return x;
}

float scale_from_amax(float amax, ElementFormat f, bool pow2) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  float s = element_format_max(f) / amax;
  if (pow2) s = std::exp2(std::floor(std::log2(s)));
  return s;
}

// One quantised operand (rows, K): q = fp8(x * scale), scale_inv = 1 / scale per tensor / 1x128 / 128x128 block.
struct QOperand {
  int rows = 0, K = 0;
  ElementFormat format = ElementFormat::E4M3;
  BlockShape granularity = kWholeTensor;
  bool pow2 = false;
  std::vector<float> x;             // (rows, K) original values
  std::vector<uint8_t> codes;       // (rows, K)
  std::vector<float> scale_inv;     // GEMM-ready layout (llmc/precision/tensor.h), padding entries 1
  std::vector<double> deq;          // (rows, K) codes * their scale_inv, computed without the layout
  uint8_t* d_codes = nullptr;
  float* d_scale_inv = nullptr;

  QOperand(int rows_, int K_, ElementFormat f, BlockShape g, bool pow2_, uint32_t seed)
      : rows(rows_), K(K_), format(f), granularity(g), pow2(pow2_), x(make_values(rows_, K_, seed)),
        codes((size_t)rows_ * K_), deq((size_t)rows_ * K_) {
    std::vector<float> elem_scale((size_t)rows * K);  // each element's multiplier
    const int L = (K + 127) / 128, RB = (rows + 127) / 128;
    auto amax_of = [&](int r0, int r1, int k0, int k1) {
      float m = 0.0f;
      for (int r = r0; r < r1; r++)
        for (int k = k0; k < k1; k++) m = std::max(m, std::fabs(x[(size_t)r * K + k]));
      return m;
    };
    if (g == kWholeTensor) {
      const float s = scale_from_amax(amax_of(0, rows, 0, K), f, pow2);
      std::fill(elem_scale.begin(), elem_scale.end(), s);
      scale_inv = {1.0f / s};
    } else if (g == kBlock1x128) {
      const int ld = (rows + 3) / 4 * 4;  // scale_inv[kb * ld + r]
      scale_inv.assign((size_t)L * ld, 1.0f);
      for (int r = 0; r < rows; r++) {
        for (int kb = 0; kb < L; kb++) {
          const int k0 = kb * 128, k1 = std::min(K, k0 + 128);
          const float s = scale_from_amax(amax_of(r, r + 1, k0, k1), f, pow2);
          scale_inv[(size_t)kb * ld + r] = 1.0f / s;
          for (int k = k0; k < k1; k++) elem_scale[(size_t)r * K + k] = s;
        }
      }
    } else {
      const int ld = (L + 3) / 4 * 4;  // scale_inv[rb * ld + kb]
      scale_inv.assign((size_t)RB * ld, 1.0f);
      for (int rb = 0; rb < RB; rb++) {
        for (int kb = 0; kb < L; kb++) {
          const int r0 = rb * 128, r1 = std::min(rows, r0 + 128), k0 = kb * 128, k1 = std::min(K, k0 + 128);
          const float s = scale_from_amax(amax_of(r0, r1, k0, k1), f, pow2);
          scale_inv[(size_t)rb * ld + kb] = 1.0f / s;
          for (int r = r0; r < r1; r++)
            for (int k = k0; k < k1; k++) elem_scale[(size_t)r * K + k] = s;
        }
      }
    }
    for (size_t i = 0; i < codes.size(); i++) {
      codes[i] = encode_fp8(x[i] * elem_scale[i], f);
      deq[i] = decode_fp8(codes[i], f) * (double)(1.0f / elem_scale[i]);
    }
    d_codes = dev_upload(codes);
    d_scale_inv = dev_upload(scale_inv);
  }
  ~QOperand() {
    cudaFree(d_codes);
    cudaFree(d_scale_inv);
  }
  QOperand(const QOperand&) = delete;
  QOperand& operator=(const QOperand&) = delete;

  Encoding encoding() const { return {format, granularity, pow2 ? ScaleFormat::Pow2FP32 : ScaleFormat::FP32}; }
  QuantOperand op() const {
    QuantOperand o;
    o.data = d_codes;
    o.encoding = encoding();
    o.scale_inv = d_scale_inv;
    return o;
  }
  std::string describe() const { return encoding_name(encoding()); }
};

// The references of D (M,N) = A (M,K) · B (N,K)ᵀ, without bias.
struct References {
  std::vector<double> ref;     // matmul_quant_cpu: FP64 of the dequantised operands
  std::vector<double> absref;  // sum_k |a_k b_k| of the dequantised operands
  std::vector<double> orig;    // FP64 of the original, unquantised values
};

References make_references(const QOperand& A, const QOperand& B) {
  const int M = A.rows, N = B.rows, K = A.K;
  References r;
  r.ref.resize((size_t)M * N);
  r.absref.resize((size_t)M * N);
  r.orig.resize((size_t)M * N);
  std::vector<double> own((size_t)M * N);  // the test's layout-free reference
  parallel_rows(M, [&](int begin, int end) {
    for (int i = begin; i < end; i++) {
      const double* a = A.deq.data() + (size_t)i * K;
      const float* xa = A.x.data() + (size_t)i * K;
      for (int j = 0; j < N; j++) {
        const double* b = B.deq.data() + (size_t)j * K;
        const float* xb = B.x.data() + (size_t)j * K;
        double s = 0, sa = 0, so = 0;
        for (int k = 0; k < K; k++) {
          s += a[k] * b[k];
          sa += std::fabs(a[k] * b[k]);
          so += (double)xa[k] * (double)xb[k];
        }
        own[(size_t)i * N + j] = s;
        r.absref[(size_t)i * N + j] = sa;
        r.orig[(size_t)i * N + j] = so;
      }
    }
  });
  matmul_quant_cpu(r.ref.data(), A.codes.data(), A.scale_inv.data(), A.encoding(), B.codes.data(), B.scale_inv.data(),
                   B.encoding(), M, N, K, nullptr);
  size_t bad = 0;
  for (size_t i = 0; i < own.size(); i++) {
    if (!(std::fabs(own[i] - r.ref[i]) <= 1e-12 * r.absref[i] + 1e-300)) {
      if (bad < 5) {
        ADD_FAILURE() << "matmul_quant_cpu disagrees with the test's layout-free dequantisation at (" << i / N << ", "
                      << i % N << "): " << r.ref[i] << " vs " << own[i] << " (A " << A.describe() << ", B "
                      << B.describe() << ")";
      }
      bad++;
    }
  }
  EXPECT_EQ(bad, 0u) << "matmul_quant_cpu reads the scales of " << A.describe() << " / " << B.describe()
                     << " differently from how the test wrote them";
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Checks

double acc_coefficient(int K, bool fast) {
  const double fp32 = 4.0 * K * std::ldexp(1.0, -24);
  return fast ? std::ldexp(1.0, -12) * (K / 128.0) + fp32 : std::ldexp(1.0, -11) + fp32;
}

double frobenius_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = (double)got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Every element within tol[i]; reports the first mismatches and the worst err/tol. Returns the worst ratio.
double expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& tol,
                     const std::vector<double>& absref, int N, const std::string& what) {
  size_t bad = 0;
  double worst = 0, worst_rel_abs = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs((double)got[i] - want[i]);
    worst = std::max(worst, err / std::max(tol[i], 1e-300));
    worst_rel_abs = std::max(worst_rel_abs, err / std::max(absref[i], 1e-300));
    if (!(err <= tol[i])) {  // also catches NaN: the poisoned output never written
      if (bad < 6) {
        ADD_FAILURE() << what << ": element (" << i / N << ", " << i % N << ") got " << got[i] << " expected "
                      << want[i] << " |err| " << err << " tol " << tol[i] << " absref " << absref[i];
      }
      bad++;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements out of tolerance";
  std::printf("      %-34s worst err/tol %.3f  max err/absref %.2e\n", what.c_str(), worst, worst_rel_abs);
  return worst;
}

double original_bound(ElementFormat a, ElementFormat b) {
  return (a == ElementFormat::E5M2 || b == ElementFormat::E5M2) ? 0.10 : 0.06;
}

// ---------------------------------------------------------------------------------------------------------------
// One operand pair and the products run on it

struct Variant {
  const char* name;
  bool d_fp32 = false;
  bool bias = false;
  bool gelu = false;
  bool fast = false;
  bool accumulate = false;
  bool required = false;  // cuBLASLt must support it on an FP8 GPU (block scales: on Hopper)
};

std::string variant_tag(const Variant& v) {
  std::string s = v.d_fp32 ? "fp32 D" : "bf16 D";
  if (v.bias) s += " +bias";
  if (v.gelu) s += " +GELU_AUX";
  if (v.fast) s += " fast_accum";
  if (v.accumulate) s += " accumulate";
  return s;
}

struct PairSpec {
  const char* name;
  int M, N, K;
  ElementFormat af, bf;
  BlockShape ag, bg;
  bool a_pow2, b_pow2;
};

void run_variant(const PairSpec& p, const QOperand& A, const QOperand& B, const References& R, const Variant& v,
                 int cc) {
  const int M = p.M, N = p.N, K = p.K;
  const size_t n_out = (size_t)M * N;
  std::mt19937 rng(17 + M + N + K);
  // bias: bf16 values (exact on the host as float)
  std::vector<float> bias_host(N);
  std::vector<bf16> bias_bits(N);
  std::uniform_real_distribution<float> ub(-2.0f, 2.0f);
  for (int j = 0; j < N; j++) {
    bias_bits[j] = __float2bfloat16(ub(rng));
    bias_host[j] = __bfloat162float(bias_bits[j]);
  }
  bf16* d_bias = v.bias ? dev_upload(bias_bits) : nullptr;
  bf16* d_pre = v.gelu ? dev_poisoned<bf16>(n_out) : nullptr;

  QuantGemmOptions opt;
  opt.bias = d_bias;
  opt.pre_gelu = d_pre;
  opt.fast_accum = v.fast;
  opt.accumulate = v.accumulate;
  const QuantOperand a = A.op(), b = B.op();
  const bool supported = matmul_quant_supported(v.d_fp32, a, b, M, N, K, opt);
  std::printf("    %-13s %-38s %s\n", v.name, variant_tag(v).c_str(), supported ? "supported" : "UNSUPPORTED");
  if (!supported) {
    const bool required = v.required && (A.granularity == kWholeTensor || block_scales_expected(cc));
    if (required) {
      ADD_FAILURE() << p.name << " / " << v.name << " (" << variant_tag(v) << ", A " << A.describe() << ", B "
                    << B.describe() << ") is not supported by cuBLASLt on this GPU (compute capability " << cc
                    << "), but the recipe needs it";
    }
    cudaFree(d_bias);
    cudaFree(d_pre);
    return;
  }

  const double acc = acc_coefficient(K, v.fast);
  std::vector<double> want(n_out), tol(n_out), want_orig(n_out), absref(n_out);
  for (size_t i = 0; i < n_out; i++) {
    const int j = (int)(i % N);
    const double bias_j = v.bias ? (double)bias_host[j] : 0.0;
    want[i] = R.ref[i] + bias_j;
    absref[i] = R.absref[i] + std::fabs(bias_j);
    want_orig[i] = R.orig[i] + bias_j;
    tol[i] = acc * absref[i] + (v.d_fp32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -8)) * std::fabs(want[i]);
  }

  std::vector<float> got;
  std::vector<uint8_t> bits1, bits2;
  std::vector<float> init;  // accumulate: D's initial values
  if (!v.d_fp32) {
    bf16* d1 = dev_poisoned<bf16>(n_out);
    bf16* d2 = dev_poisoned<bf16>(n_out);
    matmul_quant(d1, a, b, M, N, K, opt, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    got = download_bf16(d1, n_out);
    bits1 = download_bytes(d1, n_out);
    std::vector<float> pre;
    if (v.gelu) pre = download_bf16(d_pre, n_out);
    if (v.gelu) CUDA_CHECK(cudaMemset(d_pre, 0xFF, n_out * sizeof(bf16)));
    matmul_quant(d2, a, b, M, N, K, opt, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    bits2 = download_bytes(d2, n_out);
    if (v.gelu) {
      EXPECT_EQ(pre, download_bf16(d_pre, n_out)) << p.name << " / " << v.name << ": pre_gelu not bitwise deterministic";
      expect_within(pre, want, tol, absref, N, "pre_gelu (aux) vs reference");
      std::vector<double> want_gelu(n_out), tol_gelu(n_out), orig_gelu(n_out);
      for (size_t i = 0; i < n_out; i++) {
        want_gelu[i] = gelu_ref(want[i]);
        orig_gelu[i] = gelu_ref(want_orig[i]);
        tol_gelu[i] = 1.2 * acc * absref[i] + std::ldexp(1.0, -8) * std::fabs(want_gelu[i]) +
                      1.13 * std::ldexp(1.0, -8) * std::fabs(want[i]) + 1e-6;
      }
      expect_within(got, want_gelu, tol_gelu, absref, N, "gelu(out) vs reference");
      want = want_gelu;  // the aggregate below compares the GELU output with gelu(reference)
      want_orig = orig_gelu;
    } else {
      expect_within(got, want, tol, absref, N, "out vs reference");
    }
    cudaFree(d1);
    cudaFree(d2);
  } else {
    float* d1 = dev_poisoned<float>(n_out);
    float* d2 = dev_poisoned<float>(n_out);
    if (v.accumulate) {
      // D = init + 2 A·Bᵀ: two accumulating calls onto random FP32 values
      init.resize(n_out);
      std::uniform_real_distribution<float> ui(-4.0f, 4.0f);
      for (auto& x : init) x = ui(rng);
      CUDA_CHECK(cudaMemcpy(d1, init.data(), n_out * sizeof(float), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(d2, init.data(), n_out * sizeof(float), cudaMemcpyHostToDevice));
      for (size_t i = 0; i < n_out; i++) {
        want[i] = init[i] + 2.0 * R.ref[i];
        want_orig[i] = init[i] + 2.0 * R.orig[i];
        tol[i] = 2.0 * acc * absref[i] + 4.0 * std::ldexp(1.0, -24) * (std::fabs(init[i]) + 2.0 * absref[i]);
      }
      matmul_quant(d1, a, b, M, N, K, opt, 0);
      matmul_quant(d1, a, b, M, N, K, opt, 0);
      matmul_quant(d2, a, b, M, N, K, opt, 0);
      matmul_quant(d2, a, b, M, N, K, opt, 0);
    } else {
      matmul_quant(d1, a, b, M, N, K, opt, 0);
      matmul_quant(d2, a, b, M, N, K, opt, 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    got = download_f32(d1, n_out);
    bits1 = download_bytes(d1, n_out);
    bits2 = download_bytes(d2, n_out);
    expect_within(got, want, tol, absref, N, v.accumulate ? "init + 2 A*B^T vs reference" : "out vs reference");
    cudaFree(d1);
    cudaFree(d2);
  }
  EXPECT_TRUE(bits1 == bits2) << p.name << " / " << v.name << ": the same call twice gave different bits";

  // accumulation-error aggregate, and (b) against the unquantised product
  const double frob_ref = frobenius_rel(got, want);
  std::vector<double> got_minus_init_orig = want_orig;  // compare the product part only for accumulate
  std::vector<float> got_part = got;
  if (v.accumulate) {
    for (size_t i = 0; i < n_out; i++) {
      got_part[i] = got[i] - init[i];
      got_minus_init_orig[i] = 2.0 * R.orig[i];
    }
  }
  const double frob_orig = frobenius_rel(got_part, got_minus_init_orig);
  const double bound_orig = original_bound(A.format, B.format);
  std::printf("      ||gpu - ref||/||ref|| %.2e   ||gpu - original||/||original|| %.2e (bound %.2f)\n", frob_ref,
              frob_orig, bound_orig);
  if (v.fast) {
    EXPECT_LE(frob_ref, std::ldexp(1.0, -6)) << p.name << " / " << v.name << ": fast accumulation error too large";
  }
  EXPECT_LE(frob_orig, bound_orig) << p.name << " / " << v.name << " (A " << A.describe() << ", B " << B.describe()
                                   << "): too far from the unquantised product; are the scales applied?";
  cudaFree(d_bias);
  cudaFree(d_pre);
}

void run_pair(const PairSpec& p, const std::vector<Variant>& variants) {
  const int cc = compute_capability();
  std::printf("%s: D (%d x %d) = A (%d x %d, %s %s%s) * B (%d x %d, %s %s%s)^T\n", p.name, p.M, p.N, p.M, p.K,
              fmt_name(p.af), gran_name(p.ag), p.a_pow2 ? " pow2" : "", p.N, p.K, fmt_name(p.bf), gran_name(p.bg),
              p.b_pow2 ? " pow2" : "");
  SCOPED_TRACE(testing::Message() << p.name << " M=" << p.M << " N=" << p.N << " K=" << p.K);
  const uint32_t seed = 1000u + p.M * 7u + p.N * 13u + p.K * 17u;
  QOperand A(p.M, p.K, p.af, p.ag, p.a_pow2, seed), B(p.N, p.K, p.bf, p.bg, p.b_pow2, seed + 1);
  const References R = make_references(A, B);
  for (const Variant& v : variants) {
    SCOPED_TRACE(testing::Message() << v.name << " (" << variant_tag(v) << ")");
    run_variant(p, A, B, R, v, cc);
  }
}

bool fp8_gpu() { return compute_capability() >= 89; }

#define SKIP_WITHOUT_FP8()                                                                                       \
  do {                                                                                                           \
    if (!fp8_gpu()) GTEST_SKIP() << "no FP8 tensor cores (compute capability " << compute_capability() << ")"; \
  } while (0)

#define SKIP_WITHOUT_BLOCK_SCALES()                                                                              \
  do {                                                                                                           \
    if (compute_capability() < 90) GTEST_SKIP() << "block-scaled FP8 needs compute capability 9.0";              \
  } while (0)

constexpr ElementFormat E4 = ElementFormat::E4M3, E5 = ElementFormat::E5M2;
constexpr BlockShape TW = kWholeTensor, B1 = kBlock1x128, B2 = kBlock128x128;

// Variants (name, d_fp32, bias, gelu, fast, accumulate, required)
const Variant kPlain{"plain", false, false, false, false, false, true};
const Variant kFast{"fast", false, false, false, true, false, true};
const Variant kBias{"bias", false, true, false, false, false, false};
const Variant kFastBias{"fast+bias", false, true, false, true, false, false};
const Variant kGelu{"gelu", false, false, true, false, false, false};
const Variant kGeluBias{"gelu+bias", false, true, true, false, false, false};
const Variant kFastGeluBias{"fast+gelu+bias", false, true, true, true, false, false};
const Variant kF32{"fp32", true, false, false, false, false, true};
const Variant kF32Acc{"fp32 acc", true, false, false, false, true, true};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Per-tensor recipe (TE current / delayed scaling): X, W e4m3, dY e5m2; fast accumulation in fprop only.
// Shapes: GPT-2 124M at 1024 tokens, the qkv (768 -> 2304) and fcproj (3072 -> 768) layers.

TEST(GemmFp8, PerTensorFprop) {
  SKIP_WITHOUT_FP8();
  const std::vector<Variant> fprop = {kPlain, kFast, kBias, kFastBias, kGelu, kGeluBias, kFastGeluBias};
  run_pair({"fprop qkv  Y = X W^T", 1024, 2304, 768, E4, E4, TW, TW, false, true}, fprop);
  run_pair({"fprop fcproj", 1024, 768, 3072, E4, E4, TW, TW, true, false}, {kPlain, kFast, kBias});
}

TEST(GemmFp8, PerTensorDgrad) {
  SKIP_WITHOUT_FP8();
  // dX (M, C) = dY (M, N) e5m2 · Wᵀq (C, N)ᵀ e4m3
  run_pair({"dgrad qkv  dX = dY (W^T)^T", 1024, 768, 2304, E5, E4, TW, TW, false, true}, {kPlain});
  run_pair({"dgrad fcproj", 1024, 3072, 768, E5, E4, TW, TW, true, true}, {kPlain});
}

TEST(GemmFp8, PerTensorWgrad) {
  SKIP_WITHOUT_FP8();
  // dW (N, C) (+)= dYᵀq (N, M) e5m2 · Xᵀq (C, M)ᵀ e4m3, FP32
  run_pair({"wgrad qkv  dW = dY^T (X^T)^T", 2304, 768, 1024, E5, E4, TW, TW, false, false}, {kF32, kF32Acc});
  run_pair({"wgrad fcproj", 768, 3072, 1024, E5, E4, TW, TW, true, false}, {kF32, kF32Acc});
}

TEST(GemmFp8, PerTensorOddShapesAndFormatOrders) {
  SKIP_WITHOUT_FP8();
  // M, N multiples of 16 but not of 128, K a multiple of 16 only; all three format orders
  run_pair({"odd e4m3*e4m3", 272, 400, 208, E4, E4, TW, TW, true, false}, {kPlain, kFast, kBias, kGeluBias});
  run_pair({"odd e5m2*e4m3", 272, 400, 208, E5, E4, TW, TW, false, true}, {kPlain, kF32, kF32Acc});
  run_pair({"odd e4m3*e5m2", 272, 400, 208, E4, E5, TW, TW, false, false}, {kPlain, kF32Acc});
  run_pair({"tiny", 16, 16, 16, E4, E4, TW, TW, false, false}, {kPlain, kF32});
}

// ---------------------------------------------------------------------------------------------------------------
// Block-wise recipe (DeepSeek-V3 / TE Float8BlockScaling): e4m3 everywhere, activations and gradients 1x128, weights
// 128x128, split accumulation.

TEST(GemmFp8, BlockFprop) {
  SKIP_WITHOUT_BLOCK_SCALES();
  // Y (M, N) = X 1x128 (M, C) · W 128x128 (N, C)ᵀ
  run_pair({"block fprop qkv  Y = X W^T", 1024, 2304, 768, E4, E4, B1, B2, true, true},
           {kPlain, kBias, kGelu, kGeluBias});
  run_pair({"block fprop fcproj", 1024, 768, 3072, E4, E4, B1, B2, false, false}, {kPlain, kBias});
}

TEST(GemmFp8, BlockDgrad) {
  SKIP_WITHOUT_BLOCK_SCALES();
  // dX (M, C) = dY 1x128 (M, N) · Wᵀ 128x128 (C, N)ᵀ
  run_pair({"block dgrad qkv", 1024, 768, 2304, E4, E4, B1, B2, true, false}, {kPlain});
  run_pair({"block dgrad fcproj", 1024, 3072, 768, E4, E4, B1, B2, false, true}, {kPlain});
}

TEST(GemmFp8, BlockWgrad) {
  SKIP_WITHOUT_BLOCK_SCALES();
  // dW (N, C) += dYᵀ 1x128 (N, M) · Xᵀ 1x128 (C, M)ᵀ, both quantised along the tokens, FP32
  run_pair({"block wgrad qkv", 2304, 768, 1024, E4, E4, B1, B1, true, true}, {kF32, kF32Acc});
  run_pair({"block wgrad fcproj", 768, 3072, 1024, E4, E4, B1, B1, false, false}, {kF32, kF32Acc});
}

TEST(GemmFp8, BlockOddShapesAndOrders) {
  SKIP_WITHOUT_BLOCK_SCALES();
  // M, N not multiples of 128 (partial 128x128 tiles), K = 384: 3 blocks, the 128x128 stride padded to 4
  run_pair({"odd block 1x128*128x128", 272, 400, 384, E4, E4, B1, B2, false, true}, {kPlain, kBias});
  run_pair({"odd block 128x128*1x128", 272, 400, 384, E4, E4, B2, B1, true, false}, {kPlain, kF32});
  run_pair({"odd block 1x128*1x128", 272, 400, 384, E4, E4, B1, B1, false, false}, {kPlain, kF32Acc});
  // e5m2 gradients with block scales (not the DeepSeek recipe, but the API allows it)
  run_pair({"odd block e5m2 1x128*128x128", 272, 400, 384, E5, E4, B1, B2, false, false}, {kPlain, kF32Acc});
}

// ---------------------------------------------------------------------------------------------------------------
// Which combinations cuBLASLt runs on this GPU (printed for the record; the recipe's own products must be there).

TEST(GemmFp8, SupportReport) {
  const int cc = compute_capability();
  std::printf("device %s, compute capability %d.%d\n", cuda_device_name().c_str(), cc / 10, cc % 10);
  const int M = 1024, N = 2304, K = 768;
  // real (unused) buffers so that the epilogue pointers are genuine device pointers
  bf16* bias = dev_alloc<bf16>(N);
  bf16* pre = dev_alloc<bf16>((size_t)M * N);
  // real, aligned operand and scale buffers: the support answer depends on the pointers' alignment
  uint8_t* codes = dev_alloc<uint8_t>((size_t)std::max(M, N) * K);
  float* scale_inv = dev_alloc<float>((size_t)(M + N) * (K / 128 + 4) + 16);
  struct Scales {
    BlockShape a, b;
  };
  const Scales scales[] = {{TW, TW}, {B1, B1}, {B1, B2}, {B2, B1}};
  const ElementFormat formats[][2] = {{E4, E4}, {E5, E4}, {E4, E5}};
  for (const Scales& s : scales) {
    for (const auto& f : formats) {
      QuantOperand a, b;
      a.encoding = {f[0], s.a};
      b.encoding = {f[1], s.b};
      a.data = b.data = codes;
      a.scale_inv = b.scale_inv = scale_inv;
      const bool block = s.a != TW;
      for (int fast = 0; fast <= (block ? 0 : 1); fast++) {
        for (int e = 0; e < 6; e++) {
          QuantGemmOptions opt;
          opt.fast_accum = fast;
          bool d_fp32 = false;
          const char* epi = "";
          switch (e) {
            case 0: epi = "bf16 D"; break;
            case 1: epi = "bf16 D +bias"; opt.bias = bias; break;
            case 2: epi = "bf16 D +GELU_AUX"; opt.pre_gelu = pre; break;
            case 3: epi = "bf16 D +GELU_AUX+bias"; opt.bias = bias; opt.pre_gelu = pre; break;
            case 4: epi = "fp32 D"; d_fp32 = true; break;
            case 5: epi = "fp32 D accumulate"; d_fp32 = true; opt.accumulate = true; break;
          }
          const bool ok = matmul_quant_supported(d_fp32, a, b, M, N, K, opt);
          std::printf("  A %s %-7s x B %s %-7s %-24s %s : %s\n", fmt_name(f[0]), gran_name(s.a).c_str(), fmt_name(f[1]),
                      gran_name(s.b).c_str(), epi, fast ? "fast_accum" : "          ",
                      ok ? "supported" : "UNSUPPORTED");
          // what the recipes need
          const bool needed_tensor = !block && (e == 0 || e == 4 || e == 5) && (f[0] == E4 || f[1] == E4);
          const bool needed_block = block && f[0] == E4 && f[1] == E4 &&
                                    ((s.b == B2 && s.a == B1 && e == 0) || (s.a == B1 && s.b == B1 && e == 5));
          if (cc >= 89 && needed_tensor) EXPECT_TRUE(ok) << "per-tensor FP8 product the recipe needs: " << epi;
          if (block_scales_expected(cc) && needed_block) EXPECT_TRUE(ok) << "block FP8 product the recipe needs: " << epi;
          if (cc < 89) EXPECT_FALSE(ok) << "no FP8 tensor cores, yet reported supported";
        }
      }
    }
  }
  cudaFree(bias);
  cudaFree(pre);
  cudaFree(codes);
  cudaFree(scale_inv);
}

// ---------------------------------------------------------------------------------------------------------------
// Clear errors (checked before cuBLASLt is asked, so on any GPU).

namespace {
// Calls fn, expects an llmc::Error whose message contains `needle`.
template <typename F>
void expect_error(F&& fn, const char* needle, const char* what) {
  try {
    fn();
    ADD_FAILURE() << what << ": no error thrown";
  } catch (const llmc::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << what << ": the message does not mention '" << needle << "': " << e.what();
    std::printf("  %-44s -> %s\n", what, e.what());
  }
}
}  // namespace

TEST(GemmFp8, RejectsInvalidCombinations) {
  const int M = 256, N = 256, K = 256;
  uint8_t* codes = dev_alloc<uint8_t>((size_t)M * K + 64);
  float* scales = dev_alloc<float>(4096);
  bf16* d_bf16 = dev_alloc<bf16>((size_t)M * N + 64);
  float* d_f32 = dev_alloc<float>((size_t)M * N + 64);
  bf16* bias = dev_alloc<bf16>(N + 64);
  auto operand = [&](ElementFormat f, BlockShape g) {
    QuantOperand o;
    o.data = codes;
    o.encoding = {f, g};
    o.scale_inv = scales;
    return o;
  };
  const QuantGemmOptions none;
  QuantGemmOptions fast;
  fast.fast_accum = true;
  QuantGemmOptions with_bias;
  with_bias.bias = bias;
  QuantGemmOptions acc;
  acc.accumulate = true;

  expect_error([&] { matmul_quant(d_bf16, operand(E4, B2), operand(E4, B2), M, N, K, none, 0); }, "128x128*128x128",
               "2D x 2D block scales");
  expect_error([&] { matmul_quant(d_bf16, operand(E4, B1), operand(E4, B2), M, N, K, fast, 0); }, "fast",
               "fast accumulation with block scales");
  expect_error([&] { matmul_quant(d_bf16, operand(E4, TW), operand(E4, TW), M, N, 200, none, 0); }, "K=200",
               "K not a multiple of 16");
  expect_error([&] { matmul_quant(d_bf16, operand(E4, B1), operand(E4, B1), M, N, 208, none, 0); }, "multiple of 128",
               "block scales, K not a multiple of 128");
  expect_error([&] { matmul_quant(d_bf16, operand(E4, TW), operand(E4, TW), 8, N, K, none, 0); }, "multiples of 16",
               "M not a multiple of 16");
  expect_error([&] { matmul_quant(d_bf16, operand(E5, TW), operand(E5, TW), M, N, K, none, 0); }, "e5m2",
               "e5m2 x e5m2");
  expect_error([&] { matmul_quant(d_bf16, operand(E4, TW), operand(E4, B1), M, N, K, none, 0); }, "per-tensor",
               "per-tensor mixed with block scales");
  expect_error([&] { matmul_quant(d_f32, operand(E5, TW), operand(E4, TW), M, N, K, with_bias, 0); }, "bf16 D",
               "bias with FP32 D");
  expect_error([&] { matmul_quant(d_bf16, operand(E4, TW), operand(E4, TW), M, N, K, acc, 0); }, "FP32 D",
               "accumulate with bf16 D");
  QuantOperand misaligned = operand(E4, TW);
  misaligned.data = codes + 8;
  expect_error([&] { matmul_quant(d_bf16, misaligned, operand(E4, TW), M, N, K, none, 0); }, "A.data",
               "misaligned A.data");
  QuantOperand block_scale_off = operand(E4, B1);
  block_scale_off.scale_inv = scales + 1;
  expect_error([&] { matmul_quant(d_bf16, block_scale_off, operand(E4, B2), M, N, K, none, 0); }, "A.scale_inv",
               "misaligned block scales");
  QuantOperand no_scale = operand(E4, TW);
  no_scale.scale_inv = nullptr;
  expect_error([&] { matmul_quant(d_bf16, operand(E4, TW), no_scale, M, N, K, none, 0); }, "B.scale_inv is null",
               "null scale_inv");
  expect_error([&] { matmul_quant((bf16*)nullptr, operand(E4, TW), operand(E4, TW), M, N, K, none, 0); }, "D is null",
               "null D");
  // and the support query says no to all of them
  EXPECT_FALSE(matmul_quant_supported(false, operand(E4, B2), operand(E4, B2), M, N, K, none));
  EXPECT_FALSE(matmul_quant_supported(false, operand(E4, B1), operand(E4, B2), M, N, K, fast));
  EXPECT_FALSE(matmul_quant_supported(false, operand(E4, TW), operand(E4, TW), M, N, 200, none));
  EXPECT_FALSE(matmul_quant_supported(false, operand(E5, TW), operand(E5, TW), M, N, K, none));
  EXPECT_FALSE(matmul_quant_supported(true, operand(E5, TW), operand(E4, TW), M, N, K, with_bias));
  cudaFree(codes);
  cudaFree(scales);
  cudaFree(d_bf16);
  cudaFree(d_f32);
  cudaFree(bias);
}

// quant_operand: which copy and which scales a QTensor hands to the GEMM.
TEST(GemmFp8, OperandFromQTensor) {
  static uint8_t data[16], data_t[16];
  static float s[4], s_t[4];
  QTensor q;
  q.rows = 256;
  q.cols = 128;
  q.encoding = {E5, TW};
  q.data = data;
  q.data_t = data_t;
  q.scale_inv = s;
  q.scale_inv_t = s_t;
  QuantOperand o = quant_operand(q, false);
  EXPECT_EQ(o.data, data);
  EXPECT_EQ(o.scale_inv, s);
  EXPECT_EQ(o.encoding, q.encoding);
  o = quant_operand(q, true);
  EXPECT_EQ(o.data, data_t);
  EXPECT_EQ(o.scale_inv, s) << "a per-tensor transposed copy shares the tensor's scale_inv";
  q.encoding.block = B1;
  o = quant_operand(q, true);
  EXPECT_EQ(o.data, data_t);
  EXPECT_EQ(o.scale_inv, s_t) << "a block-scaled transposed copy has its own scale_inv_t";
  EXPECT_EQ(o.encoding.block, B1);
  q.data_t = nullptr;
  EXPECT_THROW(quant_operand(q, true), llmc::Error);
  q.data_t = data_t;
  q.scale_inv_t = nullptr;
  EXPECT_THROW(quant_operand(q, true), llmc::Error);
}
