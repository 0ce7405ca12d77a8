// test/run/test_memory_plan: the memory plan of a run (llmc/run/memory_plan.h) on the CPU: its rows add up to the
// bytes the allocating code holds (a model built with DeviceMemory::Count: its activation allocation, its precision
// state's device_bytes, the parameter table's buffers; the optimizer's state format and shard layout; the cuBLASLt
// workspace), for GPT-2 and Llama in bf16 and fp8_tensorwise; the terms scale as the allocations do (state format,
// ZeRO-1, micro-batch, recompute); a counting model never touches the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/distributed/zero.h"
#include "llmc/model/model.h"
#include "llmc/precision/gemm.h"
#include "llmc/run/cli.h"
#include "llmc/run/config.h"
#include "llmc/run/memory_plan.h"

using namespace llmc;

namespace {

RunConfig config(const std::string& preset, const std::string& recipe, int micro_batch, int seq_len,
                 const std::vector<std::string>& overrides = {}, int world_size = 1) {
  nlohmann::json j = {{"model", {{"preset", preset}}},
                      {"data", {{"train", "a_*.bin"}}},
                      {"precision", {{"recipe", recipe}}},
                      {"train",
                       {{"micro_batch", micro_batch},
                        {"seq_len", seq_len},
                        {"global_batch_tokens", micro_batch * seq_len * world_size}}}};
  return load_config_json(j, overrides, world_size);
}

// Elements per token of the working buffers that only the backward uses (the gradients flowing through the blocks)
// and of those that only the forward uses (llama.cu / gpt2.cu carve_activations): the norm and activation outputs
// shared by the blocks, the FP8 copies' BF16 values (the residual stream's two buffers and the activation function's
// input) and the projections' output. Without recompute the two sets share memory: the plan holds the larger.
size_t backward_only_elements(const ModelSpec& m) {
  const size_t C = m.n_embd, F = m.ffn_hidden;
  if (m.arch == "llama") {
    const size_t Q = C + 2 * (C / m.n_head) * m.n_kv_head;
    return 2 * C + F + std::max(Q, 2 * F);  // dresidual, dsmall, dh, dbig
  }
  return 2 * C + std::max(3 * C, F);  // dresidual, dsmall, dbig
}
size_t forward_only_elements(const ModelSpec& m, bool shared_inputs, bool fp8_copies, bool projection_out) {
  const size_t C = m.n_embd, F = m.ffn_hidden;
  const size_t activation_in = m.arch == "llama" ? 2 * F : F;
  return (shared_inputs ? 2 * C + F : 0) + (fp8_copies ? 2 * C + activation_in : 0) + (projection_out ? C : 0);
}

std::unique_ptr<Model> counted_model(const RunConfig& cfg) {
  return make_model(cfg.model, cfg.train.micro_batch, cfg.train.seq_len, cfg.train.recompute, cfg.precision,
                    DeviceMemory::Count);
}

}  // namespace

