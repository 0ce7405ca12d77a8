// test/precision/test_group_quant: the FP8 1x16 group quantiser, dequantiser and Group Scaling amax of
// llmc/precision/group_quant.h on the GPU against the CPU reference (test/reference/group_quant_ref.h), bit for bit:
// codes, scales and group maxima (padding entries included, buffers poisoned before every launch), on model shapes
// (4096 x 768 / 2048 / 5632 * 2) and odd ones, with all-zero, -0, inf, NaN and tiny groups; the quantize() table's
// entry gives the same bytes; the tensor amax from the group maxima equals max |x| (amax_bf16) bit for bit.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/group_quant.h"
#include "llmc/precision/quantize.h"
#include "test/reference/group_quant_ref.h"
#include "test/support/fp8_groups_test_util.cuh"
#include "test/support/gpu_test_util.cuh"

namespace {

using namespace gpu_test;
using llmc::bf16;

struct Shape {
  int rows, cols;
};
std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  return "R" + std::to_string(info.param.rows) + "_C" + std::to_string(info.param.cols);
}

class GroupQuantTest : public ::testing::TestWithParam<Shape> {};

// x with special groups where the shape has room: row 0 group 0 all zero (one -0), group 1 holds an inf, row 1 group 0
// tiny values (below the 2^-117 clamp), the last group of the last row a NaN.
std::vector<float> inputs(const Shape& s, std::mt19937_64& rng, bool with_nan) {
  std::vector<float> x = wide_range_bf16(static_cast<size_t>(s.rows) * s.cols, rng, 12);
  for (int k = 0; k < 16; k++) x[k] = 0.0f;
  x[3] = -0.0f;
  if (s.cols >= 32) x[20] = -std::numeric_limits<float>::infinity();
  if (s.rows >= 2)
    for (int k = 0; k < 16; k++) x[static_cast<size_t>(s.cols) + k] = round_bf16(std::ldexp(1.0f + k / 8.0f, -128));
  if (with_nan) x[x.size() - 5] = std::numeric_limits<float>::quiet_NaN();
  return to_float(to_bf16(x));  // exactly what the device reads
}

TEST_P(GroupQuantTest, QuantizerMatchesReferenceBitForBit) {
  const Shape s = GetParam();
  auto rng = make_rng("test_group_quant");
  for (bool with_nan : {false, true}) {
    const std::vector<float> x = inputs(s, rng, with_nan);
    const llmc::Fp8GroupsCpu want = llmc::fp8_groups_quantize_cpu(x.data(), s.rows, s.cols);
    auto d_x = upload_bf16(x);
    DeviceGroups g(s.rows, s.cols);
    AmaxSlot tensor_amax;
    llmc::fp8_groups_quantize(g.out(), d_x.ptr, s.rows, s.cols, 0, tensor_amax.ptr);
    EXPECT_TRUE(g.equals("fp8_groups_quantize", want, true));
    // The dequantiser: the reference's values, bit for bit.
    DeviceBuffer<float> d_v(x.size());
    d_v.poison();
    llmc::fp8_groups_dequantize(d_v.ptr, g.in(), s.rows, s.cols, 0);
    EXPECT_TRUE(bitwise_equal("dequantised", d_v.download(),
                              llmc::fp8_groups_dequantize_cpu(want.codes.data(), want.scale_inv.data(), s.rows,
                                                              s.cols)));
    // Group Scaling: max over the group maxima == max |x| by a direct pass, bit for bit.
    AmaxSlot from_groups, direct;
    llmc::fp8_groups_tensor_amax(from_groups.ptr, g.group_amax.ptr, s.rows, s.cols, 0);
    llmc::amax_bf16(direct.ptr, d_x.ptr, x.size(), 0);
    const float a = from_groups.value(), b = direct.value(), c = tensor_amax.value();
    EXPECT_TRUE(same_bits_or_both_nan(a, b)) << a << " vs " << b;
    EXPECT_TRUE(same_bits_or_both_nan(c, b)) << c << " vs " << b;
    EXPECT_EQ(with_nan, std::isnan(a));
    // The quantize() table's entry: the same bytes; q.amax overwritten with max |x|.
    DeviceGroups g2(s.rows, s.cols);
    DeviceBuffer<float> q_amax(1);
    q_amax.fill_value(12345.0f);
    llmc::QTensor q;
    q.rows = s.rows, q.cols = s.cols, q.encoding = llmc::kFp8Groups1x16;
    q.data = g2.codes.ptr, q.scale_inv = g2.scale_inv.ptr, q.amax = q_amax.ptr;
    llmc::quantize(q, d_x.ptr, llmc::QuantizeArgs(), 0);
    EXPECT_TRUE(g2.equals("quantize()", want, false));
    EXPECT_TRUE(same_bits_or_both_nan(q_amax.download()[0], b)) << q_amax.download()[0] << " vs " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupQuantTest,
                         ::testing::Values(Shape{1, 16}, Shape{5, 48}, Shape{37, 768}, Shape{4096, 768},
                                           Shape{4096, 2048}, Shape{4096, 11264}, Shape{3, 4112}),
                         shape_name);

TEST(GroupQuantChecks, RejectsBadArguments) {
  DeviceGroups g(4, 32);
  DeviceBuffer<bf16> x(4 * 32);
  EXPECT_THROW(llmc::fp8_groups_quantize(g.out(), x.ptr, 4, 24, 0), llmc::Error);
  EXPECT_THROW(llmc::fp8_groups_quantize(llmc::Fp8GroupsOut{}, x.ptr, 4, 32, 0), llmc::Error);
  EXPECT_THROW(llmc::fp8_groups_quantize(g.out(), x.ptr + 1, 4, 32, 0), llmc::Error);
  DeviceBuffer<float> out(4 * 32);
  EXPECT_THROW(llmc::fp8_groups_dequantize(out.ptr + 1, g.in(), 4, 32, 0), llmc::Error);
}

}  // namespace
