// llmc/precision/recipe.cpp: the recipe presets (one table), their validation, the per-linear plan and the recipe
// queries of llmc/precision/recipe.h. Host code only.
//
// Presets (facts: shared/reference/fp8_recipes.md):
//   bf16            every GEMM in BF16.
//   fp8_tensorwise  Transformer Engine's current scaling / torchao tensorwise: x, w E4M3 and dy E5M2, one scale per
//                   tensor from the current amax (the producer kernel reports it). Split (promoted) accumulation in
//                   every GEMM, as Hopper's fast FP8 accumulator keeps about 14 bits (DeepSeek-V3); Transformer
//                   Engine's fast accumulation in fprop is precision.fast_accum = true (the loss and step time of
//                   both: dev/bench/results/loss_gpt2_124m_100m).
//   fp8_delayed     Transformer Engine's DelayedScaling: the same formats and accumulation, scales from the max of an
//                   amax history (1024 steps, margin 0) recorded over earlier steps, so quantisation needs no amax
//                   pass first.
//   fp8_blockwise   DeepSeek-V3 / TE Float8BlockScaling: x and dy in 1x128 blocks, w in 128x128 tiles, split
//                   (promoted) accumulation; x and w E4M3, dy E5M2; FP32 block scales. Two choices differ from
//                   DeepSeek's, both measured (dev/bench/NOTES.md, issue 18):
//                   - power-of-two scales (DeepSeek's, precision.pow2_scales = true) put each block's amax anywhere
//                     in [224, 448) instead of on 448: on the same operands the products lose the whole gain of the
//                     blocks over one scale per tensor (FP32 block scales: +0.5 to +1.7 dB per product), and over
//                     three seeds of GPT-2 124M (100.7M tokens) they ended 1.12% ± 0.28 (validation) and
//                     0.61% ± 0.10 (held-out) above FP32 block scales, which end level with fp8_tensorwise;
//                   - DeepSeek quantises dy to E4M3 too; with power-of-two scales that ended 2.2% above BF16
//                     (GPT-2 124M, 1000 steps; 0.5% of the gradients underflowed to zero), E5M2 dy +0.01%, E4M3 dy
//                     with FP32 scales -0.8%. precision.dy_format = "e4m3" gives DeepSeek's choice.
//   nvfp4           NVIDIA's NVFP4 recipe (arXiv 2509.25149, shared/reference/fp4_recipes.md §3): E2M1 codes in 1x16
//                   blocks with E4M3 block scales under an FP32 tensor scale; weights in 16x16 tiles, so one set of
//                   codes serves fprop and dgrad; output gradients rounded stochastically (SR on gradients only); a
//                   random Hadamard transform of size 16 on both weight-gradient operands, along the tokens, with
//                   one sign vector for the run; the first and the last block in BF16 (the paper's 12B run kept the
//                   first two and the last eight of 62 blocks, 16% of the linears; on GPT-2 124M the first block
//                   lowered the final loss at every seed, the measurement in dev/bench/results/loss_gpt2_124m_100m).
//                   On Hopper the products run on BF16 tensor cores from operands expanded exactly from the FP4 codes
//                   (llmc/precision/fp4_gemm.h): FP4 numerics and storage, not FP4 speed.
//   mxfp4           Quartet (arXiv 2505.14669, shared/reference/fp4_recipes.md §1): x, w and dy E2M1 in 1x32 blocks
//                   with E8M0 scales, every product of every block linear. Forward as QuEST: x and w rotated along K
//                   by the fixed Hadamard-32, Gaussian (sigma-based) scales, round to nearest, trust masks saved.
//                   Backward (Alg. 1): dy and the saved Wq rotated along N, dyᵀ and the saved Xqᵀ along the tokens,
//                   by H32 with fresh random signs per micro-step, re-quantised with range-matched scales (RTN, or
//                   SR with precision.dy_rounding), products x16/9, masked, and the forward rotation undone along K.
//                   Each ingredient is a switch (forward_hadamard, forward_scale, trust_mask, backward_hadamard,
//                   backward_scale). On Hopper the products run on FP8 tensor cores from operands remapped exactly
//                   (llmc/precision/fp4_gemm.h): FP4 numerics and storage, not FP4 speed.
//   coat            COAT (arXiv 2410.19313, shared/reference/fp8_recipes.md §1): fp8_tensorwise's GEMMs, the inputs
//                   the norms and GELU / SwiGLU save for backward as E4M3 1x16 groups (nonlinear_fp8), GELU / SwiGLU
//                   computed from their input's copy and recomputed in backward (recompute_mlp_act: COAT's FP8 flow),
//                   the weights' FP8 codes made in every forward and backward rather than kept (cache_weights false:
//                   the same codes, the memory COAT's FSDP shards), and AdamW moments in FP8 with dynamic range
//                   expansion (optimizer.state_format fp8_expand, unless the config names another). Attention, RoPE,
//                   the embeddings, the lm_head and the residual stream stay BF16.
// All quantising presets keep the lm_head and the embeddings in BF16 and save the linear inputs for backward
// quantised. A preset starts from PrecisionRecipe's defaults (x, w E4M3 and dy E5M2 per tensor, FP32 scales).
#include "llmc/precision/recipe.h"

