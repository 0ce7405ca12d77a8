// llmc/kernels: the declared interface of every handwritten CUDA kernel the models use (everything but the GEMMs,
// which live in llmc/gemm.h). Each launcher has a CPU reference beside it (`*_cpu`, FP32/FP64 on host arrays) that
// the GPU tests compare against. Implementations: encoder.cu, layernorm.cu, gelu.cu, attention.cu, classifier.cu,
// adamw.cu, reduce.cu, and for Llama rmsnorm.cu, rope.cu, swiglu.cu.
//
// Conventions
//   - bf16 = __nv_bfloat16. Activations are row-major (B, T, C) with N = B*T rows. Weights use PyTorch nn.Linear
//     layout (out_features, in_features).
//   - Gradients of parameters are FP32 and ACCUMULATED (+=) so that gradient-accumulation micro-steps add up;
//     the caller zeroes them once per optimizer step. Gradients of activations are bf16 and as each comment says.
//   - Every kernel is deterministic: the same inputs give bit-identical outputs on every run (no float atomics whose
//     order varies). Reductions go through fixed-shape partial sums.
//   - All launchers take a cudaStream_t and check the launch (CUDA_CHECK_LAUNCH); none synchronises.
//   - CPU references take/return float arrays with the same shapes and semantics (including the += accumulation).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace llmc {

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------------------------------------------------------
// encoder.cu: token + position embedding (GPT-2), or token embedding alone (Llama: wpe = null, dwpe = null)
// out (N=B*T, C) = wte[tokens[b,t]] + wpe[t]  (wpe null: out = wte[tokens[b,t]] exactly)
void encoder_forward(bf16* out, const int* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     cudaStream_t stream);
void encoder_forward_cpu(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C);

// Deterministic embedding backward. The host builds the plan from the host copy of the tokens of this micro-batch
// (grouping positions by token id in a fixed order); the kernel then sums each token's rows in that order.
// dwte (Vp, C) += ...; dwpe (maxT, C) += sum over b of dout[b, t] (skipped when dwpe is null).
struct EncoderBackwardPlan {
  // device buffers owned by the plan (allocated on first build, grown as needed)
  int* d_bucket_starts = nullptr;  // (num_buckets + 1) offsets into d_positions
  int* d_bucket_tokens = nullptr;  // (num_buckets) token id of each bucket
  int* d_positions = nullptr;      // (B*T) flat positions b*T+t, grouped by token, ascending within a group
  int* d_bucket_order = nullptr;   // (num_buckets) the buckets in launch order: largest first
  int num_buckets = 0;
  size_t capacity = 0;
  // pinned host staging of the four arrays (the async upload reads it after build returns), and the event that
  // tells when the previous upload has finished reading it
  int* h_staging = nullptr;  // (4 * capacity + 1) ints: bucket starts, bucket tokens, positions, bucket order
  cudaEvent_t uploaded = nullptr;
  void build(const int* host_tokens, int B, int T, cudaStream_t stream);  // uploads with cudaMemcpyAsync
  void free();
};
void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const EncoderBackwardPlan& plan, int B, int T,
                      int C, cudaStream_t stream);
void encoder_backward_cpu(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C);

// ---------------------------------------------------------------------------------------------------------------
// layernorm.cu: LayerNorm (eps = 1e-5) with FP32 statistics
// out (N, C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved for backward.
// Optional out_amax / dinp_amax (may be null) in this and the other kernels that produce the input or the output
// gradient of a linear layer: max |value written| is atomically maxed into that float (llmc/cuda_utils.cuh
// atomic_max_amax; the caller zeroed it), the amax of the FP8 per-tensor scale of the linear that consumes it.
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                       int N, int C, cudaStream_t stream, float* out_amax = nullptr);
void layernorm_forward_cpu(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                           const float* bias, int N, int C);

// residual (N, C) = inp1 + inp2 (rounded to bf16), then out = LayerNorm(residual) from the rounded residual.
void fused_residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* inp1,
                                      const bf16* inp2, const bf16* weight, const bf16* bias, int N, int C,
                                      cudaStream_t stream, float* out_amax = nullptr);

// dinp (N, C) += dLN/dinp;  dweight (C) += ...;  dbias (C) += ...  (FP32 parameter gradients)
// scratch: at least layernorm_backward_scratch_floats(N, C) floats of device memory (for deterministic partial sums).
size_t layernorm_backward_scratch_floats(int N, int C);
// dinp_amax: max |dinp| after the addition (the final value written).
// dinp_sum (C), optional: += the column sums of dinp after the addition (the bf16 values written). In GPT-2 dinp is
// the residual-stream gradient, i.e. the output gradient of the projection that adds into the residual there, so
// this is that projection's bias gradient without a separate pass over dinp (bias_backward's result, summed in
// another fixed order).
void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream,
                        float* dinp_amax = nullptr, float* dinp_sum = nullptr);
void layernorm_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, const float* mean, const float* rstd, int N, int C);

