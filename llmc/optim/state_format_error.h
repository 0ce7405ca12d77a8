// llmc/optim/state_format_error.h: how much an optimizer-state format loses on given FP32 AdamW moments (COAT's
// Table 1 metric, arXiv 2410.19313): the moments are stored in the format with the host codecs
// (llmc/optim/state_format.h, bit-exact with the update kernel) and read back, and the errors of m, v and of the
// update direction they give are measured against the FP32 values. dev/tools/state_error runs it on a checkpoint.
// Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "llmc/optim/state_format.h"

namespace llmc {

// The AdamW step the moments belong to: the update direction is
//   u = (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps).
struct AdamWStepShape {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  int64_t step = 1;
};

struct StateFormatError {
  double m_rel_l2 = 0, v_rel_l2 = 0;  // ||x' - x|| / ||x|| of the stored-and-read moment (0 when x is all zero)
  double u_rel_l2 = 0;                // the same for the update direction u
  double u_mse = 0;                   // mean over the n elements of (u' - u)^2
  double m_lost = 0;                  // fraction of the nonzero m that read back as 0
  std::vector<float> k_m, k_v;        // fp8_expand: the exponent k of every group of m and of v, in group order
};

// m and v: n FP32 values each, groups counted from element 0 (as in the flat parameter buffer). The codecs run on
// `threads` host threads over group-aligned pieces; the result does not depend on the number.
StateFormatError state_format_error(const StateFormat& format, const float* m, const float* v, size_t n,
                                    const AdamWStepShape& shape, int threads);

}  // namespace llmc