#include <algorithm>

#include "llmc/core/common.h"
#include "llmc/precision/gemm.h"
#include "llmc/precision/quantize.h"

namespace llmc {

namespace {

struct RecipePreset {
  const char* name;
  const char* summary;  // one line for the help of precision.recipe
  void (*fill)(PrecisionRecipe& r);
  const char* state_format = nullptr;  // the optimizer.state_format it implies (null: the optimizer's default)
};

void fill_fp8_tensorwise(PrecisionRecipe& r) {
  r.quantize_linears = true;
  r.scaling = ScalingMode::Current;
}

const RecipePreset kPresets[] = {
    {"bf16", "every GEMM in BF16", [](PrecisionRecipe&) {}},
    {"fp8_tensorwise", "current per-tensor scaling", fill_fp8_tensorwise},
    {"fp8_delayed", "amax history",
     [](PrecisionRecipe& r) {
       r.quantize_linears = true;
       r.scaling = ScalingMode::Delayed;
       r.amax_history_len = 1024;
       r.amax_compute = "max";
       r.margin = 0;
     }},
    {"fp8_blockwise", "1x128 / 128x128 blocks",
     [](PrecisionRecipe& r) {
       r.quantize_linears = true;
       r.x = {ElementFormat::E4M3, kBlock1x128};
       r.w = {ElementFormat::E4M3, kBlock128x128};
       r.dy = {ElementFormat::E5M2, kBlock1x128};  // not DeepSeek's E4M3: see the note at the top
       r.set_pow2_scales(false);                   // not DeepSeek's power-of-two scales: see the note at the top
       r.scaling = ScalingMode::Current;
     }},
    {"nvfp4", "E2M1 1x16 blocks (w 16x16), E4M3 block + FP32 tensor scales, stochastic dy, RHT-16 wgrad; BF16 "
              "products on Hopper",
     [](PrecisionRecipe& r) {
       r.quantize_linears = true;
       r.x = role_encoding(ElementFormat::E2M1, kBlock1x16, false);
       r.w = role_encoding(ElementFormat::E2M1, kBlock16x16, false);
       r.dy = role_encoding(ElementFormat::E2M1, kBlock1x16, false);
       r.scaling = ScalingMode::Current;
       r.dy_stochastic_rounding = true;
       r.wgrad_hadamard = 16;
       r.bf16_layers = {0, -1};
     }},
    {"mxfp4", "Quartet: E2M1 1x32 blocks, E8M0 scales; QuEST forward (Hadamard-32, Gaussian scales, trust masks), "
              "backward re-quantised with fresh Hadamard-32 signs and range-matched scales; FP8 products on Hopper",
     [](PrecisionRecipe& r) {
       r.quantize_linears = true;
       r.x = role_encoding(ElementFormat::E2M1, kBlock1x32, false);
       r.w = role_encoding(ElementFormat::E2M1, kBlock1x32, false);
       r.dy = role_encoding(ElementFormat::E2M1, kBlock1x32, false);
       r.scaling = ScalingMode::Current;
       r.dy_stochastic_rounding = false;  // Quartet v4's RTN backward; "stochastic" gives v1/v2's SR
       r.forward_hadamard = 32;
       r.forward_gaussian_scales = true;
       r.trust_mask = true;
       r.backward_hadamard = 32;
       r.backward_range_matched = true;
     }},
    {"coat", "fp8_tensorwise GEMMs, norm / GELU / SwiGLU inputs saved as E4M3 1x16 groups, GELU / SwiGLU "
             "computed from them and recomputed in backward, weight codes made in every pass (no weight cache), FP8 "
             "AdamW moments (fp8_expand)",
     [](PrecisionRecipe& r) {
       fill_fp8_tensorwise(r);
       r.nonlinear_fp8 = true;
       r.recompute_mlp_act = true;
       r.cache_weights = false;
       r.cache_weight_transpose = false;
     },
     "fp8_expand"},
};

const RecipePreset* find_preset(const std::string& name) {
  for (const RecipePreset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

// The roles each product of a quantised linear multiplies: fprop x with w, dgrad dy with w, wgrad dy with x.
struct ProductRoles {
  LinearProduct product;
  const Encoding& a;
  const char* a_name;
  const Encoding& b;
  const char* b_name;
};
std::vector<ProductRoles> product_roles(const PrecisionRecipe& r) {
  return {{LinearProduct::Fprop, r.x, "x", r.w, "w"}, {LinearProduct::Dgrad, r.dy, "dy", r.w, "w"},
          {LinearProduct::Wgrad, r.dy, "dy", r.x, "x"}};
}

// The GEMMs of a quantised linear and their operands (per-tensor in the products precision.tensorwise_products names),
// with the names validation errors use.
struct GemmRoles {
  const char* gemm;
  Encoding a;
  const char* a_name;
  Encoding b;
  const char* b_name;
};
std::vector<GemmRoles> linear_gemms(const PrecisionRecipe& r) {
  std::vector<GemmRoles> gemms;
  for (const ProductRoles& p : product_roles(r)) {
    const bool whole = product_is_tensorwise(r, p.product);
    gemms.push_back({linear_product_name(p.product), whole ? whole_tensor_encoding(p.a) : p.a, p.a_name,
                     whole ? whole_tensor_encoding(p.b) : p.b, p.b_name});
  }
  return gemms;
}

}  // namespace

const char* scaling_mode_name(ScalingMode m) { return m == ScalingMode::Current ? "current" : "delayed"; }

const char* linear_product_name(LinearProduct p) {
  switch (p) {
    case LinearProduct::Fprop: return "fprop";
    case LinearProduct::Dgrad: return "dgrad";
    case LinearProduct::Wgrad: return "wgrad";
  }
  return "?";
}

std::string format_linear_products(const std::vector<LinearProduct>& products) {
  std::string s;
  for (LinearProduct p : products) s += std::string(s.empty() ? "" : ",") + linear_product_name(p);
  return s;
}

bool parse_linear_products(const std::string& s, std::vector<LinearProduct>* out, std::string* why) {
  std::vector<LinearProduct> products;
  size_t start = 0;
  while (start <= s.size() && !s.empty()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string name = s.substr(start, end - start);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    bool known = false;
    for (LinearProduct p : kLinearProducts) {
      if (name != linear_product_name(p)) continue;
      known = true;
      if (std::find(products.begin(), products.end(), p) != products.end()) {
        if (why) *why = "'" + name + "' is named twice";
        return false;
      }
      products.push_back(p);
    }
    if (!known) {
      if (why) *why = "'" + name + "' is not a product (fprop, dgrad, wgrad)";
      return false;
    }
    start = end + 1;
  }
  if (out) *out = products;
  return true;
}

bool product_is_tensorwise(const PrecisionRecipe& r, LinearProduct p) {
  return std::find(r.tensorwise_products.begin(), r.tensorwise_products.end(), p) != r.tensorwise_products.end();
}

Encoding whole_tensor_encoding(const Encoding& e) {
  return Encoding{e.element, kWholeTensor, ScaleFormat::FP32, false};
}

const char* linear_kind_name(LinearKind k) {
  switch (k) {
    case LinearKind::Qkv: return "qkv";
    case LinearKind::AttnOut: return "attn_out";
    case LinearKind::MlpUp: return "mlp_up";
    case LinearKind::MlpDown: return "mlp_down";
    case LinearKind::LmHead: return "lm_head";
  }
  return "?";
}

Encoding role_encoding(ElementFormat element, BlockShape block, bool pow2) {
  if (element == ElementFormat::E2M1) {
    if (block == kBlock1x16 || block == kBlock16x16) return {element, block, ScaleFormat::E4M3, true};  // NVFP4
    if (block == kBlock1x32) return {element, block, ScaleFormat::E8M0, false};                        // MXFP4
  }
  return {element, block, pow2 ? ScaleFormat::Pow2FP32 : ScaleFormat::FP32, false};
}

void PrecisionRecipe::set_pow2_scales(bool on) {
  for (Encoding* e : {&x, &w, &dy})
    if (e->scale == ScaleFormat::FP32 || e->scale == ScaleFormat::Pow2FP32)
      e->scale = on ? ScaleFormat::Pow2FP32 : ScaleFormat::FP32;
}

std::vector<std::string> precision_recipe_names() {
  std::vector<std::string> names;
  for (const RecipePreset& p : kPresets) names.push_back(p.name);
  return names;
}

std::string precision_recipe_summaries() {
  std::string s;
  for (const RecipePreset& p : kPresets) {
    PrecisionRecipe r;
    p.fill(r);
    const int cc = recipe_min_compute_capability(r);
    s += strformat("%s%s (%s; sm_%d)", s.empty() ? "" : " | ", p.name, p.summary, cc);
  }
  return s;
}

bool precision_recipe_preset(const std::string& name, PrecisionRecipe* out) {
  const RecipePreset* p = find_preset(name);
  if (!p) return false;
  PrecisionRecipe r;
  r.recipe = name;
  p->fill(r);
  if (out) *out = r;
  return true;
}

const char* precision_recipe_state_format(const std::string& name) {
  const RecipePreset* p = find_preset(name);
  return p ? p->state_format : nullptr;
}

void fill_precision_recipe(const std::string& name, PrecisionRecipe* out) {
  if (precision_recipe_preset(name, out)) return;
  std::string known;
  for (const RecipePreset& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.name;
  throw_error("precision.recipe: unknown recipe '%s' (known in this build: %s)", name.c_str(), known.c_str());
}

bool layer_stays_bf16(const PrecisionRecipe& r, int layer, int n_layer) {
  for (int l : r.bf16_layers)
    if ((l >= 0 ? l : n_layer + l) == layer) return true;
  return false;
}

namespace {

// The encodings precision.* can express (role_encoding) that have a quantiser and a GEMM partner among themselves.
std::vector<Encoding> configurable_encodings() {
  std::vector<Encoding> expressible;
  for (ElementFormat f : kElementFormats)
    for (BlockShape b : kBlockShapes)
      for (bool pow2 : {false, true}) {
        const Encoding e = role_encoding(f, b, pow2);
        if (encoding_error(e).empty() && quantizer_error(e).empty() &&
            std::find(expressible.begin(), expressible.end(), e) == expressible.end())
          expressible.push_back(e);
      }
  std::vector<Encoding> usable;
  for (const Encoding& a : expressible)
    for (const Encoding& b : expressible)
      if (quant_gemm_operands_error(a, "a", b, "b").empty()) {
        usable.push_back(a);
        break;
      }
  return usable;
}

}  // namespace

std::vector<ElementFormat> configurable_element_formats() {
  std::vector<ElementFormat> out;
  for (const Encoding& e : configurable_encodings())
    if (std::find(out.begin(), out.end(), e.element) == out.end()) out.push_back(e.element);
  return out;
}

std::vector<BlockShape> configurable_block_shapes() {
  std::vector<BlockShape> out;
  for (const Encoding& e : configurable_encodings())
    if (std::find(out.begin(), out.end(), e.block) == out.end()) out.push_back(e.block);
  return out;
}

namespace {

// Quartet's switches: its ingredients need its data flow (precision.backward_scale = "range_matched"), which needs
// MXFP4 for x, w and dy, quantised saved inputs, and no NVFP4-style wgrad rotation beside its own.
template <class Roles>
void validate_quartet_switches(const PrecisionRecipe& r, const Roles& roles) {
  if (r.forward_hadamard != 0 && r.forward_hadamard != 32)
    throw_error("precision.forward_hadamard must be 0 (none) or 32 (got %d)", r.forward_hadamard);
  if (r.backward_hadamard != 0 && r.backward_hadamard != 32)
    throw_error("precision.backward_hadamard must be 0 (none) or 32 (got %d)", r.backward_hadamard);
  if (r.forward_random_signs && r.forward_hadamard == 0)
    throw_error("precision.forward_signs = \"random\" signs the forward Hadamard transform, which is off; set "
                "precision.forward_hadamard = 32 or precision.forward_signs = \"none\"");
  const char* ingredient = r.forward_hadamard != 0      ? "precision.forward_hadamard = 32"
                           : r.forward_gaussian_scales ? "precision.forward_scale = \"gaussian\""
                           : r.trust_mask              ? "precision.trust_mask = true"
                           : r.backward_hadamard != 0  ? "precision.backward_hadamard = 32"
                                                       : nullptr;
  if (ingredient && !r.backward_range_matched)
    throw_error("%s is an ingredient of Quartet's data flow (the backward re-quantises the forward's saved codes); "
                "set precision.backward_scale = \"range_matched\" (or precision.recipe = \"mxfp4\"), or turn it off",
                ingredient);
  if (!r.backward_range_matched) return;
  for (const auto& role : roles)
    if (!(role.e == role_encoding(ElementFormat::E2M1, kBlock1x32, false)))
      throw_error("precision.backward_scale = \"range_matched\" is Quartet's MXFP4 backward, but precision.%s is %s; "
                  "set precision.%s_format = \"e2m1\" and precision.%s_granularity = \"1x32\" (or "
                  "precision.backward_scale = \"absmax\")", role.name, encoding_name(role.e).c_str(), role.name,
                  role.name);
  if (r.wgrad_hadamard != 0)
    throw_error("precision.wgrad_hadamard = %d rotates the wgrad operands quantised from BF16; Quartet's backward "
                "(precision.backward_scale = \"range_matched\") rotates its own with precision.backward_hadamard: "
                "set precision.wgrad_hadamard to 0", r.wgrad_hadamard);
  if (!r.save_quantized_inputs)
    throw_error("precision.backward_scale = \"range_matched\" re-quantises the forward's saved FP4 inputs; set "
                "precision.fp8_activations to true");
}

// precision.tensorwise_products: each named product multiplies two block-scaled FP8 roles (a per-tensor product of
// per-tensor roles is the recipe already; FP4 elements, Quartet's included, have no per-tensor quantiser); when fprop
// and dgrad differ, the weight's two copies differ, so the transposed one cannot be made from the row codes.
void validate_tensorwise_products(const PrecisionRecipe& r) {
  const auto fp8 = [](const Encoding& e) {
    return e.element == ElementFormat::E4M3 || e.element == ElementFormat::E5M2;
  };
  for (const ProductRoles& p : product_roles(r)) {
    if (!product_is_tensorwise(r, p.product)) continue;
    const char* product = linear_product_name(p.product);
    for (const auto& [e, name] : {std::pair<const Encoding&, const char*>{p.a, p.a_name}, {p.b, p.b_name}}) {
      if (!fp8(e))
        throw_error("precision.tensorwise_products names %s, whose operand %s is %s: per-tensor products are FP8 "
                    "(e4m3 / e5m2) only; remove %s from it", product, name, encoding_name(e).c_str(), product);
      if (e.per_tensor())
        throw_error("precision.tensorwise_products names %s, but its operand %s (%s) already has one scale per "
                    "tensor: the setting is for the block-scaled recipes (e.g. fp8_blockwise); remove %s from it",
                    product, name, encoding_name(e).c_str(), product);
    }
  }
  if (product_is_tensorwise(r, LinearProduct::Fprop) != product_is_tensorwise(r, LinearProduct::Dgrad) &&
      !r.cache_weight_transpose)
    throw_error("precision.tensorwise_products = \"%s\" scales the weight's fprop and dgrad copies differently, so "
                "the transposed codes cannot be made from the row codes: set precision.cache_weight_transpose to true",
                format_linear_products(r.tensorwise_products).c_str());
}

}  // namespace

void validate_precision_recipe(const PrecisionRecipe& r, int n_layer) {
  fill_precision_recipe(r.recipe, nullptr);  // a known preset
  for (int l : r.bf16_layers)
    if (l >= n_layer || l < -n_layer)
      throw_error("precision.bf16_layers: layer %d does not exist (the model has %d blocks: use 0..%d, or -1..-%d "
                  "from the end)", l, n_layer, n_layer - 1, n_layer);
  if (!r.tensorwise_products.empty() && !r.quantize_linears)
    throw_error("precision.tensorwise_products = \"%s\" changes the scales of quantised products, but recipe %s "
                "quantises no linear: set it to \"\"", format_linear_products(r.tensorwise_products).c_str(),
                r.recipe.c_str());
  if (r.recompute_mlp_act && !r.nonlinear_fp8)
    throw_error("precision.recompute_mlp_act computes GELU / SwiGLU from the FP8 copy of their input, which "
                "precision.nonlinear_fp8 makes: set precision.nonlinear_fp8 to true or precision.recompute_mlp_act "
                "to false (the coat preset sets both: without its FP8 copies, turn recompute_mlp_act off too)");
  if (r.recompute_mlp_act && r.backward_range_matched)
    throw_error("precision.recompute_mlp_act hands the down projection a recomputed BF16 input, but "
                "precision.backward_scale = \"range_matched\" (Quartet) re-quantises the forward's saved codes of "
                "every input: set precision.recompute_mlp_act to false");
  if (!r.cache_weights && !r.quantize_linears)
    throw_error("precision.cache_weights = false re-quantises the quantised weights in every micro-step, but recipe "
                "%s quantises no linear: set it to true", r.recipe.c_str());
  if (!r.quantize_linears) return;
  struct Role {
    const char* name;
    const Encoding& e;
  };
  const Role roles[3] = {{"x", r.x}, {"w", r.w}, {"dy", r.dy}};
  for (const Role& role : roles) {
    const std::string why = quantizer_error(role.e);
    if (!why.empty())
      throw_error("precision.%s_format / precision.%s_granularity / precision.pow2_scales give %s: %s", role.name,
                  role.name, encoding_name(role.e).c_str(), why.c_str());
    if (!role.e.per_tensor() && r.scaling == ScalingMode::Delayed)
      throw_error("precision.scaling = \"delayed\" applies to per-tensor scales only, but precision.%s_granularity = "
                  "\"%s\": block scales always come from the block's own amax (use scaling \"current\", or "
                  "granularity \"tensor\")", role.name, block_shape_name(role.e.block).c_str());
  }
  validate_tensorwise_products(r);  // before the products' operands are checked: its errors name the key
  const auto fp32_scaled = [](const Encoding& e) {
    return e.scale == ScaleFormat::FP32 || e.scale == ScaleFormat::Pow2FP32;
  };
  if (fp32_scaled(r.x) && fp32_scaled(r.w) && fp32_scaled(r.dy) && (r.x.scale != r.w.scale || r.x.scale != r.dy.scale))
    throw_error("precision.pow2_scales: the x, w and dy scale formats differ (%s, %s, %s); one scale format serves "
                "all three roles", scale_format_name(r.x.scale), scale_format_name(r.w.scale),
                scale_format_name(r.dy.scale));
  for (const GemmRoles& g : linear_gemms(r)) {
    const std::string why = quant_gemm_operands_error(g.a, g.a_name, g.b, g.b_name);
    if (!why.empty())
      throw_error("precision: the %s GEMM of every quantised linear multiplies %s (%s) with %s (%s): %s (see "
                  "precision.*_format and precision.*_granularity)", g.gemm, g.a_name, encoding_name(g.a).c_str(),
                  g.b_name, encoding_name(g.b).c_str(), why.c_str());
  }
  const bool any_block = !r.x.per_tensor() || !r.w.per_tensor() || !r.dy.per_tensor();
  if (any_block && r.fast_accum)
    throw_error("precision.fast_accum = true with block scales: block-scaled FP8 GEMMs need split (promoted) "
                "accumulation; set precision.fast_accum to false");
  if (r.scaling == ScalingMode::Delayed) {
    if (r.amax_history_len < 1)
      throw_error("precision.amax_history_len must be >= 1 (got %d)", r.amax_history_len);
    if (r.amax_compute != "max" && r.amax_compute != "most_recent")
      throw_error("precision.amax_compute must be \"max\" or \"most_recent\" (got '%s')", r.amax_compute.c_str());
  }
  if (r.margin < 0 || r.margin > 16) throw_error("precision.margin must be in [0, 16] (got %d)", r.margin);
  if (r.dy_stochastic_rounding && r.dy.element != ElementFormat::E2M1)
    throw_error("precision.dy_rounding = \"stochastic\" needs FP4 output gradients (precision.dy_format = \"e2m1\", "
                "got %s): the FP8 quantisers round to nearest; set precision.dy_rounding to \"nearest\"",
                encoding_name(r.dy).c_str());
  if (r.wgrad_hadamard != 0) {
    if (r.wgrad_hadamard != 16 && r.wgrad_hadamard != 32)
      throw_error("precision.wgrad_hadamard must be 0 (none), 16 or 32 (got %d)", r.wgrad_hadamard);
    // Both operands of the weight-gradient product are rotated along the tokens, inside their scale blocks.
    for (const Role& role : {roles[0], roles[2]}) {
      const BlockShape b = role.e.block;
      if (role.e.element != ElementFormat::E2M1 || b.rows != 1 || b.cols % r.wgrad_hadamard != 0)
        throw_error("precision.wgrad_hadamard = %d rotates x and dy inside their 1xN FP4 scale blocks (N a multiple "
                    "of %d), but precision.%s is %s; set precision.wgrad_hadamard to 0, or use FP4 1x16 / 1x32 "
                    "blocks", r.wgrad_hadamard, r.wgrad_hadamard, role.name, encoding_name(role.e).c_str());
    }
  }
  validate_quartet_switches(r, roles);
  if (!r.cache_weight_transpose && r.w.element == ElementFormat::E2M1)
    throw_error("precision.cache_weight_transpose = false transposes FP8 weight codes in every backward; FP4 weights "
                "(%s) keep their transposed copy: set it to true", encoding_name(r.w).c_str());
  if (!r.cache_weights && r.w.element == ElementFormat::E2M1)
    throw_error("precision.cache_weights = false re-quantises FP8 weights in every forward and backward; FP4 weights "
                "(%s) keep their cache (its codes are half a byte per parameter, and Quartet's backward reads the "
                "forward's): set it to true", encoding_name(r.w).c_str());
}

LinearPlan plan_linear(const PrecisionRecipe& r, int layer, int n_layer, LinearKind kind) {
  LinearPlan p;
  const bool quantized =
      r.quantize_linears && (kind == LinearKind::LmHead ? r.quantize_lm_head : !layer_stays_bf16(r, layer, n_layer));
  if (!quantized) return p;  // BF16
  p.quantized = true;
  const bool fprop_whole = product_is_tensorwise(r, LinearProduct::Fprop);
  const bool dgrad_whole = product_is_tensorwise(r, LinearProduct::Dgrad);
  const bool wgrad_whole = product_is_tensorwise(r, LinearProduct::Wgrad);
  p.x = fprop_whole ? whole_tensor_encoding(r.x) : r.x;
  p.w = fprop_whole ? whole_tensor_encoding(r.w) : r.w;
  p.dy = dgrad_whole ? whole_tensor_encoding(r.dy) : r.dy;
  p.w_t = dgrad_whole ? whole_tensor_encoding(r.w) : r.w;
  p.x_t = wgrad_whole ? whole_tensor_encoding(r.x) : r.x;
  p.dy_t = wgrad_whole ? whole_tensor_encoding(r.dy) : r.dy;
  p.scaling = r.x.per_tensor() ? r.scaling : ScalingMode::Current;
  p.amax_history_len = p.scaling == ScalingMode::Delayed ? r.amax_history_len : 1;
  p.amax_use_max = r.amax_compute != "most_recent";
  p.margin = r.margin;
  p.fast_accum_fprop = r.fast_accum && r.x.per_tensor();
  // The attention output is kept in BF16 by every model anyway (the attention backward reads it), so its
  // projection saves no quantised copy: its wgrad quantises the BF16 tensor again, and the copy's memory is saved.
  // Quartet's backward needs the forward's own codes of every input.
  // Under recompute_mlp_act the model hands the MLP's down projection its input recomputed in backward.
  p.save_quantized_input = r.save_quantized_inputs && (kind != LinearKind::AttnOut || r.backward_range_matched) &&
                           !(kind == LinearKind::MlpDown && r.recompute_mlp_act);
  p.cache_weight_transpose = r.cache_weight_transpose;
  p.cache_weights = r.cache_weights;
  p.dy_stochastic_rounding = r.dy_stochastic_rounding;
  p.wgrad_hadamard = r.wgrad_hadamard;
  p.requantize_backward = r.backward_range_matched;
  p.forward_hadamard = r.forward_hadamard;
  p.forward_random_signs = r.forward_random_signs;
  p.forward_gaussian_scales = r.forward_gaussian_scales;
  p.trust_mask = r.trust_mask;
  p.backward_hadamard = r.backward_hadamard;
  return p;
}

bool quantizes_linears(const PrecisionRecipe& r) { return r.quantize_linears; }

bool keeps_amax_history(const PrecisionRecipe& r) {
  return r.quantize_linears && r.scaling == ScalingMode::Delayed;
}

int quantized_dim_multiple(const PrecisionRecipe& r) {
  if (!r.quantize_linears) return 1;
  // Every quantised linear's in / out features are multiples of kQuantGemmAlign (Linear checks them), and a wgrad
  // Hadamard transform runs along the tokens in whole transforms.
  return std::max({quant_gemm_dim_multiple(r.x), quant_gemm_dim_multiple(r.w), quant_gemm_dim_multiple(r.dy),
                   kQuantGemmAlign, r.wgrad_hadamard, r.backward_hadamard});
}

int recipe_min_compute_capability(const PrecisionRecipe& r) {
  if (!r.quantize_linears) return kBf16GemmMinComputeCapability;
  int cc = 0;
  for (const GemmRoles& g : linear_gemms(r)) cc = std::max(cc, quant_gemm_min_compute_capability(g.a, g.b));
  return cc;
}

std::string describe_recipe(const PrecisionRecipe& r) {
  std::string nonlinear = r.nonlinear_fp8 ? "; norm / GELU / SwiGLU inputs saved as e4m3 1x16 groups" : "";
  if (r.nonlinear_fp8 && r.recompute_mlp_act)
    nonlinear += ", GELU / SwiGLU computed from them and recomputed in backward";
  if (!r.quantize_linears) return r.recipe + " (all GEMMs in BF16" + nonlinear + ")";
  std::string s = r.recipe + " (x " + encoding_name(r.x) + ", w " + encoding_name(r.w) + ", dy " + encoding_name(r.dy);
  if (r.x.per_tensor()) {
    s += std::string("; ") + scaling_mode_name(r.scaling) + " scaling";
    if (r.scaling == ScalingMode::Delayed)
      s += strformat(" (history %d, %s, margin %d)", r.amax_history_len, r.amax_compute.c_str(), r.margin);
  }
  if (!r.tensorwise_products.empty())
    s += "; per-tensor scales in " + format_linear_products(r.tensorwise_products);
  s += r.fast_accum ? "; fast accumulation in fprop" : "; split accumulation";
  if (r.dy_stochastic_rounding && !r.backward_range_matched) s += "; dy rounded stochastically";
  if (r.wgrad_hadamard != 0) s += strformat("; random Hadamard-%d on the wgrad operands", r.wgrad_hadamard);
  if (r.backward_range_matched) {
    s += "; forward";
    if (r.forward_hadamard != 0)
      s += strformat(r.forward_random_signs ? " Hadamard-%d with the run's random signs," : " Hadamard-%d,",
                     r.forward_hadamard);
    s += r.forward_gaussian_scales ? " Gaussian (QuEST) scales" : " absmax scales";
    if (r.trust_mask) s += ", trust masks";
    s += "; backward re-quantises the saved codes";
    if (r.backward_hadamard != 0) s += strformat(" under fresh random Hadamard-%d signs", r.backward_hadamard);
    s += r.dy_stochastic_rounding ? ", range-matched scales, stochastic rounding"
                                  : ", range-matched scales, round to nearest";
  }
  if (r.x.element == ElementFormat::E2M1)
    s += r.x.scale == ScaleFormat::E8M0 ? "; FP4 numerics, products on FP8 tensor cores (exact E4M3 remap)"
                         : "; FP4 numerics, products on BF16 tensor cores (exact expansion)";
  if (!r.bf16_layers.empty()) {
    s += "; bf16 layers:";
    for (int l : r.bf16_layers) s += " " + std::to_string(l);
  }
  s += r.quantize_lm_head ? "; lm_head quantised" : "; lm_head and embeddings BF16";
  s += r.save_quantized_inputs ? std::string("; linear inputs saved as ") + element_format_name(r.x.element)
                               : std::string("; linear inputs saved as BF16");
  if (!r.cache_weights)
    s += "; weight codes made in every forward and backward (no weight cache)";
  else if (!r.cache_weight_transpose)
    s += "; transposed weight codes made in every backward";
  return s + nonlinear + ")";
}

}  // namespace llmc
