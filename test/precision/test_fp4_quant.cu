// test/precision/test_fp4_quant: the FP4 kernels of llmc/precision/fp4_quant.h through the dispatch point
// llmc/precision/quantize.h, against the host references (test/reference/precision_ref.h) byte for byte: codes,
// scale codes, tensor scales and amax, for NVFP4 (1x16, 16x16 tiles) and MXFP4 (1x32), round to nearest and
// stochastic rounding, with and without fused Hadamard transforms (16 and 32, random signs), row-wise and transposed
// copies, NVFP4 1x16 copies also as BF16 values (beside or instead of the codes: the host expansion of the reference
// codes); the re-quantisation of MXFP4 codes (fp4_requantize) against dequantise-then-quantise; and the device E2M1
// conversion (fp4_codec.cuh's) and the device Hadamard transform against the host. Each run draws a fresh seed
// (printed; replay with LLM8_TEST_SEED). Inputs: model-shaped (768 x 3072) and
// odd shapes (rows and cols not multiples of 16, odd cols: a half-filled last byte), magnitudes 2^-20 .. 2^12 per row,
// exact zeros, an all-zero block, huge (3e38) and tiny (1e-38) values, a whole tensor of tiny values (amax ~2^-118:
// the clamped NVFP4 scales); QuEST's Gaussian and Quartet's range-matched MXFP4 scales with their trust masks
// (range matching must clip nothing); the telemetry of every family against its host reference, the clipped count
// exactly (and for Gaussian scales equal to the trust mask's cleared bits). Non-finite inputs: a NaN or inf in a block
// gives that block the NaN scale code (E4M3 0x7F / E8M0 0xFF) and zero codes, on both sides. Every output buffer is
// poisoned (0xEE) so an unwritten byte shows up.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/precision/fp4_codec.cuh"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/hadamard.cuh"
#include "llmc/precision/quantize.h"
#include "test/reference/fp4_gemm_ref.h"
#include "test/reference/precision_ref.h"
#include "test/support/gpu_test_util.cuh"

namespace {

using llmc::bf16;
using llmc::Encoding;
using llmc::QTensor;
using llmc::QuantizeArgs;
using llmc::Rounding;

constexpr uint8_t kPoison = 0xEE;

template <class T>
struct Buf {
  T* p = nullptr;
  size_t n = 0;
  explicit Buf(size_t count, uint8_t fill = kPoison) : n(count) {
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)));
    CUDA_CHECK(cudaMemset(p, fill, std::max<size_t>(1, n) * sizeof(T)));
  }
  ~Buf() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n) CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  Buf(const Buf&) = delete;
};

std::vector<float> model_like(int rows, int cols, std::mt19937_64& rng, bool specials) {
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-20, 12);
  for (int r = 0; r < rows; r++) {
    const float row_scale = std::ldexp(1.0f, e(rng));
    for (int c = 0; c < cols; c++) x[static_cast<size_t>(r) * cols + c] = gpu_test::round_bf16(u(rng) * row_scale);
  }
  for (size_t i = 0; i < x.size(); i += 37) x[i] = 0.0f;
  if (rows > 0)
    for (int c = 0; c < std::min(cols, 32); c++) x[c] = 0.0f;  // an all-zero block in row 0
  if (specials && rows > 2 && cols > 40) {
    x[static_cast<size_t>(1) * cols + 3] = gpu_test::round_bf16(3e38f);
    x[static_cast<size_t>(2) * cols + 5] = gpu_test::round_bf16(1e-38f);
  }
  return x;
}

struct Case {
  Encoding e;
  Rounding rounding;
  int hadamard;  // 0, 16, 32: rotates data_t (and data when rotate_data)
  bool rotate_data;
  bool gaussian = false;  // MXFP4: QuEST's Gaussian scales, and the data copy's trust mask compared too
  bool range_matched = false;  // MXFP4: Quartet's backward scales; the trust mask compared too, and on finite data
                               // it must mark every element (range matching clips nothing)
};

std::string name(const Case& c, int rows, int cols) {
  return llmc::strformat("%s%s %s hadamard %d%s, %d x %d", llmc::encoding_name(c.e).c_str(),
                         c.gaussian ? " Gaussian scales" : c.range_matched ? " range-matched scales" : "", c.rounding == Rounding::Stochastic ? "SR" : "RTN",
                         c.hadamard, c.rotate_data ? " (both copies)" : "", rows, cols);
}

template <class T>
void expect_bytes_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (!gpu_test::same_bits_or_both_nan(got[i], want[i]) && bad++ < 8)
      ADD_FAILURE() << what << " [" << i << "]: got " << +got[i] << " want " << +want[i];
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ";
}

