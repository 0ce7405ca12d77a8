// test/reference/attention_ref.cpp: the CPU reference of llmc/kernels/attention.h (declared in test/reference/kernels_ref.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "llmc/core/common.h"
#include "test/reference/kernels_ref.h"

namespace llmc {

namespace {

void check_shape(const char* what, int B, int T, int NH, int NKV, int HS) {
  if (B < 1 || T < 1 || NH < 1 || NKV < 1 || HS < 1)
    throw_error("%s: B=%d, T=%d, n_head=%d, n_kv_head=%d, head_size=%d must all be positive", what, B, T, NH, NKV, HS);
  if (NH % NKV != 0) throw_error("%s: n_kv_head=%d must divide n_head=%d", what, NKV, NH);
}

// CPU references: straightforward O(T^2) per head, accumulated in double; Real is the storage type (float or double).

template <typename Real>
void forward_reference(Real* out, Real* lse, const Real* qkv, int B, int T, int NH, int NKV, int HS) {
  check_shape("attention_forward_cpu", B, T, NH, NKV, HS);
  const size_t qkv_stride = (size_t)(NH + 2 * NKV) * HS;
  const double scale = 1.0 / std::sqrt((double)HS);
  const int group = NH / NKV;
  std::vector<double> scores(T), acc(HS);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const int kv_head = h / group;
      for (int t = 0; t < T; t++) {
        const Real* q = qkv + ((size_t)b * T + t) * qkv_stride + h * HS;
        double max_score = -INFINITY;
        for (int s = 0; s <= t; s++) {
          const Real* k = qkv + ((size_t)b * T + s) * qkv_stride + (NH + kv_head) * HS;
          double dot = 0.0;
          for (int d = 0; d < HS; d++) dot += (double)q[d] * (double)k[d];
          scores[s] = dot * scale;
          max_score = std::max(max_score, scores[s]);
        }
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int s = 0; s <= t; s++) {
          const Real* v = qkv + ((size_t)b * T + s) * qkv_stride + (NH + NKV + kv_head) * HS;
          const double p = std::exp(scores[s] - max_score);
          sum += p;
          for (int d = 0; d < HS; d++) acc[d] += p * (double)v[d];
        }
        Real* o = out + ((size_t)b * T + t) * NH * HS + h * HS;
        for (int d = 0; d < HS; d++) o[d] = (Real)(acc[d] / sum);
        lse[((size_t)b * NH + h) * T + t] = (Real)(max_score + std::log(sum));
      }
    }
  }
}

// P[t,s] = exp(scale q_t.k_s - lse_t) (s <= t);  D_t = dout_t.out_t;  dS = P (dout_t.v_s - D_t)
// dq_t = scale sum_s dS k_s;  dk_s = scale sum_t dS q_t;  dv_s = sum_t P dout_t  (summed over the heads of a group)
template <typename Real>
void backward_reference(Real* dqkv, const Real* dout, const Real* qkv, const Real* out, const Real* lse, int B, int T,
                        int NH, int NKV, int HS) {
  check_shape("attention_backward_cpu", B, T, NH, NKV, HS);
  const size_t qkv_stride = (size_t)(NH + 2 * NKV) * HS;
  const size_t out_stride = (size_t)NH * HS;
  const double scale = 1.0 / std::sqrt((double)HS);
  const int group = NH / NKV;
  std::vector<double> grad((size_t)B * T * qkv_stride, 0.0);  // (B, T, (NH + 2*NKV) * HS)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const int kv_head = h / group;
      for (int t = 0; t < T; t++) {
        const Real* q = qkv + ((size_t)b * T + t) * qkv_stride + h * HS;
        const Real* o = out + ((size_t)b * T + t) * out_stride + h * HS;
        const Real* dout_t = dout + ((size_t)b * T + t) * out_stride + h * HS;
        double* dq = grad.data() + ((size_t)b * T + t) * qkv_stride + h * HS;
        const double row_lse = (double)lse[((size_t)b * NH + h) * T + t];
        double dsum = 0.0;
        for (int d = 0; d < HS; d++) dsum += (double)dout_t[d] * (double)o[d];
        for (int s = 0; s <= t; s++) {
          const size_t kv_row = ((size_t)b * T + s) * qkv_stride;
          const Real* k = qkv + kv_row + (NH + kv_head) * HS;
          const Real* v = qkv + kv_row + (NH + NKV + kv_head) * HS;
          double* dk = grad.data() + kv_row + (NH + kv_head) * HS;
          double* dv = grad.data() + kv_row + (NH + NKV + kv_head) * HS;
          double score = 0.0, dp = 0.0;
          for (int d = 0; d < HS; d++) {
            score += (double)q[d] * (double)k[d];
            dp += (double)dout_t[d] * (double)v[d];
          }
          const double p = std::exp(score * scale - row_lse);
          const double ds = p * (dp - dsum);
          for (int d = 0; d < HS; d++) {
            dv[d] += p * (double)dout_t[d];
            dq[d] += ds * scale * (double)k[d];
            dk[d] += ds * scale * (double)q[d];
          }
        }
      }
    }
  }
  for (size_t i = 0; i < grad.size(); i++) dqkv[i] = (Real)grad[i];
}

}  // namespace

void attention_forward_cpu(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV, int HS) {
  forward_reference<float>(out, lse, qkv, B, T, NH, NKV, HS);
}

void attention_backward_cpu(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                            int B, int T, int NH, int NKV, int HS) {
  backward_reference<float>(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS);
}

// Double-precision variants, for the finite-difference checks.
void attention_forward_cpu_f64(double* out, double* lse, const double* qkv, int B, int T, int NH, int NKV, int HS) {
  forward_reference<double>(out, lse, qkv, B, T, NH, NKV, HS);
}
void attention_backward_cpu_f64(double* dqkv, const double* dout, const double* qkv, const double* out,
                                const double* lse, int B, int T, int NH, int NKV, int HS) {
  backward_reference<double>(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS);
}

}  // namespace llmc
