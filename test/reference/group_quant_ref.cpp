// test/reference/group_quant_ref.cpp: the CPU reference of the FP8 1x16 group copies
// (test/reference/group_quant_ref.h).
#include "test/reference/group_quant_ref.h"

#include <algorithm>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"
#include "llmc/kernels/fp8_groups.h"

namespace llmc {

Fp8GroupsCpu fp8_groups_quantize_cpu(const float* x, int rows, int cols) {
  if (rows < 0 || cols <= 0 || cols % kFp8GroupSize != 0)
    throw_error("fp8_groups_quantize_cpu: rows = %d, cols = %d (cols a positive multiple of 16)", rows, cols);
  const int ld = fp8_groups_ld(rows), groups = cols / kFp8GroupSize;
  Fp8GroupsCpu out;
  out.codes.resize(static_cast<size_t>(rows) * cols);
  out.scale_inv.assign(static_cast<size_t>(groups) * ld, 1.0f);
  out.group_amax.assign(static_cast<size_t>(groups) * ld, 0.0f);
  for (int r = 0; r < rows; r++)
    for (int g = 0; g < groups; g++) {
      const float* v = x + static_cast<size_t>(r) * cols + g * kFp8GroupSize;
      uint32_t bits = 0;  // max over the bits of |v| (a NaN's exceed +inf's)
      for (int k = 0; k < kFp8GroupSize; k++) bits = std::max(bits, float_to_bits(v[k]) & 0x7fffffffu);
      const float amax = bits_to_float(bits);
      float d, q;
      fp8_group_scales(amax, &d, &q);
      for (int k = 0; k < kFp8GroupSize; k++)
        out.codes[static_cast<size_t>(r) * cols + g * kFp8GroupSize + k] =
            fp8_encode(mul_rn(v[k], q), ElementFormat::E4M3);
      out.scale_inv[static_cast<size_t>(g) * ld + r] = d;
      out.group_amax[static_cast<size_t>(g) * ld + r] = amax;
    }
  return out;
}

std::vector<float> fp8_groups_dequantize_cpu(const uint8_t* codes, const float* scale_inv, int rows, int cols) {
  if (rows < 0 || cols <= 0 || cols % kFp8GroupSize != 0)
    throw_error("fp8_groups_dequantize_cpu: rows = %d, cols = %d (cols a positive multiple of 16)", rows, cols);
  const int ld = fp8_groups_ld(rows);
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      const float d = scale_inv[static_cast<size_t>(c / kFp8GroupSize) * ld + r];
      out[i] = mul_rn(fp8_decode(codes[i], ElementFormat::E4M3), d);
    }
  return out;
}

}  // namespace llmc
