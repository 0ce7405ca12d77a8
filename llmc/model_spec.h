// llmc/model_spec: what a model is, independent of the GPU: the architecture spec, the parameter table (one entry
// per named tensor, Hugging Face names, nn.Linear (out, in) layout) that drives initialisation, the optimizer,
// sharding, checkpoints and export; parameter counts, FLOPs per token and a device-memory estimate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace llmc {

struct ModelSpec {
  std::string arch = "gpt2";  // "gpt2" (later: "llama")
  int n_layer = 12;
  int n_head = 12;
  int n_kv_head = 12;           // == n_head for gpt2
  int n_embd = 768;
  int vocab_size = 50257;       // real vocabulary
  int padded_vocab_size = 50304;  // vocab rounded up to a multiple of padded_vocab_multiple (rows past vocab are 0)
  int max_seq_len = 1024;       // context length (rows of wpe)
  int ffn_hidden = 3072;        // MLP hidden size (4 * n_embd for gpt2)
  bool tied_embeddings = true;  // lm_head shares wte
  float norm_eps = 1e-5f;
  int head_size() const { return n_embd / n_head; }
};

enum class ParamRole { TokenEmbedding, PositionEmbedding, NormWeight, NormBias, LinearWeight, LinearBias };
const char* param_role_name(ParamRole role);

struct ParamInfo {
  std::string name;            // Hugging Face name, e.g. "transformer.h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // e.g. {2304, 768}: nn.Linear (out, in) layout, also for GPT-2's Conv1D tensors
  size_t offset = 0;           // element offset in the flat parameter / gradient buffers (aligned, see below)
  size_t numel = 0;
  int layer = -1;              // transformer block index, -1 for embeddings and the final norm
  ParamRole role = ParamRole::LinearWeight;
  bool weight_decay = false;   // AdamW decays 2-D tensors only (matrices and embeddings)
  float init_std = 0.0f;       // normal(0, init_std) at initialisation; 0 means constant init_value
  float init_value = 0.0f;     // for norms (1) and biases (0)
};

struct ParamTable {
  static constexpr size_t kAlign = 128;  // every tensor starts at a multiple of 128 elements (256 B in bf16)
  std::vector<ParamInfo> params;         // in storage order
  size_t total_elements = 0;             // size of the flat buffers including alignment gaps
  size_t num_parameters = 0;             // sum of numel (padded vocabulary rows included)
  int vocab_size = 0;                    // real vocabulary: rows of transformer.wte.weight past it are padding
  const ParamInfo& get(const std::string& name) const;  // throws llmc::Error naming the tensor if absent
  const ParamInfo* find(const std::string& name) const;  // nullptr if absent
};

// Builds the table for the spec; throws llmc::Error for an unsupported arch.
ParamTable build_param_table(const ModelSpec& spec);

// Initial values (FP32) for every tensor of the table, written at each tensor's offset into out
// (table.total_elements floats; alignment gaps and padded vocabulary rows are 0). GPT-2 scheme: linear weights and
// embeddings normal(0, 0.02), residual projections (attn.c_proj, mlp.c_proj) normal(0, 0.02 / sqrt(2 * n_layer)),
// biases 0, norm weights 1. Deterministic for a seed and independent of thread count: each tensor draws from its
// own generator seeded by (seed, tensor index).
void init_parameters(const ParamTable& table, uint64_t seed, float* out);

// Parameter count with the padded vocabulary (GPT-2 124M: 124,475,904) or the real one (124,439,808).
size_t count_parameters(const ModelSpec& spec, bool padded_vocab);

// Training FLOPs per token: 6 * N (non-embedding parameters + lm_head matmul) + attention 6 * L * C * T
// (the causal-mask-unaware convention llm.c and PaLM use), with N counted on the real vocabulary.
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

// Known model presets: "gpt2-tiny", "gpt2-mini", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m".
bool model_preset(const std::string& name, ModelSpec* out);
std::vector<std::string> model_preset_names();

}  // namespace llmc