// Every row is the allocation it names: the plan's total is the counted model's, the optimizer's and the workspace.
TEST(MemoryPlan, RowsAreTheAllocationsOfTheModelTheOptimizerAndTheWorkspace) {
  for (const char* preset : {"gpt2-124m", "llama-1b"}) {
    for (const char* recipe : {"bf16", "fp8_tensorwise"}) {
      for (int recompute : {0, 1}) {
        SCOPED_TRACE(std::string(preset) + " " + recipe + " recompute " + std::to_string(recompute));
        const RunConfig cfg = config(preset, recipe, 4, 1024, {"train.recompute=" + std::to_string(recompute)});
        const std::unique_ptr<Model> model = counted_model(cfg);
        const ModelMemory m = model->memory();
        const size_t elements = model->table().total_elements;

        // The model's terms are its own allocation sizes.
        EXPECT_EQ(m.weights, elements * 2);
        EXPECT_EQ(m.gradients, elements * 4);
        EXPECT_EQ(m.activation(ActivationUse::Saved) + m.activation(ActivationUse::Logits) +
                      m.activation(ActivationUse::Working),
                  model->activation_bytes());
        EXPECT_EQ(m.precision.total(), model->precision_state()->device_bytes());
        EXPECT_EQ(m.activation(ActivationUse::Logits) % 256, 0u);
        EXPECT_GE(m.activation(ActivationUse::Logits), size_t{4} * 1024 * cfg.model.padded_vocab_size * 2);
        if (std::string(recipe) == "bf16") {
          EXPECT_EQ(m.precision.total(), 0u);
        } else {
          EXPECT_GT(m.precision.weight_caches, 0u);
          EXPECT_GT(m.precision.saved_inputs, 0u);
          EXPECT_GT(m.precision.scratch, 0u);
          EXPECT_GT(m.precision.scaling, 0u);
        }

        const MemoryPlan plan = plan_memory(cfg, 1);
        size_t sum = 0;
        for (const MemoryPlan::Row& r : plan.rows) sum += r.bytes;
        EXPECT_EQ(sum, plan.total());
        const StateFormat& f = cfg.optimizer.state_format;
        EXPECT_EQ(plan.optimizer_elements, elements);
        EXPECT_EQ(plan.total(), m.total() + elements * 4 + f.m.bytes(elements) + f.v.bytes(elements) +
                                    kGemmWorkspaceBytes);
        EXPECT_EQ(plan.bytes("weights"), m.weights);
        EXPECT_EQ(plan.bytes("gradients"), m.gradients);
        EXPECT_EQ(plan.bytes("master weights"), elements * 4);
        EXPECT_EQ(plan.bytes("optimizer states"), elements * 8);  // fp32 m and v
        EXPECT_EQ(plan.bytes("precision state"), m.precision.weight_caches + m.precision.scaling);
        EXPECT_EQ(plan.bytes("saved activations"), m.activation(ActivationUse::Saved) + m.precision.saved_inputs);
        EXPECT_EQ(plan.bytes("logits and losses"), m.activation(ActivationUse::Logits));
        EXPECT_EQ(plan.bytes("transient buffers"), m.activation(ActivationUse::Working) + m.precision.scratch);
        EXPECT_EQ(plan.bytes("cuBLASLt workspace"), kGemmWorkspaceBytes);
        EXPECT_THROW(plan.bytes("no such row"), Error);
      }
    }
  }
}

// An FP8 recipe that saves the linears' inputs quantised keeps fewer BF16 activations (the inputs of the linears
// move to the precision state's saved copies), and recompute keeps fewer still.
TEST(MemoryPlan, ActivationsFollowTheRecipeRecomputeAndMicroBatch) {
  for (const char* preset : {"gpt2-124m", "llama-1b"}) {
    SCOPED_TRACE(preset);
    const ModelMemory bf16 = plan_model_memory(config(preset, "bf16", 4, 1024).model, 4, 1024, 0, PrecisionRecipe());
    const RunConfig fp8 = config(preset, "fp8_tensorwise", 4, 1024);
    const ModelMemory q = plan_model_memory(fp8.model, 4, 1024, 0, fp8.precision);
    EXPECT_LT(q.activation(ActivationUse::Saved), bf16.activation(ActivationUse::Saved));
    EXPECT_EQ(q.activation(ActivationUse::Logits), bf16.activation(ActivationUse::Logits));
    const ModelMemory recompute = plan_model_memory(fp8.model, 4, 1024, 1, PrecisionRecipe());
    EXPECT_LT(recompute.activation(ActivationUse::Saved), bf16.activation(ActivationUse::Saved));
    // Every saved buffer holds a multiple of 256 bytes at these sizes: twice the micro-batch, twice the bytes.
    const ModelMemory twice = plan_model_memory(fp8.model, 8, 1024, 0, PrecisionRecipe());
    EXPECT_EQ(twice.activation(ActivationUse::Saved), 2 * bf16.activation(ActivationUse::Saved));
    EXPECT_EQ(twice.weights, bf16.weights);
  }
}

