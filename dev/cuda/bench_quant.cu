// dev/cuda/bench_quant: times the FP8 quantisation kernels of llmc/precision/fp8_quant.h on (16384, 768) and (16384,
// 3072) bf16 tensors (GPT-2 124M activations: the attention / MLP inputs at B*T = 16K): warm-up, then the median of
// repeated cudaEvent timings; prints ms and the achieved GB/s with bytes = x read once + every output written once (the
// ideal traffic of a memory-bound kernel; scales included), and the fraction of the device's theoretical DRAM
// bandwidth. Before timing, each cast's first 256 rows are checked against the host reference (codes and scales); the
// full check is test/precision/test_quant.
// Usage: bench_quant [repeats]   (default 20)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/precision/encoding.h"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/quantize.h"
#include "test/reference/precision_ref.h"

using llmc::bf16;
using llmc::ElementFormat;
using llmc::Encoding;
using llmc::QTensor;

namespace {

std::vector<void*> g_allocations;  // freed at exit

template <class T>
T* device_alloc(size_t n) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(n, 1) * sizeof(T)));
  g_allocations.push_back(d);
  return d;
}

int g_repeats = 20;
double g_peak_gbs = 0.0;

double time_ms(const std::function<void()>& launch) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < 3 + g_repeats; i++) {
    CUDA_CHECK(cudaEventRecord(start));
    launch();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) times.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void report(const std::string& name, double ms, double bytes) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-44s %9.4f ms %9.1f GB/s %6.1f%% of peak\n", name.c_str(), ms, gbs,
              g_peak_gbs > 0 ? 100.0 * gbs / g_peak_gbs : 0.0);
}

// First `check_rows` rows of data (and their 1x128 / per-tensor scales) against the host reference. Only the
// row-major copy: data_t and the 128x1 / 128x128 blocks need all rows of a block; test_quant checks them.
bool check_rows(const QTensor& q, const std::vector<float>& x_host, int check_rows, float scale) {
  const int rows = std::min(q.rows, check_rows), cols = q.cols;
  std::vector<uint8_t> got(static_cast<size_t>(rows) * cols), want(got.size());
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(got.data(), q.data, got.size(), cudaMemcpyDeviceToHost));
  if (q.encoding.per_tensor()) {
    llmc::fp8_quantize_tensorwise_cpu(want.data(), nullptr, nullptr, x_host.data(), rows, cols, scale,
                                      q.encoding.element);
  } else if (q.encoding.block == llmc::kBlock1x128) {
    std::vector<float> si(llmc::scale_inv_count(q.encoding, rows, cols));
    llmc::fp8_quantize_blockwise_cpu(want.data(), si.data(), nullptr, nullptr, x_host.data(), rows, cols, q.encoding);
  } else {
    return true;  // 128x128 tiles need the whole tile: covered by test_quant
  }
  return got == want;
}

