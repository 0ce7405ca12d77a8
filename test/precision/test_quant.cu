// test/precision/test_quant: every kernel of llmc/precision/fp8_quant.h, and the dispatch point
// llmc/precision/quantize.h over them, against the host references (test/reference/precision_ref.h), bit for bit
// (codes, scales, amax), and the device FP8 conversion itself against llmc/core/dtypes' fp8_encode. Each run draws a
// fresh seed (printed; replay with LLM8_TEST_SEED). Inputs mix magnitudes per row (2^-8 .. 2^8), outliers 100x larger,
// exact zeros, negatives, tiny values that underflow (1e-7 at random, 1e-12 in column 1 of every row), an all-zero
// 128x128 tile, all-zero 1x128 and 128x1 blocks. Shapes that are and are not multiples of 128 (and rows not a multiple
// of 16: the byte-store path of the transposed copy). Every output buffer is poisoned with 0xFF (a NaN code / a NaN
// scale) and carries a poisoned guard zone behind it, so an unwritten element or a write past the end shows up.
// Failures print the first mismatches with their indices, the input and both codes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/precision/encoding.h"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/quantize.h"
#include "test/reference/precision_ref.h"

namespace {

using llmc::bf16;
using llmc::BlockShape;
using llmc::ElementFormat;
using llmc::Encoding;
using llmc::QTensor;
using llmc::ScaleFormat;

ScaleFormat scales(bool pow2) { return pow2 ? ScaleFormat::Pow2FP32 : ScaleFormat::FP32; }
Encoding encoding(ElementFormat f, BlockShape block, bool pow2 = false) { return {f, block, scales(pow2)}; }
// fp8_quantize_blockwise with the scales of q's encoding FP32 or power-of-two.
void quantize_blockwise(QTensor q, const bf16* x, bool pow2) {
  q.encoding.scale = scales(pow2);
  llmc::fp8_quantize_blockwise(q, x, 0);
}

// ---------------------------------------------------------------------------------------------------------------
// Seed, inputs
uint64_t run_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("LLM8_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("test_quant: seed %llu (replay with LLM8_TEST_SEED=%llu)\n", static_cast<unsigned long long>(s),
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::mt19937_64 make_rng() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  return std::mt19937_64(run_seed() ^ std::hash<std::string>{}(name));
}

float round_bf16(float x) { return llmc::bf16_decode(llmc::bf16_encode(x)); }
uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// (rows, cols) bf16-representable test input (see the file comment).
std::vector<float> make_input(int rows, int cols, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::uniform_int_distribution<int> row_exp(-8, 8);
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; r++) {
    const float row_scale = std::ldexp(1.0f, row_exp(rng));
    for (int c = 0; c < cols; c++) {
      const float u = uni(rng);
      float v = normal(rng) * row_scale;
      if (u < 0.03f) v = 0.0f;                   // exact zeros
      else if (u < 0.035f) v *= 100.0f;          // outliers
      else if (u < 0.05f) v *= 1e-7f;            // underflow in every format at any block scale
      x[static_cast<size_t>(r) * cols + c] = round_bf16(v);
    }
    // column 1 of every row: 1e-12 of the row's magnitude, below half the smallest subnormal of E5M2 too
    x[static_cast<size_t>(r) * cols + 1] = round_bf16((r % 2 ? -1e-12f : 1e-12f) * row_scale);
  }
  auto zero = [&](int r_begin, int r_end, int c_begin, int c_end) {
    for (int r = r_begin; r < std::min(rows, r_end); r++)
      for (int c = c_begin; c < std::min(cols, c_end); c++) x[static_cast<size_t>(r) * cols + c] = 0.0f;
  };
  if (rows >= 256 && cols >= 256) zero(128, 256, 128, 256);  // an all-zero 128x128 tile
  zero(rows / 2, rows / 2 + 1, 0, 128);                       // an all-zero 1x128 block
  zero(0, 128, cols - 1, cols);                               // an all-zero 128x1 block (last column)
  return x;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = __float2bfloat16_rn(v[i]);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Device buffers with a poisoned guard zone behind them.
constexpr size_t kGuardBytes = 256;

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T) + kGuardBytes));
    poison();
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // 0xFF everywhere: a NaN code in both FP8 formats (never an encode result) and a NaN float.
  void poison() { CUDA_CHECK(cudaMemset(ptr, 0xff, n * sizeof(T) + kGuardBytes)); }
  // The guard zone is still all 0xFF (nothing was written past the end).
  ::testing::AssertionResult guard_intact(const char* what) const {
    std::vector<uint8_t> g(kGuardBytes);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(g.data(), reinterpret_cast<const uint8_t*>(ptr) + n * sizeof(T), kGuardBytes,
                          cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < kGuardBytes; i++)
      if (g[i] != 0xff)
        return ::testing::AssertionFailure() << what << ": byte " << i << " past the end was written (0x" << std::hex
                                             << int(g[i]) << ")";
    return ::testing::AssertionSuccess();
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Comparisons (bit exact), reporting the first mismatches.
// Codes of a (rows, cols) matrix; x_at(r, c) gives the source value of element (r, c) for the report.
::testing::AssertionResult same_codes(const std::string& what, const std::vector<uint8_t>& got,
                                      const std::vector<uint8_t>& want, int rows, int cols, ElementFormat f,
                                      const std::function<float(int, int)>& x_at) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
  size_t bad = 0, poisoned = 0;
  std::string report;
  for (size_t i = 0; i < got.size(); i++) {
    if (got[i] == want[i]) continue;
    poisoned += got[i] == 0xff;
    if (bad++ < 8) {
      const int r = static_cast<int>(i / cols), c = static_cast<int>(i % cols);
      report += llmc::strformat("\n  [r=%d, c=%d] got 0x%02x (%g) want 0x%02x (%g), source %.9g", r, c, got[i],
                                llmc::fp8_decode(got[i], f), want[i], llmc::fp8_decode(want[i], f), x_at(r, c));
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " (" << rows << " x " << cols << ", " << llmc::element_format_name(f)
                                       << "): " << bad << " of " << got.size() << " codes differ (" << poisoned
                                       << " still 0xFF = never written)" << report;
}

// Float arrays bit for bit (NaN equal to NaN only if the reference is NaN too).
::testing::AssertionResult same_floats(const std::string& what, const std::vector<float>& got,
                                       const std::vector<float>& want, int ld = 0) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
  size_t bad = 0;
  std::string report;
  for (size_t i = 0; i < got.size(); i++) {
    const bool ok = bits_of(got[i]) == bits_of(want[i]) || (std::isnan(got[i]) && std::isnan(want[i]));
    if (ok) continue;
    if (bad++ < 8) {
      if (ld > 0)
        report += llmc::strformat("\n  [%zu = row %zu, col %zu of ld %d] got %.9g (0x%08x) want %.9g (0x%08x)", i,
                                  i / ld, i % ld, ld, got[i], bits_of(got[i]), want[i], bits_of(want[i]));
      else
        report += llmc::strformat("\n  [%zu] got %.9g (0x%08x) want %.9g (0x%08x)", i, got[i], bits_of(got[i]),
                                  want[i], bits_of(want[i]));
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size() << " differ" << report;
}

std::string gname(BlockShape g) { return llmc::block_shape_name(g); }
const char* fname(ElementFormat f) { return llmc::element_format_name(f); }

struct Shape {
  int rows, cols;
};
// Multiples of 128 and not; rows % 16 != 0 (byte stores of data_t): 1000, 7, 130, 1; small: 16 x 16, 1 x 16.
const Shape kShapes[] = {{256, 768}, {1000, 784}, {128, 3072}, {16, 16}, {7, 48}, {130, 272}, {1, 16}, {4096, 1024}};

// ---------------------------------------------------------------------------------------------------------------
// The device conversion against the host reference (everything else relies on it).
template <ElementFormat F>
__global__ void convert_kernel(uint8_t* single, uint8_t* pairs, float* decoded, const float* x, int n) {
  constexpr __nv_fp8_interpretation_t kind = F == ElementFormat::E4M3 ? __NV_E4M3 : __NV_E5M2;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) single[i] = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, kind);
  if (2 * i + 1 < n) {
    const __nv_fp8x2_storage_t p = __nv_cvt_float2_to_fp8x2(make_float2(x[2 * i], x[2 * i + 1]), __NV_SATFINITE, kind);
    pairs[2 * i] = static_cast<uint8_t>(p & 0xff);
    pairs[2 * i + 1] = static_cast<uint8_t>(p >> 8);
  }
  if (i < 256) decoded[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<uint8_t>(i), kind)));
}

