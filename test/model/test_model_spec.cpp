// test/model/test_model_spec: the GPT-2 and Llama parameter tables (names, shapes, order, aligned non-overlapping
// offsets, the contiguous fused q|k|v and gate|up groups), parameter counts against independent formulas (Llama-3.2
// 1B / 3B against their published sizes), FLOPs per token, the memory estimate's structure, the presets, and the
// deterministic initialisation (reproducible, pinned values, independent of the thread count, GPT-2 statistics, scaled
// residual projections, zero padding).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/model/family.h"
#include "llmc/model/model_spec.h"

using llmc::ModelSpec;
using llmc::ParamTable;

namespace {

ModelSpec preset(const std::string& name) {
  ModelSpec spec;
  EXPECT_TRUE(llmc::model_preset(name, &spec)) << name;
  return spec;
}

// GPT-2 parameter count written out from the architecture: embeddings (V, C) and (maxT, C); per block two
// LayerNorms (2C each), qkv (3C x C + 3C), attention projection (C x C + C), fc (4C x C + 4C), fc projection
// (C x 4C + C); the final LayerNorm (2C).
size_t gpt2_formula(size_t vocab_rows, size_t context, size_t layers, size_t C) {
  size_t block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  return vocab_rows * C + context * C + layers * block + 2 * C;
}

struct Moments {
  double mean = 0, std = 0;
  double within_one_std = 0;  // fraction of |x - mean| < std (0.6827 for a normal distribution)
};

Moments moments(const float* x, size_t n) {
  Moments m;
  double sum = 0, sum_sq = 0;
  for (size_t i = 0; i < n; i++) sum += x[i];
  m.mean = sum / n;
  for (size_t i = 0; i < n; i++) sum_sq += (x[i] - m.mean) * (x[i] - m.mean);
  m.std = std::sqrt(sum_sq / n);
  size_t inside = 0;
  for (size_t i = 0; i < n; i++) inside += std::fabs(x[i] - m.mean) < m.std;
  m.within_one_std = static_cast<double>(inside) / n;
  return m;
}

}  // namespace

TEST(ModelSpec, Gpt2_124mCounts) {
  ModelSpec spec = preset("gpt2-124m");
  EXPECT_EQ(llmc::count_parameters(spec, true), 124475904u);
  EXPECT_EQ(llmc::count_parameters(spec, false), 124439808u);
  EXPECT_EQ(llmc::build_param_table(spec).num_parameters, 124475904u);
}

TEST(ModelSpec, EveryPresetCountMatchesTheFormula) {
  for (const std::string& name : llmc::model_preset_names()) {
    ModelSpec s = preset(name);
    if (s.arch != "gpt2") continue;  // llama: LlamaCounts below
    EXPECT_EQ(s.padded_vocab_size, 50304) << name;
    EXPECT_EQ(s.ffn_hidden, 4 * s.n_embd) << name;
    EXPECT_EQ(s.n_kv_head, s.n_head) << name;
    EXPECT_EQ(s.head_size(), 64) << name;
    EXPECT_EQ(llmc::count_parameters(s, true), gpt2_formula(50304, s.max_seq_len, s.n_layer, s.n_embd)) << name;
    EXPECT_EQ(llmc::count_parameters(s, false), gpt2_formula(50257, s.max_seq_len, s.n_layer, s.n_embd)) << name;
  }
  // Published Hugging Face sizes (real vocabulary) for the four GPT-2 releases.
  EXPECT_EQ(llmc::count_parameters(preset("gpt2-350m"), false), 354823168u);
  EXPECT_EQ(llmc::count_parameters(preset("gpt2-774m"), false), 774030080u);
  EXPECT_EQ(llmc::count_parameters(preset("gpt2-1558m"), false), 1557611200u);
}

