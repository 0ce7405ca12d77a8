// llmc/precision/recipe.cpp: the recipe presets, their validation, and the per-linear plan (llmc/precision/recipe.h). Host code only.
//
// Presets (facts: shared/reference/fp8_recipes.md):
//   bf16            every GEMM in BF16.
//   fp8_tensorwise  Transformer Engine's current scaling / torchao tensorwise: x, w E4M3 and dy E5M2, one scale per
//                   tensor from the current amax (the producer kernel reports it), fast accumulation in fprop only.
//   fp8_delayed     Transformer Engine's DelayedScaling: the same formats, scales from the max of an amax history
//                   (1024 steps, margin 0) recorded over earlier steps, so quantisation needs no amax pass first.
//   fp8_blockwise   DeepSeek-V3 / TE Float8BlockScaling: x and dy in 1x128 blocks, w in 128x128 tiles, power-of-two
//                   scales, split (promoted) accumulation; x and w E4M3, dy E5M2. DeepSeek quantises dy to E4M3 too;
//                   measured here (GPT-2 124M, 1000 steps, dev/bench/NOTES.md) E4M3 dy with power-of-two scales ended
//                   2.2% above BF16's validation loss (0.5% of the gradients underflowed to zero), E5M2 dy +0.01%,
//                   E4M3 dy without power-of-two scales -0.8%. precision.dy_format = "e4m3" gives DeepSeek's choice.
// All FP8 presets keep the lm_head and the embeddings in BF16 and save the linear inputs for backward as FP8.
#include "llmc/precision/recipe.h"

#include <algorithm>
#include <cstdio>

#include "llmc/core/common.h"

