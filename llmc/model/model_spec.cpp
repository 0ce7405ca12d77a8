// llmc/model/model_spec.cpp: the parameter table of a spec (through its family, llmc/model/family.h), deterministic
// initialisation, parameter counts, FLOPs per token and the presets of every family. Host
// code only: nothing here touches the GPU.
#include "llmc/model/model_spec.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <random>
#include <system_error>
#include <thread>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/model/family.h"

namespace llmc {

static void check_spec(const ModelSpec& spec) {
  if (spec.n_layer < 1 || spec.n_head < 1 || spec.n_kv_head < 1 || spec.n_embd < 1 || spec.vocab_size < 1 ||
      spec.max_seq_len < 1 || spec.ffn_hidden < 1 || spec.padded_vocab_size < spec.vocab_size ||
      spec.n_embd % spec.n_head != 0 || spec.n_head % spec.n_kv_head != 0)
    throw_error("model spec is inconsistent (n_layer %d, n_head %d, n_kv_head %d, n_embd %d, vocab %d/%d, max_seq_len "
                "%d, ffn_hidden %d): validate the config first",
                spec.n_layer, spec.n_head, spec.n_kv_head, spec.n_embd, spec.vocab_size, spec.padded_vocab_size,
                spec.max_seq_len, spec.ffn_hidden);
}

ParamTable build_param_table(const ModelSpec& spec) {
  const ModelFamily& family = model_family(spec.arch);
  check_spec(spec);
  ParamTable t = family.build_param_table(spec);
  t.total_elements = round_up(t.total_elements, ParamTable::kAlign);
  return t;
}

// SplitMix64 finaliser: turns (seed, tensor index) into a well-mixed 64-bit generator seed.
static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Standard normal samples from std::mt19937_64 (whose output sequence the C++ standard fixes) through our own
// Box-Muller transform, so the values do not depend on the standard library's normal_distribution.
struct NormalGenerator {
  std::mt19937_64 engine;
  bool has_spare = false;
  double spare = 0.0;
  explicit NormalGenerator(uint64_t seed) : engine(seed) {}
  double uniform_open0() {  // in (0, 1]: 53 random bits
    return (static_cast<double>(engine() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  }
  double next() {
    if (has_spare) {
      has_spare = false;
      return spare;
    }
    const double kTwoPi = 6.283185307179586476925286766559;
    double radius = std::sqrt(-2.0 * std::log(uniform_open0()));
    double angle = kTwoPi * uniform_open0();
    spare = radius * std::sin(angle);
    has_spare = true;
    return radius * std::cos(angle);
  }
};

// The elements of p that init_parameters draws (the rest of the tensor stays 0): all of it, except the padded
// vocabulary rows of the token embedding and lm_head, so that their values do not depend on the padding multiple.
static size_t drawn_elements(const ParamTable& table, const ParamInfo& p) {
  if ((p.role == ParamRole::TokenEmbedding || p.role == ParamRole::LmHead) && table.vocab_size > 0)
    return std::min(p.numel, static_cast<size_t>(table.vocab_size) * static_cast<size_t>(p.shape[1]));
  return p.numel;
}

// Tensor `index` of the table: its own generator, so the values do not depend on which thread draws them.
static void init_tensor(const ParamTable& table, size_t index, uint64_t seed, float* out) {
  const ParamInfo& p = table.params[index];
  float* dst = out + p.offset;
  if (p.init_std == 0.0f) {
    std::fill(dst, dst + p.numel, p.init_value);
    return;
  }
  const size_t drawn = drawn_elements(table, p);
  NormalGenerator gen(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(index))));
  for (size_t i = 0; i < drawn; i++) dst[i] = static_cast<float>(gen.next() * p.init_std);
  std::fill(dst + drawn, dst + p.numel, 0.0f);
}

void init_parameters(const ParamTable& table, uint64_t seed, float* out, int threads) {
  const size_t n_tensors = table.params.size();
  // Alignment gaps and the space past the last tensor stay 0 (the tensors' own elements are all written below, each
  // by one thread: they must not overlap).
  std::vector<size_t> by_offset(n_tensors);
  std::iota(by_offset.begin(), by_offset.end(), size_t{0});
  std::sort(by_offset.begin(), by_offset.end(),
            [&](size_t a, size_t b) { return table.params[a].offset < table.params[b].offset; });
  size_t end = 0;
  for (size_t index : by_offset) {
    const ParamInfo& p = table.params[index];
    if (p.offset < end) throw_error("init_parameters: tensor %s overlaps the one before it", p.name.c_str());
    std::fill(out + end, out + p.offset, 0.0f);
    end = p.offset + p.numel;
  }
  if (end > table.total_elements) throw_error("init_parameters: the tensors end past the table's total_elements");
  std::fill(out + end, out + table.total_elements, 0.0f);

  // Largest tensors first, each taken whole by the next free thread: the slowest thread finishes at most one tensor
  // after the others.
  std::vector<size_t> order(n_tensors);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return drawn_elements(table, table.params[a]) > drawn_elements(table, table.params[b]);
  });
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(n_tensors, 1)));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < n_tensors; k = next++) init_tensor(table, order[k], seed, out);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; t++) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {  // no more threads to be had: fewer threads draw the same values
      break;
    }
  }
  work();
  for (std::thread& t : pool) t.join();
}

size_t count_parameters(const ModelSpec& spec, bool padded_vocab) {
  ParamTable t = build_param_table(spec);
  size_t n = t.num_parameters;
  if (!padded_vocab)
    for (const ParamInfo& p : t.params)
      if (p.role == ParamRole::TokenEmbedding || p.role == ParamRole::LmHead)
        n -= static_cast<size_t>(spec.padded_vocab_size - spec.vocab_size) * spec.n_embd;
  return n;
}

double flops_per_token(const ModelSpec& spec, int seq_len) {
  // N = non-embedding parameters + the lm_head matmul (V x C, real vocabulary) = all real parameters except the
  // tensors that are only looked up: position embeddings and, when the lm_head has its own matrix, the token
  // embedding.
  double n = static_cast<double>(count_parameters(spec, false));
  for (const ParamInfo& p : build_param_table(spec).params)
    if (p.role == ParamRole::PositionEmbedding) n -= static_cast<double>(p.numel);
  if (!spec.tied_embeddings) n -= static_cast<double>(spec.vocab_size) * static_cast<double>(spec.n_embd);
  double attention = 6.0 * spec.n_layer * static_cast<double>(spec.n_head * spec.head_size()) * seq_len;
  return 6.0 * n + attention;
}

bool model_preset(const std::string& name, ModelSpec* out) {
  for (const ModelFamily* family : model_families()) {
    for (const ModelPreset& p : family->presets) {
      if (name != p.name) continue;
      if (out) *out = preset_spec(*family, p);
      return true;
    }
  }
  return false;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelFamily* family : model_families())
    for (const ModelPreset& p : family->presets) names.push_back(p.name);
  return names;
}

}  // namespace llmc