std::vector<float> conversion_inputs() {
  std::vector<float> x;
  for (uint32_t h = 0; h < 65536; h++) x.push_back(llmc::bf16_decode(static_cast<uint16_t>(h)));  // every bf16
  for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2})
    for (int c = 0; c < 256; c++) {
      const float v = llmc::fp8_decode(static_cast<uint8_t>(c), f);
      for (int d = -2; d <= 2; d++) x.push_back(float_of(bits_of(v) + d));  // values and their FP32 neighbours
      const float next = llmc::fp8_decode(static_cast<uint8_t>(c + 1), f);
      if (std::isfinite(v) && std::isfinite(next) && (c & 0x7f) != 0x7f) {
        const float mid = 0.5f * (v + next);  // exact: ties
        x.push_back(mid);
        x.push_back(std::nextafter(mid, INFINITY));
        x.push_back(std::nextafter(mid, -INFINITY));
      }
    }
  for (uint64_t b = 0; b < (1ull << 32); b += 65521) x.push_back(float_of(static_cast<uint32_t>(b)));
  for (uint32_t b : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x7f800000u,
                     0xff800000u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000001u})
    x.push_back(float_of(b));
  if (x.size() % 2) x.push_back(0.0f);
  return x;
}

TEST(Fp8Convert, DeviceSatfiniteMatchesHostEncodeAndDecode) {
  const std::vector<float> x = conversion_inputs();
  const int n = static_cast<int>(x.size());
  DeviceBuffer<float> dx(x);
  for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2}) {
    DeviceBuffer<uint8_t> single(n), pairs(n);
    DeviceBuffer<float> decoded(256);
    const int blocks = (n + 255) / 256;
    if (f == ElementFormat::E4M3)
      convert_kernel<ElementFormat::E4M3><<<blocks, 256>>>(single.ptr, pairs.ptr, decoded.ptr, dx.ptr, n);
    else
      convert_kernel<ElementFormat::E5M2><<<blocks, 256>>>(single.ptr, pairs.ptr, decoded.ptr, dx.ptr, n);
    CUDA_CHECK_LAUNCH();
    const std::vector<uint8_t> s = single.download(), p = pairs.download();
    const std::vector<float> d = decoded.download();
    size_t bad = 0, bad_nan = 0;
    for (int i = 0; i < n; i++) {
      const uint8_t want = llmc::fp8_encode(x[i], f);
      if (s[i] == want && p[i] == want) continue;
      (std::isnan(x[i]) ? bad_nan : bad)++;
      if (bad + bad_nan <= 10)
        ADD_FAILURE() << llmc::strformat("%s: x = %a (bits %08x): device single 0x%02x, pair 0x%02x, host 0x%02x",
                                         fname(f), static_cast<double>(x[i]), bits_of(x[i]), s[i], p[i], want);
    }
    EXPECT_EQ(bad, 0u) << fname(f) << ": finite / inf inputs whose device code differs from fp8_encode, of " << n;
    EXPECT_EQ(bad_nan, 0u) << fname(f) << ": NaN inputs whose device code differs from fp8_encode's kFp8NanCode "
                           << "(0x7F): the device NaN code is not what dtypes.h documents";
    for (int c = 0; c < 256; c++) {
      const float want = llmc::fp8_decode(static_cast<uint8_t>(c), f);
      EXPECT_TRUE(bits_of(d[c]) == bits_of(want) || (std::isnan(d[c]) && std::isnan(want)))
          << fname(f) << " decode 0x" << std::hex << c << ": device " << d[c] << " host " << want;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Scales
TEST(ScaleFromAmax, MatchesHost) {
  const float amaxes[] = {1.0f, 3.0f, 0.1f, 448.0f, 57344.0f, 1e-30f, 1e-40f, 3e38f, 0.0f, -0.0f, INFINITY,
                          std::numeric_limits<float>::quiet_NaN(), 7.3e-5f, 1234.5f};
  DeviceBuffer<float> scale(1), scale_inv(1), amax(1);
  int cases = 0;
  for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2})
    for (int margin : {0, 1, 4, -2})
      for (bool pow2 : {false, true})
        for (float a : amaxes) {
          const float previous = 3.0f;
          scale.upload({previous});
          scale_inv.poison();
          amax.upload({a});
          llmc::fp8_scale_from_amax(scale.ptr, scale_inv.ptr, amax.ptr, encoding(f, llmc::kWholeTensor, pow2), margin,
                                    0);
          const float want = llmc::fp8_scale_from_amax_cpu(a, previous, encoding(f, llmc::kWholeTensor, pow2), margin);
          const float got = scale.download()[0], got_inv = scale_inv.download()[0];
          EXPECT_EQ(bits_of(got), bits_of(want)) << fname(f) << " margin " << margin << " pow2 " << pow2 << " amax "
                                                 << a << ": got " << got << " want " << want;
          EXPECT_EQ(bits_of(got_inv), bits_of(1.0f / want)) << "scale_inv for amax " << a;
          cases++;
        }
  EXPECT_EQ(cases, 2 * 4 * 2 * 14);
}