// ---------------------------------------------------------------------------------------------------------------
// gelu.cu: GELU, tanh approximation (as GPT-2 / PyTorch approximate="tanh")
void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream, float* out_amax = nullptr);
void gelu_forward_cpu(float* out, const float* inp, size_t n);
// dinout (n): in = d out, out = d inp = d out * gelu'(inp)
void gelu_backward_inplace(bf16* dinout, const bf16* inp, size_t n, cudaStream_t stream, float* dinp_amax = nullptr);
void gelu_backward_inplace_cpu(float* dinout, const float* inp, size_t n);

// ---------------------------------------------------------------------------------------------------------------
// attention.cu (+ attention_sm90.cu on Hopper): causal scaled-dot-product attention, flash-style (no (T, T) matrix
// in memory), head size 64 or 128, grouped-query capable (n_kv_head divides n_head; GPT-2 uses n_kv_head == n_head).
//   qkv (B, T, (NH + 2*NKV) * HS): per token the NH query heads, then NKV key heads, then NKV value heads.
//   out (B, T, NH * HS); lse (B, NH, T) FP32 log-sum-exp of the scaled scores (natural log), saved for backward.
//   scale = 1/sqrt(HS). Query head h uses kv head h / (NH / NKV).
void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV, int HS,
                       cudaStream_t stream, float* out_amax = nullptr);
void attention_forward_cpu(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV, int HS);
// dqkv (B, T, (NH + 2*NKV) * HS) is OVERWRITTEN with the gradient w.r.t. qkv.
// dbias ((NH + 2*NKV) * HS), optional: += the column sums of dqkv as stored (the gradient of a bias added to qkv,
// GPT-2's c_attn.bias; bias_backward's result in another fixed order). The Hopper kernels sum their rows as they
// store them; the portable path makes a pass over dqkv.
// scratch: at least attention_backward_scratch_floats(B, T, NH, HS, dbias != null) floats of device memory.
size_t attention_backward_scratch_floats(int B, int T, int NH, int HS, bool qkv_bias_grad = false);
void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS, cudaStream_t stream,
                        float* dqkv_amax = nullptr, float* dbias = nullptr);
void attention_backward_cpu(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                            int B, int T, int NH, int NKV, int HS);
// Which kernels attention_forward / attention_backward run: kAuto takes the Hopper wgmma kernels
// (attention_sm90.cu) for head size 64 on a compute-capability 9.0 GPU when the build has sm_90a code, and the
// portable mma.sync kernels otherwise; kPortable always takes the mma.sync kernels (the tests and
// dev/cuda/bench_attention run both). Process-wide; the trainer leaves it at kAuto.
enum class AttentionKernels { kAuto, kPortable };
void set_attention_kernels(AttentionKernels which);
// What attention_forward / attention_backward would run for head size HS on the current device: "sm90 wgmma" or
// "mma.sync".
const char* attention_kernels_name(int HS);

// ---------------------------------------------------------------------------------------------------------------
// Llama kernels. Optional `*_amax` arguments (may be null): max |value written| is atomically maxed into that float
// (llmc/cuda_utils.cuh atomic_max_amax; the caller zeroed it), for the FP8 scale of the linear that consumes it.
//
// rmsnorm.cu: RMSNorm with FP32 statistics: out (N, C) = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps);
// rstd (N) saved for backward.
void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C, float eps,
                     cudaStream_t stream, float* out_amax = nullptr);
void rmsnorm_forward_cpu(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
// residual (N, C) = inp1 + inp2 (rounded to bf16), then out = RMSNorm(residual) from the rounded residual.
void fused_residual_rmsnorm_forward(bf16* residual, bf16* out, float* rstd, const bf16* inp1, const bf16* inp2,
                                    const bf16* weight, int N, int C, float eps, cudaStream_t stream,
                                    float* out_amax = nullptr);
// dinp (N, C) += dRMSNorm/dinp; dweight (C) += ... (FP32). scratch: rmsnorm_backward_scratch_floats(N, C) floats.
// dinp_amax receives max |dinp| after the addition (the final value written).
size_t rmsnorm_backward_scratch_floats(int N, int C);
void rmsnorm_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout, const bf16* inp,
                      const bf16* weight, const float* rstd, int N, int C, cudaStream_t stream,
                      float* dinp_amax = nullptr);
void rmsnorm_backward_cpu(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                          const float* rstd, int N, int C);

// rope.cu: rotary position embeddings, Hugging Face Llama convention ("rotate_half": dimension i pairs with
// i + HS/2; inv_freq[i] = theta^(-2i/HS); angle = t * inv_freq[i] in FP32, cos/sin in FP32), applied in place to the
// NH query heads and NKV key heads of a packed qkv (B, T, (NH + 2*NKV) * HS) (value heads untouched); position t is
// the index within the sequence.
void rope_forward(bf16* qkv, int B, int T, int NH, int NKV, int HS, float theta, cudaStream_t stream);
void rope_forward_cpu(float* qkv, int B, int T, int NH, int NKV, int HS, float theta);
// In place on dqkv (B, T, (NH + 2*NKV) * HS): the gradient w.r.t. the rotated q, k becomes the gradient w.r.t. the
// unrotated ones (the inverse rotation); value heads untouched. dqkv_amax: max |dqkv| over the whole tensor.
void rope_backward(bf16* dqkv, int B, int T, int NH, int NKV, int HS, float theta, cudaStream_t stream,
                   float* dqkv_amax = nullptr);