TEST(ModelSpec, Presets) {
  EXPECT_EQ(preset("gpt2-tiny").n_layer, 2);
  EXPECT_EQ(preset("gpt2-tiny").max_seq_len, 256);
  EXPECT_EQ(preset("gpt2-mini").n_embd, 384);
  EXPECT_EQ(preset("gpt2-mini").max_seq_len, 512);
  EXPECT_EQ(preset("gpt2-350m").n_head, 16);
  EXPECT_EQ(preset("gpt2-774m").n_layer, 36);
  EXPECT_EQ(preset("gpt2-1558m").n_head, 25);
  ModelSpec untouched;
  EXPECT_FALSE(llmc::model_preset("gpt2-xl", &untouched));
  EXPECT_EQ(untouched.n_layer, ModelSpec().n_layer);
}

TEST(ModelSpec, TableNamesShapesAndOrder) {
  ModelSpec s = preset("gpt2-tiny");
  ParamTable t = llmc::build_param_table(s);
  const int64_t C = s.n_embd, F = s.ffn_hidden;
  ASSERT_EQ(t.params.size(), static_cast<size_t>(2 + 12 * s.n_layer + 2));
  EXPECT_EQ(t.vocab_size, s.vocab_size);
  EXPECT_EQ(t.params[0].name, "transformer.wte.weight");
  EXPECT_EQ(t.params[0].shape, (std::vector<int64_t>{s.padded_vocab_size, C}));
  EXPECT_EQ(t.params[1].name, "transformer.wpe.weight");
  EXPECT_EQ(t.params[1].shape, (std::vector<int64_t>{s.max_seq_len, C}));
  const char* block[] = {"ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
                         "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
                         "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  const std::vector<int64_t> shapes[] = {{C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C}, {F, C}, {F}, {C, F}, {C}};
  for (int layer = 0; layer < s.n_layer; layer++) {
    for (int i = 0; i < 12; i++) {
      const llmc::ParamInfo& p = t.params[2 + 12 * layer + i];
      EXPECT_EQ(p.name, "transformer.h." + std::to_string(layer) + "." + block[i]);
      EXPECT_EQ(p.shape, shapes[i]) << p.name;
      EXPECT_EQ(p.layer, layer) << p.name;
    }
  }
  EXPECT_EQ(t.params[t.params.size() - 2].name, "transformer.ln_f.weight");
  EXPECT_EQ(t.params.back().name, "transformer.ln_f.bias");
  EXPECT_EQ(t.params.back().layer, -1);

  EXPECT_EQ(&t.get("transformer.h.1.mlp.c_fc.bias"), t.find("transformer.h.1.mlp.c_fc.bias"));
  EXPECT_EQ(t.find("transformer.h.2.ln_1.weight"), nullptr);
  try {
    t.get("lm_head.weight");
    FAIL() << "get() of an absent tensor returned";
  } catch (const llmc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos);
  }
}

TEST(ModelSpec, RolesDecayAndInitConstants) {
  ModelSpec s = preset("gpt2-124m");
  ParamTable t = llmc::build_param_table(s);
  const float residual_std = 0.02f / std::sqrt(2.0f * s.n_layer);
  for (const llmc::ParamInfo& p : t.params) {
    EXPECT_EQ(p.weight_decay, p.shape.size() == 2) << p.name;
    bool is_bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
    bool is_norm = p.name.find("ln_") != std::string::npos;
    if (is_norm) {
      EXPECT_EQ(p.role, is_bias ? llmc::ParamRole::NormBias : llmc::ParamRole::NormWeight) << p.name;
      EXPECT_EQ(p.init_std, 0.0f) << p.name;
      EXPECT_EQ(p.init_value, is_bias ? 0.0f : 1.0f) << p.name;
    } else if (is_bias) {
      EXPECT_EQ(p.role, llmc::ParamRole::LinearBias) << p.name;
      EXPECT_EQ(p.init_std, 0.0f) << p.name;
      EXPECT_EQ(p.init_value, 0.0f) << p.name;
    } else if (p.name.find("c_proj.weight") != std::string::npos) {
      EXPECT_FLOAT_EQ(p.init_std, residual_std) << p.name;
    } else {
      EXPECT_FLOAT_EQ(p.init_std, 0.02f) << p.name;
    }
  }
  EXPECT_EQ(t.get("transformer.wte.weight").role, llmc::ParamRole::TokenEmbedding);
  EXPECT_EQ(t.get("transformer.wpe.weight").role, llmc::ParamRole::PositionEmbedding);
  EXPECT_STREQ(llmc::param_role_name(llmc::ParamRole::LinearWeight), "linear_weight");
}