TEST(DelayedScaling, MatchesHostOverStepsWithWrapAround) {
  std::mt19937_64 rng = make_rng();
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (int len : {5, 1024})
    for (bool use_max : {true, false})
      for (bool pow2 : {false, true}) {
        const int count = len == 5 ? 37 : 3;  // 37: not a multiple of the 8 warps per block
        const int steps = len == 5 ? 13 : 4;  // 13 > 2 * len: the ring wraps twice
        const int margin = pow2 ? 1 : 0;
        std::vector<uint8_t> formats(count);
        for (auto& fmt : formats) fmt = uni(rng) < 0.5f ? 0 : 1;
        std::vector<float> history(static_cast<size_t>(count) * len), scale(count), scale_inv(count);
        for (auto& h : history) h = uni(rng) < 0.5f ? 0.0f : round_bf16(uni(rng) * 10.0f);  // a history already there
        for (int i = 0; i < count; i++) scale[i] = 1.0f + i, scale_inv[i] = 1.0f / scale[i];
        DeviceBuffer<float> d_history(history), d_scale(scale), d_scale_inv(scale_inv), d_amax(count);
        DeviceBuffer<uint8_t> d_formats(formats);
        for (int step = 0; step < steps; step++) {
          std::vector<float> amax(count);
          for (int i = 0; i < count; i++) {
            const float u = uni(rng);
            amax[i] = u < 0.1f ? 0.0f : u < 0.15f ? INFINITY : u < 0.2f ? std::numeric_limits<float>::quiet_NaN()
                                                                        : std::ldexp(uni(rng), int(uni(rng) * 40) - 20);
          }
          d_amax.upload(amax);
          const int pos = step % len;
          llmc::fp8_delayed_scaling_update(d_history.ptr, d_amax.ptr, d_scale.ptr, d_scale_inv.ptr, d_formats.ptr,
                                           count, len, pos, use_max, margin, scales(pow2), 0);
          llmc::fp8_delayed_scaling_update_cpu(history.data(), amax.data(), scale.data(), scale_inv.data(),
                                               formats.data(), count, len, pos, use_max, margin, scales(pow2));
          const std::string what = llmc::strformat("len %d, %s, pow2 %d, step %d", len,
                                                   use_max ? "max" : "most recent", int(pow2), step);
          ASSERT_TRUE(same_floats(what + ": history", d_history.download(), history, len));
          ASSERT_TRUE(same_floats(what + ": amax (reset to 0)", d_amax.download(), amax));
          ASSERT_TRUE(same_floats(what + ": scale", d_scale.download(), scale));
          ASSERT_TRUE(same_floats(what + ": scale_inv", d_scale_inv.download(), scale_inv));
          ASSERT_TRUE(d_history.guard_intact("history") && d_scale.guard_intact("scale"));
        }
      }
}

// ---------------------------------------------------------------------------------------------------------------
TEST(AmaxBf16, ExactIncludingTailsAndLargeTensors) {
  std::mt19937_64 rng = make_rng();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(1000), size_t(4099), (size_t(1) << 20) + 3,
                   size_t(16384) * 768}) {
    std::vector<float> x(n);
    for (float& v : x) v = round_bf16(normal(rng));
    std::uniform_int_distribution<size_t> where(0, n - 1);
    x[where(rng)] = round_bf16(-1000.0f * (1.0f + std::fabs(normal(rng))));  // one outlier, negative, anywhere
    if (n > 8) x[n - 1] = round_bf16(1e4f);                                  // a larger one in the tail
    DeviceBuffer<bf16> dx(to_bf16(x));
    DeviceBuffer<float> amax(1);
    amax.upload({0.0f});
    llmc::amax_bf16(amax.ptr, dx.ptr, n, 0);
    const float got = amax.download()[0], want = llmc::amax_bf16_cpu(x.data(), n);
    EXPECT_EQ(bits_of(got), bits_of(want)) << "n = " << n << ": got " << got << " want " << want;
    // atomic max into the slot: a larger value already there stays
    amax.upload({1e30f});
    llmc::amax_bf16(amax.ptr, dx.ptr, n, 0);
    EXPECT_EQ(amax.download()[0], 1e30f) << "n = " << n;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Casts
enum class Outputs { Both, DataOnly, TransposedOnly };
const char* outputs_name(Outputs o) {
  return o == Outputs::Both ? "data+data_t" : o == Outputs::DataOnly ? "data only" : "data_t only";
}

TEST(QuantizeTensorwise, MatchesHostBitForBit) {
  std::mt19937_64 rng = make_rng();
  for (const Shape& sh : kShapes) {
    const std::vector<float> x = make_input(sh.rows, sh.cols, rng);
    DeviceBuffer<bf16> dx(to_bf16(x));
    const size_t n = x.size();
    const float amax = llmc::amax_bf16_cpu(x.data(), n);
    auto x_at = [&](int r, int c) { return x[static_cast<size_t>(r) * sh.cols + c]; };
    auto x_at_t = [&](int c, int r) { return x[static_cast<size_t>(r) * sh.cols + c]; };
    for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2})
      for (int variant = 0; variant < 3; variant++) {
        // 0: scale from the amax; 1: margin 2, pow2; 2: 16x too large (outliers saturate)
        float scale = llmc::fp8_scale_from_amax_cpu(amax, 1.0f, encoding(f, llmc::kWholeTensor, variant == 1),
                                                    variant == 1 ? 2 : 0);
        if (variant == 2) scale *= 16.0f;
        for (Outputs o : {Outputs::Both, Outputs::DataOnly, Outputs::TransposedOnly}) {
          const std::string what = llmc::strformat("tensorwise %dx%d %s scale %g %s", sh.rows, sh.cols, fname(f),
                                                   scale, outputs_name(o));
          DeviceBuffer<uint8_t> data(n), data_t(n);
          DeviceBuffer<float> d_scale(std::vector<float>{scale}), d_amax(std::vector<float>{0.0f});
          QTensor q;
          q.rows = sh.rows;
          q.cols = sh.cols;
          q.encoding.element = f;
          q.data = o != Outputs::TransposedOnly ? data.ptr : nullptr;
          q.data_t = o != Outputs::DataOnly ? data_t.ptr : nullptr;
          q.scale = d_scale.ptr;
          llmc::fp8_quantize_tensorwise(q, dx.ptr, d_amax.ptr, 0);
          std::vector<uint8_t> want(n), want_t(n);
          float want_amax = 0.0f;
          llmc::fp8_quantize_tensorwise_cpu(want.data(), want_t.data(), &want_amax, x.data(), sh.rows, sh.cols, scale, f);
          if (q.data) ASSERT_TRUE(same_codes(what + ": data", data.download(), want, sh.rows, sh.cols, f, x_at));
          else ASSERT_TRUE(same_codes(what + ": data (not requested: untouched)", data.download(),
                                      std::vector<uint8_t>(n, 0xff), sh.rows, sh.cols, f, x_at));
          if (q.data_t) ASSERT_TRUE(same_codes(what + ": data_t", data_t.download(), want_t, sh.cols, sh.rows, f, x_at_t));
          else ASSERT_TRUE(same_codes(what + ": data_t (not requested: untouched)", data_t.download(),
                                      std::vector<uint8_t>(n, 0xff), sh.cols, sh.rows, f, x_at_t));
          ASSERT_TRUE(same_floats(what + ": amax_out", d_amax.download(), {want_amax}));
          ASSERT_TRUE(data.guard_intact("data") && data_t.guard_intact("data_t") && d_amax.guard_intact("amax"));
        }
      }
  }
}