// FP4 storage: under nvfp4 (every block quantised here, to compare like with like) the saved linear inputs are the
// packed E2M1 copies with their one-byte 1x16 scales (9/16 of the FP8 bytes at these sizes), the weight caches hold
// 4-bit codes, and the scratch counts the GEMM layer's BF16 expansion of the largest product's operands.
TEST(MemoryPlan, Fp4SavesLessThanFp8) {
  for (const char* preset : {"gpt2-124m", "llama-1b"}) {
    SCOPED_TRACE(preset);
    const int B = 4, T = 1024, M = B * T;
    const RunConfig fp8 = config(preset, "fp8_tensorwise", B, T);
    const RunConfig fp4 = config(preset, "nvfp4", B, T, {"precision.bf16_layers=[]"});
    const ModelMemory q8 = plan_model_memory(fp8.model, B, T, 0, fp8.precision);
    const ModelMemory q4 = plan_model_memory(fp4.model, B, T, 0, fp4.precision);
    EXPECT_EQ(q4.activation(ActivationUse::Saved), q8.activation(ActivationUse::Saved));  // the same BF16 buffers
    EXPECT_EQ(q4.precision.saved_inputs * 16, q8.precision.saved_inputs * 9);  // no padding at these sizes
    EXPECT_LT(q4.precision.weight_caches, q8.precision.weight_caches * 10 / 16);
    // The saved inputs are exactly the transposed E2M1 copies (K, M) and their scales, per saving linear.
    const ModelSpec& m = fp4.model;
    const Encoding& x = fp4.precision.x;
    auto saved = [&](int K) { return round_up(code_bytes(x, K, M), 256) + round_up(scale_inv_bytes(x, K, M), 256); };
    // GPT-2 c_attn, c_fc, mlp.c_proj; Llama qkv, gate|up, down (the attention projection saves none)
    const size_t per_block = 2 * saved(m.n_embd) + saved(m.ffn_hidden);
    EXPECT_EQ(q4.precision.saved_inputs, per_block * m.n_layer);
    const size_t expand = quant_gemm_scratch_bytes(x, fp4.precision.w, M, m.ffn_hidden, m.n_embd);
    EXPECT_GE(q4.precision.scratch, expand);
    EXPECT_LT(q8.precision.scratch, q4.precision.scratch);
    // The default keeps the first and the last block in BF16: their inputs are BF16 activations again.
    const RunConfig def = config(preset, "nvfp4", B, T);
    const ModelMemory d = plan_model_memory(def.model, B, T, 0, def.precision);
    EXPECT_EQ(d.precision.saved_inputs, per_block * (m.n_layer - 2));
    EXPECT_GT(d.activation(ActivationUse::Saved), q4.activation(ActivationUse::Saved));
  }
}

// Quartet (mxfp4) keeps the forward's own codes: every linear (the attention projection included) saves Xq (M, K)
// with its 1x32 E8M0 scales and its trust mask (one bit per element), and the weight cache holds Wq (N, K), its
// scales and mask, with no transposed copy; without masks both shrink by exactly the masks.
TEST(MemoryPlan, QuartetSavesForwardCodesAndTrustMasks) {
  const int B = 4, T = 1024, M = B * T;
  const RunConfig q = config("gpt2-124m", "mxfp4", B, T);
  const RunConfig nomask = config("gpt2-124m", "mxfp4", B, T, {"precision.trust_mask=false"});
  const ModelMemory with = plan_model_memory(q.model, B, T, 0, q.precision);
  const ModelMemory without = plan_model_memory(nomask.model, B, T, 0, nomask.precision);
  const ModelSpec& m = q.model;
  const Encoding& x = q.precision.x;
  auto mask = [](size_t rows, int K) { return round_up(sizeof(uint32_t) * rows * (K / 32), 256); };
  auto saved = [&](int K) { return round_up(code_bytes(x, M, K), 256) + round_up(scale_inv_bytes(x, M, K), 256); };
  // c_attn, attn.c_proj and c_fc read n_embd features, mlp.c_proj ffn_hidden
  const size_t per_block = 3 * saved(m.n_embd) + saved(m.ffn_hidden);
  const size_t masks_per_block = 3 * mask(M, m.n_embd) + mask(M, m.ffn_hidden);
  EXPECT_EQ(without.precision.saved_inputs, per_block * m.n_layer);
  EXPECT_EQ(with.precision.saved_inputs, (per_block + masks_per_block) * m.n_layer);
  EXPECT_GT(with.precision.weight_caches, without.precision.weight_caches);
  const RunConfig fp4 = config("gpt2-124m", "nvfp4", B, T, {"precision.bf16_layers=[]"});
  EXPECT_LT(without.precision.weight_caches,
            plan_model_memory(fp4.model, B, T, 0, fp4.precision).precision.weight_caches);
}

