// test/core/test_param_table: first_nonfinite_element finds the first NaN / Inf of a table-laid-out buffer in storage
// order or output side first, names the tensor and the element's index in its shape, and skips the alignment gaps.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "llmc/core/param_table.h"

namespace {

// Two tensors with a gap between them: a (2, 3) at offset 0 and a (4,) at offset 128.
llmc::ParamTable two_tensors() {
  llmc::ParamTable t;
  llmc::ParamInfo a;
  a.name = "a.weight";
  a.shape = {2, 3};
  a.offset = 0;
  a.numel = 6;
  llmc::ParamInfo b;
  b.name = "b.bias";
  b.shape = {4};
  b.offset = 128;
  b.numel = 4;
  t.params = {a, b};
  t.total_elements = 256;
  t.num_parameters = 10;
  return t;
}

}  // namespace

TEST(FirstNonfiniteElement, NamesTensorAndIndexInEitherOrder) {
  const llmc::ParamTable table = two_tensors();
  std::vector<float> v(table.total_elements, 1.0f);
  v[50] = std::nanf("");  // in the gap: not a parameter
  EXPECT_EQ(llmc::first_nonfinite_element(table, v.data()), "");
  v[5] = std::numeric_limits<float>::infinity();  // a.weight[1, 2]
  v[128 + 3] = std::nanf("");                     // b.bias[3]
  EXPECT_EQ(llmc::first_nonfinite_element(table, v.data()), "a.weight[1, 2] = inf");
  EXPECT_EQ(llmc::first_nonfinite_element(table, v.data(), /*output_side_first=*/true), "b.bias[3] = nan");
  v[5] = -std::numeric_limits<float>::infinity();
  v[128 + 3] = 0.0f;
  EXPECT_EQ(llmc::first_nonfinite_element(table, v.data(), true), "a.weight[1, 2] = -inf");
}