// Current scaling in one launch: the same scale (kept for a 0 / non-finite amax) and codes as fp8_scale_from_amax
// followed by fp8_quantize_tensorwise, for amaxes from the tensor itself, from another tensor (outliers saturate),
// zero and non-finite, every margin / pow2 variant, and both outputs.
TEST(QuantizeTensorwise, FromAmaxMatchesScaleThenCast) {
  std::mt19937_64 rng = make_rng();
  int cases = 0;
  for (const Shape& sh : kShapes) {
    const std::vector<float> x = make_input(sh.rows, sh.cols, rng);
    DeviceBuffer<bf16> dx(to_bf16(x));
    const size_t n = x.size();
    const float amax = llmc::amax_bf16_cpu(x.data(), n);
    auto x_at = [&](int r, int c) { return x[static_cast<size_t>(r) * sh.cols + c]; };
    auto x_at_t = [&](int c, int r) { return x[static_cast<size_t>(r) * sh.cols + c]; };
    const float amaxes[] = {amax, amax / 16.0f, 0.0f, INFINITY, std::numeric_limits<float>::quiet_NaN()};
    for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2})
      for (int variant = 0; variant < 2; variant++)
        for (float a : amaxes) {
          const int margin = variant == 1 ? 2 : 0;
          const bool pow2 = variant == 1;
          const float previous = 0.75f;
          const float scale = llmc::fp8_scale_from_amax_cpu(a, previous, encoding(f, llmc::kWholeTensor, pow2), margin);
          const std::string what = llmc::strformat("from_amax %dx%d %s amax %g margin %d pow2 %d", sh.rows, sh.cols,
                                                   fname(f), a, margin, static_cast<int>(pow2));
          DeviceBuffer<uint8_t> data(n), data_t(n);
          DeviceBuffer<float> d_scale(std::vector<float>{previous}), d_scale_inv(1), d_amax(std::vector<float>{a});
          d_scale_inv.poison();
          QTensor q;
          q.rows = sh.rows;
          q.cols = sh.cols;
          q.encoding = encoding(f, llmc::kWholeTensor, pow2);
          q.data = data.ptr;
          q.data_t = data_t.ptr;
          q.scale = d_scale.ptr;
          q.scale_inv = d_scale_inv.ptr;
          llmc::fp8_quantize_tensorwise_from_amax(q, dx.ptr, d_amax.ptr, margin, 0);
          std::vector<uint8_t> want(n), want_t(n);
          llmc::fp8_quantize_tensorwise_cpu(want.data(), want_t.data(), nullptr, x.data(), sh.rows, sh.cols, scale, f);
          ASSERT_TRUE(same_codes(what + ": data", data.download(), want, sh.rows, sh.cols, f, x_at));
          ASSERT_TRUE(same_codes(what + ": data_t", data_t.download(), want_t, sh.cols, sh.rows, f, x_at_t));
          EXPECT_EQ(bits_of(d_scale.download()[0]), bits_of(scale)) << what << ": scale";
          EXPECT_EQ(bits_of(d_scale_inv.download()[0]), bits_of(1.0f / scale)) << what << ": scale_inv";
          EXPECT_EQ(bits_of(d_amax.download()[0]), bits_of(a)) << what << ": the amax is read, not changed";
          ASSERT_TRUE(data.guard_intact("data") && data_t.guard_intact("data_t") &&
                      d_scale.guard_intact("scale") && d_scale_inv.guard_intact("scale_inv"));
          cases++;
        }
  }
  EXPECT_EQ(cases, static_cast<int>(std::size(kShapes)) * 2 * 2 * 5);
}

// Transpose of codes: byte for byte (all 256 codes appear), for tile-aligned and ragged shapes; bad shapes rejected.
TEST(TransposeCodes, MatchesHostBitForBit) {
  std::mt19937_64 rng = make_rng();
  std::uniform_int_distribution<int> code(0, 255);
  const std::pair<int, int> shapes[] = {{16, 16}, {64, 64}, {48, 208}, {208, 48}, {1008, 784}, {128, 4096},
                                        {2048, 512}};
  for (const auto& [rows, cols] : shapes) {
    const size_t n = static_cast<size_t>(rows) * cols;
    std::vector<uint8_t> src(n);
    for (uint8_t& c : src) c = static_cast<uint8_t>(code(rng));
    DeviceBuffer<uint8_t> d_src(src), d_dst(n);
    llmc::fp8_transpose_codes(d_dst.ptr, d_src.ptr, rows, cols, 0);
    std::vector<uint8_t> want(n);
    llmc::fp8_transpose_codes_cpu(want.data(), src.data(), rows, cols);
    const std::vector<uint8_t> got = d_dst.download();
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != want[i];
    EXPECT_EQ(bad, 0u) << rows << "x" << cols << ": " << bad << " codes differ";
    EXPECT_TRUE(d_dst.guard_intact("dst")) << rows << "x" << cols;
  }
  DeviceBuffer<uint8_t> a(64 * 64), b(64 * 64);
  EXPECT_THROW(llmc::fp8_transpose_codes(b.ptr, a.ptr, 24, 64, 0), llmc::Error);
  EXPECT_THROW(llmc::fp8_transpose_codes(b.ptr, a.ptr, 64, 8, 0), llmc::Error);
}

// Block-wise, every granularity x format x pow2 x outputs x shape; q.amax poisoned before (it is overwritten).
TEST(QuantizeBlockwise, MatchesHostBitForBit) {
  std::mt19937_64 rng = make_rng();
  for (const Shape& sh : kShapes) {
    const std::vector<float> x = make_input(sh.rows, sh.cols, rng);
    DeviceBuffer<bf16> dx(to_bf16(x));
    const size_t n = x.size();
    auto x_at = [&](int r, int c) { return x[static_cast<size_t>(r) * sh.cols + c]; };
    auto x_at_t = [&](int c, int r) { return x[static_cast<size_t>(r) * sh.cols + c]; };
    for (BlockShape g : {llmc::kBlock1x128, llmc::kBlock128x128})
      for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2})
        for (bool pow2 : {false, true})
          for (Outputs o : {Outputs::Both, Outputs::DataOnly, Outputs::TransposedOnly}) {
            const std::string what = llmc::strformat("blockwise %s %dx%d %s pow2 %d %s", gname(g).c_str(), sh.rows,
                                                     sh.cols, fname(f), int(pow2), outputs_name(o));
            const size_t ns = llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), sh.rows, sh.cols);
            const size_t ns_t = llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), sh.cols, sh.rows);
            DeviceBuffer<uint8_t> data(n), data_t(n);
            DeviceBuffer<float> si(ns), si_t(ns_t), d_amax(1);  // all poisoned
            QTensor q;
            q.rows = sh.rows;
            q.cols = sh.cols;
            q.encoding.element = f;
            q.encoding.block = g;
            if (o != Outputs::TransposedOnly) q.data = data.ptr, q.scale_inv = si.ptr;
            if (o != Outputs::DataOnly) q.data_t = data_t.ptr, q.scale_inv_t = si_t.ptr;
            q.amax = d_amax.ptr;
            quantize_blockwise(q, dx.ptr, pow2);
            std::vector<uint8_t> want(n), want_t(n);
            std::vector<float> want_si(ns), want_si_t(ns_t);
            llmc::fp8_quantize_blockwise_cpu(want.data(), want_si.data(), want_t.data(), want_si_t.data(), x.data(),
                                             sh.rows, sh.cols, encoding(f, g, pow2));
            if (q.data) {
              ASSERT_TRUE(same_codes(what + ": data", data.download(), want, sh.rows, sh.cols, f, x_at));
              ASSERT_TRUE(same_floats(what + ": scale_inv (GEMM-ready layout, padding 1)", si.download(), want_si,
                                      llmc::scale_inv_ld(encoding(ElementFormat::E4M3, g), sh.rows, sh.cols)));
            } else {
              ASSERT_TRUE(same_codes(what + ": data (not requested: untouched)", data.download(),
                                     std::vector<uint8_t>(n, 0xff), sh.rows, sh.cols, f, x_at));
            }
            if (q.data_t) {
              ASSERT_TRUE(same_codes(what + ": data_t", data_t.download(), want_t, sh.cols, sh.rows, f, x_at_t));
              ASSERT_TRUE(same_floats(what + ": scale_inv_t (GEMM-ready layout, padding 1)", si_t.download(), want_si_t,
                                      llmc::scale_inv_ld(encoding(ElementFormat::E4M3, g), sh.cols, sh.rows)));
            } else {
              ASSERT_TRUE(same_codes(what + ": data_t (not requested: untouched)", data_t.download(),
                                     std::vector<uint8_t>(n, 0xff), sh.cols, sh.rows, f, x_at_t));
            }
            ASSERT_TRUE(same_floats(what + ": q.amax", d_amax.download(), {llmc::amax_bf16_cpu(x.data(), n)}));
            ASSERT_TRUE(data.guard_intact("data") && data_t.guard_intact("data_t") && si.guard_intact("scale_inv") &&
                        si_t.guard_intact("scale_inv_t") && d_amax.guard_intact("amax"));
          }
  }
}

