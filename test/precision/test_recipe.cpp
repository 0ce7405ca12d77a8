// test/precision/test_recipe.cpp: the precision recipes (llmc/precision/recipe): presets expand to the documented
// fields; for every preset the answers the models and the trainer ask (which linears are quantised, with which
// encodings, what is saved for backward, amax histories, the GEMM dimension multiple, the compute capability); the
// plan of each linear (BF16 layers, lm_head, granularity-dependent scaling and fast accumulation); validation of
// impossible combinations and of encodings this build cannot quantise, with errors naming the precision.* key; the
// names and help generated from the preset table; the precision.pow2_scales mapping onto the scale formats; the FP4
// roles (role_encoding: the scales an E2M1 block implies), the nvfp4 preset and its switches (stochastic dy, the wgrad
// Hadamard transform) with what they refuse; precision.tensorwise_products (per-tensor scales in chosen products of a
// block-scaled recipe).
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/precision/recipe.h"

using namespace llmc;

namespace {

PrecisionRecipe preset(const char* name) {
  PrecisionRecipe r;
  EXPECT_TRUE(precision_recipe_preset(name, &r)) << name;
  return r;
}

// The message of the llmc::Error validate_precision_recipe throws, or "".
std::string validation_error(const PrecisionRecipe& r, int n_layer = 12) {
  try {
    validate_precision_recipe(r, n_layer);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const Encoding kE4M3{ElementFormat::E4M3};
const Encoding kE5M2{ElementFormat::E5M2};
const Encoding kE4M3Rows{ElementFormat::E4M3, kBlock1x128, ScaleFormat::FP32};
const Encoding kE5M2Rows{ElementFormat::E5M2, kBlock1x128, ScaleFormat::FP32};
const Encoding kE4M3Tiles{ElementFormat::E4M3, kBlock128x128, ScaleFormat::FP32};
const Encoding kNvfp4Rows{ElementFormat::E2M1, kBlock1x16, ScaleFormat::E4M3, true};
const Encoding kNvfp4Tiles{ElementFormat::E2M1, kBlock16x16, ScaleFormat::E4M3, true};
const Encoding kMxfp4Rows{ElementFormat::E2M1, kBlock1x32, ScaleFormat::E8M0, false};

}  // namespace

TEST(Recipe, PresetFields) {
  EXPECT_FALSE(preset("bf16").quantize_linears);
  const PrecisionRecipe t = preset("fp8_tensorwise");
  EXPECT_TRUE(t.quantize_linears);
  EXPECT_EQ(t.x, kE4M3);
  EXPECT_EQ(t.w, kE4M3);
  EXPECT_EQ(t.dy, kE5M2);
  EXPECT_EQ(t.scaling, ScalingMode::Current);
  EXPECT_FALSE(t.fast_accum);  // split accumulation everywhere (measured; see llmc/precision/recipe.cpp)
  EXPECT_FALSE(t.quantize_lm_head);
  EXPECT_TRUE(t.save_quantized_inputs);
  EXPECT_FALSE(t.pow2_scales());
  const PrecisionRecipe d = preset("fp8_delayed");
  EXPECT_EQ(d.scaling, ScalingMode::Delayed);
  EXPECT_EQ(d.amax_history_len, 1024);
  EXPECT_EQ(d.amax_compute, "max");
  EXPECT_EQ(d.margin, 0);
  EXPECT_FALSE(d.fast_accum);
  const PrecisionRecipe b = preset("fp8_blockwise");
  EXPECT_EQ(b.x, kE4M3Rows);
  EXPECT_EQ(b.w, kE4M3Tiles);
  EXPECT_EQ(b.dy, kE5M2Rows);  // E5M2 gradients (measured; see llmc/precision/recipe.cpp)
  EXPECT_FALSE(b.pow2_scales());  // FP32 block scales (measured; see llmc/precision/recipe.cpp)
  EXPECT_FALSE(b.fast_accum);
  EXPECT_EQ(b.recipe, "fp8_blockwise");
  EXPECT_FALSE(b.dy_stochastic_rounding);
  EXPECT_EQ(b.wgrad_hadamard, 0);
  // NVIDIA's NVFP4 recipe: 1x16 x and dy, 16x16 w, E4M3 block scales under an FP32 tensor scale, SR on gradients
  // only, RHT-16 on the wgrad inputs, the first and the last block in BF16.
  const PrecisionRecipe n = preset("nvfp4");
  EXPECT_TRUE(n.quantize_linears);
  EXPECT_EQ(n.x, kNvfp4Rows);
  EXPECT_EQ(n.w, kNvfp4Tiles);
  EXPECT_EQ(n.dy, kNvfp4Rows);
  EXPECT_TRUE(n.dy_stochastic_rounding);
  EXPECT_EQ(n.wgrad_hadamard, 16);
  EXPECT_EQ(n.bf16_layers, (std::vector<int>{0, -1}));
  EXPECT_FALSE(n.fast_accum);
  EXPECT_FALSE(n.quantize_lm_head);
  EXPECT_TRUE(n.save_quantized_inputs);
  EXPECT_TRUE(n.cache_weight_transpose);
  EXPECT_FALSE(n.backward_range_matched);
  // Quartet: MXFP4 for every role; QuEST forward (fixed Hadamard-32, Gaussian scales, trust masks); backward
  // re-quantised under fresh Hadamard-32 signs with range-matched scales, RTN (Quartet v4); every block quantised.
  const PrecisionRecipe q = preset("mxfp4");
  EXPECT_TRUE(q.quantize_linears);
  EXPECT_EQ(q.x, kMxfp4Rows);
  EXPECT_EQ(q.w, kMxfp4Rows);
  EXPECT_EQ(q.dy, kMxfp4Rows);
  EXPECT_EQ(q.forward_hadamard, 32);
  EXPECT_TRUE(q.forward_gaussian_scales);
  EXPECT_TRUE(q.trust_mask);
  EXPECT_EQ(q.backward_hadamard, 32);
  EXPECT_TRUE(q.backward_range_matched);
  EXPECT_FALSE(q.dy_stochastic_rounding);
  EXPECT_EQ(q.wgrad_hadamard, 0);
  EXPECT_TRUE(q.bf16_layers.empty());
  EXPECT_FALSE(q.quantize_lm_head);
  EXPECT_TRUE(q.save_quantized_inputs);
  // COAT: fp8_tensorwise with the non-linear layers' saved inputs as FP8 1x16 groups, the MLP activation computed
  // from its copy and recomputed, and the weights' codes made in every forward and backward (with the cache turned
  // back on, the transposed codes are still made in backward).
  const PrecisionRecipe c = preset("coat");
  PrecisionRecipe expect = t;
  expect.recipe = "coat";
  expect.nonlinear_fp8 = true;
  expect.recompute_mlp_act = true;
  expect.cache_weights = false;
  expect.cache_weight_transpose = false;
  EXPECT_EQ(describe_recipe(c), describe_recipe(expect));
  EXPECT_TRUE(c.nonlinear_fp8);
  EXPECT_TRUE(c.recompute_mlp_act);
  EXPECT_FALSE(c.cache_weights);
  EXPECT_FALSE(c.cache_weight_transpose);
  EXPECT_TRUE(contains(describe_recipe(c), "no weight cache")) << describe_recipe(c);
  for (const char* other : {"bf16", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise", "nvfp4", "mxfp4"}) {
    EXPECT_FALSE(preset(other).nonlinear_fp8) << other;
    EXPECT_FALSE(preset(other).recompute_mlp_act) << other;
    EXPECT_TRUE(preset(other).cache_weight_transpose) << other;
    EXPECT_TRUE(preset(other).cache_weights) << other;
  }
  EXPECT_FALSE(precision_recipe_preset("fp8", nullptr));
}

// Every preset, and what the models, the trainer and the config ask of it.
TEST(Recipe, QueriesOfEveryPreset) {
  struct Expect {
    const char* name;
    bool quantized;
    Encoding x, w, dy;
    bool history;
    int multiple, cc;
  };
  const Expect cases[] = {
      {"bf16", false, {}, {}, {}, false, 1, 80},
      {"fp8_tensorwise", true, kE4M3, kE4M3, kE5M2, false, 16, 89},
      {"fp8_delayed", true, kE4M3, kE4M3, kE5M2, true, 16, 89},
      {"fp8_blockwise", true, kE4M3Rows, kE4M3Tiles, kE5M2Rows, false, 128, 90},
      {"nvfp4", true, kNvfp4Rows, kNvfp4Tiles, kNvfp4Rows, false, 16, 80},  // products in BF16 on Hopper
      {"mxfp4", true, kMxfp4Rows, kMxfp4Rows, kMxfp4Rows, false, 32, 90},   // Hadamard-32 along the tokens
      {"coat", true, kE4M3, kE4M3, kE5M2, false, 16, 89},  // fp8_tensorwise's GEMMs
  };
  ASSERT_EQ(precision_recipe_names().size(), std::size(cases));
  for (size_t i = 0; i < std::size(cases); i++) {
    const Expect& c = cases[i];
    EXPECT_EQ(precision_recipe_names()[i], c.name);  // the docs' order
    const PrecisionRecipe r = preset(c.name);
    EXPECT_EQ(validation_error(r), "") << c.name;
    EXPECT_EQ(quantizes_linears(r), c.quantized) << c.name;
    EXPECT_EQ(keeps_amax_history(r), c.history) << c.name;
    EXPECT_EQ(quantized_dim_multiple(r), c.multiple) << c.name;
    EXPECT_EQ(recipe_min_compute_capability(r), c.cc) << c.name;
    for (LinearKind kind : {LinearKind::Qkv, LinearKind::AttnOut, LinearKind::MlpUp, LinearKind::MlpDown}) {
      const LinearPlan p = plan_linear(r, 3, 12, kind);
      EXPECT_EQ(p.quantized, c.quantized) << c.name << " " << linear_kind_name(kind);
      if (!c.quantized) continue;
      EXPECT_EQ(p.x, c.x) << c.name;
      EXPECT_EQ(p.w, c.w) << c.name;
      EXPECT_EQ(p.dy, c.dy) << c.name;
      // Saved for backward: the quantised input, except the attention output's (kept in BF16 for attention anyway)
      // and, under recompute_mlp_act (coat), the down projection's (recomputed in backward); Quartet's backward
      // re-quantises the forward's codes of every input.
      const bool recomputed = kind == LinearKind::MlpDown && r.recompute_mlp_act;
      EXPECT_EQ(p.save_quantized_input, (kind != LinearKind::AttnOut && !recomputed) || r.backward_range_matched)
          << c.name << " " << linear_kind_name(kind);
      EXPECT_EQ(p.cache_weight_transpose, r.cache_weight_transpose) << c.name;
      EXPECT_EQ(p.requantize_backward, r.backward_range_matched) << c.name;
      EXPECT_EQ(p.forward_hadamard, r.forward_hadamard) << c.name;
      EXPECT_EQ(p.forward_random_signs, r.forward_random_signs) << c.name;
      EXPECT_EQ(p.forward_gaussian_scales, r.forward_gaussian_scales) << c.name;
      EXPECT_EQ(p.trust_mask, r.trust_mask) << c.name;
      EXPECT_EQ(p.backward_hadamard, r.backward_hadamard) << c.name;
      EXPECT_EQ(p.amax_history_len, c.history ? 1024 : 1) << c.name;
      EXPECT_EQ(p.dy_stochastic_rounding, r.dy_stochastic_rounding) << c.name;
      EXPECT_EQ(p.wgrad_hadamard, r.wgrad_hadamard) << c.name;
    }
    EXPECT_FALSE(plan_linear(r, -1, 12, LinearKind::LmHead).quantized) << c.name;  // the lm_head stays BF16
  }
}

TEST(Recipe, LinearPlans) {
  PrecisionRecipe r = preset("fp8_tensorwise");
  r.fast_accum = true;  // Transformer Engine's fast accumulation: fprop only
  r.bf16_layers = {0, -1};
  EXPECT_TRUE(layer_stays_bf16(r, 0, 12));
  EXPECT_TRUE(layer_stays_bf16(r, 11, 12));
  EXPECT_FALSE(layer_stays_bf16(r, 5, 12));
  EXPECT_FALSE(plan_linear(r, 0, 12, LinearKind::Qkv).quantized);
  EXPECT_FALSE(plan_linear(r, 11, 12, LinearKind::MlpDown).quantized);
  const LinearPlan p = plan_linear(r, 5, 12, LinearKind::MlpUp);
  EXPECT_TRUE(p.quantized);
  EXPECT_TRUE(p.fast_accum_fprop);
  EXPECT_TRUE(p.save_quantized_input);
  EXPECT_EQ(p.dy.element, ElementFormat::E5M2);
  EXPECT_EQ(p.amax_history_len, 1);
  EXPECT_TRUE(quantizes_linears(r));
  // lm_head stays BF16 unless asked.
  EXPECT_FALSE(plan_linear(r, -1, 12, LinearKind::LmHead).quantized);
  r.quantize_lm_head = true;
  EXPECT_TRUE(plan_linear(r, -1, 12, LinearKind::LmHead).quantized);
  // Inputs saved in BF16 when asked.
  r.save_quantized_inputs = false;
  EXPECT_FALSE(plan_linear(r, 5, 12, LinearKind::MlpUp).save_quantized_input);
  // Delayed scaling keeps its history length; block recipes never use fast accumulation or delayed scaling.
  const LinearPlan dp = plan_linear(preset("fp8_delayed"), 3, 12, LinearKind::Qkv);
  EXPECT_EQ(dp.scaling, ScalingMode::Delayed);
  EXPECT_EQ(dp.amax_history_len, 1024);
  EXPECT_TRUE(dp.amax_use_max);
  const LinearPlan bp = plan_linear(preset("fp8_blockwise"), 3, 12, LinearKind::AttnOut);
  EXPECT_TRUE(bp.quantized);
  EXPECT_FALSE(bp.save_quantized_input);  // the models keep the attention output in BF16 for the attention backward
  EXPECT_FALSE(bp.fast_accum_fprop);
  EXPECT_EQ(bp.scaling, ScalingMode::Current);
  EXPECT_TRUE(!bp.x.pow2_scales() && !bp.w.pow2_scales() && !bp.dy.pow2_scales());
  // BF16 recipe: nothing is quantised, whatever the encodings say.
  PrecisionRecipe bf = preset("bf16");
  bf.x = kE4M3Rows;
  EXPECT_FALSE(plan_linear(bf, 3, 12, LinearKind::Qkv).quantized);
  EXPECT_FALSE(quantizes_linears(bf));
  EXPECT_EQ(validation_error(bf), "");
}

TEST(Recipe, OverridesChangeTheAnswers) {
  PrecisionRecipe r = preset("fp8_tensorwise");
  r.x.block = r.w.block = r.dy.block = kBlock1x128;
  r.fast_accum = false;
  EXPECT_EQ(validation_error(r), "");
  EXPECT_EQ(recipe_min_compute_capability(r), 90);
  EXPECT_EQ(quantized_dim_multiple(r), 128);
  r = preset("fp8_blockwise");
  r.x.block = r.w.block = r.dy.block = kWholeTensor;
  EXPECT_EQ(validation_error(r), "");
  EXPECT_EQ(recipe_min_compute_capability(r), 89);
  EXPECT_EQ(quantized_dim_multiple(r), 16);
}

TEST(Recipe, Pow2ScalesKeyMapsOntoTheScaleFormats) {
  PrecisionRecipe r = preset("fp8_tensorwise");
  r.set_pow2_scales(true);
  EXPECT_TRUE(r.pow2_scales());
  EXPECT_EQ(r.x.scale, ScaleFormat::Pow2FP32);
  EXPECT_EQ(r.w.scale, ScaleFormat::Pow2FP32);
  EXPECT_EQ(r.dy.scale, ScaleFormat::Pow2FP32);
  r.set_pow2_scales(false);
  EXPECT_FALSE(r.pow2_scales());
  EXPECT_EQ(r.dy.scale, ScaleFormat::FP32);
  // Scale formats that are not FP32 stay what they are.
  r.w.scale = ScaleFormat::E8M0;
  r.set_pow2_scales(true);
  EXPECT_EQ(r.w.scale, ScaleFormat::E8M0);
  EXPECT_EQ(r.x.scale, ScaleFormat::Pow2FP32);
}

TEST(Recipe, NamesHelpAndDescription) {
  EXPECT_EQ(precision_recipe_names(),
            (std::vector<std::string>{"bf16", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise", "nvfp4", "mxfp4",
                                      "coat"}));
  EXPECT_EQ(precision_recipe_summaries(),
            "bf16 (every GEMM in BF16; sm_80) | fp8_tensorwise (current per-tensor scaling; sm_89) | fp8_delayed "
            "(amax history; sm_89) | fp8_blockwise (1x128 / 128x128 blocks; sm_90) | nvfp4 (E2M1 1x16 blocks (w "
            "16x16), E4M3 block + FP32 tensor scales, stochastic dy, RHT-16 wgrad; BF16 products on Hopper; sm_80) | mxfp4 "
            "(Quartet: E2M1 1x32 blocks, E8M0 scales; QuEST forward (Hadamard-32, Gaussian scales, trust masks), "
            "backward re-quantised with fresh Hadamard-32 signs and range-matched scales; FP8 products on Hopper; "
            "sm_90) | coat (fp8_tensorwise GEMMs, norm / GELU / SwiGLU inputs saved as E4M3 1x16 groups, GELU / "
            "SwiGLU computed from them and recomputed in backward, weight codes made in every pass (no weight "
            "cache), FP8 AdamW moments (fp8_expand); sm_89)");
  // Only coat brings an optimizer-state format (COAT's FP8 moments).
  for (const std::string& name : precision_recipe_names())
    EXPECT_STREQ(precision_recipe_state_format(name), name == "coat" ? "fp8_expand" : nullptr) << name;
  EXPECT_EQ(precision_recipe_state_format("fp8_magic"), nullptr);
  try {
    PrecisionRecipe r;
    fill_precision_recipe("fp8_magic", &r);
    ADD_FAILURE() << "no error for an unknown preset";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "precision.recipe: unknown recipe 'fp8_magic' (known in this build: bf16, "
                                   "fp8_tensorwise, fp8_delayed, fp8_blockwise, nvfp4, mxfp4, coat)")) << e.what();
  }
  PrecisionRecipe unknown;
  unknown.recipe = "fp8";
  EXPECT_TRUE(contains(validation_error(unknown), "unknown recipe 'fp8'"));
  PrecisionRecipe deepseek = preset("fp8_blockwise");
  deepseek.set_pow2_scales(true);
  const std::string d = describe_recipe(deepseek);
  EXPECT_TRUE(contains(d, "x e4m3 1x128 pow2 scales")) << d;
  EXPECT_TRUE(contains(d, "w e4m3 128x128 pow2 scales")) << d;
  EXPECT_TRUE(contains(d, "dy e5m2 1x128 pow2 scales")) << d;
  const std::string plain = describe_recipe(preset("fp8_blockwise"));
  EXPECT_FALSE(contains(plain, "pow2")) << plain;
  EXPECT_TRUE(contains(d, "split accumulation")) << d;
  EXPECT_TRUE(contains(d, "linear inputs saved as e4m3")) << d;
  EXPECT_TRUE(contains(describe_recipe(preset("fp8_delayed")), "delayed scaling (history 1024, max, margin 0)"));
  EXPECT_EQ(describe_recipe(preset("bf16")), "bf16 (all GEMMs in BF16)");
  const std::string n = describe_recipe(preset("nvfp4"));
  EXPECT_TRUE(contains(n, "x e2m1 1x16 e4m3 scales + fp32 tensor scale, w e2m1 16x16 e4m3 scales + fp32 tensor "
                          "scale, dy e2m1 1x16 e4m3 scales + fp32 tensor scale")) << n;
  EXPECT_TRUE(contains(n, "dy rounded stochastically; random Hadamard-16 on the wgrad operands")) << n;
  EXPECT_TRUE(contains(n, "FP4 numerics, products on BF16 tensor cores (exact expansion)")) << n;
  EXPECT_TRUE(contains(n, "bf16 layers: 0 -1")) << n;
  EXPECT_TRUE(contains(n, "linear inputs saved as e2m1")) << n;
  EXPECT_FALSE(contains(n, "scaling")) << n;  // no per-tensor scaling mode to speak of
}

TEST(Recipe, ImpossibleCombinations) {
  PrecisionRecipe r = preset("fp8_blockwise");
  r.fast_accum = true;
  EXPECT_TRUE(contains(validation_error(r), "precision.fast_accum")) << validation_error(r);
  r = preset("fp8_blockwise");
  r.dy.block = kBlock128x128;
  EXPECT_TRUE(contains(validation_error(r), "dgrad")) << validation_error(r);  // 2-D x 2-D
  EXPECT_TRUE(contains(validation_error(r), "dy and w are both 128x128")) << validation_error(r);
  r = preset("fp8_blockwise");
  r.x.block = kBlock128x128;
  EXPECT_TRUE(contains(validation_error(r), "x and w are both 128x128")) << validation_error(r);
  r = preset("fp8_tensorwise");
  r.w.block = kBlock128x128;
  EXPECT_TRUE(contains(validation_error(r), "cannot mix per-tensor and block scales")) << validation_error(r);
  r = preset("fp8_tensorwise");
  r.w.element = ElementFormat::E5M2;  // dgrad: e5m2 dy with an e5m2 w
  EXPECT_TRUE(contains(validation_error(r), "dy and w are both e5m2")) << validation_error(r);
  r = preset("fp8_blockwise");
  r.scaling = ScalingMode::Delayed;
  EXPECT_TRUE(contains(validation_error(r), "precision.scaling = \"delayed\"")) << validation_error(r);
  r = preset("fp8_blockwise");
  r.w.scale = ScaleFormat::Pow2FP32;  // one role's scales rounded to powers of two, the others' not
  EXPECT_TRUE(contains(validation_error(r), "precision.pow2_scales")) << validation_error(r);
  r = preset("fp8_delayed");
  r.amax_history_len = 0;
  EXPECT_TRUE(contains(validation_error(r), "precision.amax_history_len"));
  r = preset("fp8_tensorwise");
  r.bf16_layers = {-13};
  EXPECT_TRUE(contains(validation_error(r), "precision.bf16_layers"));
  r.bf16_layers = {-12, 11};
  EXPECT_EQ(validation_error(r), "");
}

// precision.tensorwise_products: its text, the copies' encodings in the plan, and what it refuses.
TEST(Recipe, TensorwiseProducts) {
  std::vector<LinearProduct> ps;
  std::string why;
  EXPECT_TRUE(parse_linear_products("dgrad, wgrad", &ps, &why)) << why;
  EXPECT_EQ(ps, (std::vector<LinearProduct>{LinearProduct::Dgrad, LinearProduct::Wgrad}));
  EXPECT_EQ(format_linear_products(ps), "dgrad,wgrad");
  EXPECT_TRUE(parse_linear_products("", &ps, &why));
  EXPECT_TRUE(ps.empty());
  EXPECT_EQ(format_linear_products(ps), "");
  EXPECT_FALSE(parse_linear_products("fprop,fprop", &ps, &why));
  EXPECT_TRUE(contains(why, "named twice")) << why;
  EXPECT_FALSE(parse_linear_products("fprop,bwd", &ps, &why));
  EXPECT_TRUE(contains(why, "'bwd' is not a product")) << why;
  EXPECT_FALSE(parse_linear_products("wgrad,", &ps, &why));

  // No preset sets it: every copy takes its role's encoding.
  for (const std::string& name : precision_recipe_names()) {
    PrecisionRecipe r;
    ASSERT_TRUE(precision_recipe_preset(name, &r));
    EXPECT_TRUE(r.tensorwise_products.empty()) << name;
    const LinearPlan p = plan_linear(r, 0, 12, LinearKind::MlpUp);
    EXPECT_TRUE(p.x_t == p.x && p.w_t == p.w && p.dy_t == p.dy) << name;
  }

  // Block-wise with per-tensor dgrad and wgrad: only fprop keeps the blocks.
  const Encoding x_whole{ElementFormat::E4M3}, w_whole{ElementFormat::E4M3}, dy_whole{ElementFormat::E5M2};
  PrecisionRecipe r = preset("fp8_blockwise");
  r.tensorwise_products = {LinearProduct::Dgrad, LinearProduct::Wgrad};
  EXPECT_EQ(validation_error(r), "");
  LinearPlan p = plan_linear(r, 0, 12, LinearKind::MlpUp);
  EXPECT_EQ(p.x, r.x);
  EXPECT_EQ(p.w, r.w);
  EXPECT_EQ(p.w_t, w_whole);
  EXPECT_EQ(p.dy, dy_whole);
  EXPECT_EQ(p.dy_t, dy_whole);
  EXPECT_EQ(p.x_t, x_whole);
  EXPECT_EQ(p.scaling, ScalingMode::Current);
  EXPECT_FALSE(p.fast_accum_fprop);
  EXPECT_EQ(recipe_min_compute_capability(r), 90);
  EXPECT_TRUE(contains(describe_recipe(r), "; per-tensor scales in dgrad,wgrad;")) << describe_recipe(r);
  // Blocks in wgrad only.
  r.tensorwise_products = {LinearProduct::Fprop, LinearProduct::Dgrad};
  p = plan_linear(r, 0, 12, LinearKind::MlpUp);
  EXPECT_TRUE(p.x == x_whole && p.w == w_whole && p.w_t == w_whole && p.dy == dy_whole) << describe_recipe(r);
  EXPECT_TRUE(p.x_t == r.x && p.dy_t == r.dy) << describe_recipe(r);
  EXPECT_EQ(validation_error(r), "");
  // All three: fp8_tensorwise's products (sm_89).
  r.tensorwise_products = {LinearProduct::Fprop, LinearProduct::Dgrad, LinearProduct::Wgrad};
  EXPECT_EQ(validation_error(r), "");
  EXPECT_EQ(recipe_min_compute_capability(r), 89);
  const LinearPlan t = plan_linear(preset("fp8_tensorwise"), 0, 12, LinearKind::MlpUp);
  p = plan_linear(r, 0, 12, LinearKind::MlpUp);
  EXPECT_TRUE(p.x == t.x && p.w == t.w && p.dy == t.dy && p.x_t == t.x_t && p.w_t == t.w_t && p.dy_t == t.dy_t);

  // Refused: products that are per-tensor already, FP4 operands, no quantised linears, and fprop / dgrad apart
  // without the cached weight transpose (wgrad alone is fine there: the weight's copies agree).
  r = preset("fp8_tensorwise");
  r.tensorwise_products = {LinearProduct::Fprop};
  EXPECT_TRUE(contains(validation_error(r), "already has one scale per tensor")) << validation_error(r);
  r = preset("nvfp4");
  r.tensorwise_products = {LinearProduct::Wgrad};
  EXPECT_TRUE(contains(validation_error(r), "FP8 (e4m3 / e5m2) only")) << validation_error(r);
  r = preset("mxfp4");
  r.tensorwise_products = {LinearProduct::Dgrad};
  EXPECT_TRUE(contains(validation_error(r), "precision.tensorwise_products names dgrad")) << validation_error(r);
  r = preset("bf16");
  r.tensorwise_products = {LinearProduct::Wgrad};
  EXPECT_TRUE(contains(validation_error(r), "quantises no linear")) << validation_error(r);
  r = preset("fp8_blockwise");
  r.cache_weight_transpose = false;
  r.tensorwise_products = {LinearProduct::Fprop};
  EXPECT_TRUE(contains(validation_error(r), "precision.cache_weight_transpose to true")) << validation_error(r);
  r.tensorwise_products = {LinearProduct::Fprop, LinearProduct::Dgrad};
  EXPECT_EQ(validation_error(r), "");
  r.tensorwise_products = {LinearProduct::Wgrad};
  EXPECT_EQ(validation_error(r), "");
}

// The FP4 roles: the scales an E2M1 block implies, the nvfp4 preset's plans, and the switches it brings.
TEST(Recipe, Fp4RolesAndSwitches) {
  EXPECT_EQ(role_encoding(ElementFormat::E2M1, kBlock1x16, false), kNvfp4Rows);
  EXPECT_EQ(role_encoding(ElementFormat::E2M1, kBlock16x16, true), kNvfp4Tiles);  // pow2 does not apply to FP4
  EXPECT_EQ(role_encoding(ElementFormat::E2M1, kBlock1x32, false), kMxfp4Rows);
  EXPECT_EQ(role_encoding(ElementFormat::E4M3, kBlock1x128, false), kE4M3Rows);
  EXPECT_EQ(role_encoding(ElementFormat::E4M3, kBlock1x128, true),
            (Encoding{ElementFormat::E4M3, kBlock1x128, ScaleFormat::Pow2FP32}));
  EXPECT_EQ(role_encoding(ElementFormat::E5M2, kWholeTensor, false), kE5M2);
  // E2M1 with a block no FP4 format has: FP32 scales, which nothing quantises.
  EXPECT_EQ(role_encoding(ElementFormat::E2M1, kBlock1x128, false),
            (Encoding{ElementFormat::E2M1, kBlock1x128, ScaleFormat::FP32, false}));

  const PrecisionRecipe n = preset("nvfp4");
  EXPECT_FALSE(plan_linear(n, 11, 12, LinearKind::Qkv).quantized);  // the first and the last block stay BF16
  EXPECT_FALSE(plan_linear(n, 0, 12, LinearKind::MlpDown).quantized);
  EXPECT_FALSE(plan_linear(n, -1, 12, LinearKind::LmHead).quantized);
  const LinearPlan p = plan_linear(n, 1, 12, LinearKind::MlpDown);
  EXPECT_TRUE(p.quantized);
  EXPECT_TRUE(p.dy_stochastic_rounding);
  EXPECT_EQ(p.wgrad_hadamard, 16);
  EXPECT_FALSE(p.fast_accum_fprop);
  EXPECT_EQ(p.scaling, ScalingMode::Current);
  EXPECT_TRUE(p.save_quantized_input);
  EXPECT_EQ(validation_error(n, 1), std::string());  // one block: first and last, so nothing is quantised but valid
  // The ablations of the NVFP4 paper are valid recipes: no SR, no RHT, 1x16 weights.
  PrecisionRecipe a = n;
  a.dy_stochastic_rounding = false;
  a.wgrad_hadamard = 0;
  a.w = kNvfp4Rows;
  EXPECT_EQ(validation_error(a), "");
  EXPECT_EQ(quantized_dim_multiple(a), 16);
  // MXFP4 for every role, with a size-32 transform along the tokens: the tokens must be a multiple of 32.
  PrecisionRecipe mx = n;
  mx.x = mx.w = mx.dy = kMxfp4Rows;
  mx.wgrad_hadamard = 32;
  EXPECT_EQ(validation_error(mx), "");
  EXPECT_EQ(quantized_dim_multiple(mx), 32);
  EXPECT_EQ(recipe_min_compute_capability(mx), 90);
  EXPECT_TRUE(contains(describe_recipe(mx), "products on FP8 tensor cores (exact E4M3 remap)")) << describe_recipe(mx);
}

TEST(Recipe, Fp4CombinationsRefused) {
  PrecisionRecipe r = preset("fp8_tensorwise");
  r.dy_stochastic_rounding = true;  // the FP8 quantisers round to nearest
  EXPECT_TRUE(contains(validation_error(r), "precision.dy_rounding = \"stochastic\" needs FP4 output gradients"))
      << validation_error(r);
  r = preset("fp8_blockwise");
  r.wgrad_hadamard = 16;
  EXPECT_TRUE(contains(validation_error(r), "precision.wgrad_hadamard = 16 rotates x and dy")) << validation_error(r);
  r = preset("nvfp4");
  r.wgrad_hadamard = 8;
  EXPECT_TRUE(contains(validation_error(r), "precision.wgrad_hadamard must be 0 (none), 16 or 32 (got 8)"))
      << validation_error(r);
  r.wgrad_hadamard = 32;  // wider than NVFP4's 16-element blocks
  EXPECT_TRUE(contains(validation_error(r), "but precision.x is e2m1 1x16")) << validation_error(r);
  r = preset("nvfp4");
  r.x = kNvfp4Tiles;  // a 2-D x: its transposed copy could not be rotated along the tokens, nor multiplied with dy
  EXPECT_FALSE(validation_error(r).empty());
  r = preset("nvfp4");
  r.cache_weight_transpose = false;
  EXPECT_TRUE(contains(validation_error(r), "precision.cache_weight_transpose = false")) << validation_error(r);
  r = preset("nvfp4");
  r.w = kMxfp4Rows;  // the two FP4 families do not multiply each other
  EXPECT_TRUE(contains(validation_error(r), "an FP4 operand multiplies only an operand of its own FP4 family"))
      << validation_error(r);
  r = preset("nvfp4");
  r.dy = kE5M2Rows;  // FP8 gradients with FP4 weights: no product
  r.dy_stochastic_rounding = false;
  r.wgrad_hadamard = 0;
  EXPECT_FALSE(validation_error(r).empty());
  r = preset("nvfp4");
  r.fast_accum = true;
  EXPECT_TRUE(contains(validation_error(r), "precision.fast_accum")) << validation_error(r);
}

// Quartet's switches: each ingredient names itself and the key that enables its data flow; the flow needs MXFP4 for
// every role, saved quantised inputs and no second wgrad rotation. The paper's ablations are valid recipes.
TEST(Recipe, QuartetSwitches) {
  const PrecisionRecipe q = preset("mxfp4");
  EXPECT_EQ(validation_error(q), "");
  const std::string d = describe_recipe(q);
  for (const char* part : {"forward Hadamard-32, Gaussian (QuEST) scales, trust masks",
                           "backward re-quantises the saved codes under fresh random Hadamard-32 signs, range-matched "
                           "scales, round to nearest", "products on FP8 tensor cores (exact E4M3 remap)"})
    EXPECT_TRUE(contains(d, part)) << d;
  PrecisionRecipe a = q;
  a.trust_mask = false;  // no mask
  EXPECT_EQ(validation_error(a), "");
  a = q;
  a.forward_hadamard = a.backward_hadamard = 0;  // no rotation
  EXPECT_EQ(validation_error(a), "");
  EXPECT_EQ(quantized_dim_multiple(a), 16);
  a = q;
  a.dy_stochastic_rounding = true;  // Quartet v1/v2's SR backward
  EXPECT_EQ(validation_error(a), "");
  EXPECT_TRUE(contains(describe_recipe(a), "range-matched scales, stochastic rounding")) << describe_recipe(a);
  a = q;
  a.forward_gaussian_scales = false;  // absmax forward
  EXPECT_EQ(validation_error(a), "");
  a.forward_hadamard = 0;
  a.trust_mask = false;  // Table 2's RTN-absmax forward (no rotation, amax scales, no mask), Quartet's backward
  EXPECT_EQ(validation_error(a), "");
  EXPECT_TRUE(contains(describe_recipe(a), "; forward absmax scales; backward re-quantises the saved codes under fresh "
                                           "random Hadamard-32 signs")) << describe_recipe(a);
  EXPECT_FALSE(q.forward_random_signs);  // Quartet's forward rotation is H32 alone
  a = q;
  a.forward_random_signs = true;  // the deviation: H32 times the run's random signs
  EXPECT_EQ(validation_error(a), "");
  EXPECT_TRUE(contains(describe_recipe(a), "forward Hadamard-32 with the run's random signs,")) << describe_recipe(a);
  EXPECT_EQ(plan_linear(a, 1, 4, LinearKind::MlpUp).forward_random_signs, true);
  a.forward_hadamard = 0;
  EXPECT_TRUE(contains(validation_error(a), "precision.forward_signs = \"random\" signs the forward Hadamard "
                                            "transform, which is off")) << validation_error(a);

  PrecisionRecipe r = q;
  r.forward_hadamard = 16;
  EXPECT_TRUE(contains(validation_error(r), "precision.forward_hadamard must be 0 (none) or 32 (got 16)"))
      << validation_error(r);
  r = q;
  r.backward_hadamard = 16;
  EXPECT_TRUE(contains(validation_error(r), "precision.backward_hadamard must be 0 (none) or 32 (got 16)"))
      << validation_error(r);
  r = q;
  r.backward_range_matched = false;  // the ingredients without their data flow
  EXPECT_TRUE(contains(validation_error(r), "precision.forward_hadamard = 32 is an ingredient of Quartet's data flow"))
      << validation_error(r);
  EXPECT_TRUE(contains(validation_error(r), "set precision.backward_scale = \"range_matched\"")) << validation_error(r);
  r.forward_hadamard = 0;
  EXPECT_TRUE(contains(validation_error(r), "precision.forward_scale = \"gaussian\" is an ingredient"))
      << validation_error(r);
  r.forward_gaussian_scales = false;
  EXPECT_TRUE(contains(validation_error(r), "precision.trust_mask = true is an ingredient")) << validation_error(r);
  r.trust_mask = false;
  EXPECT_TRUE(contains(validation_error(r), "precision.backward_hadamard = 32 is an ingredient"))
      << validation_error(r);
  r.backward_hadamard = 0;
  EXPECT_EQ(validation_error(r), "");  // plain MXFP4 with the absmax backward
  r = q;
  r.dy = kNvfp4Rows;
  EXPECT_FALSE(validation_error(r).empty());
  r = q;
  r.w = kE4M3Rows;  // an FP8 weight: the backward is not Quartet's (the product is refused first, or the flow)
  EXPECT_FALSE(validation_error(r).empty());
  r = preset("nvfp4");
  r.backward_range_matched = true;
  EXPECT_TRUE(contains(validation_error(r), "is Quartet's MXFP4 backward, but precision.x is e2m1 1x16"))
      << validation_error(r);
  r = q;
  r.wgrad_hadamard = 32;
  EXPECT_TRUE(contains(validation_error(r), "set precision.wgrad_hadamard to 0")) << validation_error(r);
  r = q;
  r.save_quantized_inputs = false;
  EXPECT_TRUE(contains(validation_error(r), "set precision.fp8_activations to true")) << validation_error(r);
}

// precision.cache_weights = false: FP8 weights only, and only where linears are quantised; the plans carry it and the
// description says it.
TEST(Recipe, UncachedWeights) {
  for (const char* name : {"fp8_tensorwise", "fp8_delayed", "fp8_blockwise", "coat"}) {
    PrecisionRecipe r = preset(name);
    r.cache_weights = false;
    EXPECT_EQ(validation_error(r), "") << name;
    EXPECT_FALSE(plan_linear(r, 1, 4, LinearKind::MlpUp).cache_weights) << name;
    EXPECT_TRUE(contains(describe_recipe(r), "weight codes made in every forward and backward")) << name;
  }
  for (const char* name : {"nvfp4", "mxfp4"}) {
    PrecisionRecipe r = preset(name);
    r.cache_weights = false;
    EXPECT_TRUE(contains(validation_error(r), "FP4 weights")) << validation_error(r);
  }
  PrecisionRecipe r = preset("bf16");
  r.cache_weights = false;
  EXPECT_TRUE(contains(validation_error(r), "quantises no linear: set it to true")) << validation_error(r);
  EXPECT_TRUE(plan_linear(preset("fp8_tensorwise"), 1, 4, LinearKind::MlpUp).cache_weights);
}

// An encoding this build has no quantiser for is refused by validation, naming the keys, before any kernel.
TEST(Recipe, EncodingsWithoutAQuantiserAreRefused) {
  PrecisionRecipe r = preset("fp8_tensorwise");
  r.x = {ElementFormat::E5M2, kBlock1x16, ScaleFormat::FP32, false};  // E5M2 codes in 1x16 blocks: no quantiser
  const std::string e = validation_error(r);
  EXPECT_TRUE(contains(e, "precision.x_format / precision.x_granularity")) << e;
  EXPECT_TRUE(contains(e, "no quantiser for e5m2 1x16")) << e;
  // E4M3 1x16 (the saved activations' copies) has a quantiser but is no GEMM operand.
  r.x = {ElementFormat::E4M3, kBlock1x16, ScaleFormat::FP32, false};
  EXPECT_TRUE(contains(validation_error(r), "x is e4m3 1x16")) << validation_error(r);
  r = preset("fp8_blockwise");
  r.dy.block = kBlock1x32;
  EXPECT_TRUE(contains(validation_error(r), "precision.dy_format / precision.dy_granularity")) << validation_error(r);
  r = preset("fp8_tensorwise");
  r.w.block = BlockShape{2, 64};
  EXPECT_TRUE(contains(validation_error(r), "not an encoding")) << validation_error(r);
  // Under the bf16 recipe the encodings are not used, so not checked.
  r = preset("bf16");
  r.x = {ElementFormat::E2M1, kBlock1x32, ScaleFormat::E8M0};
  EXPECT_EQ(validation_error(r), "");
}

// The choices precision.*_format / *_granularity offer are the encodings a quantised linear can use (role_encoding of
// an element and a block): FP8 per tensor, 1x128 and 128x128, and FP4 (E2M1) in NVFP4's 1x16 / 16x16 and MXFP4's
// 1x32 blocks. E4M3 1x16 (the saved activations' copies) has a quantiser but no GEMM, so it adds no choice.
TEST(Recipe, ConfigurableChoicesAreTheLinearsEncodings) {
  const std::vector<ElementFormat> elements = configurable_element_formats();
  EXPECT_EQ(elements, (std::vector<ElementFormat>{ElementFormat::E4M3, ElementFormat::E5M2, ElementFormat::E2M1}));
  const std::vector<BlockShape> blocks = configurable_block_shapes();
  EXPECT_EQ(blocks, (std::vector<BlockShape>{kWholeTensor, kBlock1x128, kBlock128x128, kBlock1x16, kBlock1x32,
                                             kBlock16x16}));
}
