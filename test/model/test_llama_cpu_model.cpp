// test/model/test_llama_cpu_model: the Llama block composed from the CPU references of llmc/kernels/ and llmc/precision/gemm.h,
// call for call in the order llmc/model/llama/llama.cu makes its GPU calls (the fused q|k|v weight read through the q_proj
// pointer, RoPE in place on the packed qkv, grouped-query attention indexing kv head h / (NH/NKV), the residual adds,
// the fused gate|up weight whose output rows are [gate | up] for SwiGLU, the untied or tied lm_head, the token-only
// embedding), compared with the PyTorch reference dev/reference/llama.py (itself checked against transformers'
// LlamaForCausalLM): logits, loss and every parameter gradient. Everything here is FP32/FP64, so the tolerances are
// tight (1e-4 relative per tensor): a wrong convention between our kernels' references and PyTorch (RoPE pairing,
// GQA mapping, the order inside a fused weight) shows as O(1) errors, before any GPU is involved. The GPU tests then
// check each kernel against these same references, and test/model/test_llama_parity the whole GPU model.
//
// Needs python3 with torch (it runs the reference on the CPU, vocabulary 1000 for speed); skipped otherwise.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include "llmc/core/common.h"

#include "llmc/model/model_spec.h"
#include "llmc/io/safetensors.h"
#include "test/reference/kernels_ref.h"
#include "test/reference/precision_ref.h"

using namespace llmc;

namespace {

std::string meta(const SafetensorsReader& r, const char* key) {
  auto it = r.metadata().find(key);
  if (it == r.metadata().end()) throw_error("%s: metadata has no key '%s'", r.path().c_str(), key);
  return it->second;
}

// out (M, N) += matmul(inp, w) etc. through the overwriting references.
void add_into(float* dst, const std::vector<float>& src) {
  for (size_t i = 0; i < src.size(); i++) dst[i] += src[i];
}

// The CPU Llama. Parameters and gradients are flat FP32 arrays laid out by the ParamTable, as on the GPU.
struct LlamaCpu {
  ModelSpec spec;
  ParamTable table;
  std::vector<float> params, grads;
  int B = 0, T = 0, N = 0, C = 0, Q = 0, F = 0, NH = 0, NKV = 0, HS = 0, V = 0, Vp = 0, L = 0;
  struct Acts {
    std::vector<float> ln1, ln1_rstd, qkv, atty, lse, residual2, ln2, ln2_rstd, gate_up, h, residual3;
  };
  std::vector<float> encoded, lnf, lnf_rstd, logits, dlogits, losses;
  std::vector<Acts> acts;
  std::vector<int> tokens, targets;

  float* p(const std::string& name) { return params.data() + table.get(name).offset; }
  float* g(const std::string& name) { return grads.data() + table.get(name).offset; }
  std::string layer(int l, const char* suffix) { return "model.layers." + std::to_string(l) + "." + suffix; }
  float* head_p() { return spec.tied_embeddings ? p("model.embed_tokens.weight") : p("lm_head.weight"); }
  float* head_g() { return spec.tied_embeddings ? g("model.embed_tokens.weight") : g("lm_head.weight"); }

  explicit LlamaCpu(const ModelSpec& s) : spec(s), table(build_param_table(s)) {
    params.assign(table.total_elements, 0.0f);
    grads.assign(table.total_elements, 0.0f);
    C = s.n_embd, Q = s.qkv_channels(), F = s.ffn_hidden, NH = s.n_head, NKV = s.n_kv_head, HS = s.head_size();
    V = s.vocab_size, Vp = s.padded_vocab_size, L = s.n_layer;
  }

