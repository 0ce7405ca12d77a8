// test/support/parity_util.cuh: what the whole-model parity tests (test_gpt2_parity.cu, test_llama_parity.cu) share: the
// debug state a PyTorch reference script writes (or a directory an environment variable names), the relative-error /
// cosine comparison, host copies of logits and gradients, the per-tensor gradient table, the tolerances (BF16 and
// FP8), the FP8-recipe parity body (a model under an FP8 recipe against the FP32 reference) and the nonlinear_fp8 one
// (COAT's FP8 activations against the BF16 model and the reference). What is per family
// stays in the test files: the model shapes, the reference script and its arguments, reading the spec back from the
// debug state, and the BF16 parity bodies. Header-only; every function is inline.
#pragma once

#include <stdlib.h>  // mkdtemp
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/precision/gemm.h"
#include "llmc/model/model.h"
#include "llmc/model/model_spec.h"
#include "llmc/optim/adamw.h"
#include "llmc/precision/recipe.h"
#include "llmc/io/safetensors.h"

namespace parity {

using llmc::bf16;

// BF16 tolerances, justified by BF16 activations (8 significant bits, ~0.4% per rounding, a few dozen roundings
// deep); both families answer to the same ones.
struct Tolerances {
  double logits_relerr = 3e-2;   // ||ours - ref|| / ||ref|| over all logits
  double logits_cosine = 0.999;
  double loss_abs = 1e-2;        // |mean loss - ref|
  double grad_relerr = 5e-2;     // per tensor ||ours - ref|| / ||ref||
  double grad_cosine = 0.999;    // per tensor
  double train_loss_abs = 2e-2;  // each of the 10 AdamW-step losses
};

// FP8 tolerances (FP8's, not BF16's): E4M3 keeps 3 mantissa bits (relative rounding error up to 2^-4 per element),
// E5M2 2 bits, so logits, loss and gradients move by a few percent; what must hold is that every gradient points the
// same way (cosine) and that training on the batch follows the reference's loss curve.
struct Fp8Tolerances {
  double logits_cosine = 0.995;
  double loss_abs = 5e-2;
  double grad_cosine = 0.97;     // per tensor
  double grad_relerr = 0.25;     // per tensor
  double train_loss_abs = 0.15;  // each of the 10 AdamW-step losses
};

struct Compare {
  double relerr = 0, cosine = 0, maxabs = 0, ref_norm = 0;
};

// ours, ref: (n) floats. relerr = ||ours - ref|| / ||ref|| (the absolute norm when ref is 0), cosine of the angle
// between them, the largest |ours - ref| and ||ref||; sums in FP64.
inline Compare compare(const float* ours, const float* ref, size_t n) {
  double dd = 0, rr = 0, oo = 0, orr = 0, mx = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = (double)ours[i] - (double)ref[i];
    dd += d * d;
    rr += (double)ref[i] * ref[i];
    oo += (double)ours[i] * ours[i];
    orr += (double)ours[i] * ref[i];
    mx = std::max(mx, std::fabs(d));
  }
  Compare c;
  c.ref_norm = std::sqrt(rr);
  c.relerr = rr > 0 ? std::sqrt(dd / rr) : std::sqrt(dd);
  c.cosine = (rr > 0 && oo > 0) ? orr / std::sqrt(rr * oo) : (dd == 0 ? 1.0 : 0.0);
  c.maxabs = mx;
  return c;
}

inline std::string meta(const llmc::SafetensorsReader& r, const char* key) {
  auto it = r.metadata().find(key);
  if (it == r.metadata().end()) llmc::throw_error("%s: metadata has no key '%s'", r.path().c_str(), key);
  return it->second;
}

