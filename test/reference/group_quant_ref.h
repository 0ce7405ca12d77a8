// test/reference/group_quant_ref.h: the CPU reference of the FP8 1x16 group copies (llmc/kernels/fp8_groups.h, the
// producers' copies and llmc/precision/group_quant.h's quantiser / dequantiser), bit for bit: the same codes, scales
// and group maxima, from the shared scale rule (fp8_group_scales) and the host FP8 codec of llmc/core/dtypes.h, written
// group by group from the definition, not from the kernels' thread layout. Lives in the test-side library
// llmc_reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace llmc {

// The copy of x (rows, cols) (float values representable in bf16; cols a multiple of 16, else llmc::Error):
// codes (rows * cols), scale_inv and group_amax (cols / 16 * round_up(rows, 4), padding entries 1 and 0).
struct Fp8GroupsCpu {
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv, group_amax;
};
Fp8GroupsCpu fp8_groups_quantize_cpu(const float* x, int rows, int cols);
// out (rows, cols) = fp8_decode(code) * its group's scale_inv, one correctly rounded FP32 product.
std::vector<float> fp8_groups_dequantize_cpu(const uint8_t* codes, const float* scale_inv, int rows, int cols);

}  // namespace llmc
