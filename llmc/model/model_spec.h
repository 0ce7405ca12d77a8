// llmc/model/model_spec.h: what a model is, independent of the GPU: the architecture spec, the parameter table (one entry
// per named tensor, Hugging Face names, nn.Linear (out, in) layout) that drives initialisation, the optimizer,
// sharding, checkpoints and export; parameter counts, FLOPs per token and a device-memory estimate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llmc/core/param_table.h"

namespace llmc {

struct ModelSpec {
  std::string arch = "gpt2";  // "gpt2" | "llama"
  int n_layer = 12;
  int n_head = 12;
  int n_kv_head = 12;           // key/value heads: == n_head for gpt2; divides n_head for llama (grouped-query)
  int n_embd = 768;
  int vocab_size = 50257;       // real vocabulary
  int padded_vocab_size = 50304;  // vocab rounded up to a multiple of padded_vocab_multiple (rows past vocab are 0)
  int max_seq_len = 1024;       // context length (gpt2: rows of wpe; llama: the longest sequence, RoPE has no table)
  int ffn_hidden = 3072;        // MLP hidden size (gpt2: 4 * n_embd; llama: the gate/up width F)
  bool tied_embeddings = true;  // lm_head shares the token embedding (always for gpt2)
  float norm_eps = 1e-5f;       // LayerNorm (gpt2) / RMSNorm (llama) epsilon
  float rope_theta = 10000.0f;  // llama: RoPE base (Llama 3: 500000); unused by gpt2
  int head_size() const { return n_embd / n_head; }
  int qkv_channels() const { return (n_head + 2 * n_kv_head) * head_size(); }  // fused q|k|v output width
};

// Builds the table for the spec; throws llmc::Error for an unsupported arch or inconsistent sizes.
//
// gpt2 (GPT2LMHeadModel names): transformer.wte.weight (Vp, C), transformer.wpe.weight (maxT, C); per block
//   transformer.h.{i}.{ln_1.weight, ln_1.bias, attn.c_attn.weight (3C, C), attn.c_attn.bias, attn.c_proj.weight (C, C),
//   attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight (F, C), mlp.c_fc.bias, mlp.c_proj.weight (C, F),
//   mlp.c_proj.bias}; transformer.ln_f.{weight, bias}. The lm_head is tied to wte.
// llama (LlamaForCausalLM names, no biases): model.embed_tokens.weight (Vp, C); per block model.layers.{i}.
//   input_layernorm.weight (C), self_attn.q_proj.weight (NH*HS, C), self_attn.k_proj.weight (NKV*HS, C),
//   self_attn.v_proj.weight (NKV*HS, C), self_attn.o_proj.weight (C, NH*HS), post_attention_layernorm.weight (C),
//   mlp.gate_proj.weight (F, C), mlp.up_proj.weight (F, C), mlp.down_proj.weight (C, F); model.norm.weight (C);
//   lm_head.weight (Vp, C) unless tied_embeddings. q_proj, k_proj, v_proj are stored back to back (no alignment gap:
//   checked here), so the q_proj pointer is the ((NH + 2*NKV)*HS, C) weight of one fused QKV GEMM; likewise
//   gate_proj, up_proj form the (2F, C) weight of one fused gate|up GEMM whose output rows are [gate | up].
ParamTable build_param_table(const ModelSpec& spec);

// Initial values (FP32) for every tensor of the table, written at each tensor's offset into out
// (table.total_elements floats; alignment gaps and padded vocabulary rows are 0). GPT-2 scheme, for both
// architectures: linear weights and embeddings normal(0, 0.02), residual projections (gpt2 attn.c_proj, mlp.c_proj;
// llama self_attn.o_proj, mlp.down_proj) normal(0, 0.02 / sqrt(2 * n_layer)), biases 0, norm weights 1. Deterministic for a seed and independent of thread count: each tensor draws from its
// own generator seeded by (seed, tensor index).
void init_parameters(const ParamTable& table, uint64_t seed, float* out);

// Parameter count with the padded vocabulary (GPT-2 124M: 124,475,904) or the real one (124,439,808).
size_t count_parameters(const ModelSpec& spec, bool padded_vocab);

// Training FLOPs per token: 6 * N (non-embedding parameters + lm_head matmul) + attention 6 * L * C * T
// (the causal-mask-unaware convention llm.c and PaLM use), with N counted on the real vocabulary: every real
// parameter except the tensors only looked up (wpe; the token embedding when the lm_head is untied). With grouped-query
// attention the k/v projections count at their (NKV*HS, C) size; the attention term is unchanged (every query head
// attends over T keys: 2 * 2 * T * NH * HS forward FLOPs per layer, NH * HS = C).
double flops_per_token(const ModelSpec& spec, int seq_len);

struct MemoryEstimate {
  size_t params_bytes = 0;       // bf16 working weights
  size_t grads_bytes = 0;        // FP32 gradients
  size_t master_bytes = 0;       // FP32 master weights (sharded by ZeRO-1)
  size_t optimizer_bytes = 0;    // FP32 m and v (sharded by ZeRO-1)
  size_t activations_bytes = 0;  // saved-for-backward activations and scratch for one micro-batch
  size_t workspace_bytes = 0;    // GEMM workspace, logits, misc
  size_t total() const {
    return params_bytes + grads_bytes + master_bytes + optimizer_bytes + activations_bytes + workspace_bytes;
  }
};
MemoryEstimate estimate_memory(const ModelSpec& spec, int micro_batch, int seq_len, bool recompute, int world_size,
                               int zero_stage);

// Known model presets: "gpt2-tiny", "gpt2-mini", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m", "llama-tiny",
// "llama-125m", "llama-350m", "llama-1b", "llama-3b".
bool model_preset(const std::string& name, ModelSpec* out);
std::vector<std::string> model_preset_names();

// Llama's default MLP width when none is given: 8C/3 rounded up to a multiple of 256 (the LLaMA rule with
// multiple_of = 256, ffn_dim_multiplier = 1; three matrices of 8C/3 hold as many parameters as GPT-2's two of 4C).
int llama_default_ffn_hidden(int n_embd);

}  // namespace llmc
