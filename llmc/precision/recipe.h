// llmc/precision/recipe.h: the precision plan. A recipe is data: the config's `precision` section (a preset such as
// "fp8_tensorwise", then any field overridden) resolves to a PrecisionRecipe, and plan_linear() turns it into the
// plan of one linear layer: for each GEMM role (x = the input, w = the weight, dy = the output gradient) whether it
// is FP8, in which format (E4M3 / E5M2) and at which scaling granularity (tensor, 1x128, 128x128), how scales are
// found (current amax, or delayed from an amax history with a margin; power-of-two rounding), fast accumulation,
// and whether the input is saved for backward as FP8. Layers listed in bf16_layers, the lm_head (by default) and the
// embeddings stay BF16. Host code only.
#pragma once

#include <string>
#include <vector>

#include "llmc/precision/tensor.h"

namespace llmc {

enum class ScalingMode : uint8_t { Current, Delayed };
const char* scaling_mode_name(ScalingMode m);

// How one operand of a linear layer's GEMMs is quantised.
struct RoleSpec {
  Fp8Format format = Fp8Format::E4M3;
  ScaleGranularity granularity = ScaleGranularity::Tensor;
};

// The resolved `precision` section.
struct PrecisionRecipe {
  std::string recipe = "bf16";   // the preset: bf16 | fp8_tensorwise | fp8_delayed | fp8_blockwise
  bool fp8 = false;              // false: every GEMM in BF16 (the fields below are ignored)
  RoleSpec x{Fp8Format::E4M3, ScaleGranularity::Tensor};
  RoleSpec w{Fp8Format::E4M3, ScaleGranularity::Tensor};
  RoleSpec dy{Fp8Format::E5M2, ScaleGranularity::Tensor};
  ScalingMode scaling = ScalingMode::Current;  // per-tensor roles only; blocks are always scaled from their own amax
  int amax_history_len = 1024;   // delayed: steps of amax history
  std::string amax_compute = "max";  // delayed: "max" over the history or "most_recent"
  int margin = 0;                // scale = fp8_max / amax / 2^margin
  bool pow2_scales = false;      // round scales down to a power of two
  bool fast_accum = true;        // fprop of per-tensor FP8 GEMMs uses fast accumulation (never dgrad/wgrad/blocks)
  std::vector<int> bf16_layers;  // blocks kept in BF16 (negative = from the end: -1 is the last block)
  bool lm_head_fp8 = false;      // the (tied) lm_head GEMMs in FP8 (embeddings always BF16)
  bool fp8_activations = true;   // save linear inputs for backward as FP8 (transposed copy) instead of BF16
  bool cache_weight_transpose = true;  // keep each FP8 weight's transposed codes for dgrad (false: transpose the row
                                       // codes in every backward: 1 byte less per FP8 parameter, one pass more)
};

// Which linear of a block (or the lm_head).
enum class LinearKind : uint8_t { Qkv, AttnOut, MlpUp, MlpDown, LmHead };
const char* linear_kind_name(LinearKind k);  // "qkv", "attn_out", "mlp_up", "mlp_down", "lm_head"

// The plan of one linear layer.
struct LinearPlan {
  bool fp8 = false;
  RoleSpec x, w, dy;
  ScalingMode scaling = ScalingMode::Current;
  int amax_history_len = 1;
  bool amax_use_max = true;      // false: most recent
  int margin = 0;
  bool pow2_scales = false;
  bool fast_accum_fprop = false;
  bool save_fp8_input = false;   // the input is kept for wgrad as its transposed FP8 copy (no BF16 copy)
  bool cache_weight_transpose = true;  // the transposed weight codes live for the optimizer step (else per backward)
};

// Names known to this build, in the order the docs list them.
std::vector<std::string> precision_recipe_names();
// Fills every field of `out` from the preset; false when the name is unknown.
bool precision_recipe_preset(const std::string& name, PrecisionRecipe* out);
// Impossible combinations (a 2-D-scaled x or dy, 128x128 on both sides of one GEMM, fast accumulation with blocks,
// delayed scaling with blocks...): throws llmc::Error naming the precision.* key and why.
void validate_precision_recipe(const PrecisionRecipe& r, int n_layer);
// True when block n (0-based) of an n_layer model is listed in bf16_layers (negative indices count from the end).
bool layer_stays_bf16(const PrecisionRecipe& r, int layer, int n_layer);
LinearPlan plan_linear(const PrecisionRecipe& r, int layer, int n_layer, LinearKind kind);
// The compute capability a recipe needs: 80 for bf16, 89 for per-tensor FP8, 90 for block-wise FP8.
int recipe_min_compute_capability(const PrecisionRecipe& r);
// One line for logs: "fp8_blockwise (x e4m3 1x128, w e4m3 128x128, dy e5m2 1x128; power-of-two scales; ...)".
std::string describe_recipe(const PrecisionRecipe& r);

}  // namespace llmc