// Where the debug state (model.safetensors + debug_state.safetensors) lives: the directory $dir_env names, or a fresh
// one filled by the reference script (removed afterwards unless LLM8_KEEP_PARITY is set).
struct DebugState {
  std::string dir;
  bool created = false;
  ~DebugState() {
    if (created && std::getenv("LLM8_KEEP_PARITY") == nullptr) std::filesystem::remove_all(dir);
  }
};

// A family's reference script.
struct Reference {
  const char* dir_env;     // names a directory the script already wrote; when set, the script is not run
  const char* tmp_prefix;  // of the fresh directory, e.g. "/tmp/llm8_parity_"
  const char* script;      // relative to the source tree, e.g. "dev/reference/gpt2.py"
};

// Fills ds->dir: $ref.dir_env when set, otherwise runs `python3 <script> <args> --out <fresh dir>` (its log goes to
// reference.log there). Exits 77 (skipped) when python3 or torch is missing; throws when the script fails.
inline void make_debug_state(DebugState* ds, const Reference& ref, const std::string& args) {
  if (const char* env = std::getenv(ref.dir_env)) {
    ds->dir = env;
    return;
  }
  std::string tmpl = std::string(ref.tmp_prefix) + "XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) llmc::throw_error("cannot create a temporary directory under /tmp");
  ds->dir = tmpl;
  ds->created = true;
  const std::string cmd = llmc::strformat("python3 %s/%s %s --out %s > %s/reference.log 2>&1", LLM8_SOURCE_DIR,
                                          ref.script, args.c_str(), ds->dir.c_str(), ds->dir.c_str());
  std::printf("running: %s\n", cmd.c_str());
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77 || code == 127) {
    std::printf("SKIPPED: the PyTorch reference cannot run here (%s); install python3 with torch, or set "
                "%s to a directory written by %s\n",
                code == 127 ? "python3 not found" : "torch is not installed", ref.dir_env, ref.script);
    std::fflush(stdout);
    std::exit(77);
  }
  if (code != 0) {
    std::system(llmc::strformat("cat %s/reference.log", ds->dir.c_str()).c_str());
    llmc::throw_error("%s failed with exit code %d (log above)", ref.script, code);
  }
}

// The FP32 master weights (table.total_elements) from model.safetensors, each tensor at its table offset. A fatal
// failure when a tensor's size differs from the table's (callers: ASSERT_NO_FATAL_FAILURE).
inline void load_master(const llmc::ParamTable& table, const llmc::SafetensorsReader& weights,
                        std::vector<float>* master) {
  master->assign(table.total_elements, 0.0f);
  for (const llmc::ParamInfo& p : table.params) {
    std::vector<float> w = weights.read_as_float(p.name);
    ASSERT_EQ(w.size(), p.numel) << p.name << " has " << w.size() << " elements in model.safetensors";
    std::copy(w.begin(), w.end(), master->begin() + p.offset);
  }
}

// The inputs and targets of the debug state: (B, T) I32 each, N = B * T.
inline void read_batch(const llmc::SafetensorsReader& dbg, int N, std::vector<int>* x, std::vector<int>* y) {
  x->resize(N);
  y->resize(N);
  dbg.read_into("inputs", x->data(), x->size() * sizeof(int));
  dbg.read_into("targets", y->data(), y->size() * sizeof(int));
}