namespace llmc {

const char* scaling_mode_name(ScalingMode m) { return m == ScalingMode::Current ? "current" : "delayed"; }

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

std::vector<std::string> precision_recipe_names() {
  return {"bf16", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise"};
}

bool precision_recipe_preset(const std::string& name, PrecisionRecipe* out) {
  PrecisionRecipe r;  // defaults: bf16 fields, per-tensor HYBRID formats for when fp8 is switched on
  r.recipe = name;
  if (name == "bf16") {
    r.fp8 = false;
  } else if (name == "fp8_tensorwise") {
    r.fp8 = true;
    r.scaling = ScalingMode::Current;
    r.fast_accum = true;
  } else if (name == "fp8_delayed") {
    r.fp8 = true;
    r.scaling = ScalingMode::Delayed;
    r.amax_history_len = 1024;
    r.amax_compute = "max";
    r.margin = 0;
    r.fast_accum = true;
  } else if (name == "fp8_blockwise") {
    r.fp8 = true;
    r.x = {Fp8Format::E4M3, ScaleGranularity::Block1x128};
    r.w = {Fp8Format::E4M3, ScaleGranularity::Block128x128};
    r.dy = {Fp8Format::E5M2, ScaleGranularity::Block1x128};  // not DeepSeek's E4M3: see the note at the top
    r.scaling = ScalingMode::Current;
    r.pow2_scales = true;
    r.fast_accum = false;
  } else {
    return false;
  }
  if (out) *out = r;
  return true;
}

bool layer_stays_bf16(const PrecisionRecipe& r, int layer, int n_layer) {
  for (int l : r.bf16_layers)
    if ((l >= 0 ? l : n_layer + l) == layer) return true;
  return false;
}

void validate_precision_recipe(const PrecisionRecipe& r, int n_layer) {
  if (!precision_recipe_preset(r.recipe, nullptr))
    throw_error("precision.recipe: unknown recipe '%s' (known: bf16, fp8_tensorwise, fp8_delayed, fp8_blockwise)",
                r.recipe.c_str());
  for (int l : r.bf16_layers)
    if (l >= n_layer || l < -n_layer)
      throw_error("precision.bf16_layers: layer %d does not exist (the model has %d blocks: use 0..%d, or -1..-%d "
                  "from the end)", l, n_layer, n_layer - 1, n_layer);
  if (!r.fp8) return;
  const RoleSpec* roles[3] = {&r.x, &r.w, &r.dy};
  const char* role_names[3] = {"x", "w", "dy"};
  for (int i = 0; i < 3; i++) {
    const bool block = roles[i]->granularity != ScaleGranularity::Tensor;
    if (block && r.scaling == ScalingMode::Delayed)
      throw_error("precision.scaling = \"delayed\" applies to per-tensor scales only, but precision.%s_granularity = "
                  "\"%s\": block scales always come from the block's own amax (use scaling \"current\", or "
                  "granularity \"tensor\")", role_names[i], scale_granularity_name(roles[i]->granularity));
  }
  const bool any_block = r.x.granularity != ScaleGranularity::Tensor || r.w.granularity != ScaleGranularity::Tensor ||
                         r.dy.granularity != ScaleGranularity::Tensor;
  const bool all_block = r.x.granularity != ScaleGranularity::Tensor && r.w.granularity != ScaleGranularity::Tensor &&
                         r.dy.granularity != ScaleGranularity::Tensor;
  if (any_block && !all_block)
    throw_error("precision: x, w and dy granularities are %s / %s / %s: cuBLASLt cannot mix per-tensor and block "
                "scales in one GEMM, so either all three are \"tensor\" or all are block-wise",
                scale_granularity_name(r.x.granularity), scale_granularity_name(r.w.granularity),
                scale_granularity_name(r.dy.granularity));
  // cuBLASLt block scaling: 1x128 x 1x128, 1x128 x 128x128 or 128x128 x 1x128, never 128x128 on both sides.
  // fprop multiplies x with w, dgrad dy with w, wgrad dy with x.
  auto is2d = [](const RoleSpec& s) { return s.granularity == ScaleGranularity::Block128x128; };
  if (is2d(r.x) && is2d(r.w))
    throw_error("precision: x and w are both 128x128: the fprop GEMM x·wᵀ would have 2-D block scales on both "
                "operands, which cuBLASLt does not support (use x_granularity \"1x128\")");
  if (is2d(r.dy) && (is2d(r.w) || is2d(r.x)))
    throw_error("precision: dy_granularity \"128x128\" with a 128x128 %s: the %s GEMM would have 2-D block scales on "
                "both operands (use dy_granularity \"1x128\")", is2d(r.w) ? "w" : "x", is2d(r.w) ? "dgrad" : "wgrad");
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
}

LinearPlan plan_linear(const PrecisionRecipe& r, int layer, int n_layer, LinearKind kind) {
  LinearPlan p;
  const bool fp8 = r.fp8 && (kind == LinearKind::LmHead ? r.lm_head_fp8 : !layer_stays_bf16(r, layer, n_layer));
  if (!fp8) return p;  // BF16
  p.fp8 = true;
  p.x = r.x;
  p.w = r.w;
  p.dy = r.dy;
  p.scaling = r.x.granularity == ScaleGranularity::Tensor ? r.scaling : ScalingMode::Current;
  p.amax_history_len = p.scaling == ScalingMode::Delayed ? r.amax_history_len : 1;
  p.amax_use_max = r.amax_compute != "most_recent";
  p.margin = r.margin;
  p.pow2_scales = r.pow2_scales;
  p.fast_accum_fprop = r.fast_accum && r.x.granularity == ScaleGranularity::Tensor;
  // The attention output is kept in BF16 by every model anyway (the attention backward reads it), so its
  // projection saves no FP8 copy: its wgrad quantises the BF16 tensor again, and the copy's memory is saved.
  p.save_fp8_input = r.fp8_activations && kind != LinearKind::AttnOut;
  p.cache_weight_transpose = r.cache_weight_transpose;
  return p;
}

int recipe_min_compute_capability(const PrecisionRecipe& r) {
  if (!r.fp8) return 80;
  return r.x.granularity == ScaleGranularity::Tensor ? 89 : 90;
}

std::string describe_recipe(const PrecisionRecipe& r) {
  if (!r.fp8) return r.recipe + " (all GEMMs in BF16)";
  std::string s = r.recipe + " (x " + fp8_format_name(r.x.format) + " " + scale_granularity_name(r.x.granularity) +
                  ", w " + fp8_format_name(r.w.format) + " " + scale_granularity_name(r.w.granularity) + ", dy " +
                  fp8_format_name(r.dy.format) + " " + scale_granularity_name(r.dy.granularity);
  if (r.x.granularity == ScaleGranularity::Tensor) {
    s += std::string("; ") + scaling_mode_name(r.scaling) + " scaling";
    if (r.scaling == ScalingMode::Delayed)
      s += strformat(" (history %d, %s, margin %d)", r.amax_history_len, r.amax_compute.c_str(), r.margin);
  }
  if (r.pow2_scales) s += "; power-of-two scales";
  s += r.fast_accum ? "; fast accumulation in fprop" : "; split accumulation";
  if (!r.bf16_layers.empty()) {
    s += "; bf16 layers:";
    for (int l : r.bf16_layers) s += " " + std::to_string(l);
  }
  s += r.lm_head_fp8 ? "; lm_head FP8" : "; lm_head and embeddings BF16";
  s += r.fp8_activations ? "; linear inputs saved as FP8" : "; linear inputs saved as BF16";
  if (!r.cache_weight_transpose) s += "; transposed weight codes made in every backward";
  return s + ")";
}

}  // namespace llmc