// inf and NaN in the input: per-tensor codes saturate / become the NaN code; a block holding inf or NaN takes scale 1;
// the amax is NaN (its bits exceed inf's). Kept apart so a device NaN-code difference is named as such.
TEST(QuantizeNonFinite, InfAndNanInputsMatchHost) {
  std::mt19937_64 rng = make_rng();
  const int rows = 256, cols = 256;
  std::vector<float> x = make_input(rows, cols, rng);
  x[3 * cols + 5] = INFINITY;         // tile (0, 0), row block (3, 0), column block (0, 5)
  x[200 * cols + 130] = -INFINITY;    // tile (1, 1)
  x[10 * cols + 200] = std::numeric_limits<float>::quiet_NaN();  // tile (0, 1)
  const size_t n = x.size();
  DeviceBuffer<bf16> dx(to_bf16(x));
  auto x_at = [&](int r, int c) { return x[static_cast<size_t>(r) * cols + c]; };
  for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2}) {
    {
      DeviceBuffer<uint8_t> data(n), data_t(n);
      DeviceBuffer<float> d_scale(std::vector<float>{2.0f}), d_amax(std::vector<float>{0.0f});
      QTensor q;
      q.rows = rows, q.cols = cols, q.encoding.element = f, q.data = data.ptr, q.data_t = data_t.ptr,
      q.scale = d_scale.ptr;
      llmc::fp8_quantize_tensorwise(q, dx.ptr, d_amax.ptr, 0);
      std::vector<uint8_t> want(n), want_t(n);
      float want_amax = 0.0f;
      llmc::fp8_quantize_tensorwise_cpu(want.data(), want_t.data(), &want_amax, x.data(), rows, cols, 2.0f, f);
      EXPECT_TRUE(same_codes(std::string("non-finite tensorwise ") + fname(f), data.download(), want, rows, cols, f, x_at));
      EXPECT_TRUE(std::isnan(d_amax.download()[0])) << "amax of a tensor holding NaN is NaN";
    }
    for (BlockShape g : {llmc::kBlock1x128, llmc::kBlock128x128}) {
      DeviceBuffer<uint8_t> data(n), data_t(n);
      DeviceBuffer<float> si(llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), rows, cols)),
          si_t(llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), cols, rows)), d_amax(1);
      QTensor q;
      q.rows = rows, q.cols = cols, q.encoding.element = f, q.encoding.block = g;
      q.data = data.ptr, q.scale_inv = si.ptr, q.data_t = data_t.ptr, q.scale_inv_t = si_t.ptr, q.amax = d_amax.ptr;
      quantize_blockwise(q, dx.ptr, false);
      std::vector<uint8_t> want(n), want_t(n);
      std::vector<float> want_si(si.n), want_si_t(si_t.n);
      llmc::fp8_quantize_blockwise_cpu(want.data(), want_si.data(), want_t.data(), want_si_t.data(), x.data(), rows,
                                       cols, encoding(f, g, false));
      const std::string what = std::string("non-finite blockwise ") + gname(g).c_str() + " " + fname(f);
      EXPECT_TRUE(same_codes(what + ": data", data.download(), want, rows, cols, f, x_at));
      EXPECT_TRUE(same_floats(what + ": scale_inv", si.download(), want_si));
      EXPECT_TRUE(same_floats(what + ": scale_inv_t", si_t.download(), want_si_t));
      EXPECT_TRUE(std::isnan(d_amax.download()[0]));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
