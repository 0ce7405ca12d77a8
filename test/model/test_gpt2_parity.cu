// test/model/test_gpt2_parity.cu: the whole GPT-2 (llmc/model/gpt2/gpt2.h + llmc/optim/adamw.h) against the PyTorch reference
// (dev/reference/gpt2.py): logits, loss and every parameter gradient of one forward/backward, then the losses of 10
// AdamW steps on the same batch. The reference computes in FP32 on the bf16-rounded weights (see gpt2.py), so the
// differences come from our bf16 activations; tolerances are set for that (kTol: parity_util.cuh's Tolerances) and a
// table of the per-tensor relative errors and cosines is printed. gpt2-tiny under the three FP8 recipes is held to
// FP8 tolerances.
//
// The debug state comes from $LLM8_PARITY_DIR (model.safetensors + debug_state.safetensors) when set; otherwise the
// test runs `python3 dev/reference/gpt2.py` itself for the gpt2-tiny preset and exits 77 (skipped) when python3 or
// torch is missing.
//
// This file owns GPT-2's parts: the reference script's arguments, the spec read back from the debug state, and the
// BF16 parity body; the comparisons, the tolerances and the FP8 parity body are parity_util.cuh's (shared with
// test_llama_parity.cu).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/model/gpt2/gpt2.h"
#include "llmc/model/model.h"
#include "llmc/model/model_spec.h"
#include "llmc/optim/adamw.h"
#include "llmc/io/safetensors.h"
#include "test/support/parity_util.cuh"

using namespace llmc;
using namespace parity;