  // Mean loss over the targets (none ignored here); dlogits = d mean loss / d logits.
  float forward(const std::vector<int>& x, const std::vector<int>& y, int b, int t) {
    B = b, T = t, N = b * t, tokens = x, targets = y;
    const float eps = spec.norm_eps, theta = spec.rope_theta;
    encoded.assign((size_t)N * C, 0.0f);
    encoder_forward_cpu(encoded.data(), tokens.data(), p("model.embed_tokens.weight"), nullptr, B, T, C);
    acts.assign(L, Acts{});
    std::vector<float> proj((size_t)N * C);
    for (int l = 0; l < L; l++) {
      Acts& a = acts[l];
      const std::vector<float>& x_in = l == 0 ? encoded : acts[l - 1].residual3;
      a.ln1.resize((size_t)N * C), a.ln1_rstd.resize(N);
      rmsnorm_forward_cpu(a.ln1.data(), a.ln1_rstd.data(), x_in.data(), p(layer(l, "input_layernorm.weight")), N, C,
                          eps);
      a.qkv.resize((size_t)N * Q);
      matmul_forward_cpu(a.qkv.data(), a.ln1.data(), p(layer(l, "self_attn.q_proj.weight")), nullptr, N, Q, C);
      rope_forward_cpu(a.qkv.data(), B, T, NH, NKV, HS, theta);
      a.atty.resize((size_t)N * NH * HS), a.lse.resize((size_t)B * NH * T);
      attention_forward_cpu(a.atty.data(), a.lse.data(), a.qkv.data(), B, T, NH, NKV, HS);
      matmul_forward_cpu(proj.data(), a.atty.data(), p(layer(l, "self_attn.o_proj.weight")), nullptr, N, C, NH * HS);
      a.residual2.resize((size_t)N * C);
      for (size_t i = 0; i < proj.size(); i++) a.residual2[i] = x_in[i] + proj[i];
      a.ln2.resize((size_t)N * C), a.ln2_rstd.resize(N);
      rmsnorm_forward_cpu(a.ln2.data(), a.ln2_rstd.data(), a.residual2.data(),
                          p(layer(l, "post_attention_layernorm.weight")), N, C, eps);
      a.gate_up.resize((size_t)N * 2 * F);
      matmul_forward_cpu(a.gate_up.data(), a.ln2.data(), p(layer(l, "mlp.gate_proj.weight")), nullptr, N, 2 * F, C);
      a.h.resize((size_t)N * F);
      swiglu_forward_cpu(a.h.data(), a.gate_up.data(), N, F);
      matmul_forward_cpu(proj.data(), a.h.data(), p(layer(l, "mlp.down_proj.weight")), nullptr, N, C, F);
      a.residual3.resize((size_t)N * C);
      for (size_t i = 0; i < proj.size(); i++) a.residual3[i] = a.residual2[i] + proj[i];
    }
    lnf.resize((size_t)N * C), lnf_rstd.resize(N);
    rmsnorm_forward_cpu(lnf.data(), lnf_rstd.data(), acts[L - 1].residual3.data(), p("model.norm.weight"), N, C, eps);
    logits.resize((size_t)N * Vp);
    matmul_forward_cpu(logits.data(), lnf.data(), head_p(), nullptr, N, Vp, C);
    dlogits = logits;
    losses.resize(N);
    fused_classifier_cpu(dlogits.data(), losses.data(), targets.data(), N, V, Vp, 1.0f / N, true);
    double sum = 0;
    for (float x : losses) sum += x;
    return static_cast<float>(sum / N);
  }