TEST(ModelSpec, OffsetsAlignedAndDisjoint) {
  for (const char* name : {"gpt2-tiny", "gpt2-124m"}) {
    ModelSpec s = preset(name);
    ParamTable t = llmc::build_param_table(s);
    size_t end = 0, sum = 0;
    for (const llmc::ParamInfo& p : t.params) {
      EXPECT_EQ(p.offset % ParamTable::kAlign, 0u) << p.name;
      EXPECT_GE(p.offset, end) << p.name << " overlaps the previous tensor";
      EXPECT_LT(p.offset - end, ParamTable::kAlign) << p.name << " leaves more than an alignment gap";
      size_t numel = 1;
      for (int64_t d : p.shape) numel *= d;
      EXPECT_EQ(p.numel, numel) << p.name;
      end = p.offset + p.numel;
      sum += p.numel;
    }
    EXPECT_EQ(sum, t.num_parameters);
    EXPECT_GE(t.total_elements, end);
    EXPECT_EQ(t.total_elements % ParamTable::kAlign, 0u);
  }
  // An odd width forces gaps: offsets must still be aligned.
  ModelSpec odd = preset("gpt2-tiny");
  odd.n_embd = 130;
  odd.n_head = 2;
  odd.n_kv_head = 2;
  odd.ffn_hidden = 520;
  ParamTable t = llmc::build_param_table(odd);
  for (const llmc::ParamInfo& p : t.params) EXPECT_EQ(p.offset % ParamTable::kAlign, 0u) << p.name;
  EXPECT_GT(t.total_elements, t.num_parameters);
}

TEST(ModelSpec, UnsupportedArchThrows) {
  ModelSpec s;
  s.arch = "bert";
  EXPECT_THROW(llmc::build_param_table(s), llmc::Error);
  ModelSpec untied_gpt2;
  untied_gpt2.tied_embeddings = false;
  EXPECT_THROW(llmc::build_param_table(untied_gpt2), llmc::Error);
}

TEST(ModelSpec, FlopsPerToken) {
  ModelSpec s = preset("gpt2-124m");
  // N = real parameters without wpe (non-embedding weights + the V x C lm_head matmul).
  double n = 124439808.0 - 1024.0 * 768.0;
  EXPECT_DOUBLE_EQ(llmc::flops_per_token(s, 1024), 6.0 * n + 6.0 * 12 * 768 * 1024);
  EXPECT_DOUBLE_EQ(llmc::flops_per_token(s, 512) - llmc::flops_per_token(s, 256), 6.0 * 12 * 768 * 256);
}

TEST(ModelSpec, InitIsDeterministic) {
  ModelSpec s = preset("gpt2-tiny");
  ParamTable t = llmc::build_param_table(s);
  std::vector<float> a(t.total_elements, -7.0f), b(t.total_elements, 3.0f), c(t.total_elements);
  llmc::init_parameters(t, 1234, a.data());
  llmc::init_parameters(t, 1234, b.data());
  llmc::init_parameters(t, 1235, c.data());
  EXPECT_EQ(a, b);
  const llmc::ParamInfo& w = t.get("transformer.h.0.attn.c_attn.weight");
  size_t differ = 0;
  for (size_t i = 0; i < w.numel; i++) differ += a[w.offset + i] != c[w.offset + i];
  EXPECT_GT(differ, w.numel * 99 / 100) << "a different seed must give different values";
  // Tensors of the same shape draw from different streams.
  const llmc::ParamInfo& w1 = t.get("transformer.h.1.attn.c_attn.weight");
  EXPECT_NE(a[w.offset], a[w1.offset]);
}