namespace {

// BF16 activations (8 significant bits, ~0.4% per rounding, a few dozen roundings deep): parity_util.cuh's bounds.
const Tolerances kTol;

const Reference kReference{"LLM8_PARITY_DIR", "/tmp/llm8_parity_", "dev/reference/gpt2.py"};

void make_debug_state(DebugState* ds, const ModelSpec& spec, int B, int T) {
  parity::make_debug_state(
      ds, kReference,
      strformat("--preset gpt2-tiny --n_layer %d --n_head %d --n_embd %d --max_seq_len %d --vocab_size %d "
                "--padded_vocab_size %d --ffn_hidden %d --B %d --T %d --seed 1",
                spec.n_layer, spec.n_head, spec.n_embd, spec.max_seq_len, spec.vocab_size, spec.padded_vocab_size,
                spec.ffn_hidden, B, T));
}

ModelSpec spec_from_metadata(const SafetensorsReader& r) {
  ModelSpec spec;
  spec.arch = "gpt2";
  spec.n_layer = std::stoi(meta(r, "n_layer"));
  spec.n_head = std::stoi(meta(r, "n_head"));
  spec.n_kv_head = spec.n_head;
  spec.n_embd = std::stoi(meta(r, "n_embd"));
  spec.max_seq_len = std::stoi(meta(r, "max_seq_len"));
  spec.vocab_size = std::stoi(meta(r, "vocab_size"));
  spec.padded_vocab_size = std::stoi(meta(r, "padded_vocab_size"));
  spec.ffn_hidden = std::stoi(meta(r, "ffn_hidden"));
  return spec;
}

void run_parity(int B, int T, bool extra_checks) {
  ModelSpec preset;
  ASSERT_TRUE(model_preset("gpt2-tiny", &preset));
  if (T > preset.max_seq_len) GTEST_SKIP() << "T=" << T << " exceeds gpt2-tiny's context " << preset.max_seq_len;
  DebugState ds;
  make_debug_state(&ds, preset, B, T);
  SafetensorsReader weights(ds.dir + "/model.safetensors");
  SafetensorsReader dbg(ds.dir + "/debug_state.safetensors");
  const ModelSpec spec = spec_from_metadata(weights);
  B = std::stoi(meta(dbg, "B"));
  T = std::stoi(meta(dbg, "T"));
  const int N = B * T, V = spec.vocab_size, Vp = spec.padded_vocab_size;
  std::printf("parity: L=%d NH=%d C=%d V=%d Vp=%d B=%d T=%d (%s)\n", spec.n_layer, spec.n_head, spec.n_embd, V, Vp,
              B, T, ds.dir.c_str());

  // inputs and targets (I32, (B, T))
  std::vector<int> x, y;
  read_batch(dbg, N, &x, &y);

  GPT2 model(spec, B, T, /*recompute=*/0);
  const ParamTable& table = model.table();
  std::vector<float> master;
  ASSERT_NO_FATAL_FAILURE(load_master(table, weights, &master));
  const double beta1 = std::stod(meta(dbg, "beta1")), beta2 = std::stod(meta(dbg, "beta2"));
  const double eps = std::stod(meta(dbg, "eps")), wd = std::stod(meta(dbg, "weight_decay"));
  const float lr = std::stof(meta(dbg, "lr")), clip = std::stof(meta(dbg, "grad_clip"));
  const int steps = std::stoi(meta(dbg, "steps"));
  AdamW opt(table, beta1, beta2, eps, wd);
  opt.set_master(master.data(), model.params(), 0);

  // 1. logits and loss (no gradient)
  model.forward(x.data(), y.data(), B, T, 0.0f, 0);
  const float loss0 = model.mean_loss(0);
  const std::vector<bf16> logits_bf = download_logits(model, N, Vp);  // (N, Vp)
  const std::vector<float> logits = unpadded_logits(logits_bf, N, V, Vp);  // (N, V): padded columns dropped
  std::vector<float> ref_logits = dbg.read_as_float("logits");
  ASSERT_EQ(ref_logits.size(), logits.size());
  Compare cl = compare(logits.data(), ref_logits.data(), logits.size());
  const float ref_loss = dbg.read_as_float("loss")[0];
  std::printf("logits: relerr %.3e cosine %.6f maxabs %.3e | loss ours %.6f ref %.6f diff %.2e\n", cl.relerr,
              cl.cosine, cl.maxabs, loss0, ref_loss, std::fabs(loss0 - ref_loss));
  EXPECT_LT(cl.relerr, kTol.logits_relerr);
  EXPECT_GT(cl.cosine, kTol.logits_cosine);
  EXPECT_NEAR(loss0, ref_loss, kTol.loss_abs);
  bool padded_zero = true;
  for (int n = 0; n < N; n++) {
    for (int v = V; v < Vp; v++) padded_zero &= __bfloat162float(logits_bf[(size_t)n * Vp + v]) == 0.0f;
  }
  EXPECT_TRUE(padded_zero) << "logits of the padded vocabulary columns must be 0";

  // 2. gradients of one forward/backward
  float loss1 = 0;
  std::vector<float> grads = train_grads(model, x, y, B, T, &loss1);
  EXPECT_NEAR(loss1, ref_loss, kTol.loss_abs) << "training forward loss";
  check_grads(table, grads, dbg, kTol, "recompute=0");

  if (extra_checks) {
    // bitwise determinism: the same step again
    float loss2 = 0;
    std::vector<float> grads2 = train_grads(model, x, y, B, T, &loss2);
    EXPECT_EQ(0, std::memcmp(grads.data(), grads2.data(), grads.size() * sizeof(float)))
        << "two identical backward passes gave different gradients";
    EXPECT_EQ(loss1, loss2);
    // gradient accumulation: two micro-steps without zeroing give twice the gradient (up to FP32 rounding)
    model.zero_grads(0);
    for (int micro = 0; micro < 2; micro++) {
      model.forward(x.data(), y.data(), B, T, 1.0f / (B * T), 0);
      model.backward(0);
    }
    std::vector<float> acc(table.total_elements);
    CUDA_CHECK(cudaMemcpy(acc.data(), model.grads(), acc.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (auto& g : grads2) g *= 2.0f;
    Compare ca = compare(acc.data(), grads2.data(), acc.size());
    EXPECT_LT(ca.relerr, 1e-6) << "accumulated gradients are not the sum of the micro-steps";
    // recompute=1 gives the same physics
    GPT2 model_rc(spec, B, T, /*recompute=*/1);
    CUDA_CHECK(cudaMemcpy(model_rc.params(), model.params(), table.total_elements * sizeof(bf16),
                          cudaMemcpyDeviceToDevice));
    float loss_rc = 0;
    std::vector<float> grads_rc = train_grads(model_rc, x, y, B, T, &loss_rc);
    EXPECT_NEAR(loss_rc, ref_loss, kTol.loss_abs);
    check_grads(table, grads_rc, dbg, kTol, "recompute=1");
    std::printf("activation bytes: recompute=0 %zu, recompute=1 %zu\n", model.activation_bytes(),
                model_rc.activation_bytes());
    EXPECT_LT(model_rc.activation_bytes(), model.activation_bytes());
  }

  // 3. AdamW steps on the same batch (the optimizer state is fresh: set_master above, m = v = 0)
  std::vector<float> ref_losses = dbg.read_as_float("losses");
  ASSERT_EQ((int)ref_losses.size(), steps);
  std::printf("%4s %12s %12s %10s %10s\n", "step", "ours", "ref", "diff", "grad_norm");
  for (int t = 1; t <= steps; t++) {
    const float loss = train_step(model, opt, x, y, B, T, lr, t, clip);
    const float norm = opt.last_grad_norm(0);
    std::printf("%4d %12.6f %12.6f %10.2e %10.4f\n", t, loss, ref_losses[t - 1], std::fabs(loss - ref_losses[t - 1]),
                norm);
    EXPECT_NEAR(loss, ref_losses[t - 1], kTol.train_loss_abs) << "AdamW step " << t;
  }
  EXPECT_LT(ref_losses.back(), ref_losses.front()) << "the reference run should learn the batch";
}

// FP8 recipes on gpt2-tiny against the same FP32 reference, at parity_util.cuh's FP8 tolerances.
const Fp8Tolerances kFp8Tol;

void run_fp8_parity(const char* recipe_name) {
  ModelSpec preset;
  ASSERT_TRUE(model_preset("gpt2-tiny", &preset));
  DebugState ds;
  make_debug_state(&ds, preset, 4, 64);
  SafetensorsReader weights(ds.dir + "/model.safetensors");
  SafetensorsReader dbg(ds.dir + "/debug_state.safetensors");
  parity::run_fp8_parity(recipe_name, spec_from_metadata(weights), weights, dbg, kFp8Tol);
}

// COAT's FP8 activations over BF16 GEMMs on the same gpt2-tiny state (parity_util.cuh's run_nonlinear_fp8_parity).
void run_nonlinear_fp8_parity() {
  ModelSpec preset;
  ASSERT_TRUE(model_preset("gpt2-tiny", &preset));
  DebugState ds;
  make_debug_state(&ds, preset, 4, 64);
  SafetensorsReader weights(ds.dir + "/model.safetensors");
  SafetensorsReader dbg(ds.dir + "/debug_state.safetensors");
  parity::run_nonlinear_fp8_parity(spec_from_metadata(weights), weights, dbg, parity::NonlinearFp8Tolerances());
}

}  // namespace

TEST(GPT2Fp8Parity, Tensorwise) { run_fp8_parity("fp8_tensorwise"); }
TEST(GPT2Fp8Parity, Delayed) { run_fp8_parity("fp8_delayed"); }
TEST(GPT2Fp8Parity, Blockwise) { run_fp8_parity("fp8_blockwise"); }
TEST(GPT2Fp8Parity, Coat) { run_fp8_parity("coat"); }
TEST(GPT2NonlinearFp8Parity, AgainstBf16AndTheReference) { run_nonlinear_fp8_parity(); }

TEST(GPT2Parity, Tiny_B4_T64) { run_parity(4, 64, /*extra_checks=*/true); }
TEST(GPT2Parity, Tiny_B4_T100) {
  if (std::getenv("LLM8_PARITY_DIR")) GTEST_SKIP() << "LLM8_PARITY_DIR holds one shape; ran it in Tiny_B4_T64";
  run_parity(4, 100, false);
}
TEST(GPT2Parity, Tiny_B4_T256) {
  if (std::getenv("LLM8_PARITY_DIR")) GTEST_SKIP() << "LLM8_PARITY_DIR holds one shape; ran it in Tiny_B4_T64";
  run_parity(4, 256, false);
}