  void backward() {
    std::fill(grads.begin(), grads.end(), 0.0f);
    std::vector<float> dsmall((size_t)N * C), dresidual((size_t)N * C, 0.0f);
    std::vector<float> tmp;
    auto wgrad_add = [&](float* dw, const std::vector<float>& dy, const std::vector<float>& x, int rows, int cols) {
      tmp.assign((size_t)rows * cols, 0.0f);
      matmul_wgrad_cpu(tmp.data(), dy.data(), x.data(), N, rows, cols);
      add_into(dw, tmp);
    };
    // lm_head
    wgrad_add(head_g(), dlogits, lnf, Vp, C);
    matmul_dgrad_cpu(dsmall.data(), dlogits.data(), head_p(), N, Vp, C);
    rmsnorm_backward_cpu(dresidual.data(), g("model.norm.weight"), dsmall.data(), acts[L - 1].residual3.data(),
                         p("model.norm.weight"), lnf_rstd.data(), N, C);
    std::vector<float> dh((size_t)N * F), dgate_up((size_t)N * 2 * F), datty((size_t)N * NH * HS),
        dqkv((size_t)N * Q);
    for (int l = L - 1; l >= 0; l--) {
      Acts& a = acts[l];
      const std::vector<float>& x_in = l == 0 ? encoded : acts[l - 1].residual3;
      // MLP
      wgrad_add(g(layer(l, "mlp.down_proj.weight")), dresidual, a.h, C, F);
      matmul_dgrad_cpu(dh.data(), dresidual.data(), p(layer(l, "mlp.down_proj.weight")), N, C, F);
      swiglu_backward_cpu(dgate_up.data(), dh.data(), a.gate_up.data(), N, F);
      wgrad_add(g(layer(l, "mlp.gate_proj.weight")), dgate_up, a.ln2, 2 * F, C);  // fused: gate_proj | up_proj
      matmul_dgrad_cpu(dsmall.data(), dgate_up.data(), p(layer(l, "mlp.gate_proj.weight")), N, 2 * F, C);
      rmsnorm_backward_cpu(dresidual.data(), g(layer(l, "post_attention_layernorm.weight")), dsmall.data(),
                           a.residual2.data(), p(layer(l, "post_attention_layernorm.weight")), a.ln2_rstd.data(), N,
                           C);
      // attention
      wgrad_add(g(layer(l, "self_attn.o_proj.weight")), dresidual, a.atty, C, NH * HS);
      matmul_dgrad_cpu(datty.data(), dresidual.data(), p(layer(l, "self_attn.o_proj.weight")), N, C, NH * HS);
      attention_backward_cpu(dqkv.data(), datty.data(), a.qkv.data(), a.atty.data(), a.lse.data(), B, T, NH, NKV, HS);
      rope_backward_cpu(dqkv.data(), B, T, NH, NKV, HS, spec.rope_theta);
      wgrad_add(g(layer(l, "self_attn.q_proj.weight")), dqkv, a.ln1, Q, C);  // fused: q_proj | k_proj | v_proj
      matmul_dgrad_cpu(dsmall.data(), dqkv.data(), p(layer(l, "self_attn.q_proj.weight")), N, Q, C);
      rmsnorm_backward_cpu(dresidual.data(), g(layer(l, "input_layernorm.weight")), dsmall.data(), x_in.data(),
                           p(layer(l, "input_layernorm.weight")), a.ln1_rstd.data(), N, C);
    }
    encoder_backward_cpu(g("model.embed_tokens.weight"), nullptr, dresidual.data(), tokens.data(), B, T, C);
  }
};

struct Compare {
  double relerr = 0, cosine = 0;
};
Compare compare(const float* ours, const float* ref, size_t n) {
  double dd = 0, rr = 0, oo = 0, orr = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = (double)ours[i] - ref[i];
    dd += d * d, rr += (double)ref[i] * ref[i], oo += (double)ours[i] * ours[i], orr += (double)ours[i] * ref[i];
  }
  Compare c;
  c.relerr = rr > 0 ? std::sqrt(dd / rr) : std::sqrt(dd);
  c.cosine = (rr > 0 && oo > 0) ? orr / std::sqrt(rr * oo) : (dd == 0 ? 1.0 : 0.0);
  return c;
}