// The norm and activation outputs that blocks do not keep for backward share one working buffer per tensor, and that
// buffer exists only when some block uses it: BF16 without recompute keeps every one in the block's own buffer and
// carves none (recompute 1 carves all three); an FP8 recipe saves the linears' inputs quantised and shares them either
// way. Without recompute the forward's working buffers share memory with the backward's, so recompute 1 adds what
// the smaller set held.
TEST(MemoryPlan, SharedInputBuffersOnlyWhenABlockUsesThem) {
  const int B = 4, T = 1024;
  const size_t N = static_cast<size_t>(B) * T;
  for (const char* preset : {"gpt2-124m", "llama-1b"}) {
    SCOPED_TRACE(preset);
    const RunConfig bf16 = config(preset, "bf16", B, T);
    const RunConfig fp8 = config(preset, "fp8_tensorwise", B, T);
    const bool llama = bf16.model.arch == "llama";  // GPT-2's BF16 projections add the residual in their GEMM
    auto working = [&](const RunConfig& cfg, int recompute) {
      return plan_model_memory(cfg.model, B, T, recompute, cfg.precision).activation(ActivationUse::Working);
    };
    const size_t backward = backward_only_elements(bf16.model);
    const size_t bf16_forward = forward_only_elements(bf16.model, false, false, llama);
    const size_t bf16_forward_recompute = forward_only_elements(bf16.model, true, false, llama);
    EXPECT_EQ(working(bf16, 1) - working(bf16, 0),
              (bf16_forward_recompute + backward - std::max(bf16_forward, backward)) * N * 2);
    const size_t fp8_forward = forward_only_elements(fp8.model, true, false, true);
    EXPECT_EQ(working(fp8, 1) - working(fp8, 0), std::min(fp8_forward, backward) * N * 2);
    // One BF16 block under an FP8 recipe keeps its own inputs; the others still share, so the buffers stay.
    const RunConfig mixed = config(preset, "fp8_tensorwise", B, T, {"precision.bf16_layers=[0]"});
    EXPECT_EQ(working(mixed, 0), working(fp8, 0));
  }
}

// The coat preset with its FP8 copies alone (the MLP activation kept, the weights' row and transposed codes cached).
const std::vector<std::string> kCoatCopiesOnly = {"precision.recompute_mlp_act=false", "precision.cache_weights=true",
                                                  "precision.cache_weight_transpose=true"};