// FNV-1a over the bytes of a buffer: one number for "the same bits".
uint64_t fnv1a(const std::vector<float>& x) {
  uint64_t h = 0xcbf29ce484222325ull;
  const unsigned char* b = reinterpret_cast<const unsigned char*>(x.data());
  for (size_t i = 0; i < x.size() * sizeof(float); i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

// The values of a fresh initialisation are part of every recorded run (train.seed picks them): these hashes were taken
// from the single-threaded implementation (glibc's log / sin / cos, which the Box-Muller transform calls) and pin
// them, whatever the thread count.
TEST(ModelSpec, InitValuesArePinned) {
  struct Case {
    const char* preset;
    uint64_t seed;
    uint64_t hash;
  };
  for (const Case& c :
       {Case{"gpt2-tiny", 1234, 0xe567fb1e30c2f6bdull}, Case{"llama-tiny", 7, 0x9e0bd4c5227ce932ull}}) {
    ParamTable t = llmc::build_param_table(preset(c.preset));
    std::vector<float> x(t.total_elements, -1.0f);
    llmc::init_parameters(t, c.seed, x.data());
    EXPECT_EQ(fnv1a(x), c.hash) << c.preset;
  }
}

TEST(ModelSpec, InitDoesNotDependOnThreads) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    ParamTable t = llmc::build_param_table(preset(name));
    std::vector<float> one(t.total_elements, -1.0f), three(t.total_elements, 5.0f), all(t.total_elements, 7.0f),
        many(t.total_elements, 9.0f);
    llmc::init_parameters(t, 99, one.data(), 1);
    llmc::init_parameters(t, 99, three.data(), 3);
    llmc::init_parameters(t, 99, all.data());                                        // one per hardware thread
    llmc::init_parameters(t, 99, many.data(), static_cast<int>(t.params.size()) + 5);  // more threads than tensors
    EXPECT_EQ(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)), 0) << name;
    EXPECT_EQ(std::memcmp(one.data(), all.data(), one.size() * sizeof(float)), 0) << name;
    EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0) << name;
  }
}

TEST(ModelSpec, InitStatistics) {
  ModelSpec s = preset("gpt2-tiny");
  s.n_layer = 8;  // residual std 0.02 / 4 = 0.005
  ParamTable t = llmc::build_param_table(s);
  std::vector<float> x(t.total_elements);
  llmc::init_parameters(t, 42, x.data());
  for (const llmc::ParamInfo& p : t.params) {
    const float* v = x.data() + p.offset;
    if (p.init_std == 0.0f) {
      for (size_t i = 0; i < p.numel; i++) ASSERT_EQ(v[i], p.init_value) << p.name;
      continue;
    }
    size_t n = p.role == llmc::ParamRole::TokenEmbedding ? static_cast<size_t>(s.vocab_size) * s.n_embd : p.numel;
    Moments m = moments(v, n);
    double expected = p.name.find("c_proj.weight") != std::string::npos ? 0.02 / std::sqrt(2.0 * s.n_layer) : 0.02;
    double tolerance = 4.0 / std::sqrt(2.0 * n);  // ~4 standard errors of a sample std
    EXPECT_NEAR(m.std / expected, 1.0, tolerance) << p.name;
    EXPECT_NEAR(m.mean / expected, 0.0, 4.0 / std::sqrt(static_cast<double>(n))) << p.name;
    EXPECT_NEAR(m.within_one_std, 0.6827, 0.02) << p.name << " is not normally distributed";
  }
  // Padded vocabulary rows and alignment gaps stay 0.
  const llmc::ParamInfo& wte = t.get("transformer.wte.weight");
  for (size_t i = static_cast<size_t>(s.vocab_size) * s.n_embd; i < wte.numel; i++) ASSERT_EQ(x[wte.offset + i], 0.0f);
  size_t end = 0;
  for (const llmc::ParamInfo& p : t.params) {
    for (size_t i = end; i < p.offset; i++) ASSERT_EQ(x[i], 0.0f) << "gap before " << p.name;
    end = p.offset + p.numel;
  }
  for (size_t i = end; i < t.total_elements; i++) ASSERT_EQ(x[i], 0.0f);
}

