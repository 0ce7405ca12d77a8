// test/reference/optim_ref.cpp: the CPU reference of the AdamW update (test/reference/optim_ref.h).
#include "test/reference/optim_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/optim/adamw_math.cuh"

namespace llmc {

namespace {

// The reference's own codecs of the moment codes (bf16 through llmc/core/dtypes, not the CUDA conversions).
float decode_code(float c) { return c; }
float decode_code(__nv_bfloat16 c) { return bf16_decode(static_cast<__nv_bfloat16_raw>(c).x); }
void encode_code(float x, float* c) { *c = x; }
void encode_code(float x, __nv_bfloat16* c) {
  __nv_bfloat16_raw raw;
  raw.x = bf16_encode(x);
  *c = raw;
}

}  // namespace

template <class Storage>
void adamw_update_cpu(float* master, float* params, const float* grads, typename Storage::Code* m,
                      typename Storage::Code* v, size_t n, float lr, float beta1, float beta2, float eps,
                      float weight_decay, int t, float grad_scale) {
  const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, weight_decay, t);
  if (!std::isfinite(grad_scale)) return;  // the skipped step
  for (size_t i = 0; i < n; i++) {
    float mi = decode_code(m[i]), vi = decode_code(v[i]);
    adamw_element(master[i], mi, vi, grads[i], grad_scale, step);
    encode_code(mi, &m[i]);
    encode_code(vi, &v[i]);
    params[i] = bf16_decode(bf16_encode(master[i]));
  }
}

template void adamw_update_cpu<Fp32Moments>(float*, float*, const float*, float*, float*, size_t, float, float,
                                            float, float, float, int, float);
template void adamw_update_cpu<Bf16Moments>(float*, float*, const float*, __nv_bfloat16*, __nv_bfloat16*, size_t,
                                            float, float, float, float, float, int, float);

namespace {

template <class Storage>
void adamw_update_grouped_cpu(float* master, float* params, const float* grads, MomentView m, MomentView v, size_t n,
                              const AdamWStep& step, float grad_scale) {
  using Code = typename Storage::Code;
  constexpr int S = Storage::kScalesPerGroup;
  Code* m_codes = static_cast<Code*>(m.codes);
  Code* v_codes = static_cast<Code*>(v.codes);
  for (size_t g = 0, b = 0; b < n; g++, b += kMomentGroupSize) {
    const size_t count = std::min(kMomentGroupSize, n - b);
    float w[kMomentGroupSize], mk[kMomentGroupSize], vk[kMomentGroupSize];
    decode_group<Storage>(m_codes + b, m.groups + g * S, count, mk);
    decode_group<Storage>(v_codes + b, v.groups + g * S, count, vk);
    bool finite = true;
    for (size_t i = 0; i < count; i++) {
      w[i] = master[b + i];
      adamw_element(w[i], mk[i], vk[i], grads[b + i], grad_scale, step);
      finite = finite && std::isfinite(w[i]) && std::isfinite(mk[i]) && std::isfinite(vk[i]);
    }
    if (!finite) continue;  // the group keeps everything
    encode_group<Storage>(mk, count, m_codes + b, m.groups + g * S);
    encode_group<Storage>(vk, count, v_codes + b, v.groups + g * S);
    for (size_t i = 0; i < count; i++) {
      master[b + i] = w[i];
      params[b + i] = bf16_decode(bf16_encode(w[i]));
    }
  }
}

}  // namespace

void adamw_update_cpu(const StateFormat& format, float* master, float* params, const float* grads, MomentView m,
                      MomentView v, size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                      float grad_scale) {
  switch (format.id) {
    case StateFormat::Id::FP32:
      adamw_update_cpu<Fp32Moments>(master, params, grads, static_cast<float*>(m.codes), static_cast<float*>(v.codes),
                                    n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
      return;
    case StateFormat::Id::BF16:
      adamw_update_cpu<Bf16Moments>(master, params, grads, static_cast<__nv_bfloat16*>(m.codes),
                                    static_cast<__nv_bfloat16*>(v.codes), n, lr, beta1, beta2, eps, weight_decay, t,
                                    grad_scale);
      return;
    case StateFormat::Id::FP8:
    case StateFormat::Id::FP8_EXPAND: {
      const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, weight_decay, t);
      if (!std::isfinite(grad_scale)) return;  // the skipped step
      if (format.id == StateFormat::Id::FP8)
        adamw_update_grouped_cpu<Fp8Moments>(master, params, grads, m, v, n, step, grad_scale);
      else
        adamw_update_grouped_cpu<Fp8ExpandMoments>(master, params, grads, m, v, n, step, grad_scale);
      return;
    }
  }
  throw_error("internal error: adamw_update_cpu has no reference for state format '%s'", format.name);
}

void adamw_update_cpu(float* master, float* params, const float* grads, float* m, float* v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale) {
  adamw_update_cpu<Fp32Moments>(master, params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
}

}  // namespace llmc