TEST(Dequantize, MatchesHostForEveryGranularityAndTransposedCopies) {
  std::mt19937_64 rng = make_rng();
  for (const Shape& sh : {Shape{1000, 784}, Shape{256, 768}, Shape{7, 48}}) {
    const std::vector<float> x = make_input(sh.rows, sh.cols, rng);
    DeviceBuffer<bf16> dx(to_bf16(x));
    const size_t n = x.size();
    for (BlockShape g : {llmc::kWholeTensor, llmc::kBlock1x128, llmc::kBlock128x128})
      for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2}) {
        DeviceBuffer<uint8_t> data(n), data_t(n);
        DeviceBuffer<float> si(llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), sh.rows, sh.cols)),
            si_t(llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), sh.cols, sh.rows));
        const float scale =
            llmc::fp8_scale_from_amax_cpu(llmc::amax_bf16_cpu(x.data(), n), 1.0f, encoding(f, llmc::kWholeTensor), 0);
        DeviceBuffer<float> d_scale(std::vector<float>{scale});
        QTensor q;
        q.rows = sh.rows, q.cols = sh.cols, q.encoding.element = f, q.encoding.block = g, q.data = data.ptr,
        q.data_t = data_t.ptr;
        if (g == llmc::kWholeTensor) {
          si.upload({1.0f / scale});
          q.scale = d_scale.ptr, q.scale_inv = si.ptr;
          llmc::fp8_quantize_tensorwise(q, dx.ptr, nullptr, 0);
        } else {
          q.scale_inv = si.ptr, q.scale_inv_t = si_t.ptr;
          quantize_blockwise(q, dx.ptr, false);
        }
        for (bool transposed : {false, true}) {
          const int rows = transposed ? sh.cols : sh.rows, cols = transposed ? sh.rows : sh.cols;
          DeviceBuffer<float> out(n);
          llmc::fp8_dequantize(out.ptr, q, transposed, 0);
          const std::vector<uint8_t> codes = transposed ? data_t.download() : data.download();
          const std::vector<float> scales = transposed && g != llmc::kWholeTensor ? si_t.download() : si.download();
          std::vector<float> want(n);
          llmc::fp8_dequantize_cpu(want.data(), codes.data(), scales.data(), rows, cols, encoding(f, g));
          ASSERT_TRUE(same_floats(llmc::strformat("dequantize %s %s %dx%d%s", gname(g).c_str(), fname(f), sh.rows,
                                                  sh.cols, transposed ? " transposed" : ""),
                                  out.download(), want, cols));
          ASSERT_TRUE(out.guard_intact("out"));
        }
      }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Telemetry: counts, amax and scale exact; the sums (FP64 in another order than the host's) to 1e-9 relative.
::testing::AssertionResult same_stats(const std::string& what, const llmc::QuantStats& got,
                                      const llmc::QuantStats& want) {
  auto rel = [](double a, double b) { return a == b ? 0.0 : std::fabs(a - b) / std::max(std::fabs(a), std::fabs(b)); };
  std::string bad;
  if (got.amax != want.amax)
    bad += llmc::strformat(" amax %.9g vs %.9g;", got.amax, want.amax);
  if (got.scale != want.scale) bad += llmc::strformat(" scale %.17g vs %.17g;", got.scale, want.scale);
  if (got.saturated_frac != want.saturated_frac)
    bad += llmc::strformat(" saturated_frac %.17g vs %.17g;", got.saturated_frac, want.saturated_frac);
  if (got.underflow_frac != want.underflow_frac)
    bad += llmc::strformat(" underflow_frac %.17g vs %.17g;", got.underflow_frac, want.underflow_frac);
  if (got.clipped_frac != want.clipped_frac)
    bad += llmc::strformat(" clipped_frac %.17g vs %.17g;", got.clipped_frac, want.clipped_frac);
  const bool both_inf = std::isinf(got.snr_db) && std::isinf(want.snr_db);
  if (!both_inf && !(rel(got.snr_db, want.snr_db) <= 1e-9))
    bad += llmc::strformat(" snr_db %.17g vs %.17g;", got.snr_db, want.snr_db);
  if (bad.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ":" << bad;
}

TEST(QuantStats, MatchHostAndAreDeterministic) {
  std::mt19937_64 rng = make_rng();
  for (const Shape& sh : {Shape{1000, 784}, Shape{4096, 1024}, Shape{16, 16}, Shape{130, 272}}) {
    const std::vector<float> x = make_input(sh.rows, sh.cols, rng);
    DeviceBuffer<bf16> dx(to_bf16(x));
    const size_t n = x.size();
    for (BlockShape g : {llmc::kWholeTensor, llmc::kBlock1x128, llmc::kBlock128x128})
      for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2})
        for (bool pow2 : {false, true}) {  // block scales FP32 or power-of-two (the clipped count's multiplier)
          if (pow2 && g == llmc::kWholeTensor) continue;
          DeviceBuffer<uint8_t> data(n);
          DeviceBuffer<float> si(llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), sh.rows, sh.cols));
          // per-tensor: 4x the amax scale, so outliers saturate
          const float scale = 4.0f * llmc::fp8_scale_from_amax_cpu(llmc::amax_bf16_cpu(x.data(), n), 1.0f,
                                                                   encoding(f, llmc::kWholeTensor), 0);
          DeviceBuffer<float> d_scale(std::vector<float>{scale});
          QTensor q;
          q.rows = sh.rows, q.cols = sh.cols, q.encoding = encoding(f, g, pow2), q.data = data.ptr,
          q.scale_inv = si.ptr;
          if (g == llmc::kWholeTensor) {
            si.upload({1.0f / scale});
            q.scale = d_scale.ptr;
            llmc::fp8_quantize_tensorwise(q, dx.ptr, nullptr, 0);
          } else {
            quantize_blockwise(q, dx.ptr, pow2);
          }
          // The second run goes through the dispatch point (llmc/precision/quantize.h): the same kernels, the same
          // bits.
          DeviceBuffer<double> slots(llmc::kQuantStatsSlots), slots2(llmc::kQuantStatsSlots);
          llmc::fp8_quant_stats(slots.ptr, q, dx.ptr, 0);
          llmc::quant_stats(slots2.ptr, q, dx.ptr, 0);
          const std::vector<double> s = slots.download(), s2 = slots2.download();
          const std::string what = llmc::strformat("stats %s %s%s %dx%d", gname(g).c_str(), fname(f),
                                                   pow2 ? " pow2" : "", sh.rows, sh.cols);
          ASSERT_EQ(std::memcmp(s.data(), s2.data(), sizeof(double) * s.size()), 0) << what << ": two runs differ";
          EXPECT_EQ(s[llmc::kStatElements], double(n)) << what << ": element count";
          const std::vector<uint8_t> codes = data.download();
          const std::vector<float> scales = si.download();
          const llmc::QuantStats want =
              llmc::fp8_quant_stats_cpu(x.data(), codes.data(), scales.data(), sh.rows, sh.cols, q.encoding, scale);
          ASSERT_TRUE(same_stats(what, llmc::finish_quant_stats(s.data()), want));
          if (g == llmc::kWholeTensor) {
            EXPECT_GT(want.saturated_frac, 0.0) << what << ": the test saturates";
            EXPECT_GT(want.clipped_frac, 0.0) << what << ": the test clips";
          }
          EXPECT_GT(want.underflow_frac, 0.0) << what << ": the test underflows";
        }
  }
}

// ---------------------------------------------------------------------------------------------------------------
TEST(Determinism, CastsAreBitIdenticalAcrossRuns) {
  std::mt19937_64 rng = make_rng();
  const int rows = 1000, cols = 784;
  const std::vector<float> x = make_input(rows, cols, rng);
  DeviceBuffer<bf16> dx(to_bf16(x));
  const size_t n = x.size();
  for (BlockShape g : {llmc::kWholeTensor, llmc::kBlock1x128, llmc::kBlock128x128}) {
    std::vector<uint8_t> first, first_t;
    std::vector<float> first_si, first_amax;
    for (int run = 0; run < 2; run++) {
      DeviceBuffer<uint8_t> data(n), data_t(n);
      DeviceBuffer<float> si(llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), rows, cols)),
          si_t(llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), cols, rows));
      DeviceBuffer<float> d_scale(std::vector<float>{3.0f}), d_amax(std::vector<float>{0.0f});
      QTensor q;
      q.rows = rows, q.cols = cols, q.encoding.block = g, q.data = data.ptr, q.data_t = data_t.ptr;
      q.scale = d_scale.ptr, q.scale_inv = si.ptr, q.scale_inv_t = si_t.ptr, q.amax = d_amax.ptr;
      if (g == llmc::kWholeTensor)
        llmc::fp8_quantize_tensorwise(q, dx.ptr, d_amax.ptr, 0);
      else
        quantize_blockwise(q, dx.ptr, false);
      if (run == 0) {
        first = data.download(), first_t = data_t.download(), first_si = si.download(), first_amax = d_amax.download();
      } else {
        EXPECT_TRUE(data.download() == first) << gname(g);
        EXPECT_TRUE(data_t.download() == first_t) << gname(g);
        EXPECT_TRUE(same_floats(gname(g) + " scale_inv", si.download(), first_si));
        EXPECT_TRUE(same_floats(gname(g) + " amax", d_amax.download(), first_amax));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// More than 2^31 elements: size_t indexing in every address. x is filled on the device from a hash of the index;
// sampled blocks near the end are checked against the host reference computed from the same hash.
__host__ __device__ inline uint16_t pattern_bf16(size_t i) {
  uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  const uint32_t sign = static_cast<uint32_t>(h & 1) << 15;
  const uint32_t exponent = 127 - 12 + static_cast<uint32_t>((h >> 1) % 16);  // 2^-12 .. 2^3
  const uint32_t mantissa = static_cast<uint32_t>(h >> 8) & 0x7f;
  return static_cast<uint16_t>(sign | (exponent << 7) | mantissa);
}
__global__ void fill_pattern_kernel(uint16_t* x, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] = pattern_bf16(i);
}