TEST(ModelSpec, InitDoesNotDependOnVocabPadding) {
  ModelSpec a = preset("gpt2-tiny"), b = a;
  b.padded_vocab_size = 50257;  // unpadded
  ParamTable ta = llmc::build_param_table(a), tb = llmc::build_param_table(b);
  std::vector<float> xa(ta.total_elements), xb(tb.total_elements);
  llmc::init_parameters(ta, 7, xa.data());
  llmc::init_parameters(tb, 7, xb.data());
  size_t real = static_cast<size_t>(a.vocab_size) * a.n_embd;
  for (size_t i = 0; i < real; i++) ASSERT_EQ(xa[i], xb[i]);  // wte is first in both tables
  const llmc::ParamInfo& pa = ta.get("transformer.h.1.mlp.c_fc.weight");
  const llmc::ParamInfo& pb = tb.get("transformer.h.1.mlp.c_fc.weight");
  for (size_t i = 0; i < pa.numel; i++) ASSERT_EQ(xa[pa.offset + i], xb[pb.offset + i]);
}

// ---------------------------------------------------------------------------------------------------------------
// Llama

namespace {

// Llama parameter count written out from the architecture: the token embedding (V, C); per block two RMSNorm
// weights (C each), q_proj (NH*HS x C), k_proj and v_proj (NKV*HS x C each), o_proj (C x NH*HS), gate_proj and
// up_proj (F x C each), down_proj (C x F); the final RMSNorm (C); an untied lm_head (V, C). No biases.
size_t llama_formula(size_t vocab_rows, size_t layers, size_t C, size_t NH, size_t NKV, size_t F, bool tied) {
  const size_t HS = C / NH;
  const size_t block = 2 * C + NH * HS * C + 2 * NKV * HS * C + C * NH * HS + 3 * F * C;
  return vocab_rows * C + layers * block + C + (tied ? 0 : vocab_rows * C);
}

bool is_llama_preset(const std::string& name) { return name.rfind("llama-", 0) == 0; }

}  // namespace

