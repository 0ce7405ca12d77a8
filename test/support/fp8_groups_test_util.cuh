// test/support/fp8_groups_test_util.cuh: device buffers of an FP8 1x16 group copy (llmc/kernels/fp8_groups.h) for the
// GPU tests (test/precision/test_group_quant, test/kernels/test_fp8_activations): codes, scale_inv and group maxima
// of a (rows, cols) tensor, poisoned so that any entry a kernel fails to write shows up, with the kernels' views and
// bitwise comparison against the CPU reference (test/reference/group_quant_ref.h). Header-only.
#pragma once

#include <cstdint>
#include <vector>

#include "llmc/kernels/fp8_groups.h"
#include "test/reference/group_quant_ref.h"
#include "test/support/gpu_test_util.cuh"

namespace gpu_test {

struct DeviceGroups {
  int rows, cols;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scale_inv, group_amax;
  DeviceGroups(int r, int c)
      : rows(r), cols(c), codes(static_cast<size_t>(r) * c),
        scale_inv(static_cast<size_t>(c / llmc::kFp8GroupSize) * llmc::fp8_groups_ld(r)),
        group_amax(static_cast<size_t>(c / llmc::kFp8GroupSize) * llmc::fp8_groups_ld(r)) {
    poison();
  }
  void poison() { codes.poison(), scale_inv.poison(), group_amax.poison(); }
  llmc::Fp8GroupsOut out(bool with_group_amax = true) const {
    llmc::Fp8GroupsOut o;
    o.codes = codes.ptr;
    o.scale_inv = scale_inv.ptr;
    o.group_amax = with_group_amax ? group_amax.ptr : nullptr;
    return o;
  }
  llmc::Fp8Groups in() const { return llmc::Fp8Groups{codes.ptr, scale_inv.ptr}; }
  void upload(const llmc::Fp8GroupsCpu& g) { codes.upload(g.codes), scale_inv.upload(g.scale_inv); }
  // codes and scale_inv (and group_amax, if checked) equal the reference's, bit for bit, padding included.
  ::testing::AssertionResult equals(const char* what, const llmc::Fp8GroupsCpu& want, bool check_group_amax) const {
    auto r = bitwise_equal("codes", codes.download(), want.codes);
    if (!r) return r << " (" << what << ")";
    r = bitwise_equal("scale_inv", scale_inv.download(), want.scale_inv);
    if (!r) return r << " (" << what << ")";
    if (check_group_amax) {
      r = bitwise_equal("group_amax", group_amax.download(), want.group_amax);
      if (!r) return r << " (" << what << ")";
    }
    return ::testing::AssertionSuccess();
  }
};

// bf16-exact floats with a wide range inside and across groups: normal values times 2^e, e in [-spread, spread].
inline std::vector<float> wide_range_bf16(size_t n, std::mt19937_64& rng, int spread) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-spread, spread);
  std::vector<float> x(n);
  for (float& v : x) v = round_bf16(std::ldexp(normal(rng), exponent(rng)));
  return x;
}

// An FP8 copy whose dequantised values are exactly bf16 numbers: random finite codes and power-of-two scales, so the
// BF16 backward on dequant(copy) and the FP8 backward on the copy see the same FP32 inputs.
inline llmc::Fp8GroupsCpu exact_pow2_groups(int rows, int cols, std::mt19937_64& rng, int scale_spread) {
  const int ld = llmc::fp8_groups_ld(rows), groups = cols / llmc::kFp8GroupSize;
  llmc::Fp8GroupsCpu g;
  g.codes.resize(static_cast<size_t>(rows) * cols);
  std::uniform_int_distribution<int> code(0, 255), exponent(-scale_spread, scale_spread);
  for (uint8_t& c : g.codes) {
    do c = static_cast<uint8_t>(code(rng));
    while ((c & 0x7f) == 0x7f);  // no NaN codes
  }
  g.scale_inv.assign(static_cast<size_t>(groups) * ld, 1.0f);
  g.group_amax.assign(g.scale_inv.size(), 0.0f);
  for (int grp = 0; grp < groups; grp++)
    for (int r = 0; r < rows; r++) g.scale_inv[static_cast<size_t>(grp) * ld + r] = std::ldexp(1.0f, exponent(rng));
  return g;
}

}  // namespace gpu_test