TEST(LargeTensor, MoreThan2Pow31ElementsUseSizeTIndexing) {
  const int rows = 65600, cols = 32768;  // 2.15e9 elements
  const size_t n = static_cast<size_t>(rows) * cols;
  const size_t need = n * 2 + 2 * n + (size_t(64) << 20);
  size_t free_bytes = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  if (free_bytes < need + (size_t(1) << 30)) GTEST_SKIP() << "needs " << (need >> 20) << " MiB of GPU memory";
  std::mt19937_64 rng = make_rng();
  uint16_t* x = nullptr;
  uint8_t *data = nullptr, *data_t = nullptr;
  CUDA_CHECK(cudaMalloc(&x, n * 2));
  CUDA_CHECK(cudaMalloc(&data, n));
  CUDA_CHECK(cudaMalloc(&data_t, n));
  fill_pattern_kernel<<<4096, 256>>>(x, n);
  CUDA_CHECK_LAUNCH();
  const float big = 1000.0f;  // the tensor's amax, at its very last element
  const uint16_t big_bits = llmc::bf16_encode(big);
  CUDA_CHECK(cudaMemcpy(x + n - 1, &big_bits, 2, cudaMemcpyHostToDevice));
  auto host_x = [&](int r, int c) {
    const size_t i = static_cast<size_t>(r) * cols + c;
    return i == n - 1 ? big : llmc::bf16_decode(pattern_bf16(i));
  };
  auto fetch = [](const uint8_t* p, size_t offset, size_t count) {
    std::vector<uint8_t> v(count);
    CUDA_CHECK(cudaMemcpy(v.data(), p + offset, count, cudaMemcpyDeviceToHost));
    return v;
  };
  std::uniform_int_distribution<int> rrow(rows - 2000, rows - 1), rcol(0, cols / 128 - 1);
  const ElementFormat f = ElementFormat::E4M3;

  {  // per-tensor, both copies
    float* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, 2 * sizeof(float)));
    const float init[2] = {4.0f, 0.0f};
    CUDA_CHECK(cudaMemcpy(d, init, sizeof(init), cudaMemcpyHostToDevice));
    QTensor q;
    q.rows = rows, q.cols = cols, q.encoding.element = f, q.data = data, q.data_t = data_t, q.scale = d;
    llmc::fp8_quantize_tensorwise(q, reinterpret_cast<const bf16*>(x), d + 1, 0);
    float amax = 0.0f;
    CUDA_CHECK(cudaMemcpy(&amax, d + 1, sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(amax, big);
    for (int s = 0; s < 64; s++) {
      const int r = s == 0 ? rows - 1 : rrow(rng), c0 = (s == 0 ? cols / 128 - 1 : rcol(rng)) * 128;
      const std::vector<uint8_t> got = fetch(data, static_cast<size_t>(r) * cols + c0, 128);
      for (int c = 0; c < 128; c++)
        ASSERT_EQ(got[c], llmc::fp8_encode(host_x(r, c0 + c) * 4.0f, f)) << "tensorwise data r " << r << " c " << c0 + c;
      const std::vector<uint8_t> got_t = fetch(data_t, static_cast<size_t>(c0) * rows + (rows - 128), 128);
      for (int i = 0; i < 128; i++)
        ASSERT_EQ(got_t[i], llmc::fp8_encode(host_x(rows - 128 + i, c0) * 4.0f, f))
            << "tensorwise data_t c " << c0 << " r " << rows - 128 + i;
    }
    CUDA_CHECK(cudaFree(d));
  }
  {  // 1x128 blocks, both copies
    const BlockShape g = llmc::kBlock1x128;
    const size_t ns = llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), rows, cols),
                 ns_t = llmc::scale_inv_count(encoding(ElementFormat::E4M3, g), cols, rows);
    float *si = nullptr, *si_t = nullptr, *amax = nullptr;
    CUDA_CHECK(cudaMalloc(&si, ns * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&si_t, ns_t * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&amax, sizeof(float)));
    QTensor q;
    q.rows = rows, q.cols = cols, q.encoding.element = f, q.encoding.block = g;
    q.data = data, q.data_t = data_t, q.scale_inv = si, q.scale_inv_t = si_t, q.amax = amax;
    quantize_blockwise(q, reinterpret_cast<const bf16*>(x), true);
    float got_amax = 0.0f;
    CUDA_CHECK(cudaMemcpy(&got_amax, amax, sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got_amax, big);
    const int ld = llmc::scale_inv_ld(encoding(ElementFormat::E4M3, g), rows, cols),
              ld_t = llmc::scale_inv_ld(encoding(ElementFormat::E4M3, g), cols, rows);
    const int last_rb = (rows - 1) / 128;
    for (int s = 0; s < 64; s++) {
      const int r = s == 0 ? rows - 1 : rrow(rng), kb = s == 0 ? cols / 128 - 1 : rcol(rng);
      float m = 0.0f;
      for (int c = 0; c < 128; c++) m = std::max(m, std::fabs(host_x(r, kb * 128 + c)));
      const float scale = llmc::fp8_scale_from_amax_cpu(m, 1.0f, encoding(f, llmc::kWholeTensor, true), 0);
      const std::vector<uint8_t> got = fetch(data, static_cast<size_t>(r) * cols + kb * 128, 128);
      for (int c = 0; c < 128; c++)
        ASSERT_EQ(got[c], llmc::fp8_encode(host_x(r, kb * 128 + c) * scale, f)) << "1x128 data r " << r;
      float got_si = 0.0f;
      CUDA_CHECK(cudaMemcpy(&got_si, si + static_cast<size_t>(kb) * ld + r, sizeof(float), cudaMemcpyDeviceToHost));
      ASSERT_EQ(got_si, 1.0f / scale) << "1x128 scale_inv r " << r << " kb " << kb;
      // the column block (last_rb, c) of column c = kb * 128 + (s % 128), written at data_t[c * rows + r]
      const int c = kb * 128 + s % 128, rb_rows = rows - last_rb * 128;
      float mc = 0.0f;
      for (int i = 0; i < rb_rows; i++) mc = std::max(mc, std::fabs(host_x(last_rb * 128 + i, c)));
      const float scale_c = llmc::fp8_scale_from_amax_cpu(mc, 1.0f, encoding(f, llmc::kWholeTensor, true), 0);
      const std::vector<uint8_t> got_t = fetch(data_t, static_cast<size_t>(c) * rows + last_rb * 128, rb_rows);
      for (int i = 0; i < rb_rows; i++)
        ASSERT_EQ(got_t[i], llmc::fp8_encode(host_x(last_rb * 128 + i, c) * scale_c, f)) << "128x1 data_t c " << c;
      float got_si_t = 0.0f;
      CUDA_CHECK(cudaMemcpy(&got_si_t, si_t + static_cast<size_t>(last_rb) * ld_t + c, sizeof(float),
                            cudaMemcpyDeviceToHost));
      ASSERT_EQ(got_si_t, 1.0f / scale_c) << "128x1 scale_inv_t c " << c;
    }
    CUDA_CHECK(cudaFree(si));
    CUDA_CHECK(cudaFree(si_t));
    CUDA_CHECK(cudaFree(amax));
  }
  CUDA_CHECK(cudaFree(x));
  CUDA_CHECK(cudaFree(data));
  CUDA_CHECK(cudaFree(data_t));
}