void rope_backward_cpu(float* dqkv, int B, int T, int NH, int NKV, int HS, float theta);

// swiglu.cu: gate_up (N, 2F) holds per row [gate (F) | up (F)] (the fused gate_proj|up_proj GEMM output);
// out (N, F) = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void swiglu_forward(bf16* out, const bf16* gate_up, int N, int F, cudaStream_t stream, float* out_amax = nullptr);
void swiglu_forward_cpu(float* out, const float* gate_up, int N, int F);
// dgate_up (N, 2F) = [dout * up * silu'(gate) | dout * silu(gate)] (overwritten).
void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int N, int F, cudaStream_t stream,
                     float* dgate_up_amax = nullptr);
void swiglu_backward_cpu(float* dgate_up, const float* dout, const float* gate_up, int N, int F);

// ---------------------------------------------------------------------------------------------------------------
// classifier.cu: fused softmax + cross-entropy + dlogits; the probabilities are never written to memory.
//   logits (N, Vp) bf16 with the real vocabulary in columns [0, V); targets (N) in [0, V), or -1 = ignore.
//   losses (N) FP32: -log softmax(logits[n, :V])[targets[n]] (0 for ignored rows).
//   If write_dlogits: logits is overwritten in place with dloss * (softmax - onehot(target)); columns [V, Vp) and
//   ignored rows get 0.
void fused_classifier(bf16* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                      bool write_dlogits, cudaStream_t stream);
void fused_classifier_cpu(float* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                          bool write_dlogits);
// total[0] (one double, device) += weight * the mean of losses over the rows whose target is >= 0 (nothing is added
// when every target is ignored). One block, a fixed summation order: deterministic. Lets the trainer sum a step's
// micro-batch losses on the device and read them once per step instead of waiting for every forward.
void accumulate_mean_loss(double* total, const float* losses, const int* targets, int N, double weight,
                          cudaStream_t stream);
// The mean of losses over the non-ignored targets (0 when there are none), summed in FP64.
double mean_loss_cpu(const float* losses, const int* targets, int N);

// ---------------------------------------------------------------------------------------------------------------
// reduce.cu: reductions and small elementwise helpers
// dbias (OC) += sum over the N rows of dout (N, OC). scratch: bias_backward_scratch_floats(N, OC) floats.
size_t bias_backward_scratch_floats(int N, int OC);
void bias_backward(float* dbias, float* scratch, const bf16* dout, int N, int OC, cudaStream_t stream);
void bias_backward_cpu(float* dbias, const float* dout, int N, int OC);

// Sum of squares of n FP32 values, deterministically: writes the partial sums of this tensor into
// partials[0 .. global_norm_partials_per_tensor()) (overwrites). The final norm is the fixed-order sum of all the
// partials of all tensors: global_norm_finish.
int global_norm_partials_per_tensor();
void global_norm_squared(float* partials, const float* values, size_t n, cudaStream_t stream);
// out[0] = sqrt(sum of partials[0 .. count)) in a fixed order (single block). out is device memory.
void global_norm_finish(float* out, const float* partials, int count, cudaStream_t stream);
double global_norm_cpu(const float* values, size_t n);

// x (M, N) += bias (N) in place, rounded to bf16 (for FP8 GEMMs whose epilogue cannot add the bias: block scales);
// amax: max |result|. N a multiple of 8.
void add_bias(bf16* x, const bf16* bias, int M, int N, cudaStream_t stream, float* amax = nullptr);
void add_bias_cpu(float* x, const float* bias, int M, int N);

void convert_float_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream);
void convert_bf16_to_float(float* out, const bf16* in, size_t n, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------------
// adamw.cu: AdamW on FP32 master weights with FP32 moments; writes the bf16 working copy (round to nearest even).
//   g = grads[i] * grad_scale (grad_scale folds in clipping: min(1, clip / norm), and 1 when clipping is off)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  mhat = m / (1 - b1^t);  vhat = v / (1 - b2^t)
//   master -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * master);  params = bf16(master)
// t is the 1-based optimizer step. grad_scale is read from device memory (computed there by the norm kernels) so
// the whole step stays on the GPU without a host sync.
void adamw_update(float* master, bf16* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t, const float* grad_scale,
                  cudaStream_t stream);
void adamw_update_cpu(float* master, float* params, const float* grads, float* m, float* v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale);
// grad_scale[0] = (clip > 0 && norm[0] > clip) ? clip / norm[0] : 1   (device memory; norm from global_norm_finish);
// NaN when norm[0] is not finite, and adamw_update then leaves everything unchanged (a skipped step).
void clip_scale_from_norm(float* grad_scale, const float* norm, float clip, cudaStream_t stream);

}  // namespace llmc
