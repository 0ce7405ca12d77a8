// llmc/optim/state_format_error.cpp: the store-and-read error of an optimizer-state format on FP32 moments (see the
// header).
#include "llmc/optim/state_format_error.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "llmc/core/common.h"

namespace llmc {

namespace {

// values -> storage -> values for n elements, on threads over pieces of whole groups; the k of every fp8_expand group
// (metadata: scale, k, centre) is returned in group order.
std::vector<float> store_and_read(const MomentStorage& storage, const float* values, size_t n, float* out,
                                  int threads) {
  const size_t align = storage.group_size;
  const size_t per = (n + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  const size_t chunk = std::max(align, (per + align - 1) / align * align);
  const size_t pieces = (n + chunk - 1) / chunk;
  std::vector<std::vector<float>> piece_ks(pieces);
  std::vector<std::thread> pool;
  for (size_t p = 0; p < pieces; p++) {
    pool.emplace_back([&, p] {
      const size_t begin = p * chunk, len = std::min(n, begin + chunk) - begin;
      std::vector<uint8_t> block(storage.bytes(len));
      encode_moment(storage, values + begin, len, block.data());
      decode_moment(storage, block.data(), len, out + begin);
      if (storage.scaling == MomentScaling::RangeExpansion) {
        const float* meta = reinterpret_cast<const float*>(block.data());
        for (size_t g = 0; g < storage.num_groups(len); g++)
          piece_ks[p].push_back(meta[g * static_cast<size_t>(storage.scales_per_group) + 1]);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  std::vector<float> ks;
  for (const std::vector<float>& k : piece_ks) ks.insert(ks.end(), k.begin(), k.end());
  return ks;
}

double rel_l2(const float* ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

}  // namespace

StateFormatError state_format_error(const StateFormat& format, const float* m, const float* v, size_t n,
                                    const AdamWStepShape& shape, int threads) {
  if (threads < 1) throw_error("state_format_error: threads must be at least 1 (got %d)", threads);
  if (shape.step < 1) throw_error("state_format_error: the step must be at least 1 (got %lld)",
                                  static_cast<long long>(shape.step));
  StateFormatError e;
  std::vector<float> m2(n), v2(n);
  e.k_m = store_and_read(format.m, m, n, m2.data(), threads);
  e.k_v = store_and_read(format.v, v, n, v2.data(), threads);
  const double t = static_cast<double>(shape.step);
  const double c1 = 1.0 - std::pow(shape.beta1, t), c2 = 1.0 - std::pow(shape.beta2, t);
  auto direction = [&](float mm, float vv) {
    return (mm / c1) / (std::sqrt(std::max(0.0, static_cast<double>(vv) / c2)) + shape.eps);
  };
  double num = 0, den = 0;
  size_t nonzero = 0, lost = 0;
  for (size_t i = 0; i < n; i++) {
    const double u = direction(m[i], v[i]), d = direction(m2[i], v2[i]) - u;
    num += d * d;
    den += u * u;
    nonzero += m[i] != 0.0f;
    lost += m[i] != 0.0f && m2[i] == 0.0f;
  }
  e.m_rel_l2 = rel_l2(m, m2);
  e.v_rel_l2 = rel_l2(v, v2);
  e.u_rel_l2 = den > 0 ? std::sqrt(num / den) : 0.0;
  e.u_mse = n ? num / static_cast<double>(n) : 0.0;
  e.m_lost = nonzero ? static_cast<double>(lost) / static_cast<double>(nonzero) : 0.0;
  return e;
}

}  // namespace llmc
