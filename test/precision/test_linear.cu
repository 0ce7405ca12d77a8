// test/precision/test_linear: llmc/precision/linear under each FP8 recipe, against host references built from the
// bit-exact quantisation references of llmc/precision/fp8_quant and the FP64 product of llmc/precision/gemm
// (matmul_quant_cpu):
//   - fprop, dgrad and wgrad equal the FP64 product of the host-quantised operands (tight: FP32 accumulation, one
//     bf16 rounding of the output; fast accumulation in fprop gets its documented looser bound),
//   - and stay close to the FP64 product of the ORIGINAL operands (loose, documented: what FP8 costs),
//   - the weight is quantised once per optimizer step (cache) and re-quantised after weights_changed(),
//   - a producer-reported amax gives the same bits as the amax the layer measures itself,
//   - GELU forward / backward options,
//   - delayed scaling: the first step scales from the current amax, later steps from the history,
//   - numerics telemetry names and sanity; the product telemetry's SNRs against the host's FP64 products,
//   - the BF16 plan is exactly the cuBLASLt BF16 path;
//   - precision.tensorwise_products: each product gives the bits of the preset whose scaling it takes;
//   - Quartet plans (mxfp4 and its ablations): fprop, dgrad and wgrad against a host reference of exactly its
//     algorithm (forward rotation, scales, trust masks; backward re-quantisation under the micro-step's signs with
//     range-matched scales; the products x16/9, masked, rotated back) within the FP4 products' accumulation bounds.
//   - FP4 plans (nvfp4, its ablations, MXFP4 for every role): fprop, dgrad and wgrad equal the FP64 product of the
//     operands the host FP4 quantisers make with the same arguments (x RTN, w 16x16 or 1x16 RTN, dy stochastic with
//     the precision state's key, the transposed x and dy rotated by the run's Hadamard signs), within the bounds of
//     the FP4 product paths (test_fp4_gemm); stochastic rounding repeats for the same step and micro-step and changes
//     with them; the MXFP4 inexact-block count reaches the telemetry.
// Fresh random inputs each run (seed printed; LLM8_TEST_SEED replays).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/kernels/reduce.h"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/gemm.h"
#include "llmc/precision/linear.h"
#include "llmc/precision/recipe.h"
#include "test/reference/fp4_gemm_ref.h"
#include "test/reference/kernels_ref.h"
#include "test/reference/precision_ref.h"

using namespace llmc;

namespace {

uint64_t seed() {
  static const uint64_t s = [] {
    const char* env = std::getenv("LLM8_TEST_SEED");
    const uint64_t v = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("test_linear: seed %llu (replay with LLM8_TEST_SEED=%llu)\n", (unsigned long long)v,
                (unsigned long long)v);
    return v;
  }();
  return s;
}

// Random bf16-exact values, N(0, std) with a few outliers 30x larger (FP8 scaling must survive them).
std::vector<float> random_values(size_t n, std::mt19937_64& rng, float std_dev) {
  std::normal_distribution<float> dist(0.0f, std_dev);
  std::uniform_int_distribution<size_t> pick(0, n - 1);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  for (int i = 0; i < 8; i++) v[pick(rng)] *= 30.0f;
  for (float& x : v) x = __bfloat162float(__float2bfloat16_rn(x));
  return v;
}

template <class T>
struct Dev {
  T* ptr = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T))); }
  ~Dev() { cudaFree(ptr); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void poison() { CUDA_CHECK(cudaMemset(ptr, 0xff, n * sizeof(T))); }
};

