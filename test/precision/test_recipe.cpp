// test/precision/test_recipe.cpp: the precision recipes (llmc/precision/recipe): presets expand to the documented fields, the plan of
// each linear (BF16 layers, lm_head, granularity-dependent scaling and fast accumulation), the compute capability a
// recipe needs, validation of impossible combinations, and the GEMM-ready scale sizes of llmc/precision/tensor.h.
#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/precision/recipe.h"
#include "llmc/precision/tensor.h"

using namespace llmc;

namespace {

PrecisionRecipe preset(const char* name) {
  PrecisionRecipe r;
  EXPECT_TRUE(precision_recipe_preset(name, &r)) << name;
  return r;
}

}  // namespace

TEST(Recipe, Presets) {
  EXPECT_FALSE(preset("bf16").fp8);
  const PrecisionRecipe t = preset("fp8_tensorwise");
  EXPECT_TRUE(t.fp8);
  EXPECT_EQ(t.x.format, Fp8Format::E4M3);
  EXPECT_EQ(t.w.format, Fp8Format::E4M3);
  EXPECT_EQ(t.dy.format, Fp8Format::E5M2);
  EXPECT_EQ(t.x.granularity, ScaleGranularity::Tensor);
  EXPECT_EQ(t.scaling, ScalingMode::Current);
  EXPECT_TRUE(t.fast_accum);
  EXPECT_FALSE(t.lm_head_fp8);
  EXPECT_TRUE(t.fp8_activations);
  const PrecisionRecipe d = preset("fp8_delayed");
  EXPECT_EQ(d.scaling, ScalingMode::Delayed);
  EXPECT_EQ(d.amax_history_len, 1024);
  EXPECT_EQ(d.amax_compute, "max");
  EXPECT_EQ(d.margin, 0);
  const PrecisionRecipe b = preset("fp8_blockwise");
  EXPECT_EQ(b.x.granularity, ScaleGranularity::Block1x128);
  EXPECT_EQ(b.w.granularity, ScaleGranularity::Block128x128);
  EXPECT_EQ(b.dy.granularity, ScaleGranularity::Block1x128);
  EXPECT_EQ(b.dy.format, Fp8Format::E5M2);  // E5M2 gradients (measured; see llmc/precision/recipe.cpp)
  EXPECT_TRUE(b.pow2_scales);
  EXPECT_FALSE(b.fast_accum);
  EXPECT_FALSE(precision_recipe_preset("fp8", nullptr));
  for (const std::string& n : precision_recipe_names()) EXPECT_NO_THROW(validate_precision_recipe(preset(n.c_str()), 12));
}

TEST(Recipe, LinearPlans) {
  PrecisionRecipe r = preset("fp8_tensorwise");
  r.bf16_layers = {0, -1};
  EXPECT_TRUE(layer_stays_bf16(r, 0, 12));
  EXPECT_TRUE(layer_stays_bf16(r, 11, 12));
  EXPECT_FALSE(layer_stays_bf16(r, 5, 12));
  EXPECT_FALSE(plan_linear(r, 0, 12, LinearKind::Qkv).fp8);
  EXPECT_FALSE(plan_linear(r, 11, 12, LinearKind::MlpDown).fp8);
  const LinearPlan p = plan_linear(r, 5, 12, LinearKind::MlpUp);
  EXPECT_TRUE(p.fp8);
  EXPECT_TRUE(p.fast_accum_fprop);
  EXPECT_TRUE(p.save_fp8_input);
  EXPECT_EQ(p.dy.format, Fp8Format::E5M2);
  EXPECT_EQ(p.amax_history_len, 1);
  // lm_head stays BF16 unless asked.
  EXPECT_FALSE(plan_linear(r, -1, 12, LinearKind::LmHead).fp8);
  r.lm_head_fp8 = true;
  EXPECT_TRUE(plan_linear(r, -1, 12, LinearKind::LmHead).fp8);
  // Delayed scaling keeps its history length; block recipes never use fast accumulation or delayed scaling.
  const LinearPlan dp = plan_linear(preset("fp8_delayed"), 3, 12, LinearKind::Qkv);
  EXPECT_EQ(dp.scaling, ScalingMode::Delayed);
  EXPECT_EQ(dp.amax_history_len, 1024);
  EXPECT_TRUE(dp.amax_use_max);
  const LinearPlan bp = plan_linear(preset("fp8_blockwise"), 3, 12, LinearKind::AttnOut);
  EXPECT_TRUE(bp.fp8);
  EXPECT_FALSE(bp.save_fp8_input);  // the models keep the attention output in BF16 for the attention backward
  EXPECT_FALSE(bp.fast_accum_fprop);
  EXPECT_EQ(bp.scaling, ScalingMode::Current);
  EXPECT_TRUE(bp.pow2_scales);
  // BF16 recipe: nothing is FP8.
  EXPECT_FALSE(plan_linear(preset("bf16"), 3, 12, LinearKind::Qkv).fp8);
}