// ---------------------------------------------------------------------------------------------------------------
// The dispatch point (llmc/precision/quantize.h) against the host references: both sources of a whole-tensor scale
// (from an amax inside the cast's launch; a stored scale, the amax recorded) and both block encodings reach their
// kernel with the encoding's element format and power-of-two scales, bit for bit (codes, scales, amax).
TEST(QuantizeDispatch, MatchesHostForEveryScaleSourceAndEncoding) {
  std::mt19937_64 rng = make_rng();
  int cases = 0;
  for (const Shape& sh : {Shape{256, 768}, Shape{130, 272}, Shape{7, 48}}) {
    const std::vector<float> x = make_input(sh.rows, sh.cols, rng);
    DeviceBuffer<bf16> dx(to_bf16(x));
    const size_t n = x.size();
    const float amax = llmc::amax_bf16_cpu(x.data(), n);
    auto x_at = [&](int r, int c) { return x[static_cast<size_t>(r) * sh.cols + c]; };
    auto x_at_t = [&](int c, int r) { return x[static_cast<size_t>(r) * sh.cols + c]; };
    for (ElementFormat f : {ElementFormat::E4M3, ElementFormat::E5M2})
      for (bool pow2 : {false, true}) {
        const Encoding tensor = encoding(f, llmc::kWholeTensor, pow2);
        std::vector<uint8_t> want(n), want_t(n);
        {  // the scale from the amax, margin 1, computed in the cast's launch
          const std::string what =
              llmc::strformat("dispatch %s amax %dx%d", llmc::encoding_name(tensor).c_str(), sh.rows, sh.cols);
          const float previous = 0.5f;
          DeviceBuffer<uint8_t> data(n), data_t(n);
          DeviceBuffer<float> d_scale(std::vector<float>{previous}), d_scale_inv(1), d_amax(std::vector<float>{amax});
          QTensor q;
          q.rows = sh.rows, q.cols = sh.cols, q.encoding = tensor;
          q.data = data.ptr, q.data_t = data_t.ptr, q.scale = d_scale.ptr, q.scale_inv = d_scale_inv.ptr;
          llmc::QuantizeArgs args;
          args.source = llmc::ScaleSource::Amax;
          args.amax = d_amax.ptr;
          args.margin = 1;
          llmc::quantize(q, dx.ptr, args, 0);
          const float scale = llmc::fp8_scale_from_amax_cpu(amax, previous, tensor, 1);
          llmc::fp8_quantize_tensorwise_cpu(want.data(), want_t.data(), nullptr, x.data(), sh.rows, sh.cols, scale, f);
          ASSERT_TRUE(same_codes(what + ": data", data.download(), want, sh.rows, sh.cols, f, x_at));
          ASSERT_TRUE(same_codes(what + ": data_t", data_t.download(), want_t, sh.cols, sh.rows, f, x_at_t));
          ASSERT_TRUE(same_floats(what + ": scale", d_scale.download(), {scale}));
          ASSERT_TRUE(same_floats(what + ": scale_inv", d_scale_inv.download(), {1.0f / scale}));
          cases++;
        }
        {  // a stored scale (2x too large: outliers saturate), the amax recorded into amax_out (a running max)
          const std::string what =
              llmc::strformat("dispatch %s stored %dx%d", llmc::encoding_name(tensor).c_str(), sh.rows, sh.cols);
          const float scale = 2.0f * llmc::fp8_scale_from_amax_cpu(amax, 1.0f, tensor, 0);
          DeviceBuffer<uint8_t> data(n), data_t(n);
          DeviceBuffer<float> d_scale(std::vector<float>{scale}), d_out(std::vector<float>{0.0f});
          QTensor q;
          q.rows = sh.rows, q.cols = sh.cols, q.encoding = tensor;
          q.data = data.ptr, q.data_t = data_t.ptr, q.scale = d_scale.ptr;
          llmc::QuantizeArgs args;
          args.source = llmc::ScaleSource::Stored;
          args.amax_out = d_out.ptr;
          llmc::quantize(q, dx.ptr, args, 0);
          float want_amax = 0.0f;
          llmc::fp8_quantize_tensorwise_cpu(want.data(), want_t.data(), &want_amax, x.data(), sh.rows, sh.cols, scale,
                                            f);
          ASSERT_TRUE(same_codes(what + ": data", data.download(), want, sh.rows, sh.cols, f, x_at));
          ASSERT_TRUE(same_codes(what + ": data_t", data_t.download(), want_t, sh.cols, sh.rows, f, x_at_t));
          ASSERT_TRUE(same_floats(what + ": amax_out", d_out.download(), {want_amax}));
          ASSERT_TRUE(same_floats(what + ": the stored scale is unchanged", d_scale.download(), {scale}));
          cases++;
        }
        for (BlockShape g : {llmc::kBlock1x128, llmc::kBlock128x128}) {  // block scales (the args do not apply)
          const Encoding e = encoding(f, g, pow2);
          const std::string what =
              llmc::strformat("dispatch %s %dx%d", llmc::encoding_name(e).c_str(), sh.rows, sh.cols);
          const size_t ns = llmc::scale_inv_count(e, sh.rows, sh.cols),
                       ns_t = llmc::scale_inv_count(e, sh.cols, sh.rows);
          DeviceBuffer<uint8_t> data(n), data_t(n);
          DeviceBuffer<float> si(ns), si_t(ns_t), d_amax(1);
          QTensor q;
          q.rows = sh.rows, q.cols = sh.cols, q.encoding = e;
          q.data = data.ptr, q.data_t = data_t.ptr, q.scale_inv = si.ptr, q.scale_inv_t = si_t.ptr, q.amax = d_amax.ptr;
          llmc::quantize(q, dx.ptr, llmc::QuantizeArgs(), 0);
          std::vector<float> want_si(ns), want_si_t(ns_t);
          llmc::fp8_quantize_blockwise_cpu(want.data(), want_si.data(), want_t.data(), want_si_t.data(), x.data(),
                                           sh.rows, sh.cols, e);
          ASSERT_TRUE(same_codes(what + ": data", data.download(), want, sh.rows, sh.cols, f, x_at));
          ASSERT_TRUE(same_codes(what + ": data_t", data_t.download(), want_t, sh.cols, sh.rows, f, x_at_t));
          ASSERT_TRUE(same_floats(what + ": scale_inv", si.download(), want_si));
          ASSERT_TRUE(same_floats(what + ": scale_inv_t", si_t.download(), want_si_t));
          ASSERT_TRUE(same_floats(what + ": amax", d_amax.download(), {amax}));
          cases++;
        }
      }
  }
  EXPECT_EQ(cases, 3 * 2 * 2 * 4);
}

// ---------------------------------------------------------------------------------------------------------------
TEST(QuantErrors, BadShapesAreClearErrors) {
  DeviceBuffer<bf16> x(64 * 64);
  DeviceBuffer<uint8_t> data(64 * 64);
  DeviceBuffer<float> s(64);
  QTensor q;
  q.rows = 64, q.cols = 40, q.data = data.ptr, q.scale = s.ptr, q.scale_inv = s.ptr;
  try {
    llmc::fp8_quantize_tensorwise(q, x.ptr, nullptr, 0);
    ADD_FAILURE() << "cols = 40 accepted";
  } catch (const llmc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("q.cols = 40"), std::string::npos) << e.what();
  }
  q.encoding.block = llmc::kBlock1x128;
  EXPECT_THROW(quantize_blockwise(q, x.ptr, false), llmc::Error);
  q.cols = 64;
  q.encoding.block = llmc::kWholeTensor;
  EXPECT_THROW(quantize_blockwise(q, x.ptr, false), llmc::Error);
  CUDA_CHECK(cudaDeviceSynchronize());  // nothing was launched
}

}  // namespace