// Runs the reference for the spec into a fresh directory; false when python3 / torch is missing.
bool make_reference(const ModelSpec& s, int B, int T, const std::string& dir) {
  const std::string cmd = strformat(
      "python3 %s/dev/reference/llama.py --preset llama-tiny --n_layer %d --n_head %d --n_kv_head %d --n_embd %d "
      "--max_seq_len %d --vocab_size %d --padded_vocab_size %d --ffn_hidden %d --rope_theta %.9g --norm_eps %.9g %s "
      "--B %d --T %d --steps 1 --seed 3 --device cpu --out %s > %s/reference.log 2>&1",
      LLM8_SOURCE_DIR, s.n_layer, s.n_head, s.n_kv_head, s.n_embd, s.max_seq_len, s.vocab_size, s.padded_vocab_size,
      s.ffn_hidden, (double)s.rope_theta, (double)s.norm_eps, s.tied_embeddings ? "--tied" : "--untied", B, T,
      dir.c_str(), dir.c_str());
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77 || code == 127) return false;
  if (code != 0) {
    std::system(strformat("cat %s/reference.log", dir.c_str()).c_str());
    throw_error("dev/reference/llama.py failed with exit code %d (log above)", code);
  }
  return true;
}

void run_case(ModelSpec s, int B, int T) {
  char tmpl[] = "/tmp/llm8_llama_cpu_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{dir};
  if (!make_reference(s, B, T, dir)) GTEST_SKIP() << "python3 with torch is not available to run dev/reference/llama.py";
  SafetensorsReader weights(dir + "/model.safetensors"), dbg(dir + "/debug_state.safetensors");
  ASSERT_EQ(meta(weights, "arch"), "llama");

  LlamaCpu model(s);
  for (const ParamInfo& info : model.table.params) {
    std::vector<float> w = weights.read_as_float(info.name);
    ASSERT_EQ(w.size(), info.numel) << info.name;
    for (size_t i = 0; i < w.size(); i++)  // the reference computes with the bf16 rounding of the master weights
      model.params[info.offset + i] = __bfloat162float(__float2bfloat16_rn(w[i]));
  }
  std::vector<int> x(B * T), y(B * T);
  dbg.read_into("inputs", x.data(), x.size() * sizeof(int));
  dbg.read_into("targets", y.data(), y.size() * sizeof(int));
  const float loss = model.forward(x, y, B, T);
  model.backward();

  const float ref_loss = dbg.read_as_float("loss")[0];
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss)) << "loss";
  std::vector<float> ref_logits = dbg.read_as_float("logits"), logits((size_t)B * T * s.vocab_size);
  for (int n = 0; n < B * T; n++)
    for (int v = 0; v < s.vocab_size; v++)
      logits[(size_t)n * s.vocab_size + v] = model.logits[(size_t)n * s.padded_vocab_size + v];
  Compare cl = compare(logits.data(), ref_logits.data(), logits.size());
  std::printf("loss ours %.7f ref %.7f; logits relerr %.3e\n", loss, ref_loss, cl.relerr);
  EXPECT_LT(cl.relerr, 1e-5) << "logits";
  for (const ParamInfo& info : model.table.params) {
    std::vector<float> ref = dbg.read_as_float("grads." + info.name);
    ASSERT_EQ(ref.size(), info.numel) << info.name;
    Compare c = compare(model.grads.data() + info.offset, ref.data(), info.numel);
    std::printf("  %-46s relerr %.3e cosine %.8f\n", info.name.c_str(), c.relerr, c.cosine);
    EXPECT_LT(c.relerr, 1e-4) << "gradient of " << info.name;
  }
}

ModelSpec small_spec(int n_embd, int n_head, int n_kv_head, bool tied, float theta) {
  ModelSpec s;
  EXPECT_TRUE(model_preset("llama-tiny", &s));
  s.n_embd = n_embd;
  s.n_head = n_head;
  s.n_kv_head = n_kv_head;
  s.ffn_hidden = 192;
  s.vocab_size = 1000;
  s.padded_vocab_size = 1024;
  s.tied_embeddings = tied;
  s.rope_theta = theta;
  return s;
}

}  // namespace

TEST(LlamaCpuModel, UntiedGqa2MatchesPyTorch) { run_case(small_spec(128, 2, 1, false, 10000.0f), 2, 17); }
TEST(LlamaCpuModel, TiedGqa4HeadSize32MatchesPyTorch) { run_case(small_spec(128, 4, 1, true, 500000.0f), 2, 24); }