TEST(Recipe, ComputeCapabilityAndDescription) {
  EXPECT_EQ(recipe_min_compute_capability(preset("bf16")), 80);
  EXPECT_EQ(recipe_min_compute_capability(preset("fp8_tensorwise")), 89);
  EXPECT_EQ(recipe_min_compute_capability(preset("fp8_delayed")), 89);
  EXPECT_EQ(recipe_min_compute_capability(preset("fp8_blockwise")), 90);
  const std::string d = describe_recipe(preset("fp8_blockwise"));
  EXPECT_NE(d.find("x e4m3 1x128"), std::string::npos) << d;
  EXPECT_NE(d.find("w e4m3 128x128"), std::string::npos) << d;
  EXPECT_NE(d.find("power-of-two"), std::string::npos) << d;
  EXPECT_NE(describe_recipe(preset("fp8_delayed")).find("delayed scaling (history 1024, max, margin 0)"),
            std::string::npos);
}

TEST(Recipe, ImpossibleCombinations) {
  PrecisionRecipe r = preset("fp8_blockwise");
  r.fast_accum = true;
  EXPECT_THROW(validate_precision_recipe(r, 12), Error);
  r = preset("fp8_blockwise");
  r.dy.granularity = ScaleGranularity::Block128x128;
  EXPECT_THROW(validate_precision_recipe(r, 12), Error);  // dgrad would be 2-D x 2-D
  r = preset("fp8_delayed");
  r.amax_history_len = 0;
  EXPECT_THROW(validate_precision_recipe(r, 12), Error);
  r = preset("fp8_tensorwise");
  r.bf16_layers = {-13};
  EXPECT_THROW(validate_precision_recipe(r, 12), Error);
  r.bf16_layers = {-12, 11};
  EXPECT_NO_THROW(validate_precision_recipe(r, 12));
}

// Sizes of the GEMM-ready block-scale arrays (llmc/precision/tensor.h).
TEST(Tensor, ScaleLayouts) {
  EXPECT_EQ(scale_inv_floats(ScaleGranularity::Tensor, 1000, 768), 1u);
  // 1x128: ceil(cols / 128) blocks of round_up(rows, 4) scales.
  EXPECT_EQ(scale_inv_floats(ScaleGranularity::Block1x128, 1000, 768), 6u * 1000u);
  EXPECT_EQ(scale_inv_floats(ScaleGranularity::Block1x128, 1001, 768), 6u * 1004u);
  EXPECT_EQ(scale_inv_ld(ScaleGranularity::Block1x128, 1001, 768), 1004);
  EXPECT_EQ(scale_inv_floats(ScaleGranularity::Block1x128, 768, 1001), 8u * 768u);  // the transposed copy
  // 128x128: ceil(rows / 128) rows of round_up(ceil(cols / 128), 4) tiles.
  EXPECT_EQ(scale_inv_floats(ScaleGranularity::Block128x128, 2304, 768), 18u * 8u);
  EXPECT_EQ(scale_inv_ld(ScaleGranularity::Block128x128, 2304, 768), 8);
  EXPECT_EQ(scale_inv_floats(ScaleGranularity::Block128x128, 768, 2304), 6u * 20u);
  Fp8Format f;
  ScaleGranularity g;
  EXPECT_TRUE(parse_fp8_format("e5m2", &f));
  EXPECT_EQ(f, Fp8Format::E5M2);
  EXPECT_FALSE(parse_fp8_format("E5M2x", &f));
  EXPECT_TRUE(parse_scale_granularity("128x128", &g));
  EXPECT_EQ(g, ScaleGranularity::Block128x128);
  EXPECT_STREQ(scale_granularity_name(ScaleGranularity::Block1x128), "1x128");
  EXPECT_STREQ(fp8_format_name(Fp8Format::E4M3), "e4m3");
}