void bench_shape(int rows, int cols, std::mt19937& rng) {
  const size_t n = static_cast<size_t>(rows) * cols;
  std::printf("\n(%d, %d) bf16, %.1f MB\n", rows, cols, n * 2 / 1e6);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x_host(n);
  std::vector<bf16> x_bf16(n);
  for (size_t i = 0; i < n; i++) {
    x_host[i] = llmc::bf16_decode(llmc::bf16_encode(normal(rng)));
    x_bf16[i] = __float2bfloat16_rn(x_host[i]);
  }
  bf16* x = device_alloc<bf16>(n);
  CUDA_CHECK(cudaMemcpy(x, x_bf16.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  uint8_t* data = device_alloc<uint8_t>(n);
  uint8_t* data_t = device_alloc<uint8_t>(n);
  float* amax = device_alloc<float>(1);
  float* scale = device_alloc<float>(1);
  float* scale_inv = device_alloc<float>(1);
  const float amax_host = llmc::amax_bf16_cpu(x_host.data(), n);
  const Encoding tensor{ElementFormat::E4M3, llmc::kWholeTensor};
  const float scale_host = llmc::fp8_scale_from_amax_cpu(amax_host, 1.0f, tensor, 0);
  const float scale_inv_host = 1.0f / scale_host;
  CUDA_CHECK(cudaMemcpy(scale, &scale_host, sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(scale_inv, &scale_inv_host, sizeof(float), cudaMemcpyHostToDevice));
  const double bx = 2.0 * n, b8 = static_cast<double>(n);

  report("amax_bf16", time_ms([&] {
           CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float)));
           llmc::amax_bf16(amax, x, n, 0);
         }),
         bx);

  QTensor q;
  q.rows = rows, q.cols = cols, q.encoding = tensor, q.scale = scale, q.scale_inv = scale_inv;
  q.data = data;
  llmc::fp8_quantize_tensorwise(q, x, nullptr, 0);
  const bool ok_t = check_rows(q, x_host, 256, scale_host);
  report(std::string("tensorwise cast") + (ok_t ? "" : " [MISMATCH]"),
         time_ms([&] { llmc::fp8_quantize_tensorwise(q, x, nullptr, 0); }), bx + b8);
  q.data_t = data_t;
  report("tensorwise cast + transpose", time_ms([&] { llmc::fp8_quantize_tensorwise(q, x, nullptr, 0); }),
         bx + 2 * b8);
  report("tensorwise cast + transpose + amax", time_ms([&] { llmc::fp8_quantize_tensorwise(q, x, amax, 0); }),
         bx + 2 * b8);

  for (llmc::BlockShape g : {llmc::kBlock1x128, llmc::kBlock128x128}) {
    const Encoding e{ElementFormat::E4M3, g, llmc::ScaleFormat::Pow2FP32};
    const size_t ns = llmc::scale_inv_count(e, rows, cols), ns_t = llmc::scale_inv_count(e, cols, rows);
    QTensor b;
    b.rows = rows, b.cols = cols, b.encoding = e;
    b.data = data, b.scale_inv = device_alloc<float>(ns), b.amax = amax;
    llmc::fp8_quantize_blockwise(b, x, 0);
    const bool ok = check_rows(b, x_host, 256, 0.0f);
    const std::string name = std::string("blockwise ") + llmc::block_shape_name(g);
    report(name + " data" + (ok ? "" : " [MISMATCH]"), time_ms([&] { llmc::fp8_quantize_blockwise(b, x, 0); }),
           bx + b8 + 4.0 * ns);
    b.data_t = data_t, b.scale_inv_t = device_alloc<float>(ns_t);
    report(name + " data + data_t", time_ms([&] { llmc::fp8_quantize_blockwise(b, x, 0); }),
           bx + 2 * b8 + 4.0 * (ns + ns_t));
  }

  double* stats = device_alloc<double>(llmc::kQuantStatsSlots);
  QTensor sq = q;
  sq.data_t = nullptr;
  report("fp8_quant_stats (tensor)", time_ms([&] { llmc::fp8_quant_stats(stats, sq, x, 0); }), bx + b8);
  float* out = device_alloc<float>(n);
  report("fp8_dequantize (tensor)", time_ms([&] { llmc::fp8_dequantize(out, sq, false, 0); }), b8 + 4.0 * n);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_repeats = std::max(1, std::atoi(argv[1]));
  if (llmc::cuda_device_count() == 0) {
    std::printf("bench_quant: no CUDA GPU on this machine\n");
    return 1;
  }
  int bus_width = 0, mem_clock_khz = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&bus_width, cudaDevAttrGlobalMemoryBusWidth, 0));
  CUDA_CHECK(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0));
  g_peak_gbs = 2.0 * mem_clock_khz * 1e3 * (bus_width / 8.0) / 1e9;  // DDR: two transfers per clock
  std::printf("bench_quant on %s (theoretical DRAM %.0f GB/s), median of %d\n", llmc::cuda_device_name().c_str(),
              g_peak_gbs, g_repeats);
  std::mt19937 rng(42);
  bench_shape(16384, 768, rng);
  bench_shape(16384, 3072, rng);

  // Delayed scaling: one launch for every per-tensor slot of a model (3 roles x 4 linears x 48 layers).
  const int count = 576, len = 1024;
  std::vector<uint8_t> formats(count, 0);
  float* history = device_alloc<float>(static_cast<size_t>(count) * len);
  CUDA_CHECK(cudaMemset(history, 0, sizeof(float) * count * len));
  float* amax = device_alloc<float>(count);
  float* scale = device_alloc<float>(count);
  float* scale_inv = device_alloc<float>(count);
  uint8_t* d_formats = device_alloc<uint8_t>(count);
  CUDA_CHECK(cudaMemcpy(d_formats, formats.data(), count, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(amax, 0, sizeof(float) * count));
  CUDA_CHECK(cudaMemset(scale, 0, sizeof(float) * count));
  int step = 0;
  std::printf("\n");
  report("fp8_delayed_scaling_update (576 x 1024)", time_ms([&] {
           llmc::fp8_delayed_scaling_update(history, amax, scale, scale_inv, d_formats, count, len, step++ % len, true,
                                            0, llmc::ScaleFormat::FP32, 0);
         }),
         4.0 * count * len + 16.0 * count);
  for (void* p : g_allocations) cudaFree(p);
  return 0;
}