// COAT's FP8 activations: under coat the tensors the non-linear layers read in backward are saved as E4M3 codes with
// one FP32 scale per 16 channels (1.25 bytes per element at these sizes) instead of BF16, and their BF16 values move
// to working buffers shared by the blocks; the linears' FP8 state is fp8_tensorwise's, and the moments are fp8_expand.
TEST(MemoryPlan, CoatSavesNonlinearInputsAsFp8Groups) {
  const int B = 4, T = 1024;
  const size_t N = static_cast<size_t>(B) * T;
  for (const char* preset : {"gpt2-124m", "llama-1b"}) {
    SCOPED_TRACE(preset);
    const RunConfig fp8 = config(preset, "fp8_tensorwise", B, T);
    const RunConfig coat = config(preset, "coat", B, T, kCoatCopiesOnly);
    const ModelMemory q = plan_model_memory(fp8.model, B, T, 0, fp8.precision);
    const ModelMemory c = plan_model_memory(coat.model, B, T, 0, coat.precision);
    const size_t C = coat.model.n_embd, F = coat.model.ffn_hidden, L = coat.model.n_layer;
    // (tensor elements replaced by copies, BF16 working elements added)
    const bool llama = coat.model.arch == "llama";
    // The embedding output and each block's residual2 and residual3 (the norms' inputs), and each block's input of
    // the activation function (Llama's gate|up, GPT-2's pre-GELU); working: the two residual-stream buffers and one
    // for the activation function's input, forward-only buffers that share memory with the backward's.
    const size_t act_in = llama ? 2 * F : F;
    const size_t replaced = N * C * (1 + 2 * L) + N * act_in * L;
    EXPECT_EQ(q.activation(ActivationUse::Saved) - c.activation(ActivationUse::Saved), replaced * 2 - replaced * 5 / 4);
    const size_t backward = backward_only_elements(coat.model);
    const size_t q_forward = forward_only_elements(fp8.model, true, false, true);
    const size_t c_forward = forward_only_elements(coat.model, true, true, true);
    EXPECT_EQ(c_forward - q_forward, 2 * C + act_in);
    EXPECT_EQ(c.activation(ActivationUse::Working) - q.activation(ActivationUse::Working),
              (std::max(c_forward, backward) - std::max(q_forward, backward)) * N * 2);
    EXPECT_EQ(c.activation(ActivationUse::Logits), q.activation(ActivationUse::Logits));
    EXPECT_EQ(c.precision.total(), q.precision.total());
    const MemoryPlan plan = plan_memory(coat, 1);
    const size_t n = plan.optimizer_elements;
    EXPECT_EQ(plan.bytes("optimizer states"),
              StateFormat::fp8_expand().m.bytes(n) + StateFormat::fp8_expand().v.bytes(n));
  }
}

// precision.recompute_mlp_act: the MLP's down projection keeps no quantised copy of its input (ffn_hidden FP8 bytes
// per token and block), and the backward gets one buffer of its own for the recomputed activation (ffn_hidden BF16
// elements per token, in the working memory the forward's buffers overlay). Every other allocation stays. With the
// weight cache on, cache_weight_transpose = false drops the transposed codes (one byte per FP8 parameter); the preset
// keeps no weight codes at all (UncachedWeightsLiveInScratch).
TEST(MemoryPlan, CoatRecomputesTheMlpActivationInsteadOfKeepingIt) {
  const int B = 4, T = 1024;
  const size_t N = static_cast<size_t>(B) * T;
  for (const char* preset : {"gpt2-124m", "llama-1b"}) {
    SCOPED_TRACE(preset);
    const RunConfig coat = config(preset, "coat", B, T, kCoatCopiesOnly);
    const RunConfig flow = config(preset, "coat", B, T,
                                  {"precision.cache_weights=true", "precision.cache_weight_transpose=true"});
    const ModelMemory c = plan_model_memory(coat.model, B, T, 0, coat.precision);
    const ModelMemory r = plan_model_memory(flow.model, B, T, 0, flow.precision);
    const size_t F = coat.model.ffn_hidden, L = coat.model.n_layer;
    EXPECT_EQ(c.precision.saved_inputs - r.precision.saved_inputs, N * F * L);
    EXPECT_EQ(r.activation(ActivationUse::Saved), c.activation(ActivationUse::Saved));
    const size_t backward = backward_only_elements(coat.model);
    const size_t forward = forward_only_elements(coat.model, true, true, true);
    EXPECT_EQ(r.activation(ActivationUse::Working) - c.activation(ActivationUse::Working),
              (std::max(forward, backward + F) - std::max(forward, backward)) * N * 2);
    EXPECT_EQ(r.precision.weight_caches, c.precision.weight_caches);
    EXPECT_GE(r.precision.scratch, c.precision.scratch);  // the wgrad input quantised in backward
    EXPECT_LE(r.precision.scratch - c.precision.scratch, N * F);
    EXPECT_LT(r.total(), c.total());
    const RunConfig rows = config(preset, "coat", B, T, {"precision.cache_weights=true"});
    const ModelMemory p = plan_model_memory(rows.model, B, T, 0, rows.precision);
    EXPECT_EQ(p.precision.weight_caches * 2, r.precision.weight_caches);  // row codes only (no padding at these sizes)
    EXPECT_EQ(p.activation(ActivationUse::Saved), r.activation(ActivationUse::Saved));
    EXPECT_LT(p.total(), r.total());
    const RunConfig full = config(preset, "coat", B, T);
    const ModelMemory f = plan_model_memory(full.model, B, T, 0, full.precision);
    EXPECT_EQ(f.precision.weight_caches, 0u);
    EXPECT_EQ(f.activation(ActivationUse::Saved), r.activation(ActivationUse::Saved));
    EXPECT_LT(f.total(), p.total());
  }
  // It needs the FP8 copies.
  EXPECT_THROW(config("llama-1b", "fp8_tensorwise", B, T, {"precision.recompute_mlp_act=true"}), Error);
  EXPECT_THROW(config("llama-1b", "bf16", B, T, {"precision.recompute_mlp_act=true"}), Error);
}