Dev<bf16>* upload(const std::vector<float>& v) {
  auto* d = new Dev<bf16>(v.size());
  std::vector<bf16> h(v.size());
  for (size_t i = 0; i < v.size(); i++) h[i] = __float2bfloat16_rn(v[i]);
  CUDA_CHECK(cudaMemcpy(d->ptr, h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  return d;
}
std::vector<float> download(const bf16* p, size_t n) {
  std::vector<bf16> h(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(h[i]);
  return out;
}
std::vector<float> download(const float* p, size_t n) {
  std::vector<float> out(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

std::vector<float> transpose(const std::vector<float>& a, int rows, int cols) {
  std::vector<float> t(a.size());
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) t[(size_t)c * rows + r] = a[(size_t)r * cols + c];
  return t;
}

// Host quantisation of a (rows, cols) source with the recipe role: codes (and transposed codes) + scale_inv arrays in
// the GEMM-ready layouts. Per-tensor: current scaling from the source's amax (margin 0).
struct HostQ {
  std::vector<uint8_t> data, data_t;
  std::vector<float> scale_inv, scale_inv_t;
  Encoding e;
};
HostQ host_quantize(const std::vector<float>& x, int rows, int cols, const Encoding& e) {
  HostQ q;
  q.e = e;
  q.data.resize((size_t)rows * cols);
  q.data_t.resize((size_t)rows * cols);
  if (e.per_tensor()) {
    const float amax = amax_bf16_cpu(x.data(), x.size());
    const float scale = fp8_scale_from_amax_cpu(amax, 1.0f, e, 0);
    fp8_quantize_tensorwise_cpu(q.data.data(), q.data_t.data(), nullptr, x.data(), rows, cols, scale, e.element);
    q.scale_inv = {1.0f / scale};
    q.scale_inv_t = q.scale_inv;
  } else {
    q.scale_inv.assign(scale_inv_count(e, rows, cols), 1.0f);
    q.scale_inv_t.assign(scale_inv_count(e, cols, rows), 1.0f);
    fp8_quantize_blockwise_cpu(q.data.data(), q.scale_inv.data(), q.data_t.data(), q.scale_inv_t.data(), x.data(), rows,
                               cols, e);
  }
  return q;
}

// |got - ref| <= rel |ref| + abs_frac * absref [+ largest_frac * largest] per element (absref = the same product on
// |operands|; largest = the largest single |a_k b_k| of the element, where given).
void expect_close(const char* what, const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<double>& absref, double rel, double abs_frac,
                  const std::vector<double>* largest = nullptr, double largest_frac = 0.0) {
  ASSERT_EQ(got.size(), ref.size());
  if (largest) ASSERT_EQ(largest->size(), ref.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double tol = rel * std::fabs(ref[i]) + abs_frac * absref[i] + (largest ? largest_frac * (*largest)[i] : 0.0) +
                       1e-30;
    if (!(std::fabs(got[i] - ref[i]) <= tol)) {
      if (bad < 5)
        ADD_FAILURE() << what << "[" << i << "] got " << got[i] << " want " << ref[i] << " (tol " << tol << ")";
      bad++;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": elements outside tolerance";
}

// ‖got - ref‖ / ‖ref‖ with ref the FP64 product on the original (unquantised) operands.
double rel_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// FP64 D (M, N) = A (M, K) · B (N, K)ᵀ on plain floats.
std::vector<double> product(const std::vector<float>& a, const std::vector<float>& b, int M, int N, int K,
                            bool absolute = false) {
  std::vector<double> d((size_t)M * N, 0.0);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double acc = 0;
      for (int k = 0; k < K; k++) {
        const double p = (double)a[(size_t)m * K + k] * b[(size_t)n * K + k];
        acc += absolute ? std::fabs(p) : p;
      }
      d[(size_t)m * N + n] = acc;
    }
  return d;
}

// The largest single term max_k |a[m, k] b[n, k]| of every output element (M, N), for the accumulation bound of an
// element that one product dominates.
std::vector<double> largest_term(const std::vector<float>& a, const std::vector<float>& b, int M, int N, int K) {
  std::vector<double> d((size_t)M * N, 0.0);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double big = 0;
      for (int k = 0; k < K; k++) big = std::max(big, std::fabs((double)a[(size_t)m * K + k] * b[(size_t)n * K + k]));
      d[(size_t)m * N + n] = big;
    }
  return d;
}

// The telemetry of linear `name` after a training forward and backward: an entry per role (x, w, dy), each with a
// positive amax, an SNR above min_snr dB and fractions in range.
void expect_role_telemetry(const std::vector<TensorNumerics>& numerics, const std::string& name, double min_snr) {
  std::vector<std::string> names;
  for (const TensorNumerics& t : numerics) {
    names.push_back(t.name);
    EXPECT_GT(t.stats.snr_db, min_snr) << t.name;
    EXPECT_GE(t.stats.saturated_frac, 0.0) << t.name;
    EXPECT_LT(t.stats.underflow_frac, 0.5) << t.name;
    EXPECT_GT(t.stats.amax, 0.0) << t.name;
  }
  for (const char* role : {".x", ".w", ".dy"})
    EXPECT_NE(std::find(names.begin(), names.end(), name + role), names.end()) << name << role;
}

// FP64 product of host-quantised operands (matmul_quant_cpu).
std::vector<double> fp8_product(const HostQ& a, bool at, const HostQ& b, bool bt, int M, int N, int K,
                                const float* bias = nullptr) {
  std::vector<double> d((size_t)M * N);
  matmul_quant_cpu(d.data(), (at ? a.data_t : a.data).data(), (at ? a.scale_inv_t : a.scale_inv).data(), a.e,
                   (bt ? b.data_t : b.data).data(), (bt ? b.scale_inv_t : b.scale_inv).data(), b.e, M, N, K, bias);
  return d;
}

struct Problem {
  int M = 256, N = 384, K = 512;
  std::vector<float> x, w, bias, dy, dw0;
  explicit Problem(std::mt19937_64& rng, int rows = 256, int out_features = 384, int in_features = 512)
      : M(rows), N(out_features), K(in_features) {
    x = random_values((size_t)M * K, rng, 1.0f);
    w = random_values((size_t)N * K, rng, 0.02f);
    bias = random_values(N, rng, 0.1f);
    dy = random_values((size_t)M * N, rng, 1e-4f);  // gradient-sized values: E5M2 needs its scale
    std::uniform_real_distribution<float> u(-1e-3f, 1e-3f);
    dw0.resize((size_t)N * K);
    for (float& v : dw0) v = u(rng);
  }
};

// One training micro-step of `lin` on p (telemetry requested): forward with the bias, backward from the saved input
// into dw = dw0 + dW; the outputs (poisoned before) and the key its dy was drawn with.
struct MicroStep {
  std::vector<float> out, dx, dw;
  StochasticKey dy_key;
};
MicroStep train_micro_step(PrecisionState& state, Linear& lin, const Problem& p) {
  const int M = p.M, N = p.N, K = p.K;
  std::unique_ptr<Dev<bf16>> x(upload(p.x)), w(upload(p.w)), bias(upload(p.bias)), dy(upload(p.dy));
  Dev<bf16> out((size_t)M * N), dx((size_t)M * K);
  Dev<float> dw((size_t)N * K);
  CUDA_CHECK(cudaMemcpy(dw.ptr, p.dw0.data(), p.dw0.size() * sizeof(float), cudaMemcpyHostToDevice));
  out.poison();
  dx.poison();
  state.request_numerics();
  state.begin_forward(0);
  lin.forward(out.ptr, x->ptr, w->ptr, bias->ptr, M, /*training=*/true, 0);
  state.begin_backward(0);
  MicroStep r;
  r.dy_key = state.stochastic_key(0, LinearRole::Dy);  // the first registered linear's, this micro-step
  lin.backward(dx.ptr, dw.ptr, dy->ptr, /*x=*/nullptr, w->ptr, M, 0);
  r.out = download(out.ptr, out.n);
  r.dx = download(dx.ptr, dx.n);
  r.dw = download(dw.ptr, dw.n);
  return r;
}

// The message of the llmc::Error validate_precision_recipe throws for r (4 blocks), or "".
std::string validate_recipe_error(const PrecisionRecipe& r) {
  try {
    validate_precision_recipe(r, 4);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

PrecisionRecipe recipe(const char* name) {
  PrecisionRecipe r;
  EXPECT_TRUE(precision_recipe_preset(name, &r));
  return r;
}

class LinearFp8 : public ::testing::TestWithParam<const char*> {};

TEST_P(LinearFp8, ProductsMatchHostQuantisedReference) {
  std::mt19937_64 rng(seed() ^ std::hash<std::string>{}(GetParam()));
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  const PrecisionRecipe r = recipe(GetParam());
  const LinearPlan plan = plan_linear(r, 1, 4, LinearKind::MlpUp);
  ASSERT_TRUE(plan.quantized);
  PrecisionState state(r);
  Linear lin(state, "test.linear", LinearKind::MlpUp, 1, N, K, plan, M);

  const MicroStep step = train_micro_step(state, lin, p);
  const std::vector<float>&out_h = step.out, &dx_h = step.dx, &dw_h = step.dw;

  // Host references from the quantisation references.
  const HostQ xq = host_quantize(p.x, M, K, plan.x);
  const HostQ wq = host_quantize(p.w, N, K, plan.w);
  const HostQ dyq = host_quantize(p.dy, M, N, plan.dy);
  // The absolute products bound the accumulation error: FP32 over K terms, or fast accumulation in fprop.
  auto dequant = [](const HostQ& q, int rows, int cols, bool t) {
    std::vector<float> v((size_t)rows * cols);
    fp8_dequantize_cpu(v.data(), (t ? q.data_t : q.data).data(), (t ? q.scale_inv_t : q.scale_inv).data(), rows, cols,
                       q.e);
    return v;
  };
  const std::vector<float> xd = dequant(xq, M, K, false), wd = dequant(wq, N, K, false),
                           dyd = dequant(dyq, M, N, false), wtd = dequant(wq, K, N, true),
                           dytd = dequant(dyq, N, M, true), xtd = dequant(xq, K, M, true);
  // Accumulation error per element, as a fraction of sum |products| (the bounds test_gemm_fp8 calibrates): Hopper's
  // FP8 tensor cores accumulate a 128-deep K block in a reduced-precision accumulator before it is promoted to FP32
  // (2^-10: twice test_gemm_fp8's 2^-11, measured on an H100 at 1.03x of 2^-11 for one wgrad element), and fast
  // accumulation promotes only at the end (2^-12 per 128 of K); plus FP32 rounding over K terms.
  auto accumulation = [](int k, bool fast) {
    const double fp32 = 4.0 * k * std::ldexp(1.0, -24);
    return fast ? std::ldexp(1.0, -12) * (k / 128.0) + fp32 : std::ldexp(1.0, -10) + fp32;
  };
  // + 2^-9 of the absolute product in fprop: with block scales the bias is added after the GEMM's bf16 rounding
  // (add_bias), a second rounding of the product before the bias.
  const double fprop_abs = accumulation(K, plan.fast_accum_fprop) + std::ldexp(1.0, -9);
  // + 2^-7 of the element's largest single product: the tensor cores align the products of one 32-long step to the
  // largest and add them with ~14 significant bits, so where one product dominates an element (an outlier of each
  // operand meeting, as the data has) each other product of its step can lose up to 2^-13 of it, 31 of them plus
  // one loss per later step of its 128-long slice: (31 + 3) 2^-13 < 2^-7. A wgrad element that was one product of
  // two outliers erred by 2^-9.7 of it, 1.07x the 2^-10 absref bound alone (seed 3156936043, fp8_delayed, H200).
  const double largest_frac = std::ldexp(1.0, -7);
  const std::vector<double> out_ref = fp8_product(xq, false, wq, false, M, N, K, p.bias.data());
  const std::vector<double> out_big = largest_term(xd, wd, M, N, K);
  expect_close("fprop", out_h, out_ref, product(xd, wd, M, N, K, true), std::ldexp(1.0, -8), fprop_abs, &out_big,
               largest_frac);
  const std::vector<double> dx_ref = fp8_product(dyq, false, wq, true, M, K, N);
  const std::vector<double> dx_big = largest_term(dyd, wtd, M, K, N);
  expect_close("dgrad", dx_h, dx_ref, product(dyd, wtd, M, K, N, true), std::ldexp(1.0, -8), accumulation(N, false),
               &dx_big, largest_frac);
  std::vector<double> dw_ref = fp8_product(dyq, true, xq, true, N, K, M);
  for (size_t i = 0; i < dw_ref.size(); i++) dw_ref[i] += p.dw0[i];
  std::vector<double> dw_abs = product(dytd, xtd, N, K, M, true);
  for (size_t i = 0; i < dw_abs.size(); i++) dw_abs[i] += std::fabs(p.dw0[i]);
  const std::vector<double> dw_big = largest_term(dytd, xtd, N, K, M);
  expect_close("wgrad", dw_h, dw_ref, dw_abs, 1e-6, accumulation(M, false), &dw_big, largest_frac);

  // Against the unquantised operands (what FP8 costs; loose, documented): E4M3 keeps 3 mantissa bits (relative
  // rounding error <= 2^-4 per element, ~2^-5.5 rms), E5M2 2 bits (<= 2^-3): the products' relative Frobenius errors
  // stay below 6% (fprop, E4M3 x E4M3) and 12% (dgrad, wgrad with an E5M2 or E4M3 gradient).
  std::vector<double> out_exact = product(p.x, p.w, M, N, K);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) out_exact[(size_t)m * N + n] += p.bias[n];
  const std::vector<float> wt = transpose(p.w, N, K), dyt = transpose(p.dy, M, N), xt = transpose(p.x, M, K);
  const double e_fprop = rel_error(out_h, out_exact);
  const double e_dgrad = rel_error(dx_h, product(p.dy, wt, M, K, N));
  std::vector<double> dw_exact = product(dyt, xt, N, K, M);
  for (size_t i = 0; i < dw_exact.size(); i++) dw_exact[i] += p.dw0[i];
  const double e_wgrad = rel_error(dw_h, dw_exact);
  std::printf("  %s: relative error vs unquantised fprop %.3f dgrad %.3f wgrad %.3f\n", GetParam(), e_fprop, e_dgrad,
              e_wgrad);
  EXPECT_LT(e_fprop, 0.06);
  EXPECT_LT(e_dgrad, 0.12);
  EXPECT_LT(e_wgrad, 0.12);

  // Telemetry: one record per quantised role, with sane values.
  expect_role_telemetry(state.collect_numerics(0), "test.linear", 10.0);
}

TEST_P(LinearFp8, WeightCacheProducerAmaxAndDeterminism) {
  std::mt19937_64 rng(seed() ^ 7 ^ std::hash<std::string>{}(GetParam()));
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  const PrecisionRecipe r = recipe(GetParam());
  const LinearPlan plan = plan_linear(r, 0, 2, LinearKind::Qkv);
  PrecisionState state(r);
  Linear lin(state, "cache", LinearKind::Qkv, 0, N, K, plan, M);
  std::unique_ptr<Dev<bf16>> x(upload(p.x)), w(upload(p.w)), w2(upload(random_values(p.w.size(), rng, 0.02f)));
  Dev<bf16> out((size_t)M * N);
  auto run = [&](const bf16* weights, bool producer_amax) {
    out.poison();
    state.begin_forward(0);
    Linear::ForwardOptions opt;
    if (producer_amax && lin.x_amax_slot() != nullptr) {
      amax_bf16(lin.x_amax_slot(), x->ptr, p.x.size(), 0);  // what a producer kernel reports
      opt.x_amax_ready = true;
    }
    lin.forward(out.ptr, x->ptr, weights, nullptr, M, true, 0, opt);
    return download(out.ptr, out.n);
  };
  const std::vector<float> a = run(w->ptr, false);
  const std::vector<float> b = run(w->ptr, true);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "producer amax changes the result";
  // Same forward again: bit-identical (deterministic).
  const std::vector<float> c = run(w->ptr, false);
  EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float))) << "not deterministic";
  // New weights without weights_changed(): the cached FP8 weight is used (same result) ...
  const std::vector<float> d = run(w2->ptr, false);
  EXPECT_EQ(0, std::memcmp(a.data(), d.data(), a.size() * sizeof(float))) << "weight cache not used";
  // ... and after weights_changed() the new weights are quantised.
  lin.weights_changed();
  const std::vector<float> e = run(w2->ptr, false);
  EXPECT_NE(0, std::memcmp(a.data(), e.data(), a.size() * sizeof(float))) << "weights not re-quantised";
}

// precision.cache_weight_transpose = false (the transposed weight codes made in every backward) and
// precision.cache_weights = false (the weight quantised into shared scratch in every forward and again in every
// backward) give the cached plan's bits: forward, dgrad and wgrad over two optimizer steps with a weight update
// between them. Two linears share the precision state and run interleaved (forward a, forward b, backward b,
// backward a), so without a cache b's casts overwrite the scratch a's backward needs, and a must quantise again.
TEST_P(LinearFp8, UncachedWeightsAreBitIdentical) {
  std::mt19937_64 rng(seed() ^ 13 ^ std::hash<std::string>{}(GetParam()));
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  const PrecisionRecipe cached = recipe(GetParam());
  PrecisionRecipe no_transpose = cached, no_cache = cached;
  no_transpose.cache_weight_transpose = false;
  no_cache.cache_weights = false;
  std::unique_ptr<Dev<bf16>> x(upload(p.x)), w(upload(p.w)), dy(upload(p.dy)),
      w2(upload(random_values(p.w.size(), rng, 0.02f))), xb(upload(random_values(p.x.size(), rng, 1.0f))),
      wb(upload(random_values(p.w.size(), rng, 0.05f)));
  struct Result {
    std::vector<float> out, dx, dw;
  };
  auto train = [&](const PrecisionRecipe& r) {
    PrecisionState state(r);
    const LinearPlan plan = plan_linear(r, 0, 2, LinearKind::MlpUp);
    EXPECT_EQ(plan.cache_weight_transpose, r.cache_weight_transpose);
    EXPECT_EQ(plan.cache_weights, r.cache_weights);
    Linear a(state, "a", LinearKind::MlpUp, 0, N, K, plan, M), b(state, "b", LinearKind::MlpUp, 0, N, K, plan, M);
    Dev<bf16> out_a((size_t)M * N), dx_a((size_t)M * K), out_b((size_t)M * N), dx_b((size_t)M * K);
    Dev<float> dw_a((size_t)N * K), dw_b((size_t)N * K);
    CUDA_CHECK(cudaMemset(dw_a.ptr, 0, dw_a.n * sizeof(float)));
    CUDA_CHECK(cudaMemset(dw_b.ptr, 0, dw_b.n * sizeof(float)));
    Result res;
    for (const bf16* weights : {w->ptr, w2->ptr}) {
      for (Dev<bf16>* d : {&out_a, &dx_a, &out_b, &dx_b}) d->poison();
      state.begin_forward(0);
      a.forward(out_a.ptr, x->ptr, weights, nullptr, M, true, 0);
      b.forward(out_b.ptr, xb->ptr, wb->ptr, nullptr, M, true, 0);
      state.begin_backward(0);
      b.backward(dx_b.ptr, dw_b.ptr, dy->ptr, xb->ptr, wb->ptr, M, 0);
      a.backward(dx_a.ptr, dw_a.ptr, dy->ptr, x->ptr, weights, M, 0);
      state.end_step(0);
      a.weights_changed();
      b.weights_changed();
      for (const Dev<bf16>* d : {&out_a, &dx_a, &out_b, &dx_b})
        for (float v : download(d->ptr, d->n)) (d == &out_a || d == &out_b ? res.out : res.dx).push_back(v);
    }
    res.dw = download(dw_a.ptr, dw_a.n);
    for (float v : download(dw_b.ptr, dw_b.n)) res.dw.push_back(v);
    return res;
  };
  const Result want = train(cached);
  for (float v : want.dx) ASSERT_TRUE(std::isfinite(v)) << "dgrad not written";
  for (const PrecisionRecipe* r : {&no_transpose, &no_cache}) {
    SCOPED_TRACE(r == &no_cache ? "cache_weights = false" : "cache_weight_transpose = false");
    const Result got = train(*r);
    ASSERT_EQ(want.out.size(), got.out.size());
    EXPECT_EQ(0, std::memcmp(want.out.data(), got.out.data(), want.out.size() * sizeof(float))) << "fprop differs";
    EXPECT_EQ(0, std::memcmp(want.dx.data(), got.dx.data(), want.dx.size() * sizeof(float))) << "dgrad differs";
    EXPECT_EQ(0, std::memcmp(want.dw.data(), got.dw.data(), want.dw.size() * sizeof(float))) << "wgrad differs";
  }
}

// precision.tensorwise_products: a product with per-tensor scales gives fp8_tensorwise's bits and one with blocks
// fp8_blockwise's (the presets share their element formats: x, w E4M3, dy E5M2), for each of the 8 subsets of the
// three products. The weight's and the input's copies are then quantised separately (a block row copy beside a
// whole-tensor transposed one, or the reverse), from the same amax as the recipe that quantises them together; so
// this also checks that one quantisation writing both block copies gives the bits of two writing one each; and each
// subset without a weight cache gives the same bits as with one. Shapes: the small problem, and GPT-2 124M's MLP up
// and down projections at 8192 tokens.
class LinearTensorwiseProducts : public ::testing::TestWithParam<std::array<int, 3>> {};

TEST_P(LinearTensorwiseProducts, EachProductGivesItsRecipesBits) {
  const auto [M, N, K] = GetParam();
  std::mt19937_64 rng(seed() ^ 17 ^ (uint64_t)M * N * K);
  const Problem p(rng, M, N, K);
  auto run = [&](const PrecisionRecipe& r) {
    EXPECT_EQ(validate_recipe_error(r), "");
    PrecisionState state(r);
    Linear lin(state, "mixed", LinearKind::MlpUp, 0, p.N, p.K, plan_linear(r, 0, 2, LinearKind::MlpUp), p.M);
    return train_micro_step(state, lin, p);
  };
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const MicroStep tensorwise = run(recipe("fp8_tensorwise")), blockwise = run(recipe("fp8_blockwise"));
  ASSERT_FALSE(same(tensorwise.out, blockwise.out)) << "the two recipes' fprop must differ for this test to mean much";
  ASSERT_FALSE(same(tensorwise.dx, blockwise.dx));
  ASSERT_FALSE(same(tensorwise.dw, blockwise.dw));
  for (int subset = 0; subset < 8; subset++) {
    PrecisionRecipe r = recipe("fp8_blockwise");
    for (LinearProduct product : kLinearProducts)
      if (subset & (1 << static_cast<int>(product))) r.tensorwise_products.push_back(product);
    const std::string name = "tensorwise_products = \"" + format_linear_products(r.tensorwise_products) + "\"";
    const MicroStep m = run(r);
    auto expected = [&](LinearProduct product) {
      return product_is_tensorwise(r, product) ? &tensorwise : &blockwise;
    };
    EXPECT_TRUE(same(m.out, expected(LinearProduct::Fprop)->out)) << name << ": fprop";
    EXPECT_TRUE(same(m.dx, expected(LinearProduct::Dgrad)->dx)) << name << ": dgrad";
    EXPECT_TRUE(same(m.dw, expected(LinearProduct::Wgrad)->dw)) << name << ": wgrad";
    // Without a weight cache (the weight's two copies then quantised into scratch, separately where they differ).
    r.cache_weights = false;
    const MicroStep u = run(r);
    EXPECT_TRUE(same(u.out, m.out) && same(u.dx, m.dx) && same(u.dw, m.dw)) << name << ", cache_weights = false";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTensorwiseProducts,
                         ::testing::Values(std::array<int, 3>{256, 384, 512}, std::array<int, 3>{8192, 3072, 768},
                                           std::array<int, 3>{8192, 768, 3072}));

// Product telemetry (PrecisionState::set_product_numerics, log.numerics_products): each product's error against the
// BF16 product of the unquantised operands equals the error computed here against the FP64 product of those operands,
// up to the reference's own rounding: with e = ‖got - ref‖ / ‖ref‖ = 10^(-SNR/20), |e_gpu - e_host| <= 2^-8 (BF16's
// unit roundoff; the triangle inequality) plus FP32 accumulation; wgrad is measured when backward receives the BF16
// input and not otherwise; nothing is measured without the request.
TEST_P(LinearFp8, ProductTelemetryMatchesTheHostProducts) {
  std::mt19937_64 rng(seed() ^ 19 ^ std::hash<std::string>{}(GetParam()));
  Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  std::fill(p.dw0.begin(), p.dw0.end(), 0.0f);  // dw is then this micro-step's product alone
  const PrecisionRecipe r = recipe(GetParam());
  std::unique_ptr<Dev<bf16>> x(upload(p.x)), w(upload(p.w)), bias(upload(p.bias)), dy(upload(p.dy));
  auto run = [&](bool products, bool bf16_input, std::vector<TensorNumerics>* numerics) {
    PrecisionState state(r);
    Linear lin(state, "t", LinearKind::MlpUp, 0, N, K, plan_linear(r, 0, 2, LinearKind::MlpUp), M);
    Dev<bf16> out((size_t)M * N), dx((size_t)M * K);
    Dev<float> dw((size_t)N * K);
    CUDA_CHECK(cudaMemset(dw.ptr, 0, dw.n * sizeof(float)));
    state.set_product_numerics(products);
    state.request_numerics();
    state.begin_forward(0);
    lin.forward(out.ptr, x->ptr, w->ptr, bias->ptr, M, /*training=*/true, 0);
    state.begin_backward(0);
    lin.backward(dx.ptr, dw.ptr, dy->ptr, bf16_input ? x->ptr : nullptr, w->ptr, M, 0);
    *numerics = state.collect_numerics(0);
    return MicroStep{download(out.ptr, out.n), download(dx.ptr, dx.n), download(dw.ptr, dw.n), {}};
  };
  auto find = [](const std::vector<TensorNumerics>& numerics, const std::string& name) -> const TensorNumerics* {
    for (const TensorNumerics& t : numerics)
      if (t.name == name) return &t;
    return nullptr;
  };
  auto snr_db = [](const std::vector<float>& got, const std::vector<double>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); i++) {
      num += (got[i] - ref[i]) * (got[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    return 10.0 * std::log10(den / num);
  };
  std::vector<TensorNumerics> numerics;
  const MicroStep m = run(/*products=*/true, /*bf16_input=*/true, &numerics);
  std::vector<double> out_exact = product(p.x, p.w, M, N, K);
  for (int i = 0; i < M; i++)
    for (int n = 0; n < N; n++) out_exact[(size_t)i * N + n] += p.bias[n];
  const std::vector<double> dx_exact = product(p.dy, transpose(p.w, N, K), M, K, N);
  const std::vector<double> dw_exact = product(transpose(p.dy, M, N), transpose(p.x, M, K), N, K, M);
  const struct {
    const char* name;
    const std::vector<float>& got;
    const std::vector<double>& exact;
  } products[] = {{".fprop", m.out, out_exact}, {".dgrad", m.dx, dx_exact}, {".wgrad", m.dw, dw_exact}};
  for (const auto& prod : products) {
    const TensorNumerics* t = find(numerics, std::string("t") + prod.name);
    ASSERT_NE(t, nullptr) << prod.name << " not measured";
    EXPECT_TRUE(t->product) << prod.name;
    const double host = snr_db(prod.got, prod.exact);
    std::printf("  %s %s: product SNR %.2f dB (host, against FP64: %.2f dB)\n", GetParam(), prod.name,
                t->stats.snr_db, host);
    EXPECT_NEAR(std::pow(10.0, -t->stats.snr_db / 20), std::pow(10.0, -host / 20), std::ldexp(1.0, -8) + 1e-4)
        << prod.name;
    EXPECT_GT(t->stats.snr_db, 15.0) << prod.name;
  }
  for (const TensorNumerics& t : numerics)  // the quantised tensors' records are unchanged by the request
    if (!t.product) EXPECT_TRUE(t.name == "t.x" || t.name == "t.w" || t.name == "t.dy") << t.name;
  // Without the BF16 input there is no wgrad reference; without the request, no product is measured, and the
  // layer's outputs do not depend on either.
  std::vector<TensorNumerics> without_input, plain;
  const MicroStep a = run(true, false, &without_input), b = run(false, true, &plain);
  EXPECT_NE(find(without_input, "t.dgrad"), nullptr);
  EXPECT_EQ(find(without_input, "t.wgrad"), nullptr);
  for (const TensorNumerics& t : plain) EXPECT_FALSE(t.product) << t.name;
  EXPECT_EQ(plain.size(), 3u);
  for (const MicroStep* o : {&a, &b}) {
    EXPECT_EQ(0, std::memcmp(o->out.data(), m.out.data(), m.out.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(o->dx.data(), m.dx.data(), m.dx.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(o->dw.data(), m.dw.data(), m.dw.size() * sizeof(float)));
  }
}

// GELU_AUX forward (epilogue or separate kernel) and the DGELU backward.
TEST_P(LinearFp8, GeluForwardAndBackward) {
  std::mt19937_64 rng(seed() ^ 11 ^ std::hash<std::string>{}(GetParam()));
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  const PrecisionRecipe r = recipe(GetParam());
  PrecisionState state(r);
  Linear up(state, "up", LinearKind::MlpUp, 0, N, K, plan_linear(r, 0, 2, LinearKind::MlpUp), M);
  Linear down(state, "down", LinearKind::MlpDown, 0, K, N, plan_linear(r, 0, 2, LinearKind::MlpDown), M);
  std::unique_ptr<Dev<bf16>> x(upload(p.x)), w(upload(p.w)), bias(upload(p.bias)),
      w_down(upload(random_values(p.w.size(), rng, 0.02f))), dy(upload(random_values((size_t)M * K, rng, 1e-4f)));
  Dev<bf16> h((size_t)M * N), pre((size_t)M * N), y((size_t)M * K), dpre((size_t)M * N);
  Dev<float> dw_down((size_t)K * N);
  CUDA_CHECK(cudaMemset(dw_down.ptr, 0, dw_down.n * sizeof(float)));
  h.poison();
  pre.poison();
  state.begin_forward(0);
  Linear::ForwardOptions opt;
  opt.pre_gelu = pre.ptr;
  up.forward(h.ptr, x->ptr, w->ptr, bias->ptr, M, true, 0, opt);
  down.forward(y.ptr, h.ptr, w_down->ptr, nullptr, M, true, 0);
  const std::vector<float> pre_h = download(pre.ptr, pre.n), h_h = download(h.ptr, h.n);
  // The GELU_AUX epilogue applies GELU to the FP32 accumulator, pre_gelu is that value rounded to bf16: allow one
  // bf16 rounding of the output plus gelu' times one bf16 rounding of the input. The epilogue forms 1 + tanh(u) in
  // FP32, which cannot resolve values below a few ulps of 1: for pre_gelu under about -4.8 it returns 0 where gelu is
  // still -5e-7 (seen on an H100). Allow 16 ulps of 1 times |pre_gelu| / 2, i.e. |pre_gelu| * 2^-21, on top.
  std::vector<float> gelu_ref(pre_h.size()), gelu_slope(pre_h.size(), 1.0f);
  gelu_forward_cpu(gelu_ref.data(), pre_h.data(), pre_h.size());
  gelu_backward_inplace_cpu(gelu_slope.data(), pre_h.data(), pre_h.size());
  size_t bad = 0;
  for (size_t i = 0; i < h_h.size(); i++) {
    const double tol = std::ldexp(1.0, -8) * std::fabs(gelu_ref[i]) +
                       std::ldexp(1.0, -8) * std::fabs(gelu_slope[i] * pre_h[i]) +
                       std::ldexp(std::fabs(pre_h[i]), -21) + 1e-7;
    if (!(std::fabs(h_h[i] - gelu_ref[i]) <= tol)) {
      if (bad < 5) ADD_FAILURE() << "gelu[" << i << "] " << h_h[i] << " vs gelu(" << pre_h[i] << ") = " << gelu_ref[i];
      bad++;
    }
  }
  EXPECT_EQ(bad, 0u) << "GELU output is not gelu(pre_gelu)";
  // DGELU: dpre = (dy · W_down) * gelu'(pre), against the same without the GELU option followed by the host gelu'.
  state.begin_backward(0);
  Linear::BackwardOptions bopt;
  bopt.x_pre_gelu = pre.ptr;
  down.backward(dpre.ptr, dw_down.ptr, dy->ptr, nullptr, w_down->ptr, M, 0, bopt);
  const std::vector<float> dpre_h = download(dpre.ptr, dpre.n);
  Dev<bf16> dh((size_t)M * N);
  state.begin_backward(0);
  down.backward(dh.ptr, dw_down.ptr, dy->ptr, nullptr, w_down->ptr, M, 0);
  std::vector<float> expect = download(dh.ptr, dh.n);
  gelu_backward_inplace_cpu(expect.data(), pre_h.data(), expect.size());
  bad = 0;
  for (size_t i = 0; i < expect.size(); i++)
    if (!(std::fabs(dpre_h[i] - expect[i]) <= std::ldexp(1.0, -7) * std::fabs(expect[i]) + 1e-9)) bad++;
  EXPECT_EQ(bad, 0u) << "DGELU backward differs from dgrad followed by gelu'";
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearFp8, ::testing::Values("fp8_tensorwise", "fp8_delayed", "fp8_blockwise"));

// Delayed scaling: the first step scales from the current amax; end_step records the step's amaxes and the next
// scales come from the max over the history.
TEST(LinearDelayed, ScalesFollowTheHistory) {
  std::mt19937_64 rng(seed() ^ 99);
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  PrecisionRecipe r = recipe("fp8_delayed");
  r.amax_history_len = 4;
  PrecisionState state(r);
  Linear lin(state, "d", LinearKind::Qkv, 0, N, K, plan_linear(r, 0, 1, LinearKind::Qkv), M);
  std::vector<float> x2 = p.x;
  for (float& v : x2) v *= 4.0f;  // a larger step-2 input (exact in bf16)
  std::unique_ptr<Dev<bf16>> x(upload(p.x)), xb(upload(x2)), w(upload(p.w)), dy(upload(p.dy));
  Dev<bf16> out((size_t)M * N), dx((size_t)M * K);
  Dev<float> dw((size_t)N * K);
  auto step = [&](const bf16* input) {
    state.begin_forward(0);
    lin.forward(out.ptr, input, w->ptr, nullptr, M, true, 0);
    state.begin_backward(0);
    lin.backward(dx.ptr, dw.ptr, dy->ptr, nullptr, w->ptr, M, 0);
    state.end_step(0);
    std::vector<float> scales, history;
    state.download(&scales, &history);
    return scales;  // [scale (3) | scale_inv (3)]: slots x, w, dy
  };
  const float amax1 = amax_bf16_cpu(p.x.data(), p.x.size()), amax2 = 4.0f * amax1;
  std::vector<float> s1 = step(x->ptr);
  EXPECT_EQ(s1[0], fp8_scale_from_amax_cpu(amax1, 1.0f, r.x, 0)) << "x scale after step 1";
  EXPECT_EQ(s1[2], fp8_scale_from_amax_cpu(amax_bf16_cpu(p.dy.data(), p.dy.size()), 1.0f, r.dy, 0))
      << "dy scale after step 1";
  std::vector<float> s2 = step(xb->ptr);
  EXPECT_EQ(s2[0], fp8_scale_from_amax_cpu(amax2, 1.0f, r.x, 0)) << "x scale after step 2";
  std::vector<float> s3 = step(x->ptr);  // smaller again: the history's max (step 2) still rules
  EXPECT_EQ(s3[0], s2[0]) << "x scale after step 3 must come from the history max";
  EXPECT_EQ(s1[3], 1.0f / s1[0]) << "scale_inv";
  // Checkpoint round trip of the scaling state.
  std::vector<float> scales, history;
  state.download(&scales, &history);
  PrecisionState restored(r);
  Linear lin2(restored, "d", LinearKind::Qkv, 0, N, K, plan_linear(r, 0, 1, LinearKind::Qkv), M);
  restored.upload(state.describe(), scales, history);
  std::vector<float> scales2, history2;
  restored.download(&scales2, &history2);
  EXPECT_EQ(scales, scales2);
  EXPECT_EQ(history, history2);
  EXPECT_EQ(restored.describe(), state.describe());
}

// ---------------------------------------------------------------------------------------------------------------
// FP4 plans

// One FP4 copy made on the host by fp4_quantize_cpu: packed codes, one-byte scale codes, the NVFP4 decode scale.
struct HostFp4 {
  std::vector<uint8_t> codes, scales;
  float tensor_scale_inv = 1.0f;
  Encoding e;
  int rows = 0, K = 0;
  Fp4CpuOperand op() const {
    Fp4CpuOperand o;
    o.codes = codes.data();
    o.scales = scales.data();
    o.tensor_scale_inv = tensor_scale_inv;
    o.encoding = e;
    o.rows = rows;
    o.K = K;
    return o;
  }
};
// The row copy (transposed = false) or the transposed copy of x (rows, cols) quantised as the linear does it.
HostFp4 host_fp4(const std::vector<float>& x, int rows, int cols, const Encoding& e, const QuantizeArgs& args,
                 bool transposed) {
  HostFp4 h;
  h.e = e;
  h.rows = transposed ? cols : rows;
  h.K = transposed ? rows : cols;
  h.codes.resize(code_bytes(e, h.rows, h.K));
  h.scales.resize(scale_inv_bytes(e, h.rows, h.K));
  Fp4CpuOut out;
  (transposed ? out.data_t : out.data) = h.codes.data();
  (transposed ? out.scale_inv_t : out.scale_inv) = h.scales.data();
  fp4_quantize_cpu(&out, x.data(), rows, cols, e, args, nullptr);
  h.tensor_scale_inv = transposed ? out.tensor_scale_inv_t : out.tensor_scale_inv;
  return h;
}
// FP64 D = A·Bᵀ over the exact FP4 values (+ bias), and sum |a b|.
void fp4_reference(std::vector<double>* d, std::vector<double>* absref, const HostFp4& a, const HostFp4& b,
                   const float* bias = nullptr) {
  d->assign((size_t)a.rows * b.rows, 0.0);
  absref->assign(d->size(), 0.0);
  fp4_matmul_cpu(d->data(), absref->data(), a.op(), b.op(), 0, a.rows);
  if (bias)
    for (int m = 0; m < a.rows; m++)
      for (int n = 0; n < b.rows; n++) (*d)[(size_t)m * b.rows + n] += bias[n];
}

PrecisionRecipe fp4_recipe(const std::string& variant) {
  if (variant.rfind("quartet", 0) == 0) {  // the mxfp4 preset and its ablations
    PrecisionRecipe q = recipe("mxfp4");
    if (variant == "quartet_sr") q.dy_stochastic_rounding = true;
    if (variant == "quartet_no_mask") q.trust_mask = false;
    if (variant == "quartet_no_rotation") q.forward_hadamard = q.backward_hadamard = 0;
    if (variant == "quartet_absmax") q.forward_gaussian_scales = false;
    if (variant == "quartet_signed") q.forward_random_signs = true;
    validate_precision_recipe(q, 4);
    return q;
  }
  PrecisionRecipe r = recipe("nvfp4");
  r.bf16_layers.clear();
  if (variant == "nvfp4_rtn") r.dy_stochastic_rounding = false;
  if (variant == "nvfp4_no_rht") r.wgrad_hadamard = 0;
  if (variant == "nvfp4_1x16_w") r.w = r.x;
  if (variant == "mxfp4") {
    r.x = r.w = r.dy = role_encoding(ElementFormat::E2M1, kBlock1x32, false);
    r.wgrad_hadamard = 32;
  }
  validate_precision_recipe(r, 4);
  return r;
}

class LinearFp4 : public ::testing::TestWithParam<const char*> {};

// The three products of one training micro-step against the host-quantised FP4 operands.
TEST_P(LinearFp4, ProductsMatchHostQuantisedReference) {
  std::mt19937_64 rng(seed() ^ 17 ^ std::hash<std::string>{}(GetParam()));
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  const PrecisionRecipe r = fp4_recipe(GetParam());
  const LinearPlan plan = plan_linear(r, 1, 4, LinearKind::MlpUp);
  ASSERT_TRUE(plan.quantized);
  if (plan.requantize_backward) GTEST_SKIP() << "Quartet plans: LinearQuartet checks their own algorithm";
  PrecisionState state(r);
  state.set_random_stream(seed(), 0, 1);
  state.begin_step(41);
  Linear lin(state, "fp4.linear", LinearKind::MlpUp, 1, N, K, plan, M);
  EXPECT_TRUE(lin.saves_quantized_input());
  EXPECT_EQ(lin.x_amax_slot(), nullptr);  // no per-tensor slot: FP4 tensors are scaled from their blocks

  const MicroStep step = train_micro_step(state, lin, p);
  const std::vector<float>&out_h = step.out, &dx_h = step.dx, &dw_h = step.dw;
  const StochasticKey& dy_key = step.dy_key;

  // The host copies, with the arguments the plan implies.
  QuantizeArgs rtn, rotate_t, dy_args;
  if (plan.wgrad_hadamard != 0) {
    rotate_t.hadamard = {plan.wgrad_hadamard, state.hadamard_signs(plan.wgrad_hadamard), false, true};
  }
  dy_args.hadamard = rotate_t.hadamard;
  if (plan.dy_stochastic_rounding) {
    dy_args.rounding = Rounding::Stochastic;
    dy_args.sr_key = dy_key;
  }
  QuantizeArgs dy_rows = dy_args;  // the row copy never rotates
  dy_rows.hadamard = HadamardOption();
  const HostFp4 xq = host_fp4(p.x, M, K, plan.x, rtn, false);
  const HostFp4 xtq = host_fp4(p.x, M, K, plan.x, rotate_t, true);
  const HostFp4 wq = host_fp4(p.w, N, K, plan.w, rtn, false);
  const HostFp4 wtq = host_fp4(p.w, N, K, plan.w, rtn, true);
  const HostFp4 dyq = host_fp4(p.dy, M, N, plan.dy, dy_rows, false);
  const HostFp4 dytq = host_fp4(p.dy, M, N, plan.dy, dy_args, true);

  // Accumulation bounds of the FP4 paths (derived in test_fp4_gemm): NVFP4 runs exact BF16 operands on BF16 tensor
  // cores, (4 K + 8) 2^-24 of sum |a b|; MXFP4 exact E4M3 operands with split accumulation, 2^-11 + 4 K 2^-24 (here
  // 2^-10, as this file allows the FP8 products); + 2^-9 in fprop where the bias is added after the product's
  // rounding.
  const bool mx = plan.x.scale == ScaleFormat::E8M0;
  auto accumulation = [&](int k) {
    const double u = std::ldexp(1.0, -24);
    return mx ? std::ldexp(1.0, -10) + 4.0 * k * u : (4.0 * k + 8.0) * u;
  };
  std::vector<double> ref, absref;
  fp4_reference(&ref, &absref, xq, wq, p.bias.data());
  expect_close("fp4 fprop", out_h, ref, absref, std::ldexp(1.0, -8), accumulation(K) + std::ldexp(1.0, -9));
  fp4_reference(&ref, &absref, dyq, wtq);
  expect_close("fp4 dgrad", dx_h, ref, absref, std::ldexp(1.0, -8), accumulation(N));
  fp4_reference(&ref, &absref, dytq, xtq);
  for (size_t i = 0; i < ref.size(); i++) {
    ref[i] += p.dw0[i];
    absref[i] += std::fabs(p.dw0[i]);
  }
  expect_close("fp4 wgrad", dw_h, ref, absref, 1e-6, accumulation(M));

  // What FP4 costs against the unquantised operands (loose, printed): E2M1 keeps one mantissa bit, so an element
  // errs by up to 1/4 of its block's scale step; a product of two such operands stays within 40% (relative Frobenius
  // norm) on these Gaussian operands with outliers, the Hadamard-rotated wgrad included (the rotation is orthogonal).
  std::vector<double> out_exact = product(p.x, p.w, M, N, K);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) out_exact[(size_t)m * N + n] += p.bias[n];
  const std::vector<float> wt = transpose(p.w, N, K), dyt = transpose(p.dy, M, N), xt = transpose(p.x, M, K);
  std::vector<double> dw_exact = product(dyt, xt, N, K, M);
  for (size_t i = 0; i < dw_exact.size(); i++) dw_exact[i] += p.dw0[i];
  const double e_fprop = rel_error(out_h, out_exact), e_dgrad = rel_error(dx_h, product(p.dy, wt, M, K, N)),
               e_wgrad = rel_error(dw_h, dw_exact);
  std::printf("  %s: relative error vs unquantised fprop %.3f dgrad %.3f wgrad %.3f\n", GetParam(), e_fprop, e_dgrad,
              e_wgrad);
  EXPECT_LT(e_fprop, 0.4);
  EXPECT_LT(e_dgrad, 0.4);
  EXPECT_LT(e_wgrad, 0.4);

  // Telemetry: x, w, dy of FP4 tensors; the MXFP4 count of inexact remapped blocks on the x entry (0 on these data:
  // no 128-column run spans more binades than E4M3 holds).
  const std::vector<TensorNumerics> numerics = state.collect_numerics(0);
  expect_role_telemetry(numerics, "fp4.linear", 8.0);
  for (const TensorNumerics& t : numerics)
    EXPECT_EQ(t.inexact_blocks, mx && t.name == "fp4.linear.x" ? 0 : -1) << t.name;
}

// Stochastic rounding is a function of (seed, step, micro-step, rank, linear): the same step replayed (a resumed run)
// gives the same bits; the next micro-step and another step draw other bits; RTN plans never change.
TEST_P(LinearFp4, RandomStreamsRepeatPerStepAndMicroStep) {
  std::mt19937_64 rng(seed() ^ 19 ^ std::hash<std::string>{}(GetParam()));
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  const PrecisionRecipe r = fp4_recipe(GetParam());
  const LinearPlan plan = plan_linear(r, 0, 4, LinearKind::Qkv);
  std::unique_ptr<Dev<bf16>> x(upload(p.x)), w(upload(p.w)), dy(upload(p.dy));
  struct Grads {
    std::vector<float> dx, dw;
  };
  // Micro-steps `micros` of step `step` from a fresh state (as after a resume); the grads of the last one.
  auto run = [&](long long step, int micros, int rank) {
    PrecisionState state(r);
    state.set_random_stream(1234, rank, 2);
    Linear lin(state, "q", LinearKind::Qkv, 0, N, K, plan, M);
    Dev<bf16> out((size_t)M * N), dx((size_t)M * K);
    Dev<float> dw((size_t)N * K);
    state.begin_step(step);
    for (int i = 0; i < micros; i++) {
      CUDA_CHECK(cudaMemset(dw.ptr, 0, dw.n * sizeof(float)));
      state.begin_forward(0);
      lin.forward(out.ptr, x->ptr, w->ptr, nullptr, M, true, 0);
      state.begin_backward(0);
      lin.backward(dx.ptr, dw.ptr, dy->ptr, nullptr, w->ptr, M, 0);
    }
    return Grads{download(dx.ptr, dx.n), download(dw.ptr, dw.n)};
  };
  auto same = [](const Grads& a, const Grads& b) {
    return a.dx.size() == b.dx.size() && std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * sizeof(float)) == 0 &&
           std::memcmp(a.dw.data(), b.dw.data(), a.dw.size() * sizeof(float)) == 0;
  };
  const Grads a = run(7, 1, 0);
  EXPECT_TRUE(same(a, run(7, 1, 0))) << "the same step and micro-step must repeat bit for bit";
  const bool sr = plan.dy_stochastic_rounding;
  const bool random = sr || plan.backward_hadamard != 0;  // Quartet re-draws its rotation signs every micro-step
  EXPECT_EQ(!same(a, run(8, 1, 0)), random) << "another step";
  EXPECT_EQ(!same(a, run(7, 2, 0)), random) << "another micro-step";
  EXPECT_EQ(!same(a, run(7, 1, 1)), random) << "another rank";
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearFp4,
                         ::testing::Values("nvfp4", "nvfp4_rtn", "nvfp4_no_rht", "nvfp4_1x16_w", "mxfp4", "quartet",
                                           "quartet_sr", "quartet_no_rotation"));

// ---------------------------------------------------------------------------------------------------------------
// Quartet plans (the mxfp4 preset and its ablations) against a host reference of exactly its algorithm: the forward
// codes (fixed Hadamard-32 along K, Gaussian or amax scales) and trust masks; the backward re-quantisations of dy and
// of the decoded Wq and Xq (the micro-step's random Hadamard-32 signs, range-matched scales, RTN or SR with the
// linear's keys); the products over the exact FP4 values in FP64, x 16/9, masked, and rotated back along K by H32.
// A host MXFP4 copy: codes and scales of data (rows, cols) or of data_t (cols, rows), and data's trust mask.
struct HostMx {
  HostFp4 q;
  std::vector<uint32_t> mask;
};
HostMx host_mx(const std::vector<float>& x, int rows, int cols, const QuantizeArgs& args, bool transposed) {
  HostMx h;
  const Encoding e = kMxfp4Encoding;
  h.q.e = e;
  h.q.rows = transposed ? cols : rows;
  h.q.K = transposed ? rows : cols;
  h.q.codes.resize(code_bytes(e, h.q.rows, h.q.K));
  h.q.scales.resize(scale_inv_bytes(e, h.q.rows, h.q.K));
  h.mask.assign((size_t)rows * (cols / 32), 0u);
  Fp4CpuOut out;
  (transposed ? out.data_t : out.data) = h.q.codes.data();
  (transposed ? out.scale_inv_t : out.scale_inv) = h.q.scales.data();
  if (!transposed) out.trust_mask = h.mask.data();
  fp4_quantize_cpu(&out, x.data(), rows, cols, e, args, nullptr);
  return h;
}
std::vector<float> host_decode(const HostFp4& h) {
  std::vector<float> v((size_t)h.rows * h.K);
  fp4_dequantize_cpu(v.data(), h.codes.data(), h.scales.data(), 1.0f, h.rows, h.K, h.e);
  return v;
}
// The epilogue on g (rows, cols) FP64 with its sum |a b| absg: ref = H32 along the rows of (16/9 g ⊙ mask) (no
// rotation when hadamard is 0), and the error scale of each output: 16/9 of the masked absg of its 32-block / sqrt(32)
// (the FP32 product's and butterflies' errors mix within a block), or of the element itself.
void quartet_epilogue_ref(std::vector<double>* ref, std::vector<double>* absref, const std::vector<double>& g,
                          const std::vector<double>& absg, const std::vector<uint32_t>* mask, int rows, int cols,
                          int hadamard, uint32_t signs) {
  const double factor = 16.0 / 9.0;
  ref->assign(g.size(), 0.0);
  absref->assign(g.size(), 0.0);
  for (int r = 0; r < rows; r++)
    for (int c0 = 0; c0 < cols; c0 += 32) {
      double v[32], a[32], block_abs = 0;
      for (int i = 0; i < 32; i++) {
        const size_t idx = (size_t)r * cols + c0 + i;
        const bool kept = !mask || (((*mask)[(size_t)r * (cols / 32) + c0 / 32] >> i) & 1u);
        v[i] = kept ? factor * g[idx] : 0.0;
        a[i] = kept ? factor * absg[idx] : 0.0;
        block_abs += a[i];
      }
      for (int i = 0; i < 32; i++) {
        const size_t idx = (size_t)r * cols + c0 + i;
        if (hadamard == 0) {
          (*ref)[idx] = v[i];
          (*absref)[idx] = a[i];
          continue;
        }
        double acc = 0;
        for (int j = 0; j < 32; j++) acc += (__builtin_popcount(i & j) % 2 ? -v[j] : v[j]);
        (*ref)[idx] = ((signs >> i) & 1u ? -acc : acc) / std::sqrt(32.0);  // S · H32, the forward's H32 · S undone
        (*absref)[idx] = block_abs / std::sqrt(32.0);
      }
    }
}
size_t cleared_bits(const std::vector<uint32_t>& mask) {
  size_t n = 0;
  for (uint32_t w : mask) n += 32 - __builtin_popcount(w);
  return n;
}

class LinearQuartet : public ::testing::TestWithParam<const char*> {};

TEST_P(LinearQuartet, ProductsFollowTheAlgorithm) {
  std::mt19937_64 rng(seed() ^ 23 ^ std::hash<std::string>{}(GetParam()));
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  const PrecisionRecipe r = fp4_recipe(GetParam());
  const LinearPlan plan = plan_linear(r, 1, 4, LinearKind::MlpUp);
  ASSERT_TRUE(plan.quantized && plan.requantize_backward);
  PrecisionState state(r);
  state.set_random_stream(seed(), 0, 1);
  state.begin_step(41);
  Linear lin(state, "quartet.linear", LinearKind::MlpUp, 1, N, K, plan, M);
  EXPECT_TRUE(lin.saves_quantized_input());
  const MicroStep step = train_micro_step(state, lin, p);

  // Forward: x and w along K, the fixed rotation, the plan's scale rule, round to nearest, trust masks.
  QuantizeArgs fwd;
  fwd.mxfp4_scale = plan.forward_gaussian_scales ? Mxfp4Scale::Gaussian : Mxfp4Scale::Amax;
  const uint32_t forward_signs = plan.forward_random_signs ? state.hadamard_signs(plan.forward_hadamard) : 0u;
  if (plan.forward_random_signs) EXPECT_NE(forward_signs, 0u);
  if (plan.forward_hadamard) fwd.hadamard = {plan.forward_hadamard, forward_signs, true, false};
  const HostMx xq = host_mx(p.x, M, K, fwd, false), wq = host_mx(p.w, N, K, fwd, false);
  if (plan.forward_gaussian_scales) {  // the masks below must be able to matter
    EXPECT_GT(cleared_bits(xq.mask), 0u) << "Gaussian scales clip some x";
    EXPECT_GT(cleared_bits(wq.mask), 0u) << "Gaussian scales clip some w";
  }
  // Backward: the micro-step's signs and keys (the state is still in that micro-step).
  const int h = plan.backward_hadamard;
  const uint32_t signs = h ? state.rotation_signs(0, LinearRole::Dy, h) : 0u;
  auto bwd = [&](LinearRole role, bool data, bool data_t) {
    QuantizeArgs a;
    a.mxfp4_scale = Mxfp4Scale::RangeMatched;
    if (plan.dy_stochastic_rounding) a.rounding = Rounding::Stochastic, a.sr_key = state.stochastic_key(0, role);
    if (h) a.hadamard = {h, signs, data, data_t};
    return a;
  };
  const HostMx dyq = host_mx(p.dy, M, N, bwd(LinearRole::Dy, true, true), false);
  const HostMx dytq = host_mx(p.dy, M, N, bwd(LinearRole::Dy, true, true), true);
  const HostMx wtq = host_mx(host_decode(wq.q), N, K, bwd(LinearRole::W, false, true), true);
  const HostMx xtq = host_mx(host_decode(xq.q), M, K, bwd(LinearRole::X, false, true), true);

  // MXFP4 products: exact E4M3 operands, split accumulation (test_fp4_gemm's bound, as LinearFp4 uses it); the
  // epilogue adds its FP32 roundings (scale, butterflies) within 2^-19 of the block's magnitude.
  auto accumulation = [](int k) {
    return std::ldexp(1.0, -10) + 4.0 * k * std::ldexp(1.0, -24) + std::ldexp(1.0, -19);
  };
  std::vector<double> ref, absref, g, absg;
  fp4_reference(&ref, &absref, xq.q, wq.q, p.bias.data());
  expect_close("quartet fprop", step.out, ref, absref, std::ldexp(1.0, -8), accumulation(K) + std::ldexp(1.0, -9));
  fp4_reference(&g, &absg, dyq.q, wtq.q);
  quartet_epilogue_ref(&ref, &absref, g, absg, plan.trust_mask ? &xq.mask : nullptr, M, K, plan.forward_hadamard,
                       forward_signs);
  expect_close("quartet dgrad", step.dx, ref, absref, std::ldexp(1.0, -8), accumulation(N));
  fp4_reference(&g, &absg, dytq.q, xtq.q);
  quartet_epilogue_ref(&ref, &absref, g, absg, plan.trust_mask ? &wq.mask : nullptr, N, K, plan.forward_hadamard,
                       forward_signs);
  for (size_t i = 0; i < ref.size(); i++) {
    ref[i] += p.dw0[i];
    absref[i] += std::fabs(p.dw0[i]);
  }
  expect_close("quartet wgrad", step.dw, ref, absref, 1e-6, accumulation(M));

  // Against the unquantised products (loose, printed): the masks drop the clipped elements' gradients, so the
  // gradients are biased by design; they still point the same way.
  const std::vector<float> wt = transpose(p.w, N, K), dyt = transpose(p.dy, M, N), xt = transpose(p.x, M, K);
  std::vector<double> dw_exact = product(dyt, xt, N, K, M);
  for (size_t i = 0; i < dw_exact.size(); i++) dw_exact[i] += p.dw0[i];
  const double e_dgrad = rel_error(step.dx, product(p.dy, wt, M, K, N)), e_wgrad = rel_error(step.dw, dw_exact);
  std::printf("  %s: relative error vs unquantised dgrad %.3f wgrad %.3f\n", GetParam(), e_dgrad, e_wgrad);
  EXPECT_LT(e_dgrad, 0.6);
  EXPECT_LT(e_wgrad, 0.6);

  // Telemetry: x, w (their rotated values, as quantised) and dy (its data copy, rotated as quantised), and the count
  // of inexact E4M3 remap blocks on the x entry (0 on these data).
  const std::vector<TensorNumerics> numerics = state.collect_numerics(0);
  expect_role_telemetry(numerics, "quartet.linear", 8.0);
  for (const TensorNumerics& t : numerics)
    EXPECT_EQ(t.inexact_blocks, t.name == "quartet.linear.x" ? 0 : -1) << t.name;
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearQuartet,
                         ::testing::Values("quartet", "quartet_sr", "quartet_no_mask", "quartet_no_rotation",
                                           "quartet_absmax", "quartet_signed"));

// precision.recompute_mlp_act: the down projection's plan keeps no quantised input (the other linears' do), and its
// backward, handed the BF16 input again (the model recomputes it), gives the saving plan's three products bit for
// bit: the transposed copy quantised in backward with the forward's per-tensor scale, or from its own blocks.
class LinearRecomputedInput : public ::testing::TestWithParam<const char*> {};

TEST_P(LinearRecomputedInput, BackwardFromTheBf16InputEqualsTheSavedCopy) {
  std::mt19937_64 rng(seed() ^ 23 ^ std::hash<std::string>{}(GetParam()));
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  const PrecisionRecipe saving = recipe(GetParam());
  PrecisionRecipe flow = saving;
  flow.nonlinear_fp8 = true;
  flow.recompute_mlp_act = true;
  validate_precision_recipe(flow, 4);
  EXPECT_TRUE(plan_linear(flow, 1, 4, LinearKind::MlpUp).save_quantized_input);
  EXPECT_TRUE(plan_linear(flow, 1, 4, LinearKind::Qkv).save_quantized_input);
  auto run = [&](const PrecisionRecipe& r) {
    const LinearPlan plan = plan_linear(r, 1, 4, LinearKind::MlpDown);
    EXPECT_TRUE(plan.quantized);
    PrecisionState state(r);
    state.set_random_stream(seed(), 0, 1);
    state.begin_step(41);
    Linear lin(state, "test.down", LinearKind::MlpDown, 1, N, K, plan, M);
    std::unique_ptr<Dev<bf16>> x(upload(p.x)), w(upload(p.w)), dy(upload(p.dy));
    Dev<bf16> out((size_t)M * N), dx((size_t)M * K);
    Dev<float> dw((size_t)N * K);
    CUDA_CHECK(cudaMemcpy(dw.ptr, p.dw0.data(), p.dw0.size() * sizeof(float), cudaMemcpyHostToDevice));
    out.poison();
    dx.poison();
    state.begin_forward(0);
    lin.forward(out.ptr, x->ptr, w->ptr, nullptr, M, /*training=*/true, 0);
    state.begin_backward(0);
    // The recomputing plan gets the input again, from a buffer of its own (the forward's may be overwritten).
    std::unique_ptr<Dev<bf16>> x_again(upload(p.x));
    lin.backward(dx.ptr, dw.ptr, dy->ptr, lin.saves_quantized_input() ? nullptr : x_again->ptr, w->ptr, M, 0);
    return std::make_tuple(lin.saves_quantized_input(), download(out.ptr, out.n), download(dx.ptr, dx.n),
                           download(dw.ptr, dw.n));
  };
  const auto [saved_a, out_a, dx_a, dw_a] = run(saving);
  const auto [saved_b, out_b, dx_b, dw_b] = run(flow);
  EXPECT_TRUE(saved_a);
  EXPECT_FALSE(saved_b);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(out_a, out_b)) << "fprop";
  EXPECT_TRUE(same(dx_a, dx_b)) << "dgrad";
  EXPECT_TRUE(same(dw_a, dw_b)) << "wgrad";
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearRecomputedInput,
                         ::testing::Values("fp8_tensorwise", "fp8_delayed", "fp8_blockwise", "nvfp4"));

// The BF16 plan is the cuBLASLt BF16 path, bit for bit.
TEST(LinearBf16, IsTheBf16Gemm) {
  std::mt19937_64 rng(seed() ^ 5);
  const Problem p(rng);
  const int M = p.M, N = p.N, K = p.K;
  PrecisionState state{PrecisionRecipe()};
  Linear lin(state, "b", LinearKind::Qkv, 0, N, K, LinearPlan(), M);
  std::unique_ptr<Dev<bf16>> x(upload(p.x)), w(upload(p.w)), bias(upload(p.bias));
  Dev<bf16> a((size_t)M * N), b((size_t)M * N);
  lin.forward(a.ptr, x->ptr, w->ptr, bias->ptr, M, true, 0);
  matmul_forward(b.ptr, x->ptr, w->ptr, bias->ptr, M, N, K, 0);
  const std::vector<float> ah = download(a.ptr, a.n), bh = download(b.ptr, b.n);
  EXPECT_EQ(0, std::memcmp(ah.data(), bh.data(), ah.size() * sizeof(float)));
  EXPECT_EQ(lin.x_amax_slot(), nullptr);
  EXPECT_FALSE(lin.saves_quantized_input());
}

}  // namespace
