// llmc/precision/recipe.h: the precision plan. A recipe is data: the config's `precision` section (a preset such as
// "fp8_tensorwise", then any field overridden) resolves to a PrecisionRecipe, and the questions the models, the
// trainer and the config ask are answered here: which linears are quantised and how (plan_linear: the encodings of
// x = the input, w = the weight, dy = the output gradient, how whole-tensor scales are found, fast accumulation,
// whether the input is saved for backward quantised, how output gradients are rounded, which Hadamard transform the
// weight-gradient operands get), whether the recipe quantises anything at all, whether it keeps amax histories
// (checkpointed), the multiple a quantised GEMM needs of every dimension, and the compute capability the recipe
// needs. Layers listed in bf16_layers, the lm_head (by default) and the embeddings stay BF16. The presets are one
// table in recipe.cpp; names, help text and errors are generated from it. Host code only.
#pragma once

#include <string>
#include <vector>

#include "llmc/precision/encoding.h"

namespace llmc {

// The three products of a linear layer: fprop y = x·wᵀ, dgrad dx = dy·w, wgrad dw = dyᵀ·x.
enum class LinearProduct : uint8_t { Fprop, Dgrad, Wgrad };
constexpr LinearProduct kLinearProducts[] = {LinearProduct::Fprop, LinearProduct::Dgrad, LinearProduct::Wgrad};
const char* linear_product_name(LinearProduct p);  // "fprop" | "dgrad" | "wgrad"
// precision.tensorwise_products' text: the names joined by ',' ("" for none), and back (false, out untouched, for an
// unknown or repeated name; *why then says which).
std::string format_linear_products(const std::vector<LinearProduct>& products);
bool parse_linear_products(const std::string& s, std::vector<LinearProduct>* out, std::string* why);

// How whole-tensor scales are found: from the tensor's current amax, or delayed from an amax history.
enum class ScalingMode : uint8_t { Current, Delayed };
const char* scaling_mode_name(ScalingMode m);  // "current" | "delayed"

// The resolved `precision` section (config keys in comments where the name differs).
struct PrecisionRecipe {
  std::string recipe = "bf16";     // the preset (precision_recipe_names())
  bool quantize_linears = false;   // false: every GEMM in BF16 (the fields up to fast_accum are then unused)
  Encoding x{ElementFormat::E4M3};   // linear inputs       (x_format, x_granularity, pow2_scales)
  Encoding w{ElementFormat::E4M3};   // weights             (w_format, w_granularity, pow2_scales)
  Encoding dy{ElementFormat::E5M2};  // output gradients    (dy_format, dy_granularity, pow2_scales)
  ScalingMode scaling = ScalingMode::Current;  // whole-tensor roles only; blocks are scaled from their own amax
  int amax_history_len = 1024;     // delayed: steps of amax history
  std::string amax_compute = "max";  // delayed: "max" over the history or "most_recent"
  int margin = 0;                  // scale = max(format) / amax / 2^margin
  bool fast_accum = false;         // fast accumulation in the fprop of per-tensor quantised GEMMs (never dgrad, wgrad
                                   // or blocks); Transformer Engine's choice, off in every preset (see recipe.cpp)
  std::vector<int> bf16_layers;    // blocks kept in BF16 (negative = from the end: -1 is the last block)
  bool quantize_lm_head = false;   // (lm_head_fp8) the (tied) lm_head GEMMs quantised too (embeddings always BF16)
  bool save_quantized_inputs = true;  // (fp8_activations) save linear inputs for backward quantised (transposed
                                      // copy) instead of BF16
  bool cache_weight_transpose = true;  // keep each quantised weight's transposed codes for dgrad (false: transpose
                                       // the row codes in every backward: less memory, one pass more; FP8 only)
  bool cache_weights = true;  // keep each quantised weight's codes for the optimizer step (false: quantise the
                              // weight into shared scratch in every forward and again in every backward, the same
                              // codes: no per-parameter cache, two casts more per micro-step; FP8 only)
  bool dy_stochastic_rounding = false;  // (dy_rounding) output gradients rounded stochastically (FP4 dy only; the
                                        // random bits are keyed by the run seed, step, micro-step and tensor)
  int wgrad_hadamard = 0;  // size (16 or 32) of the random Hadamard transform applied, along the tokens, to both
                           // operands of the weight-gradient product (dyᵀ and xᵀ; FP4 only; 0 = none). One sign
                           // vector for the whole run and every layer, drawn from the run seed.
  // Quartet (MXFP4 x, w and dy; arXiv 2505.14669, shared/reference/fp4_recipes.md §1). backward_range_matched selects
  // its data flow: the forward saves its own codes of x and w (rotated, with their trust masks), and the backward
  // re-quantises them, and dy, along the other direction of each product with range-matched scales; the other
  // switches are its ingredients (each needs backward_range_matched, so the paper's ablations are runs of the same
  // flow).
  int forward_hadamard = 0;        // 0 or 32: the fixed Hadamard-32 on x and w along K before the forward product
  bool forward_random_signs = false;  // (forward_signs) "random": the forward rotation is H32·S with one random sign
                                      // vector S for the run (drawn from the run seed; a deviation from Quartet,
                                      // whose S is the identity); "none": H32 alone
  bool forward_gaussian_scales = false;  // (forward_scale) "gaussian": QuEST's sigma-based E8M0 scales for x and w;
                                         // "absmax": the OCP amax rule
  bool trust_mask = false;         // QuEST's trust masks of x and w (1 bit per element) saved and applied to dx, dw
  int backward_hadamard = 0;       // 0 or 32: fresh random signs per micro-step, H32·S on both operands of dgrad
                                   // (along N) and wgrad (along the tokens)
  bool backward_range_matched = false;  // (backward_scale) "range_matched": Quartet's backward; "absmax": the
                                        // quantised backward of the other presets
  // Products whose two operands take one whole-tensor scale each (current scaling, FP32 scales, the roles' element
  // formats) instead of the roles' block scales: the block-scaled FP8 recipes' per-product ablation (which product
  // carries the difference between block and per-tensor scaling). Empty in every preset.
  std::vector<LinearProduct> tensorwise_products;
  bool nonlinear_fp8 = false;  // COAT's FP8 precision flow: the inputs the norms (LayerNorm / RMSNorm) and GELU /
                               // SwiGLU save for backward are kept as E4M3 with one FP32 scale per 1x16 channel
                               // group (llmc/kernels/fp8_groups.h) instead of BF16; the forward and the residual
                               // stream stay BF16. Independent of quantize_linears.
  bool recompute_mlp_act = false;  // COAT's FP8 flow for the MLP activation (needs nonlinear_fp8): GELU / SwiGLU
                                   // compute their output from the FP8 copy of their input, so backward recomputes
                                   // that output (the c_proj / down_proj input) from the copy, the forward's bits
                                   // exactly, instead of keeping it (its quantised or BF16 copy) for wgrad.