// precision.cache_weights = false: no linear keeps weight codes (the weight caches are empty); every cast goes to the
// shared scratch, which grows by at most the largest linear's row and transposed codes (and block scales). The
// saved activations do not change. FP4 weights and recipes without quantised linears refuse it.
TEST(MemoryPlan, UncachedWeightsLiveInScratch) {
  const int B = 4, T = 1024;
  for (const char* preset : {"gpt2-124m", "llama-1b"}) {
    for (const char* recipe : {"fp8_tensorwise", "fp8_blockwise", "coat"}) {
      SCOPED_TRACE(std::string(preset) + " " + recipe);
      const RunConfig cached = config(preset, recipe, B, T, {"precision.cache_weights=true"});
      const RunConfig uncached = config(preset, recipe, B, T, {"precision.cache_weights=false"});
      const ModelMemory c = plan_model_memory(cached.model, B, T, 0, cached.precision);
      const ModelMemory u = plan_model_memory(uncached.model, B, T, 0, uncached.precision);
      EXPECT_GT(c.precision.weight_caches, 0u);
      EXPECT_EQ(u.precision.weight_caches, 0u);
      EXPECT_EQ(u.precision.saved_inputs, c.precision.saved_inputs);
      EXPECT_EQ(u.activation(ActivationUse::Saved), c.activation(ActivationUse::Saved));
      const ModelSpec& m = cached.model;
      const size_t widest = std::max({static_cast<size_t>(m.n_embd) * m.n_embd * 3,
                                      static_cast<size_t>(m.n_embd) * m.ffn_hidden * (m.arch == "llama" ? 2 : 1)});
      EXPECT_GE(u.precision.scratch, c.precision.scratch);
      EXPECT_LE(u.precision.scratch - c.precision.scratch, 2 * widest + widest / 16);  // codes both ways + scales
      EXPECT_LT(u.total(), c.total());
    }
  }
  EXPECT_THROW(config("llama-1b", "nvfp4", B, T, {"precision.cache_weights=false"}), Error);
  EXPECT_THROW(config("llama-1b", "mxfp4", B, T, {"precision.cache_weights=false"}), Error);
  EXPECT_THROW(config("llama-1b", "bf16", B, T, {"precision.cache_weights=false"}), Error);
}

