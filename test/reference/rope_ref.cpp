// test/reference/rope_ref.cpp: the CPU reference of llmc/kernels/rope.h (declared in test/reference/kernels_ref.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "test/reference/kernels_ref.h"

namespace llmc {

namespace {

// FP32 inverse frequency as the kernels compute it (theta^(-2i/HS) in FP64, rounded once).
float rope_inv_freq(int i, int HS, float theta) {
  return static_cast<float>(std::pow(static_cast<double>(theta), -2.0 * i / HS));
}

void rope_cpu(float* qkv, int B, int T, int NH, int NKV, int HS, float theta, bool backward) {
  const int half = HS / 2, width = (NH + 2 * NKV) * HS;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float* row = qkv + (static_cast<size_t>(b) * T + t) * width;
      for (int h = 0; h < NH + NKV; h++)
        for (int i = 0; i < half; i++) {
          const float angle = static_cast<float>(t) * rope_inv_freq(i, HS, theta);  // FP32 product, as the GPU
          const double c = std::cos(static_cast<double>(angle)), s = std::sin(static_cast<double>(angle));
          float* lo = row + h * HS + i;
          float* hi = lo + half;
          const double a = *lo, v = *hi;
          *lo = static_cast<float>(backward ? a * c + v * s : a * c - v * s);
          *hi = static_cast<float>(backward ? v * c - a * s : v * c + a * s);
        }
    }
}

}  // namespace

// CPU references: FP32 angle as the GPU, cos/sin and the rotation in FP64.
void rope_forward_cpu(float* qkv, int B, int T, int NH, int NKV, int HS, float theta) {
  rope_cpu(qkv, B, T, NH, NKV, HS, theta, false);
}

void rope_backward_cpu(float* dqkv, int B, int T, int NH, int NKV, int HS, float theta) {
  rope_cpu(dqkv, B, T, NH, NKV, HS, theta, true);
}

}  // namespace llmc
