// dev/tools/debug_state.cu: our model's logits, loss and parameter gradients for one batch, written to safetensors,
// so that an outside reference (test/model/test_transformers_parity_gpu.py: Hugging Face transformers) can be compared with
// the trainer's GPU model tensor by tensor.
//
//   debug_state --model DIR|FILE.bin --batch batch.safetensors --out state.safetensors [--recompute 0|1]
//
//   --model   a Hugging Face directory (config.json + model.safetensors) or an llm.c model file: the spec comes from
//             it (llmc/io/interop), the FP32 weights become the model's bf16 working weights exactly as in training
//             (AdamW::set_master: round to nearest even)
//   --batch   "inputs" and "targets", I32 (B, T)
//   --out     logits F32 (B, T, V) of the evaluation forward (padded vocabulary columns dropped), loss F32 (1) = the
//             mean cross-entropy over the targets, and grads.<name> F32 for every tensor of the parameter table (our
//             names and nn.Linear (out, in) shapes, padded vocabulary rows included) of one training forward/backward
//             at grad_scale 1/(B*T), i.e. the gradients of that mean loss. Metadata: arch, B, T, V, Vp.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/core/common.h"
#include "llmc/precision/gemm.h"
#include "llmc/model/model.h"
#include "llmc/io/interop.h"
#include "llmc/optim/adamw.h"
#include "llmc/io/safetensors.h"

using namespace llmc;

namespace {

std::vector<int> read_tokens(const SafetensorsReader& r, const char* name, int* B, int* T) {
  const TensorEntry& e = r.entry(name);
  if (e.dtype != "I32" || e.shape.size() != 2)
    throw_error("%s: '%s' must be I32 of shape (B, T), got %s with %zu dims", r.path().c_str(), name, e.dtype.c_str(),
                e.shape.size());
  *B = static_cast<int>(e.shape[0]);
  *T = static_cast<int>(e.shape[1]);
  std::vector<int> v(static_cast<size_t>(*B) * *T);
  r.read_into(name, v.data(), v.size() * sizeof(int));
  return v;
}

int run(const std::string& model_path, const std::string& batch_path, const std::string& out_path, int recompute) {
  if (cuda_device_count() == 0) throw_error("no CUDA GPU found: debug_state runs the GPU model");
  const ModelWeights w = detect_weights_format(model_path) == WeightsFormat::Llmc ? import_llmc(model_path)
                                                                                  : import_hf(model_path);
  const ModelSpec& spec = w.spec;
  const SafetensorsReader batch(batch_path);
  int B = 0, T = 0, B2 = 0, T2 = 0;
  const std::vector<int> inputs = read_tokens(batch, "inputs", &B, &T);
  const std::vector<int> targets = read_tokens(batch, "targets", &B2, &T2);
  if (B != B2 || T != T2)
    throw_error("%s: inputs (%d, %d) and targets (%d, %d) differ", batch_path.c_str(), B, T, B2, T2);
  if (T > spec.max_seq_len)
    throw_error("%s: T = %d exceeds the model's context %d", batch_path.c_str(), T, spec.max_seq_len);
  gemm_init();
  std::unique_ptr<Model> model_ptr = make_model(spec, B, T, recompute);  // any architecture this build has
  Model& model = *model_ptr;
  const ParamTable& table = model.table();
  AdamW optimizer(table, 0.9, 0.95, 1e-8, 0.0);  // only for its master -> bf16 upload, as the trainer does
  optimizer.set_master(w.values.data(), model.params(), 0);

  // Evaluation forward: logits and loss.
  model.forward(inputs.data(), targets.data(), B, T, 0.0f, 0);
  const float loss = model.mean_loss(0);
  const int V = spec.vocab_size, Vp = spec.padded_vocab_size;
  const size_t N = static_cast<size_t>(B) * T;
  std::vector<__nv_bfloat16> logits_bf(N * Vp);
  CUDA_CHECK(cudaMemcpy(logits_bf.data(), model.logits(), logits_bf.size() * sizeof(__nv_bfloat16),
                        cudaMemcpyDeviceToHost));
  std::vector<float> logits(N * V);
  for (size_t n = 0; n < N; n++)
    for (int v = 0; v < V; v++) logits[n * V + v] = __bfloat162float(logits_bf[n * Vp + v]);

  // Training forward/backward at grad_scale 1/(B*T): the gradients of the mean loss.
  model.zero_grads(0);
  model.forward(inputs.data(), targets.data(), B, T, 1.0f / static_cast<float>(N), 0);
  model.backward(0);
  std::vector<float> grads(table.total_elements);
  CUDA_CHECK(cudaMemcpy(grads.data(), model.grads(), grads.size() * sizeof(float), cudaMemcpyDeviceToHost));

  SafetensorsWriter out;
  out.add("logits", "F32", {B, T, V}, logits.data(), logits.size() * sizeof(float));
  out.add("loss", "F32", {1}, &loss, sizeof(float));
  for (const ParamInfo& p : table.params)
    out.add("grads." + p.name, "F32", p.shape, grads.data() + p.offset, p.numel * sizeof(float));
  out.set_metadata("arch", spec.arch);
  out.set_metadata("B", std::to_string(B));
  out.set_metadata("T", std::to_string(T));
  out.set_metadata("V", std::to_string(V));
  out.set_metadata("Vp", std::to_string(Vp));
  out.write(out_path);
  std::printf("debug_state: %s B=%d T=%d loss %.6f -> %s\n", spec.arch.c_str(), B, T, loss, out_path.c_str());
  gemm_shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"debug_state: our model's logits, loss and gradients for one batch (for parity tests)", "debug_state"};
  std::string model_path, batch_path, out_path;
  int recompute = 0;
  app.add_option("--model", model_path, "Hugging Face directory or llm.c model file")->required();
  app.add_option("--batch", batch_path, "safetensors with I32 'inputs' and 'targets' of shape (B, T)")->required();
  app.add_option("--out", out_path, "safetensors to write")->required();
  app.add_option("--recompute", recompute, "0 or 1, as train.recompute")->check(CLI::Range(0, 1));
  CLI11_PARSE(app, argc, argv);
  try {
    return run(model_path, batch_path, out_path, recompute);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