// Issue 14's memory goal in plans: at BF16's largest micro-batch on one 139 GiB GPU (44 on llama-1b, 17 on llama-3b,
// T = 2048) the coat preset plans at most 0.65x BF16's memory. The plans were within 2% of the measured peaks
// (dev/bench/results/coat/README.md: 0.634x and 0.638x measured); at smaller micro-batches the 10 bytes per parameter
// of weights, master weights and gradients keep the ratio above 0.65.
TEST(MemoryPlan, CoatPlansAtMostTwoThirdsOfBf16WhereActivationsDominate) {
  for (const auto& [preset, B] : std::vector<std::pair<std::string, int>>{{"llama-1b", 44}, {"llama-3b", 17}}) {
    SCOPED_TRACE(preset);
    const double bf16 = static_cast<double>(plan_memory(config(preset, "bf16", B, 2048), 1).total());
    const double coat = static_cast<double>(plan_memory(config(preset, "coat", B, 2048), 1).total());
    const double cached =
        static_cast<double>(plan_memory(config(preset, "coat", B, 2048, {"precision.cache_weights=true"}), 1).total());
    EXPECT_LE(coat, 0.65 * bf16) << coat / bf16;
    EXPECT_LT(coat, cached);
  }
}

// Issue 14's llama-7b goal in plans: on one H200 (about 138.9 GiB for the run at T = 2048) the coat preset's largest
// micro-batch is at least 3x BF16's (GPT-2 vocabulary; plans: BF16 2 at 132.35 GiB, coat 11 at 137.13; measured: 2
// and 11).
TEST(MemoryPlan, Llama7bCoatFitsThreeTimesBf16sMicroBatch) {
  const double budget = 138.9 * 1073741824.0;
  auto largest = [&](const char* recipe) {
    int b = 0;
    while (plan_memory(config("llama-7b", recipe, b + 1, 2048), 1).total() <= budget) b++;
    return b;
  };
  const int bf16 = largest("bf16"), coat = largest("coat");
  EXPECT_GE(bf16, 1);
  EXPECT_GE(coat, 3 * bf16) << "coat " << coat << ", bf16 " << bf16;
}

// The optimizer-state row is the state format's m.bytes(n) + v.bytes(n): bf16 halves fp32.
TEST(MemoryPlan, OptimizerStatesFollowTheStateFormat) {
  for (const char* preset : {"gpt2-124m", "llama-1b"}) {
    SCOPED_TRACE(preset);
    const MemoryPlan fp32 = plan_memory(config(preset, "bf16", 4, 1024), 1);
    const MemoryPlan bf16 = plan_memory(config(preset, "bf16", 4, 1024, {"optimizer.state_format=bf16"}), 1);
    const size_t n = fp32.optimizer_elements;
    EXPECT_EQ(fp32.bytes("optimizer states"), StateFormat::fp32().m.bytes(n) + StateFormat::fp32().v.bytes(n));
    EXPECT_EQ(bf16.bytes("optimizer states"), StateFormat::bf16().m.bytes(n) + StateFormat::bf16().v.bytes(n));
    EXPECT_EQ(2 * bf16.bytes("optimizer states"), fp32.bytes("optimizer states"));
    EXPECT_EQ(fp32.total() - bf16.total(), n * 4);
    for (const char* row : {"weights", "master weights", "gradients", "precision state", "saved activations"})
      EXPECT_EQ(fp32.bytes(row), bf16.bytes(row)) << row;
  }
}

