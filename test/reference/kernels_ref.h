// test/reference/kernels_ref.h: the CPU references of the handwritten kernels of llmc/kernels (one section per
// family, the same shapes and semantics as the launchers in llmc/kernels/<family>.h, += accumulation included),
// computed in FP32 / FP64 on host arrays. They live in the test-side library llmc_reference, never in the trainer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llmc {

// -----------------------------------------------------------------------------------------------------------------
// embedding (llmc/kernels/encoder.h)
void encoder_forward_cpu(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward_cpu(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C);

// -----------------------------------------------------------------------------------------------------------------
// LayerNorm (llmc/kernels/layernorm.h)
void layernorm_forward_cpu(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                           const float* bias, int N, int C);
void layernorm_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, const float* mean, const float* rstd, int N, int C);

// -----------------------------------------------------------------------------------------------------------------
// GELU (llmc/kernels/gelu.h)
void gelu_forward_cpu(float* out, const float* inp, size_t n);
void gelu_backward_inplace_cpu(float* dinout, const float* inp, size_t n);

// -----------------------------------------------------------------------------------------------------------------
// attention (llmc/kernels/attention.h)
void attention_forward_cpu(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV, int HS);
void attention_backward_cpu(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                            int B, int T, int NH, int NKV, int HS);
// The same references with double storage, for the finite-difference checks.
void attention_forward_cpu_f64(double* out, double* lse, const double* qkv, int B, int T, int NH, int NKV, int HS);
void attention_backward_cpu_f64(double* dqkv, const double* dout, const double* qkv, const double* out,
                                const double* lse, int B, int T, int NH, int NKV, int HS);

// -----------------------------------------------------------------------------------------------------------------
// RMSNorm (llmc/kernels/rmsnorm.h)
void rmsnorm_forward_cpu(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
void rmsnorm_backward_cpu(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                          const float* rstd, int N, int C);

// -----------------------------------------------------------------------------------------------------------------
// RoPE (llmc/kernels/rope.h)
void rope_forward_cpu(float* qkv, int B, int T, int NH, int NKV, int HS, float theta);
void rope_backward_cpu(float* dqkv, int B, int T, int NH, int NKV, int HS, float theta);

// -----------------------------------------------------------------------------------------------------------------
// SwiGLU (llmc/kernels/swiglu.h)
void swiglu_forward_cpu(float* out, const float* gate_up, int N, int F);
void swiglu_backward_cpu(float* dgate_up, const float* dout, const float* gate_up, int N, int F);

// -----------------------------------------------------------------------------------------------------------------
// fused classifier (llmc/kernels/classifier.h)
void fused_classifier_cpu(float* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                          bool write_dlogits);
double mean_loss_cpu(const float* losses, const int* targets, int N);

// -----------------------------------------------------------------------------------------------------------------
// reductions (llmc/kernels/reduce.h)
void bias_backward_cpu(float* dbias, const float* dout, int N, int OC);
double global_norm_cpu(const float* values, size_t n);
void add_bias_cpu(float* x, const float* bias, int M, int N);

}  // namespace llmc
