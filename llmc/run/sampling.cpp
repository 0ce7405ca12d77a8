// llmc/run/sampling.cpp: token sampling and text generation with the training forward (llmc/run/sampling.h).
#include "llmc/run/sampling.h"

#include <algorithm>
#include <cmath>

#include <cuda_bf16.h>

#include "llmc/core/common.h"

namespace llmc {

int sample_token(const std::vector<float>& logits, double temperature, int top_k, SampleRng& rng) {
  const int V = static_cast<int>(logits.size());
  std::vector<int> idx(V);
  for (int i = 0; i < V; i++) idx[i] = i;
  const int k = (top_k > 0 && top_k < V) ? top_k : V;
  if (k < V)
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  double max_logit = -INFINITY;
  for (int i = 0; i < k; i++) max_logit = std::max(max_logit, static_cast<double>(logits[idx[i]]));
  std::vector<double> weights(k);
  double total = 0;
  for (int i = 0; i < k; i++) total += weights[i] = std::exp((logits[idx[i]] - max_logit) / temperature);
  const double u = rng.next_unit() * total;
  double acc = 0;
  for (int i = 0; i < k; i++) {
    acc += weights[i];
    if (u < acc) return idx[i];
  }
  return idx[k - 1];
}

std::string generate_sample(Model& model, const GPT2Tokenizer& tokenizer, const SampleOptions& options,
                            SampleRng& rng, cudaStream_t stream) {
  const int V = model.spec().vocab_size, Vp = model.spec().padded_vocab_size;
  std::vector<int> context{tokenizer.eot_token()}, generated, batch;
  std::vector<__nv_bfloat16> row(V);
  std::vector<float> logits(V);
  for (int i = 0; i < options.tokens; i++) {
    const int start = std::max(0, static_cast<int>(context.size()) - options.seq_len);
    const int T = static_cast<int>(context.size()) - start;
    if (options.full_batch > 0) {
      batch.assign(static_cast<size_t>(options.full_batch) * options.seq_len, tokenizer.eot_token());
      std::copy(context.begin() + start, context.end(), batch.begin());
      model.forward(batch.data(), nullptr, options.full_batch, options.seq_len, 0.0f, stream);
    } else {
      model.forward(context.data() + start, nullptr, 1, T, 0.0f, stream);
    }
    CUDA_CHECK(cudaMemcpyAsync(row.data(), model.logits() + static_cast<size_t>(T - 1) * Vp,
                               V * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int v = 0; v < V; v++) logits[v] = __bfloat162float(row[v]);
    const int next = sample_token(logits, options.temperature, options.top_k, rng);
    context.push_back(next);
    generated.push_back(next);
  }
  return tokenizer.decode(generated);
}

}  // namespace llmc