// ZeRO-1 shards the master weights and the moments (this rank's pieces of the shard layout); the gradients and the
// weights stay whole; ZeRO-0 shards nothing.
TEST(MemoryPlan, ZeroOneShardsMasterWeightsAndOptimizerStates) {
  const RunConfig one_cfg = config("llama-1b", "bf16", 4, 1024);
  const MemoryPlan one = plan_memory(one_cfg, 1);
  const RunConfig eight_cfg = config("llama-1b", "bf16", 4, 1024, {}, 8);
  const MemoryPlan eight = plan_memory(eight_cfg, 8);
  const ParamTable table = build_param_table(one_cfg.model);
  const ShardLayout layout = make_shard_layout(table, 8);
  EXPECT_TRUE(eight.sharded);
  EXPECT_EQ(eight.optimizer_elements, layout.owned_elements(0));
  EXPECT_LT(eight.optimizer_elements, table.total_elements / 8 + 8 * ShardLayout::kAlign);
  EXPECT_EQ(eight.bytes("master weights"), eight.optimizer_elements * 4);
  EXPECT_EQ(eight.bytes("optimizer states"), eight.optimizer_elements * 8);
  EXPECT_EQ(eight.bytes("gradients"), one.bytes("gradients"));
  EXPECT_EQ(eight.bytes("weights"), one.bytes("weights"));
  const MemoryPlan zero0 = plan_memory(config("llama-1b", "bf16", 4, 1024, {"parallel.zero_stage=0"}, 8), 8);
  EXPECT_FALSE(zero0.sharded);
  EXPECT_EQ(zero0.bytes("optimizer states"), one.bytes("optimizer states"));
}

// llama-7b with FP32 states holds 18 bytes per parameter before its first activation (bf16 weights, fp32 master,
// gradients, m and v): with Llama 2's vocabulary the 113 GiB the COAT issue quotes for BF16 on one H200.
TEST(MemoryPlan, Llama7bStateBeforeActivations) {
  const RunConfig cfg = config("llama-7b", "bf16", 1, 2048, {"model.vocab_size=32000"});
  const MemoryPlan plan = plan_memory(cfg, 1);
  const size_t elements = build_param_table(cfg.model).total_elements;
  const size_t state = plan.bytes("weights") + plan.bytes("master weights") + plan.bytes("gradients") +
                       plan.bytes("optimizer states");
  EXPECT_EQ(state, 18 * elements);
  EXPECT_EQ(format_gib(state), "112.96 GiB");
  EXPECT_GT(plan.total(), state);
}

// A counting model makes no CUDA call (this test runs without a GPU) and refuses to run.
TEST(MemoryPlan, ACountingModelRefusesToRun) {
  const RunConfig cfg = config("llama-tiny", "fp8_tensorwise", 2, 64);
  const std::unique_ptr<Model> model = counted_model(cfg);
  EXPECT_EQ(model->params(), nullptr);
  EXPECT_EQ(model->grads(), nullptr);
  EXPECT_FALSE(model->precision_state()->allocates());
  const std::vector<int> tokens(2 * 64, 1);
  try {
    model->forward(tokens.data(), tokens.data(), 2, 64, 1.0f, nullptr);
    FAIL() << "a counting model ran a forward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DeviceMemory::Count"), std::string::npos) << e.what();
  }
}

// The --dry-run table: every row with GiB and bytes, and the total.
TEST(MemoryPlan, DryRunPrintsTheRows) {
  const RunConfig cfg = config("llama-1b", "fp8_tensorwise", 4, 1024, {"optimizer.state_format=bf16"});
  const MemoryPlan plan = plan_memory(cfg, 1);
  const std::string table = format_memory_plan(plan, "  ");
  for (const MemoryPlan::Row& r : plan.rows) {
    EXPECT_NE(table.find(std::string("  ") + r.name), std::string::npos) << r.name << " not in:\n" << table;
    EXPECT_NE(table.find(with_thousands(r.bytes) + " B"), std::string::npos) << r.name << " not in:\n" << table;
  }
  EXPECT_NE(table.find("total"), std::string::npos);
  EXPECT_NE(table.find(format_gib(plan.total())), std::string::npos);
  EXPECT_NE(table.find("optimizer.state_format bf16"), std::string::npos);
  const std::string report = dry_run_report(cfg, 1);
  EXPECT_NE(report.find(table), std::string::npos) << report;
  EXPECT_EQ(format_gib(size_t{3} << 29), "1.50 GiB");
}