// The model's last logits as stored: (N, Vp) bf16, padded vocabulary columns included.
inline std::vector<bf16> download_logits(const llmc::Model& model, int N, int Vp) {
  std::vector<bf16> logits_bf((size_t)N * Vp);
  CUDA_CHECK(cudaMemcpy(logits_bf.data(), model.logits(), logits_bf.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  return logits_bf;
}

// (N, Vp) bf16 logits -> (N, V) floats: the padded columns dropped, as the reference writes them.
inline std::vector<float> unpadded_logits(const std::vector<bf16>& logits_bf, int N, int V, int Vp) {
  std::vector<float> logits((size_t)N * V);
  for (int n = 0; n < N; n++)
    for (int v = 0; v < V; v++) logits[(size_t)n * V + v] = __bfloat162float(logits_bf[(size_t)n * Vp + v]);
  return logits;
}

// Forward + backward at grad_scale 1/N (mean loss); returns the host gradients (table.total_elements).
inline std::vector<float> train_grads(llmc::Model& model, const std::vector<int>& x, const std::vector<int>& y, int B,
                                      int T, float* loss) {
  model.zero_grads(0);
  model.forward(x.data(), y.data(), B, T, 1.0f / (B * T), 0);
  model.backward(0);
  *loss = model.mean_loss(0);
  std::vector<float> g(model.table().total_elements);
  CUDA_CHECK(cudaMemcpy(g.data(), model.grads(), g.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return g;
}

// One AdamW step on the batch: forward + backward at grad_scale 1/N, then opt.step at lr (t: the step, from 1; clip:
// the gradient-norm clip). Returns the step's mean loss. FP8 models also need model.end_step(0) after it.
inline float train_step(llmc::Model& model, llmc::AdamW& opt, const std::vector<int>& x, const std::vector<int>& y,
                        int B, int T, float lr, int t, float clip) {
  model.zero_grads(0);
  model.forward(x.data(), y.data(), B, T, 1.0f / (B * T), 0);
  model.backward(0);
  const float loss = model.mean_loss(0);
  opt.step(model.params(), model.grads(), lr, t, clip, 0);
  return loss;
}

// Per-tensor comparison of a gradient buffer (table.total_elements) against the reference's grads.<name>, at the BF16
// tolerances; prints one line per tensor and the worst relerr / cosine.
inline void check_grads(const llmc::ParamTable& table, const std::vector<float>& grads,
                        const llmc::SafetensorsReader& dbg, const Tolerances& tol, const char* label) {
  std::printf("%-48s %12s %10s %10s %10s   [%s]\n", "gradient", "|ref|", "relerr", "cosine", "maxabs", label);
  double worst_rel = 0, worst_cos = 1;
  for (const llmc::ParamInfo& p : table.params) {
    std::vector<float> ref = dbg.read_as_float("grads." + p.name);
    ASSERT_EQ(ref.size(), p.numel) << p.name;
    Compare c = compare(grads.data() + p.offset, ref.data(), p.numel);
    std::printf("%-48s %12.4e %10.3e %10.6f %10.3e\n", p.name.c_str(), c.ref_norm, c.relerr, c.cosine, c.maxabs);
    EXPECT_LT(c.relerr, tol.grad_relerr) << label << ": gradient of " << p.name;
    EXPECT_GT(c.cosine, tol.grad_cosine) << label << ": gradient of " << p.name;
    worst_rel = std::max(worst_rel, c.relerr);
    worst_cos = std::min(worst_cos, c.cosine);
  }
  std::printf("worst gradient relerr %.3e, worst cosine %.6f [%s]\n", worst_rel, worst_cos, label);
}

// The FP8 parity body: the model of `spec` under the preset recipe `recipe_name`, with the reference's weights and
// batch, against the reference's logits and loss (no gradient), every parameter gradient of one forward/backward
// (twice: bitwise determinism), and the losses of the reference's AdamW steps on the same batch.
inline void run_fp8_parity(const char* recipe_name, const llmc::ModelSpec& spec, const llmc::SafetensorsReader& weights,
                           const llmc::SafetensorsReader& dbg, const Fp8Tolerances& tol) {
  const int B = std::stoi(meta(dbg, "B")), T = std::stoi(meta(dbg, "T"));
  const int N = B * T, V = spec.vocab_size, Vp = spec.padded_vocab_size;
  llmc::PrecisionRecipe recipe;
  ASSERT_TRUE(llmc::precision_recipe_preset(recipe_name, &recipe));
  llmc::gemm_init();
  std::unique_ptr<llmc::Model> model = llmc::make_model(spec, B, T, 0, recipe);
  const llmc::ParamTable& table = model->table();
  std::vector<float> master;
  ASSERT_NO_FATAL_FAILURE(load_master(table, weights, &master));
  std::vector<int> x, y;
  read_batch(dbg, N, &x, &y);
  llmc::AdamW opt(table, std::stod(meta(dbg, "beta1")), std::stod(meta(dbg, "beta2")), std::stod(meta(dbg, "eps")),
                  std::stod(meta(dbg, "weight_decay")));
  opt.set_master(master.data(), model->params(), 0);
  model->weights_changed();

  model->forward(x.data(), y.data(), B, T, 0.0f, 0);
  const float loss0 = model->mean_loss(0);
  const std::vector<float> logits = unpadded_logits(download_logits(*model, N, Vp), N, V, Vp);  // (N, V)
  const std::vector<float> ref_logits = dbg.read_as_float("logits");
  const Compare cl = compare(logits.data(), ref_logits.data(), logits.size());
  const float ref_loss = dbg.read_as_float("loss")[0];
  std::printf("[%s] logits relerr %.3e cosine %.6f | loss %.6f ref %.6f\n", recipe_name, cl.relerr, cl.cosine, loss0,
              ref_loss);
  EXPECT_GT(cl.cosine, tol.logits_cosine) << recipe_name;
  EXPECT_NEAR(loss0, ref_loss, tol.loss_abs) << recipe_name;

  float loss1 = 0;
  const std::vector<float> grads = train_grads(*model, x, y, B, T, &loss1);
  double worst_cos = 1, worst_rel = 0;
  for (const llmc::ParamInfo& p : table.params) {
    const std::vector<float> ref = dbg.read_as_float("grads." + p.name);
    const Compare c = compare(grads.data() + p.offset, ref.data(), p.numel);
    std::printf("[%s] %-46s relerr %.3e cosine %.5f\n", recipe_name, p.name.c_str(), c.relerr, c.cosine);
    EXPECT_GT(c.cosine, tol.grad_cosine) << recipe_name << ": gradient of " << p.name;
    EXPECT_LT(c.relerr, tol.grad_relerr) << recipe_name << ": gradient of " << p.name;
    worst_cos = std::min(worst_cos, c.cosine);
    worst_rel = std::max(worst_rel, c.relerr);
  }
  std::printf("[%s] gradients: worst cosine %.5f, worst relerr %.3e\n", recipe_name, worst_cos, worst_rel);
  // Determinism under FP8 too.
  float loss2 = 0;
  const std::vector<float> grads2 = train_grads(*model, x, y, B, T, &loss2);
  EXPECT_EQ(0, std::memcmp(grads.data(), grads2.data(), grads.size() * sizeof(float))) << recipe_name;

  const std::vector<float> ref_losses = dbg.read_as_float("losses");
  const float lr = std::stof(meta(dbg, "lr")), clip = std::stof(meta(dbg, "grad_clip"));
  for (int t = 1; t <= (int)ref_losses.size(); t++) {
    const float loss = train_step(*model, opt, x, y, B, T, lr, t, clip);
    model->end_step(0);
    std::printf("[%s] step %2d loss %.6f ref %.6f\n", recipe_name, t, loss, ref_losses[t - 1]);
    EXPECT_NEAR(loss, ref_losses[t - 1], tol.train_loss_abs) << recipe_name << " AdamW step " << t;
  }
}

// COAT's FP8 activations alone (precision.nonlinear_fp8 over BF16 GEMMs) against the same model without them and the
// FP32 reference. The forward must not change at all (the copies are written beside the BF16 tensors): logits and the
// training loss bit-identical to the BF16 model's. Backward reads the E4M3 1x16 copies in the norm and GELU / SwiGLU
// backwards, so the gradients must differ from the BF16 model's (the copies are used) yet stay within
// NonlinearFp8Tolerances of the reference (E4M3's relative rounding error, at most 2^-4 per saved element, enters only
// through those backwards); and they repeat bit for bit.
struct NonlinearFp8Tolerances {
  double grad_cosine = 0.995;  // per tensor
  double grad_relerr = 0.1;    // per tensor
};

inline void run_nonlinear_fp8_parity(const llmc::ModelSpec& spec, const llmc::SafetensorsReader& weights,
                                     const llmc::SafetensorsReader& dbg, const NonlinearFp8Tolerances& tol) {
  const int B = std::stoi(meta(dbg, "B")), T = std::stoi(meta(dbg, "T"));
  const int N = B * T, Vp = spec.padded_vocab_size;
  llmc::gemm_init();
  llmc::PrecisionRecipe with_copies;
  with_copies.nonlinear_fp8 = true;
  std::unique_ptr<llmc::Model> bf16_model = llmc::make_model(spec, B, T, 0, llmc::PrecisionRecipe());
  std::unique_ptr<llmc::Model> model = llmc::make_model(spec, B, T, 0, with_copies);
  std::vector<float> master;
  ASSERT_NO_FATAL_FAILURE(load_master(model->table(), weights, &master));
  for (llmc::Model* m : {bf16_model.get(), model.get()}) {
    llmc::AdamW opt(m->table(), 0.9, 0.95, 1e-8, 0.0);
    opt.set_master(master.data(), m->params(), 0);
    m->weights_changed();
  }
  std::vector<int> x, y;
  read_batch(dbg, N, &x, &y);

  bf16_model->forward(x.data(), y.data(), B, T, 0.0f, 0);
  model->forward(x.data(), y.data(), B, T, 0.0f, 0);
  const std::vector<bf16> logits_bf16 = download_logits(*bf16_model, N, Vp);
  const std::vector<bf16> logits = download_logits(*model, N, Vp);
  EXPECT_EQ(0, std::memcmp(logits.data(), logits_bf16.data(), logits.size() * sizeof(bf16)))
      << "nonlinear_fp8 changed the forward";

  float loss_bf16 = 0, loss = 0, loss_again = 0;
  const std::vector<float> grads_bf16 = train_grads(*bf16_model, x, y, B, T, &loss_bf16);
  const std::vector<float> grads = train_grads(*model, x, y, B, T, &loss);
  EXPECT_EQ(loss, loss_bf16) << "nonlinear_fp8 changed the training forward";
  EXPECT_NE(0, std::memcmp(grads.data(), grads_bf16.data(), grads.size() * sizeof(float)))
      << "nonlinear_fp8 gave the BF16 gradients: backward did not read the FP8 copies";
  double worst_cos = 1, worst_rel = 0;
  for (const llmc::ParamInfo& p : model->table().params) {
    const std::vector<float> ref = dbg.read_as_float("grads." + p.name);
    const Compare c = compare(grads.data() + p.offset, ref.data(), p.numel);
    const Compare b = compare(grads_bf16.data() + p.offset, ref.data(), p.numel);
    std::printf("[nonlinear_fp8] %-46s relerr %.3e (bf16 %.3e) cosine %.5f\n", p.name.c_str(), c.relerr, b.relerr,
                c.cosine);
    EXPECT_GT(c.cosine, tol.grad_cosine) << "gradient of " << p.name;
    EXPECT_LT(c.relerr, tol.grad_relerr) << "gradient of " << p.name;
    worst_cos = std::min(worst_cos, c.cosine);
    worst_rel = std::max(worst_rel, c.relerr);
  }
  std::printf("[nonlinear_fp8] gradients: worst cosine %.5f, worst relerr %.3e\n", worst_cos, worst_rel);
  const std::vector<float> again = train_grads(*model, x, y, B, T, &loss_again);
  EXPECT_EQ(0, std::memcmp(grads.data(), again.data(), grads.size() * sizeof(float))) << "not deterministic";
}

}  // namespace parity