TEST(LlamaSpec, PresetShapes) {
  ModelSpec b1 = preset("llama-1b");  // Llama-3.2-1B
  EXPECT_EQ(b1.arch, "llama");
  EXPECT_EQ(b1.n_layer, 16);
  EXPECT_EQ(b1.n_embd, 2048);
  EXPECT_EQ(b1.n_head, 32);
  EXPECT_EQ(b1.n_kv_head, 8);
  EXPECT_EQ(b1.head_size(), 64);
  EXPECT_EQ(b1.ffn_hidden, 8192);
  EXPECT_FLOAT_EQ(b1.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(b1.norm_eps, 1e-5f);
  EXPECT_TRUE(b1.tied_embeddings);
  ModelSpec b3 = preset("llama-3b");  // Llama-3.2-3B
  EXPECT_EQ(b3.n_layer, 28);
  EXPECT_EQ(b3.n_embd, 3072);
  EXPECT_EQ(b3.n_head, 24);
  EXPECT_EQ(b3.n_kv_head, 8);
  EXPECT_EQ(b3.head_size(), 128);
  EXPECT_EQ(b3.ffn_hidden, 8192);
  ModelSpec b7 = preset("llama-7b");  // Llama-2-7B
  EXPECT_EQ(b7.n_layer, 32);
  EXPECT_EQ(b7.n_embd, 4096);
  EXPECT_EQ(b7.n_head, 32);
  EXPECT_EQ(b7.n_kv_head, 32);
  EXPECT_EQ(b7.head_size(), 128);
  EXPECT_EQ(b7.ffn_hidden, 11008);
  EXPECT_EQ(b7.max_seq_len, 4096);
  EXPECT_FLOAT_EQ(b7.rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(b7.norm_eps, 1e-5f);
  EXPECT_FALSE(b7.tied_embeddings);
  ModelSpec tiny = preset("llama-tiny");
  EXPECT_FALSE(tiny.tied_embeddings);  // the tests' model covers the untied lm_head
  EXPECT_EQ(tiny.head_size(), 64);
  EXPECT_LT(tiny.n_kv_head, tiny.n_head);  // and grouped-query attention
  for (const std::string& name : llmc::model_preset_names()) {
    if (!is_llama_preset(name)) continue;
    ModelSpec s = preset(name);
    EXPECT_EQ(s.arch, "llama") << name;
    EXPECT_EQ(s.vocab_size, 50257) << name;
    EXPECT_EQ(s.padded_vocab_size, 50304) << name;
    EXPECT_TRUE(s.head_size() == 64 || s.head_size() == 128) << name;
    EXPECT_EQ(s.n_head % s.n_kv_head, 0) << name;
    EXPECT_EQ(s.ffn_hidden % 256, 0) << name;
  }
  // The 8C/3 rule, rounded up to a multiple of 256.
  const auto llama_default_ffn_hidden = llmc::model_family("llama").default_ffn_hidden;
  EXPECT_EQ(llama_default_ffn_hidden(768), 2048);
  EXPECT_EQ(llama_default_ffn_hidden(1024), 2816);  // 2730.7 -> 2816
  EXPECT_EQ(llama_default_ffn_hidden(4096), 11008);  // LLaMA-7B's width
  EXPECT_EQ(preset("llama-125m").ffn_hidden, 2048);
  EXPECT_EQ(preset("llama-350m").ffn_hidden, 2816);
}

TEST(LlamaSpec, Counts) {
  // Llama-3.2-1B: 1,235,814,400 parameters with its 128,256-token vocabulary (the published count); with ours
  // (50,304 padded rows) the embedding shrinks by 78,000 rows x 2048. Llama-3.2-3B: 3,212,749,824.
  ModelSpec b1 = preset("llama-1b");
  EXPECT_EQ(llama_formula(128256, 16, 2048, 32, 8, 8192, true), 1235814400u);
  EXPECT_EQ(llmc::count_parameters(b1, true), 1076168704u);
  EXPECT_EQ(llmc::count_parameters(b1, true), llama_formula(50304, 16, 2048, 32, 8, 8192, true));
  EXPECT_EQ(llmc::count_parameters(b1, false), llama_formula(50257, 16, 2048, 32, 8, 8192, true));
  b1.vocab_size = b1.padded_vocab_size = 128256;
  EXPECT_EQ(llmc::count_parameters(b1, true), 1235814400u);
  ModelSpec b3 = preset("llama-3b");
  b3.vocab_size = b3.padded_vocab_size = 128256;
  EXPECT_EQ(llmc::count_parameters(b3, true), 3212749824u);
  // Llama-2-7B: 6,738,415,616 parameters with its 32,000-token vocabulary; 6,888,361,984 with ours.
  ModelSpec b7 = preset("llama-7b");
  EXPECT_EQ(llmc::count_parameters(b7, true), 6888361984u);
  b7.vocab_size = b7.padded_vocab_size = 32000;
  EXPECT_EQ(llmc::count_parameters(b7, true), 6738415616u);
  for (const std::string& name : llmc::model_preset_names()) {
    if (!is_llama_preset(name)) continue;
    ModelSpec s = preset(name);
    for (bool padded : {true, false})
      EXPECT_EQ(llmc::count_parameters(s, padded),
                llama_formula(padded ? 50304 : 50257, s.n_layer, s.n_embd, s.n_head, s.n_kv_head, s.ffn_hidden,
                              s.tied_embeddings))
          << name << (padded ? " padded" : " real");
  }
  // Untying adds exactly one (Vp, C) matrix; the padded rows of both vocabulary tensors are excluded from the real
  // count.
  ModelSpec untied = preset("llama-125m");
  untied.tied_embeddings = false;
  EXPECT_EQ(llmc::count_parameters(untied, true) - llmc::count_parameters(preset("llama-125m"), true), 50304u * 768);
  EXPECT_EQ(llmc::count_parameters(untied, false) - llmc::count_parameters(preset("llama-125m"), false), 50257u * 768);
}

TEST(LlamaSpec, TableNamesShapesAndOrder) {
  ModelSpec s = preset("llama-tiny");  // untied
  ParamTable t = llmc::build_param_table(s);
  const int64_t C = s.n_embd, F = s.ffn_hidden, HS = s.head_size(), Vp = s.padded_vocab_size;
  const int64_t q = s.n_head * HS, kv = s.n_kv_head * HS;
  ASSERT_EQ(t.params.size(), static_cast<size_t>(1 + 9 * s.n_layer + 2));
  EXPECT_EQ(t.params[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(t.params[0].shape, (std::vector<int64_t>{Vp, C}));
  EXPECT_EQ(t.params[0].role, llmc::ParamRole::TokenEmbedding);
  const char* block[] = {"input_layernorm.weight",       "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                         "self_attn.v_proj.weight",      "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                         "mlp.gate_proj.weight",         "mlp.up_proj.weight",      "mlp.down_proj.weight"};
  const std::vector<int64_t> shapes[] = {{C}, {q, C}, {kv, C}, {kv, C}, {C, q}, {C}, {F, C}, {F, C}, {C, F}};
  for (int layer = 0; layer < s.n_layer; layer++)
    for (int i = 0; i < 9; i++) {
      const llmc::ParamInfo& p = t.params[1 + 9 * layer + i];
      EXPECT_EQ(p.name, "model.layers." + std::to_string(layer) + "." + block[i]);
      EXPECT_EQ(p.shape, shapes[i]) << p.name;
      EXPECT_EQ(p.layer, layer) << p.name;
      EXPECT_EQ(p.role, p.shape.size() == 1 ? llmc::ParamRole::NormWeight : llmc::ParamRole::LinearWeight) << p.name;
    }
  EXPECT_EQ(t.params[t.params.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(t.params[t.params.size() - 2].layer, -1);
  const llmc::ParamInfo& head = t.params.back();
  EXPECT_EQ(head.name, "lm_head.weight");
  EXPECT_EQ(head.shape, (std::vector<int64_t>{Vp, C}));
  EXPECT_EQ(head.role, llmc::ParamRole::LmHead);
  EXPECT_TRUE(head.weight_decay);
  EXPECT_STREQ(llmc::param_role_name(llmc::ParamRole::LmHead), "lm_head");
  for (const llmc::ParamInfo& p : t.params) EXPECT_EQ(p.name.find(".bias"), std::string::npos) << p.name;
  // Tied: no lm_head tensor.
  s.tied_embeddings = true;
  ParamTable tied = llmc::build_param_table(s);
  EXPECT_EQ(tied.params.size(), t.params.size() - 1);
  EXPECT_EQ(tied.find("lm_head.weight"), nullptr);
  EXPECT_EQ(tied.params.back().name, "model.norm.weight");
}

// One fused GEMM reads q|k|v (and gate|up) through the first tensor's pointer: they must be back to back.
TEST(LlamaSpec, FusedGroupsAreContiguous) {
  for (const std::string& name : llmc::model_preset_names()) {
    if (!is_llama_preset(name)) continue;
    ParamTable t = llmc::build_param_table(preset(name));
    for (const llmc::ParamInfo& p : t.params) {
      EXPECT_EQ(p.offset % ParamTable::kAlign, 0u) << name << " " << p.name;
      auto next_follows = [&](const std::string& first, const std::string& second) {
        if (p.name.size() < first.size() || p.name.compare(p.name.size() - first.size(), first.size(), first) != 0)
          return;
        const std::string other = p.name.substr(0, p.name.size() - first.size()) + second;
        EXPECT_EQ(p.offset + p.numel, t.get(other).offset) << name << ": " << other << " does not follow " << p.name;
      };
      next_follows("q_proj.weight", "k_proj.weight");
      next_follows("k_proj.weight", "v_proj.weight");
      next_follows("gate_proj.weight", "up_proj.weight");
    }
  }
  // Sizes that would leave an alignment gap are refused with a message naming the tensors.
  ModelSpec odd = preset("llama-tiny");
  odd.n_embd = 96;
  odd.n_head = 1;
  odd.n_kv_head = 1;
  odd.ffn_hidden = 7;  // 7 * 96 = 672 elements, not a multiple of 128
  try {
    llmc::build_param_table(odd);
    FAIL() << "a gate_proj that leaves a gap before up_proj was accepted";
  } catch (const llmc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("up_proj"), std::string::npos) << e.what();
  }
}

TEST(LlamaSpec, InitScheme) {
  ModelSpec s = preset("llama-tiny");
  s.n_layer = 8;  // residual std 0.02 / 4 = 0.005
  ParamTable t = llmc::build_param_table(s);
  std::vector<float> x(t.total_elements, 123.0f);
  llmc::init_parameters(t, 42, x.data());
  const double residual_std = 0.02 / std::sqrt(2.0 * s.n_layer);
  for (const llmc::ParamInfo& p : t.params) {
    const float* v = x.data() + p.offset;
    if (p.shape.size() == 1) {
      EXPECT_EQ(p.init_std, 0.0f) << p.name;
      for (size_t i = 0; i < p.numel; i++) ASSERT_EQ(v[i], 1.0f) << p.name;  // RMSNorm weights
      continue;
    }
    const bool residual = p.name.find("o_proj") != std::string::npos || p.name.find("down_proj") != std::string::npos;
    EXPECT_FLOAT_EQ(p.init_std, residual ? residual_std : 0.02) << p.name;
    const bool vocab = p.role == llmc::ParamRole::TokenEmbedding || p.role == llmc::ParamRole::LmHead;
    const size_t n = vocab ? static_cast<size_t>(s.vocab_size) * s.n_embd : p.numel;
    Moments m = moments(v, n);
    EXPECT_NEAR(m.std / p.init_std, 1.0, 4.0 / std::sqrt(2.0 * n)) << p.name;
    EXPECT_NEAR(m.within_one_std, 0.6827, 0.02) << p.name;
    for (size_t i = n; i < p.numel; i++) ASSERT_EQ(v[i], 0.0f) << p.name << " padded row element " << i;
  }
  // The untied lm_head is drawn independently of the embedding.
  EXPECT_NE(x[t.get("lm_head.weight").offset], x[t.get("model.embed_tokens.weight").offset]);
}

TEST(LlamaSpec, FlopsPerToken) {
  ModelSpec s = preset("llama-1b");  // tied: N = every real parameter (the embedding is the lm_head matmul)
  const double n = static_cast<double>(llmc::count_parameters(s, false));
  EXPECT_DOUBLE_EQ(llmc::flops_per_token(s, 2048), 6.0 * n + 6.0 * 16 * 2048 * 2048);
  ModelSpec untied = s;
  untied.tied_embeddings = false;  // the embedding lookup costs nothing, the lm_head matmul counts once
  EXPECT_DOUBLE_EQ(llmc::flops_per_token(untied, 2048), llmc::flops_per_token(s, 2048));
  // GQA: fewer k/v parameters, the same attention term.
  ModelSpec mha = s;
  mha.n_kv_head = mha.n_head;
  const double extra_kv = 16.0 * 2 * (32 - 8) * 64 * 2048;
  EXPECT_DOUBLE_EQ(llmc::flops_per_token(mha, 2048) - llmc::flops_per_token(s, 2048), 6.0 * extra_kv);
}