void run_case(const Case& c, int rows, int cols, const std::vector<float>& x, uint64_t seed, bool given_amax) {
  SCOPED_TRACE(name(c, rows, cols));
  const Encoding& e = c.e;
  const auto xb = gpu_test::to_bf16(x);
  Buf<bf16> dx(xb.size());
  CUDA_CHECK(cudaMemcpy(dx.p, xb.data(), xb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  Buf<uint8_t> data(llmc::code_bytes(e, rows, cols)), data_t(llmc::code_bytes(e, cols, rows));
  Buf<uint8_t> s(llmc::scale_inv_bytes(e, rows, cols)), s_t(llmc::scale_inv_bytes(e, cols, rows));
  Buf<float> tsi(1), tsi_t(1), amax(1), given(1);
  const bool masked = c.gaussian || c.range_matched;
  Buf<uint32_t> trust(masked ? static_cast<size_t>(rows) * llmc::ceil_div(cols, 32) : 0);
  QTensor q;
  q.rows = rows, q.cols = cols, q.encoding = e;
  q.data = data.p, q.data_t = data_t.p;
  q.scale_inv = reinterpret_cast<float*>(s.p), q.scale_inv_t = reinterpret_cast<float*>(s_t.p);
  q.tensor_scale_inv = tsi.p, q.tensor_scale_inv_t = tsi_t.p;
  q.amax = amax.p;
  QuantizeArgs args;
  args.rounding = c.rounding;
  args.sr_key = {seed, 7, 3};
  args.hadamard.size = c.hadamard;
  args.hadamard.signs = llmc::random_signs({seed, 0, 0}, c.hadamard ? c.hadamard : 16);
  args.hadamard.data = c.rotate_data;
  args.hadamard.data_t = c.hadamard != 0;
  if (c.gaussian) args.mxfp4_scale = llmc::Mxfp4Scale::Gaussian, args.trust_mask = trust.p;
  if (c.range_matched) args.mxfp4_scale = llmc::Mxfp4Scale::RangeMatched, args.trust_mask = trust.p;
  float given_value = 0.0f;
  if (given_amax) {  // a producer's amax, larger than max |x|: the scales must follow it, not max |x|
    given_value = 2.0f * llmc::amax_bf16_cpu(x.data(), x.size());
    CUDA_CHECK(cudaMemcpy(given.p, &given_value, sizeof(float), cudaMemcpyHostToDevice));
    args.amax = given.p;
  }
  llmc::quantize(q, dx.p, args, 0);
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<uint8_t> rd(data.n), rs(s.n), rdt(data_t.n), rst(s_t.n);
  llmc::Fp4CpuOut ref;
  ref.data = rd.data(), ref.scale_inv = rs.data(), ref.data_t = rdt.data(), ref.scale_inv_t = rst.data();
  std::vector<uint32_t> rtrust(trust.n);
  if (masked) ref.trust_mask = rtrust.data();
  llmc::fp4_quantize_cpu(&ref, x.data(), rows, cols, e, args, given_amax ? &given_value : nullptr);
  if (c.gaussian) {
    expect_bytes_equal(trust.get(), rtrust, "trust_mask");
    size_t clipped = 0;
    for (uint32_t w : rtrust) clipped += 32 - __builtin_popcount(w);
    if (rows * cols >= 4096) EXPECT_GT(clipped, 0u) << "model-like data has elements beyond 2.92 sigma";
  }
  if (c.range_matched) {
    expect_bytes_equal(trust.get(), rtrust, "trust_mask");
    const bool finite = std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
    const int blocks = static_cast<int>(llmc::ceil_div(cols, 32));
    size_t clipped = 0;
    for (int r = 0; r < rows && finite; r++)
      for (int kb = 0; kb < blocks; kb++) {
        const int n = std::min(32, cols - 32 * kb);
        const uint32_t all = n == 32 ? 0xFFFFFFFFu : (1u << n) - 1u;
        clipped += rtrust[static_cast<size_t>(r) * blocks + kb] != all;
      }
    EXPECT_EQ(clipped, 0u) << "range-matched blocks (amax x 3/4 in [3, 6)) clip nothing";
  }
  expect_bytes_equal(data.get(), rd, "data");
  expect_bytes_equal(s.get(), rs, "scale_inv");
  expect_bytes_equal(data_t.get(), rdt, "data_t");
  expect_bytes_equal(s_t.get(), rst, "scale_inv_t");
  EXPECT_TRUE(gpu_test::same_bits_or_both_nan(amax.get()[0], llmc::amax_bf16_cpu(x.data(), x.size())))
      << amax.get()[0] << " vs " << llmc::amax_bf16_cpu(x.data(), x.size());
  if (e.tensor_scale && rows > 0 && cols > 0) {  // an empty tensor encodes nothing and writes no tensor scale
    EXPECT_EQ(tsi.get()[0], ref.tensor_scale_inv);
    EXPECT_EQ(tsi_t.get()[0], ref.tensor_scale_inv_t);
  }
  // NVFP4 1x16 copies asked for as values: the same pass writes e2m1 * block scale in BF16 (the host expansion of
  // the reference codes), beside the codes or instead of them, and the same scales.
  if (e == llmc::kNvfp4Encoding && !given_amax && rows > 0 && cols > 0 && (cols % 16 == 0 || rows % 16 == 0)) {
    const bool v_rows = cols % 16 == 0, v_cols = rows % 16 == 0;
    const size_t n_values = static_cast<size_t>(rows) * cols;
    Buf<bf16> values(v_rows ? n_values : 0), values_t(v_cols ? n_values : 0);
    Buf<uint8_t> s2(llmc::scale_inv_bytes(e, rows, cols)), s2_t(llmc::scale_inv_bytes(e, cols, rows));
    Buf<float> tsi2(1), tsi2_t(1);
    for (const bool keep_codes : {false, true}) {
      SCOPED_TRACE(keep_codes ? "values and codes" : "values only");
      QTensor qv = q;
      qv.amax = nullptr;
      qv.data = keep_codes ? data.p : nullptr, qv.data_t = keep_codes ? data_t.p : nullptr;
      qv.values = v_rows ? values.p : nullptr, qv.values_t = v_cols ? values_t.p : nullptr;
      if (!keep_codes && !v_rows) qv.data = data.p;  // a copy without values keeps its codes
      if (!keep_codes && !v_cols) qv.data_t = data_t.p;
      qv.scale_inv = reinterpret_cast<float*>(s2.p), qv.scale_inv_t = reinterpret_cast<float*>(s2_t.p);
      qv.tensor_scale_inv = tsi2.p, qv.tensor_scale_inv_t = tsi2_t.p;
      for (const auto& [ptr, bytes] : {std::pair<void*, size_t>{data.p, data.n}, {data_t.p, data_t.n},
                                       {values.p, values.n * sizeof(bf16)}, {values_t.p, values_t.n * sizeof(bf16)},
                                       {s2.p, s2.n}, {s2_t.p, s2_t.n}})
        CUDA_CHECK(cudaMemset(ptr, kPoison, bytes));
      llmc::quantize(qv, dx.p, args, 0);
      CUDA_CHECK(cudaDeviceSynchronize());
      expect_bytes_equal(s2.get(), rs, "scale_inv (values run)");
      expect_bytes_equal(s2_t.get(), rst, "scale_inv_t (values run)");
      EXPECT_EQ(tsi2.get()[0], ref.tensor_scale_inv);
      EXPECT_EQ(tsi2_t.get()[0], ref.tensor_scale_inv_t);
      if (keep_codes) {
        expect_bytes_equal(data.get(), rd, "data (values run)");
        expect_bytes_equal(data_t.get(), rdt, "data_t (values run)");
      }
      for (const bool transposed : {false, true}) {
        if (!(transposed ? v_cols : v_rows)) continue;
        llmc::Fp4CpuOperand op;
        op.codes = transposed ? rdt.data() : rd.data();
        op.scales = transposed ? rst.data() : rs.data();
        op.encoding = e;
        op.rows = transposed ? cols : rows;
        op.K = transposed ? rows : cols;
        std::vector<uint16_t> want_bits(static_cast<size_t>(rows) * cols);
        llmc::nvfp4_to_bf16_cpu(want_bits.data(), op);  // K % 16 == 0: no padding columns
        const std::vector<bf16> got = (transposed ? values_t : values).get();
        std::vector<uint16_t> got_bits(got.size());
        std::memcpy(got_bits.data(), got.data(), got.size() * sizeof(uint16_t));
        expect_bytes_equal(got_bits, want_bits, transposed ? "values_t" : "values");
      }
    }
  }
  // dequantisation matches the host's
  std::vector<float> want(x.size());
  Buf<float> out(x.size());
  llmc::fp4_dequantize(out.p, q, false, 0);
  llmc::fp4_dequantize_cpu(want.data(), rd.data(), rs.data(), ref.tensor_scale_inv, rows, cols, e);
  expect_bytes_equal(out.get(), want, "dequantised data");
  llmc::fp4_dequantize(out.p, q, true, 0);
  llmc::fp4_dequantize_cpu(want.data(), rdt.data(), rst.data(), ref.tensor_scale_inv_t, cols, rows, e);
  expect_bytes_equal(out.get(), want, "dequantised data_t");
}

const Case kCases[] = {
    {llmc::kNvfp4Encoding, Rounding::Nearest, 0, false},
    {llmc::kNvfp4Encoding, Rounding::Stochastic, 0, false},
    {llmc::kNvfp4Encoding, Rounding::Nearest, 16, false},     // NVFP4 wgrad x: RHT-16 on the transposed copy
    {llmc::kNvfp4Encoding, Rounding::Stochastic, 16, true},   // both copies rotated
    {llmc::kNvfp4WeightEncoding, Rounding::Nearest, 0, false},
    {llmc::kNvfp4WeightEncoding, Rounding::Stochastic, 0, false},
    {llmc::kMxfp4Encoding, Rounding::Nearest, 0, false},
    {llmc::kMxfp4Encoding, Rounding::Stochastic, 0, false},
    {llmc::kMxfp4Encoding, Rounding::Nearest, 32, true},
    {llmc::kMxfp4Encoding, Rounding::Stochastic, 32, false},
    {llmc::kMxfp4Encoding, Rounding::Nearest, 16, true},
    {llmc::kMxfp4Encoding, Rounding::Nearest, 32, true, true},  // Quartet's forward: Hadamard-32, QuEST scales
    {llmc::kMxfp4Encoding, Rounding::Stochastic, 32, false, true},
    {llmc::kMxfp4Encoding, Rounding::Nearest, 0, false, true},
    // Quartet's backward: re-randomised Hadamard-32 on both copies, range-matched scales, RTN or SR
    {llmc::kMxfp4Encoding, Rounding::Nearest, 32, true, false, true},
    {llmc::kMxfp4Encoding, Rounding::Stochastic, 32, true, false, true},
    {llmc::kMxfp4Encoding, Rounding::Stochastic, 0, false, false, true},
};

TEST(Fp4Quantize, ModelShapedMatchesHostBitForBit) {
  auto rng = gpu_test::make_rng("test_fp4_quant");
  const std::vector<float> x = model_like(768, 3072, rng, true);
  for (const Case& c : kCases) run_case(c, 768, 3072, x, rng(), false);
}

TEST(Fp4Quantize, OddShapesAndGivenAmaxMatchHost) {
  auto rng = gpu_test::make_rng("test_fp4_quant");
  const int shapes[][2] = {{33, 80}, {17, 45}, {1, 7}, {5, 33}, {64, 96}, {48, 45}, {32, 62}, {0, 32}};
  for (const auto& sh : shapes) {
    const std::vector<float> x = model_like(sh[0], sh[1], rng, false);
    for (const Case& c : kCases) {
      const bool rows_ok = c.hadamard == 0 || sh[0] % c.hadamard == 0;
      const bool cols_ok = !c.rotate_data || sh[1] % c.hadamard == 0;
      if (!rows_ok || !cols_ok) continue;  // a rotated direction must be a multiple of the transform size
      if (c.gaussian && (sh[0] % 32 != 0 || sh[1] % 32 != 0)) continue;  // Gaussian scales take whole blocks
      run_case(c, sh[0], sh[1], x, rng(), false);
      if (c.e.tensor_scale) run_case(c, sh[0], sh[1], x, rng(), true);
    }
  }
}

TEST(Fp4Quantize, NonFiniteBlocksGetNanScalesOnBothSides) {
  auto rng = gpu_test::make_rng("test_fp4_quant");
  std::vector<float> x = model_like(32, 64, rng, false);
  x[3 * 64 + 10] = std::numeric_limits<float>::quiet_NaN();
  x[20 * 64 + 40] = std::numeric_limits<float>::infinity();
  for (const Case& c : kCases)
    if (c.hadamard == 0) run_case(c, 32, 64, x, rng(), true);  // NVFP4 with a finite given amax
}

TEST(Fp4Quantize, TinyTensorAmaxMatchesHost) {
  // tensor amax about 2^-118: NVFP4's s_enc clamps to FLT_MAX and blocks far below the amax have E4M3 scales under
  // 1, so the element multiplier s_enc / s_b is clamped to FLT_MAX too (fp4_codec.cuh); their zeros stay code 0
  auto rng = gpu_test::make_rng("test_fp4_quant");
  std::vector<float> x = model_like(32, 64, rng, false);
  for (float& v : x) v = gpu_test::round_bf16(v * 0x1p-130f);
  for (const Case& c : kCases) run_case(c, 32, 64, x, rng(), false);
}

TEST(Fp4Quantize, GaussianScalesAndTrustMasksAreMxfp4Options) {
  Buf<bf16> x(64 * 48);
  Buf<uint8_t> codes(64 * 48), scales(64 * 64);
  Buf<uint32_t> trust(64 * 2);
  QTensor q;
  q.rows = 64, q.cols = 64, q.data = codes.p, q.scale_inv = reinterpret_cast<float*>(scales.p);
  QuantizeArgs args;
  args.mxfp4_scale = llmc::Mxfp4Scale::Gaussian;
  q.encoding = llmc::kNvfp4Encoding;
  EXPECT_THROW(llmc::quantize(q, x.p, args, 0), llmc::Error);  // NVFP4 has its own scales
  q.encoding = llmc::kMxfp4Encoding, q.cols = 48;
  EXPECT_THROW(llmc::quantize(q, x.p, args, 0), llmc::Error);  // a partial block of 16
  args = QuantizeArgs{};
  args.trust_mask = trust.p;
  q.cols = 64, q.data = nullptr, q.data_t = codes.p, q.scale_inv_t = reinterpret_cast<float*>(scales.p);
  EXPECT_THROW(llmc::quantize(q, x.p, args, 0), llmc::Error);  // the mask belongs to the data copy
  q.encoding = Encoding{llmc::ElementFormat::E4M3, llmc::kWholeTensor, llmc::ScaleFormat::FP32, false};
  EXPECT_THROW(llmc::quantize(q, x.p, args, 0), llmc::Error);  // not an option of the FP8 quantisers
  args = QuantizeArgs{};
  args.mxfp4_scale = llmc::Mxfp4Scale::RangeMatched;
  EXPECT_THROW(llmc::quantize(q, x.p, args, 0), llmc::Error);  // nor are range-matched scales
  q.encoding = llmc::kNvfp4Encoding;
  EXPECT_THROW(llmc::quantize(q, x.p, args, 0), llmc::Error);  // an MXFP4 rule
}

TEST(Fp4Quantize, StochasticRoundingIsReproducibleAndKeyed) {
  auto rng = gpu_test::make_rng("test_fp4_quant");
  const std::vector<float> x = model_like(64, 256, rng, false);
  const auto xb = gpu_test::to_bf16(x);
  Buf<bf16> dx(xb.size());
  CUDA_CHECK(cudaMemcpy(dx.p, xb.data(), xb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  auto run = [&](uint64_t seed, uint32_t step) {
    Buf<uint8_t> data(llmc::code_bytes(llmc::kMxfp4Encoding, 64, 256));
    Buf<uint8_t> s(llmc::scale_inv_bytes(llmc::kMxfp4Encoding, 64, 256));
    QTensor q;
    q.rows = 64, q.cols = 256, q.encoding = llmc::kMxfp4Encoding;
    q.data = data.p, q.scale_inv = reinterpret_cast<float*>(s.p);
    QuantizeArgs args;
    args.rounding = Rounding::Stochastic;
    args.sr_key = {seed, step, 1};
    llmc::quantize(q, dx.p, args, 0);
    return data.get();
  };
  EXPECT_EQ(run(11, 1), run(11, 1));
  EXPECT_NE(run(11, 1), run(12, 1));
  EXPECT_NE(run(11, 1), run(11, 2));
}

// fp4_requantize (Quartet's backward re-quantisation of saved MXFP4 codes) against what it stands for: the codes
// dequantised to BF16 (fp4_dequantize) and quantised again, on the GPU and on the host, byte for byte; with both
// copies or the transposed one, H32 or none, range-matched or amax scales, RTN or SR; model-shaped and odd shapes (the
// element-wise loads: cols not a multiple of 8, partial blocks); and its argument checks.
TEST(Fp4Quantize, RequantiseFromCodesEqualsDequantiseThenQuantise) {
  auto rng = gpu_test::make_rng("test_fp4_quant");
  const Encoding e = llmc::kMxfp4Encoding;
  struct Shape {
    int rows, cols, hadamard;
  };
  for (const Shape sh : {Shape{768, 3072, 32}, Shape{64, 96, 32}, Shape{37, 100, 0}, Shape{33, 70, 0}}) {
    for (const Rounding rounding : {Rounding::Nearest, Rounding::Stochastic}) {
      for (const bool both : {false, true}) {
        const int rows = sh.rows, cols = sh.cols;
        SCOPED_TRACE(llmc::strformat("%d x %d hadamard %d %s%s", rows, cols, sh.hadamard,
                                     rounding == Rounding::Stochastic ? "SR" : "RTN", both ? " both copies" : ""));
        // the source: x's forward codes (QuEST scales when whole blocks, as Quartet's forward)
        const std::vector<float> x = model_like(rows, cols, rng, false);
        const auto xb = gpu_test::to_bf16(x);
        Buf<bf16> dx(xb.size());
        CUDA_CHECK(cudaMemcpy(dx.p, xb.data(), xb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
        Buf<uint8_t> src_codes(llmc::code_bytes(e, rows, cols)), src_scales(llmc::scale_inv_bytes(e, rows, cols));
        QTensor src;
        src.rows = rows, src.cols = cols, src.encoding = e;
        src.data = src_codes.p, src.scale_inv = reinterpret_cast<float*>(src_scales.p);
        QuantizeArgs fwd;
        if (cols % 32 == 0) fwd.mxfp4_scale = llmc::Mxfp4Scale::Gaussian;
        llmc::quantize(src, dx.p, fwd, 0);

        QuantizeArgs args;
        args.mxfp4_scale = both ? llmc::Mxfp4Scale::Amax : llmc::Mxfp4Scale::RangeMatched;
        args.rounding = rounding;
        args.sr_key = {0x5eed, 4, 9};
        args.hadamard.size = sh.hadamard;
        args.hadamard.signs = llmc::random_signs({0x5eed, 1, 2}, sh.hadamard ? sh.hadamard : 16);
        args.hadamard.data = both && sh.hadamard != 0;
        args.hadamard.data_t = sh.hadamard != 0;
        auto make = [&](Buf<uint8_t>& d, Buf<uint8_t>& s, Buf<uint8_t>& dt, Buf<uint8_t>& st) {
          QTensor q;
          q.rows = rows, q.cols = cols, q.encoding = e;
          if (both) q.data = d.p, q.scale_inv = reinterpret_cast<float*>(s.p);
          q.data_t = dt.p, q.scale_inv_t = reinterpret_cast<float*>(st.p);
          return q;
        };
        Buf<uint8_t> ad(llmc::code_bytes(e, rows, cols)), as(llmc::scale_inv_bytes(e, rows, cols));
        Buf<uint8_t> adt(llmc::code_bytes(e, cols, rows)), ast(llmc::scale_inv_bytes(e, cols, rows));
        Buf<uint8_t> bd(ad.n), bs(as.n), bdt(adt.n), bst(ast.n);
        Buf<bf16> decoded(xb.size());
        llmc::fp4_dequantize(decoded.p, src, false, 0);
        llmc::quantize(make(ad, as, adt, ast), decoded.p, args, 0);
        llmc::fp4_requantize(make(bd, bs, bdt, bst), src, args, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        expect_bytes_equal(bdt.get(), adt.get(), "data_t");
        expect_bytes_equal(bst.get(), ast.get(), "scale_inv_t");
        if (both) {
          expect_bytes_equal(bd.get(), ad.get(), "data");
          expect_bytes_equal(bs.get(), as.get(), "scale_inv");
        }
        // and the host: the dequantised values quantised by fp4_quantize_cpu
        std::vector<float> values(x.size());
        llmc::fp4_dequantize_cpu(values.data(), src_codes.get().data(), src_scales.get().data(), 1.0f, rows, cols, e);
        std::vector<uint8_t> rd(ad.n), rs(as.n), rdt(adt.n), rst(ast.n);
        llmc::Fp4CpuOut ref;
        if (both) ref.data = rd.data(), ref.scale_inv = rs.data();
        ref.data_t = rdt.data(), ref.scale_inv_t = rst.data();
        llmc::fp4_quantize_cpu(&ref, values.data(), rows, cols, e, args, nullptr);
        expect_bytes_equal(bdt.get(), rdt, "data_t (host)");
        if (both) expect_bytes_equal(bd.get(), rd, "data (host)");
      }
    }
  }
  // argument checks
  Buf<uint8_t> codes(64 * 64), scales(64 * 64);
  Buf<float> amax(1);
  QTensor src, q;
  src.rows = q.rows = 64, src.cols = q.cols = 64, src.encoding = q.encoding = e;
  src.data = codes.p, src.scale_inv = reinterpret_cast<float*>(scales.p);
  q.data_t = codes.p, q.scale_inv_t = reinterpret_cast<float*>(scales.p);
  QTensor bad = src;
  bad.encoding = llmc::kNvfp4Encoding;
  EXPECT_THROW(llmc::fp4_requantize(q, bad, QuantizeArgs{}, 0), llmc::Error);  // an NVFP4 source
  bad = q;
  bad.cols = 32;
  EXPECT_THROW(llmc::fp4_requantize(bad, src, QuantizeArgs{}, 0), llmc::Error);  // another shape
  bad = q;
  bad.amax = amax.p;
  EXPECT_THROW(llmc::fp4_requantize(bad, src, QuantizeArgs{}, 0), llmc::Error);  // no amax of an FP4 source
  bad = src;
  bad.data = nullptr;
  EXPECT_THROW(llmc::fp4_requantize(q, bad, QuantizeArgs{}, 0), llmc::Error);  // no codes
}

// Quartet's backward epilogue: factor * g, masked, H32 along the rows (signs 0), stored as BF16 or added to FP32, bit
// for bit against the host doing the same FP32 operations (hadamard.cuh, float_rn.cuh); and its argument checks.
// Shapes and offsets that reach both kernel forms: whole runs from aligned pointers (four elements per lane; 5 x 96
// leaves a part-filled last warp), a partial last run (cols 45, no rotation) and pointers one float off alignment (one
// element per lane).
TEST(Fp4Quantize, GradientEpilogueMatchesHost) {
  auto rng = gpu_test::make_rng("test_fp4_quant");
  struct Shape { int rows, cols, offset; };
  for (const Shape sh : {Shape{48, 96, 0}, Shape{5, 96, 0}, Shape{5, 45, 0}, Shape{7, 64, 1}}) {
    const int rows = sh.rows, cols = sh.cols, runs = (cols + 31) / 32;
    const size_t n = static_cast<size_t>(rows) * cols;
    const std::vector<float> g = gpu_test::random_floats(n, rng, -3.0f, 3.0f);
    const std::vector<float> acc0 = gpu_test::random_floats(n, rng, -1.0f, 1.0f);
    std::vector<uint32_t> mask(static_cast<size_t>(rows) * runs);
    for (uint32_t& w : mask) w = static_cast<uint32_t>(rng()) | static_cast<uint32_t>(rng());  // most bits set
    Buf<float> dg(n + 1), dacc(n + 1);
    Buf<uint32_t> dmask(mask.size());
    Buf<bf16> dout(n + 1);
    float* const g_at = dg.p + sh.offset;
    float* const acc_at = dacc.p + sh.offset;
    bf16* const out_at = dout.p + sh.offset;
    CUDA_CHECK(cudaMemcpy(g_at, g.data(), n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dmask.p, mask.data(), mask.size() * 4, cudaMemcpyHostToDevice));
    const float factor = llmc::kRangeMatchProductFactor;
    // signs: none (Quartet's fixed H32) or a random word (the forward's H32·S undone as S·H32)
    const uint32_t random_signs = static_cast<uint32_t>(rng());
    for (int hadamard : {0, 32})
      for (uint32_t signs : {0u, random_signs})
        for (bool masked : {false, true}) {
          if (hadamard && cols % 32 != 0) continue;
          if (!hadamard && signs) continue;
          SCOPED_TRACE(llmc::strformat("%d x %d + %d, hadamard %d, signs 0x%08x, %s", rows, cols, sh.offset, hadamard,
                                       signs, masked ? "masked" : "no mask"));
          std::vector<float> want(n);
          for (int r = 0; r < rows; r++)
            for (int c0 = 0; c0 < cols; c0 += 32) {
              float v[32] = {};
              for (int i = 0; i < 32 && c0 + i < cols; i++) {
                const size_t idx = static_cast<size_t>(r) * cols + c0 + i;
                const bool kept = !masked || ((mask[static_cast<size_t>(r) * runs + c0 / 32] >> i) & 1u);
                v[i] = kept ? llmc::mul_rn(g[idx], factor) : 0.0f;
              }
              if (hadamard) llmc::hadamard_transform<32>(v, 0u);
              for (int i = 0; i < 32; i++)
                if ((signs >> i) & 1u) v[i] = -v[i];
              for (int i = 0; i < 32 && c0 + i < cols; i++) want[static_cast<size_t>(r) * cols + c0 + i] = v[i];
            }
          const uint32_t* m = masked ? dmask.p : nullptr;
          llmc::mxfp4_gradient_epilogue(out_at, nullptr, g_at, m, rows, cols, factor, hadamard, signs, 0);
          std::vector<bf16> got_bf16(n);
          CUDA_CHECK(cudaMemcpy(got_bf16.data(), out_at, n * sizeof(bf16), cudaMemcpyDeviceToHost));
          std::vector<float> got(n), want_bf16(n);
          for (size_t i = 0; i < n; i++)
            got[i] = __bfloat162float(got_bf16[i]), want_bf16[i] = gpu_test::round_bf16(want[i]);
          expect_bytes_equal(got, want_bf16, "bf16 out");
          CUDA_CHECK(cudaMemcpy(acc_at, acc0.data(), n * 4, cudaMemcpyHostToDevice));
          llmc::mxfp4_gradient_epilogue(nullptr, acc_at, g_at, m, rows, cols, factor, hadamard, signs, 0);
          std::vector<float> got_acc(n), want_acc(n);
          CUDA_CHECK(cudaMemcpy(got_acc.data(), acc_at, n * 4, cudaMemcpyDeviceToHost));
          for (size_t i = 0; i < n; i++) want_acc[i] = llmc::add_rn(acc0[i], want[i]);
          expect_bytes_equal(got_acc, want_acc, "fp32 accumulated");
          if (masked) {  // the mask must matter: some element of the masked output differs from the unmasked one
            size_t cleared = 0;
            for (uint32_t w : mask) cleared += 32 - __builtin_popcount(w);
            EXPECT_GT(cleared, 0u);
          }
        }
  }
  Buf<float> dg(48 * 96), dacc(48 * 96);
  Buf<bf16> dout(48 * 96);
  const float factor = llmc::kRangeMatchProductFactor;
  EXPECT_THROW(llmc::mxfp4_gradient_epilogue(dout.p, dacc.p, dg.p, nullptr, 48, 96, factor, 0, 0, 0), llmc::Error);
  EXPECT_THROW(llmc::mxfp4_gradient_epilogue(dout.p, nullptr, dg.p, nullptr, 48, 96, factor, 16, 0, 0), llmc::Error);
  EXPECT_THROW(llmc::mxfp4_gradient_epilogue(dout.p, nullptr, dg.p, nullptr, 48, 48, factor, 32, 0, 0), llmc::Error);
  EXPECT_THROW(llmc::mxfp4_gradient_epilogue(dout.p, nullptr, dg.p, nullptr, 48, 96, factor, 0, 5u, 0), llmc::Error);
}

// The telemetry of a rotated MXFP4 copy measures the rotated values the quantiser saw: its amax is that of the
// rotated tensor, and its SNR that of the codes against the rotated values (host: hadamard_cpu, the same FP32 bits).
TEST(Fp4Quantize, RotatedTelemetryMeasuresTheRotatedValues) {
  auto rng = gpu_test::make_rng("test_fp4_quant");
  const int rows = 64, cols = 128;
  const std::vector<float> x = model_like(rows, cols, rng, false);
  const auto xb = gpu_test::to_bf16(x);
  Buf<bf16> dx(xb.size());
  CUDA_CHECK(cudaMemcpy(dx.p, xb.data(), xb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  const Encoding e = llmc::kMxfp4Encoding;
  Buf<uint8_t> data(llmc::code_bytes(e, rows, cols)), s(llmc::scale_inv_bytes(e, rows, cols));
  QTensor q;
  q.rows = rows, q.cols = cols, q.encoding = e, q.data = data.p, q.scale_inv = reinterpret_cast<float*>(s.p);
  QuantizeArgs args;
  args.mxfp4_scale = llmc::Mxfp4Scale::Gaussian;
  args.hadamard = {32, 0x1234567u, true, false};
  llmc::quantize(q, dx.p, args, 0);
  Buf<double> slots(llmc::kQuantStatsSlots);
  llmc::quant_stats(slots.p, q, dx.p, 0, args.hadamard);
  std::vector<double> host_slots = slots.get();
  const llmc::QuantStats got = llmc::finish_quant_stats(host_slots.data());
  std::vector<float> rotated = x, deq(x.size());
  llmc::hadamard_cpu(rotated.data(), rotated.size(), 32, args.hadamard.signs);
  llmc::fp4_dequantize_cpu(deq.data(), data.get().data(), s.get().data(), 1.0f, rows, cols, e);
  double amax = 0, sx = 0, se = 0;
  for (size_t i = 0; i < x.size(); i++) {
    amax = std::max(amax, static_cast<double>(std::fabs(rotated[i])));
    sx += static_cast<double>(rotated[i]) * rotated[i];
    se += (static_cast<double>(rotated[i]) - deq[i]) * (static_cast<double>(rotated[i]) - deq[i]);
  }
  EXPECT_EQ(got.amax, amax);
  EXPECT_NEAR(got.snr_db, 10.0 * std::log10(sx / se), 1e-6);
  // unrotated, the same codes compare badly with x itself: the rotation is what the numbers describe
  llmc::quant_stats(slots.p, q, dx.p, 0);
  host_slots = slots.get();
  EXPECT_LT(llmc::finish_quant_stats(host_slots.data()).snr_db, got.snr_db - 10.0);
  // the FP8 families have no rotated copies
  q.encoding = Encoding{llmc::ElementFormat::E4M3, llmc::kWholeTensor, llmc::ScaleFormat::FP32, false};
  EXPECT_THROW(llmc::quant_stats(slots.p, q, dx.p, 0, args.hadamard), llmc::Error);
}

// The telemetry of every FP4 family against its host reference (fp4_quant_stats_cpu): the counts (saturated,
// underflow, clipped), amax and scale exactly, the SNR to 1e-9 relative (FP64 sums in another order); two runs
// bit-identical. MXFP4 under the amax rule, QuEST's Gaussian scales (with outliers that clip, unrotated and rotated by
// H32: the clipped count is then exactly the trust mask's cleared bits, no block being non-finite) and range-matched
// scales (nothing clipped); NVFP4 1x16 (unrotated and rotated by H16: the clipped count's multiplier needs the
// rotated copy's tensor amax) and 16x16 tiles.
TEST(Fp4Quantize, TelemetryMatchesHostIncludingTheClippedCount) {
  using llmc::Mxfp4Scale;
  auto rng = gpu_test::make_rng("test_fp4_quant");
  const int rows = 96, cols = 256;
  std::vector<float> x = model_like(rows, cols, rng, true);
  for (size_t i = 11; i < x.size(); i += 97) x[i] = gpu_test::round_bf16(x[i] * 64.0f);  // outliers within their rows
  const auto xb = gpu_test::to_bf16(x);
  Buf<bf16> dx(xb.size());
  CUDA_CHECK(cudaMemcpy(dx.p, xb.data(), xb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  struct Case {
    Encoding e;
    Mxfp4Scale rule;
    int hadamard;
  };
  const Case cases[] = {{llmc::kMxfp4Encoding, Mxfp4Scale::Amax, 0},
                        {llmc::kMxfp4Encoding, Mxfp4Scale::Gaussian, 0},
                        {llmc::kMxfp4Encoding, Mxfp4Scale::Gaussian, 32},
                        {llmc::kMxfp4Encoding, Mxfp4Scale::RangeMatched, 0},
                        {llmc::kMxfp4Encoding, Mxfp4Scale::RangeMatched, 32},
                        {llmc::kNvfp4Encoding, Mxfp4Scale::Amax, 0},
                        {llmc::kNvfp4Encoding, Mxfp4Scale::Amax, 16},
                        {llmc::kNvfp4WeightEncoding, Mxfp4Scale::Amax, 0}};
  for (const Case& k : cases) {
    const Encoding& e = k.e;
    const bool mxfp4 = llmc::mxfp4_encoding(e), quest = k.rule == Mxfp4Scale::Gaussian;
    const std::string what = llmc::encoding_name(e) + " rule " + std::to_string(static_cast<int>(k.rule)) +
                             " hadamard " + std::to_string(k.hadamard);
    Buf<uint8_t> data(llmc::code_bytes(e, rows, cols)), sc(llmc::scale_inv_bytes(e, rows, cols));
    Buf<float> tsi(1);
    Buf<uint32_t> mask(static_cast<size_t>(rows) * (cols / llmc::kGaussianBlock));
    QTensor q;
    q.rows = rows, q.cols = cols, q.encoding = e, q.data = data.p, q.scale_inv = reinterpret_cast<float*>(sc.p);
    if (!mxfp4) q.tensor_scale_inv = tsi.p;
    QuantizeArgs args;
    args.mxfp4_scale = k.rule;
    if (k.hadamard != 0) args.hadamard = {k.hadamard, k.hadamard == 32 ? 0x2468ace1u : 0xace1u, true, false};
    if (quest) args.trust_mask = mask.p;
    llmc::quantize(q, dx.p, args, 0);
    Buf<double> slots(llmc::kQuantStatsSlots), slots2(llmc::kQuantStatsSlots);
    llmc::quant_stats(slots.p, q, dx.p, 0, args.hadamard, args.mxfp4_scale);
    llmc::quant_stats(slots2.p, q, dx.p, 0, args.hadamard, args.mxfp4_scale);
    const std::vector<double> s = slots.get(), s2 = slots2.get();
    ASSERT_EQ(std::memcmp(s.data(), s2.data(), sizeof(double) * s.size()), 0) << what << ": two runs differ";
    const llmc::QuantStats got = llmc::finish_quant_stats(s.data());
    QuantizeArgs host_args = args;
    host_args.trust_mask = nullptr;
    const float host_tsi = mxfp4 ? 0.0f : tsi.get()[0];
    const llmc::QuantStats want = llmc::fp4_quant_stats_cpu(x.data(), data.get().data(), sc.get().data(), host_tsi,
                                                            rows, cols, e, host_args);
    EXPECT_EQ(got.amax, want.amax) << what;
    EXPECT_EQ(got.scale, want.scale) << what;
    EXPECT_EQ(got.saturated_frac, want.saturated_frac) << what;
    EXPECT_EQ(got.underflow_frac, want.underflow_frac) << what;
    EXPECT_EQ(got.clipped_frac, want.clipped_frac) << what;
    EXPECT_NEAR(got.snr_db, want.snr_db, 1e-9 * std::fabs(want.snr_db)) << what;
    if (k.rule == Mxfp4Scale::RangeMatched) EXPECT_EQ(got.clipped_frac, 0.0) << what;
    if (quest) {
      EXPECT_GT(got.clipped_frac, 0.0) << what << ": the test clips";
      double untrusted = 0;
      for (uint32_t w : mask.get()) untrusted += 32 - __builtin_popcount(w);
      EXPECT_EQ(s[llmc::kStatClipped], untrusted) << what;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The device conversions
__global__ void e2m1_kernel(uint8_t* rn, uint8_t* sr, const float* x, const uint32_t* r, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) rn[i] = llmc::e2m1_rn(x[i]), sr[i] = llmc::e2m1_sr(x[i], r[i]);
}

TEST(Fp4Convert, DeviceE2M1MatchesHostOnSweepAndThresholds) {
  std::vector<float> x;
  for (uint64_t b = 0; b < (1ull << 32); b += 4099) x.push_back(llmc::bits_to_float(static_cast<uint32_t>(b)));
  for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 0.5f, 2.0f, 4.0f})
    for (float sgn : {1.0f, -1.0f})
      for (int d = -3; d <= 3; d++) x.push_back(llmc::bits_to_float(llmc::float_to_bits(sgn * t) + d));
  std::mt19937 rng(5);
  std::vector<uint32_t> r(x.size());
  for (auto& w : r) w = rng();
  Buf<float> dx(x.size());
  Buf<uint32_t> dr(r.size());
  Buf<uint8_t> rn(x.size()), sr(x.size());
  CUDA_CHECK(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dr.p, r.data(), r.size() * 4, cudaMemcpyHostToDevice));
  e2m1_kernel<<<static_cast<unsigned>(llmc::ceil_div(x.size(), 256)), 256>>>(rn.p, sr.p, dx.p, dr.p, x.size());
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto got_rn = rn.get(), got_sr = sr.get();
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); i++) {
    if (got_rn[i] != llmc::e2m1_encode(x[i]) && bad++ < 8)
      ADD_FAILURE() << std::hexfloat << x[i] << ": device RTN " << +got_rn[i] << " host " << +llmc::e2m1_encode(x[i]);
    if (got_sr[i] != llmc::e2m1_sr(x[i], r[i]) && bad++ < 8)
      ADD_FAILURE() << std::hexfloat << x[i] << ": device SR " << +got_sr[i] << " host " << +llmc::e2m1_sr(x[i], r[i]);
  }
  EXPECT_EQ(bad, 0u);
}

__global__ void hadamard_kernel(float* v, int size, uint32_t signs, size_t n) {
  const size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if ((g + 1) * size <= n) llmc::hadamard_transform_n(v + g * size, size, signs);
}

TEST(Hadamard, DeviceMatchesHostAndDenseMatrix) {
  auto rng = gpu_test::make_rng("test_fp4_quant");
  for (int size : {16, 32}) {
    const size_t n = 4096;
    const std::vector<float> x = gpu_test::random_floats(n, rng, -3.0f, 3.0f);
    const uint32_t signs = static_cast<uint32_t>(rng());
    Buf<float> dv(n);
    CUDA_CHECK(cudaMemcpy(dv.p, x.data(), n * 4, cudaMemcpyHostToDevice));
    hadamard_kernel<<<static_cast<unsigned>(llmc::ceil_div(n / size, 128)), 128>>>(dv.p, size, signs, n);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> host = x;
    llmc::hadamard_cpu(host.data(), n, size, signs);
    expect_bytes_equal(dv.get(), host, llmc::strformat("hadamard %d", size));
    for (size_t g = 0; g < n; g += size)  // dense H diag(s) in FP64
      for (int i = 0; i < size; i++) {
        double acc = 0.0, l1 = 0.0;
        for (int j = 0; j < size; j++) {
          acc += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * ((signs >> j) & 1 ? -1.0 : 1.0) * x[g + j];
          l1 += std::fabs(x[g + j]);
        }
        acc /= std::sqrt(static_cast<double>(size));
        // log2(size) rounded additions and one rounded multiply, each off by at most 2^-24 of a partial sum <= l1
        ASSERT_NEAR(host[g + i], acc, 8 * gpu_test::kFp32Eps * l1) << "size " << size << " group " << g << " row " << i;
      }
  }
}

}  // namespace
