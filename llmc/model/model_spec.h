// llmc/model/model_spec.h: what a model is, independent of the GPU: the architecture spec, the parameter table (one
// entry per named tensor, Hugging Face names, nn.Linear (out, in) layout) that drives initialisation, the optimizer,
// sharding, checkpoints and export; parameter counts, FLOPs per token and the presets. What differs between
// architectures comes from the model family of spec.arch (llmc/model/family.h). The device memory of a model is
// counted by its own constructors (llmc/model/model.h plan_model_memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llmc/core/param_table.h"

namespace llmc {

struct ModelSpec {
  std::string arch = "gpt2";  // the model family (llmc/model/family.h): "gpt2" | "llama"
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

// The table of the spec, built by its family (llmc/model/<arch>/<arch>_family.cpp, where the names and shapes are
// listed); throws llmc::Error for an unknown arch or inconsistent sizes.
ParamTable build_param_table(const ModelSpec& spec);

// Initial values (FP32) for every tensor of the table, written at each tensor's offset into out
// (table.total_elements floats; alignment gaps and padded vocabulary rows are 0): normal(0, init_std) or init_value,
// as the family's table says (GPT-2's scheme for every family: linear weights and embeddings normal(0, 0.02), the
// projections into the residual stream normal(0, 0.02 / sqrt(2 * n_layer)), biases 0, norm weights 1).
// Deterministic for a seed and independent of thread count: each tensor draws from its own generator seeded by
// (seed, tensor index), and `threads` threads (0: one per hardware thread) draw whole tensors, largest first.
void init_parameters(const ParamTable& table, uint64_t seed, float* out, int threads = 0);

// Parameter count with the padded vocabulary (GPT-2 124M: 124,475,904) or the real one (124,439,808).
size_t count_parameters(const ModelSpec& spec, bool padded_vocab);

// Training FLOPs per token: 6 * N (non-embedding parameters + lm_head matmul) + attention 6 * L * C * T
// (the causal-mask-unaware convention llm.c and PaLM use), with N counted on the real vocabulary: every real
// parameter except the tensors only looked up (position embeddings; the token embedding when the lm_head is untied).
// With grouped-query attention the k/v projections count at their (NKV*HS, C) size; the attention term is unchanged
// (every query head attends over T keys: 2 * 2 * T * NH * HS forward FLOPs per layer, NH * HS = C).
double flops_per_token(const ModelSpec& spec, int seq_len);

// Known model presets, those of every family in registry order: "gpt2-tiny", "gpt2-mini", "gpt2-124m", "gpt2-350m",
// "gpt2-774m", "gpt2-1558m", "llama-tiny", "llama-125m", "llama-350m", "llama-1b", "llama-3b", "llama-7b".
bool model_preset(const std::string& name, ModelSpec* out);
std::vector<std::string> model_preset_names();

}  // namespace llmc