  // precision.pow2_scales: the roles' scales are FP32 rounded down to powers of two (Pow2FP32) rather than FP32.
  // Setting it changes only roles whose scales are FP32 or Pow2FP32.
  bool pow2_scales() const { return x.scale == ScaleFormat::Pow2FP32; }
  void set_pow2_scales(bool on);
};

// The channel groups of nonlinear_fp8's copies (COAT's 1x16; llmc/precision/group_quant.h's kFp8Groups1x16): the
// widths they cover must be multiples of its cols.
constexpr BlockShape kNonlinearFp8Groups = kBlock1x16;

// Which linear of a block (or the lm_head).
enum class LinearKind : uint8_t { Qkv, AttnOut, MlpUp, MlpDown, LmHead };
const char* linear_kind_name(LinearKind k);  // "qkv", "attn_out", "mlp_up", "mlp_down", "lm_head"

// The plan of one linear layer: BF16 GEMMs, or quantised ones with the encodings of the operands' two copies: the
// row copies x, w (fprop) and dy (dgrad), the transposed copies wᵀ (dgrad), xᵀ and dyᵀ (wgrad). A copy's encoding is
// its role's, except in the products precision.tensorwise_products names (then one whole-tensor scale).
struct LinearPlan {
  bool quantized = false;        // false: BF16 GEMMs (the fields below are unused)
  Encoding x, w, dy;             // row copies
  Encoding x_t, w_t, dy_t;       // transposed copies
  ScalingMode scaling = ScalingMode::Current;  // of the whole-tensor scales
  int amax_history_len = 1;
  bool amax_use_max = true;      // false: most recent
  int margin = 0;
  bool fast_accum_fprop = false;
  bool save_quantized_input = false;   // the input is kept for wgrad as its transposed quantised copy (no BF16 copy)
  bool cache_weight_transpose = true;  // the transposed weight codes live for the optimizer step (else per backward)
  bool cache_weights = true;           // the weight codes live for the optimizer step (else quantised into scratch
                                       // by every forward and again by every backward)
  bool dy_stochastic_rounding = false; // dy's codes (both copies) rounded stochastically
  int wgrad_hadamard = 0;              // Hadamard size of the wgrad operands dyᵀ and xᵀ (along the tokens), or 0
  // Quartet's data flow (PrecisionRecipe's fields of the same names): the forward keeps Xq (M, K) and the weight
  // cache Wq (N, K) (codes, scales, trust masks; no transposed copies) and the backward re-quantises them.
  bool requantize_backward = false;    // PrecisionRecipe::backward_range_matched
  int forward_hadamard = 0;
  bool forward_random_signs = false;
  bool forward_gaussian_scales = false;
  bool trust_mask = false;
  int backward_hadamard = 0;
};

// The presets known to this build, in the order the docs list them.
std::vector<std::string> precision_recipe_names();
// "bf16 (every GEMM in BF16; sm_80) | fp8_tensorwise (...) | ...": the presets with their one-line summaries and the
// compute capability each needs, for the help of precision.recipe.
std::string precision_recipe_summaries();
// Fills every field of `out` from the preset; false when the name is unknown.
bool precision_recipe_preset(const std::string& name, PrecisionRecipe* out);
// The optimizer.state_format a known preset brings with it (COAT's FP8 moments for "coat"), or null when it leaves
// the optimizer's default; an explicit optimizer.state_format wins over it.
const char* precision_recipe_state_format(const std::string& name);
// The same, with llmc::Error naming precision.recipe and the known presets when the name is unknown.
void fill_precision_recipe(const std::string& name, PrecisionRecipe* out);
// Unknown presets, encodings this build cannot quantise, impossible combinations (a 2-D-scaled x or dy, 128x128 on
// both sides of one GEMM, fast accumulation with blocks, delayed scaling with blocks...): throws llmc::Error naming
// the precision.* key and why.
void validate_precision_recipe(const PrecisionRecipe& r, int n_layer);
// The choices of precision.*_format and precision.*_granularity: the element formats and block shapes of the encodings
// those keys can express (FP32 or power-of-two scales, no second-level tensor scale) that this build can quantise and
// that take part in at least one quantised GEMM with another such encoding.
std::vector<ElementFormat> configurable_element_formats();
std::vector<BlockShape> configurable_block_shapes();
// The encoding a role gets from the config keys precision.<role>_format and precision.<role>_granularity: FP8
// elements take FP32 scales (power-of-two ones with pow2), E2M1 elements the scales their block implies (1x16 and
// 16x16: NVFP4's E4M3 block scales under an FP32 tensor scale; 1x32: MXFP4's E8M0 scales; other blocks: FP32, which
// validation then refuses).
Encoding role_encoding(ElementFormat element, BlockShape block, bool pow2);
// True when block n (0-based) of an n_layer model is listed in bf16_layers (negative indices count from the end).
bool layer_stays_bf16(const PrecisionRecipe& r, int layer, int n_layer);
LinearPlan plan_linear(const PrecisionRecipe& r, int layer, int n_layer, LinearKind kind);
// Whether precision.tensorwise_products names product p.
bool product_is_tensorwise(const PrecisionRecipe& r, LinearProduct p);
// The encoding a copy of role encoding e takes in a product with whole-tensor scales: e's element format, one FP32
// scale for the tensor.
Encoding whole_tensor_encoding(const Encoding& e);

// Whether the recipe runs quantised GEMMs for its linears (all but those bf16_layers and the lm_head keep in BF16).
// Sampling must then run the training batch shape (quantised GEMMs need their rows in whole multiples), and the
// numerics telemetry applies.
bool quantizes_linears(const PrecisionRecipe& r);
// Whether whole-tensor scales come from amax histories (delayed scaling): state that lives across steps and is
// checkpointed with the scales.
bool keeps_amax_history(const PrecisionRecipe& r);
// The multiple that every dimension of a quantised linear GEMM must be (the tokens B*T, the channels, the hidden
// width): 16 for per-tensor FP8, 128 with 1x128 / 128x128 blocks, 16 for NVFP4 and MXFP4 (32 for the tokens with a
// size-32 wgrad or backward Hadamard transform); 1 when nothing is quantised.
int quantized_dim_multiple(const PrecisionRecipe& r);
// The compute capability the recipe's GEMMs need: 80 for BF16 and NVFP4 (its products run in BF16), 89 for
// per-tensor FP8, 90 for block-wise FP8 and MXFP4.
int recipe_min_compute_capability(const PrecisionRecipe& r);
// One line for logs: "fp8_blockwise (x e4m3 1x128, w e4m3 128x128, dy e5m2 1x128; split accumulation; ...)"; a scale
// format other than FP32 is named ("x e4m3 1x128 pow2 scales").
std::string describe_recipe(const PrecisionRecipe& r);

}  // namespace llmc
