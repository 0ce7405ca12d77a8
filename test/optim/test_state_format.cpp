// test/optim/test_state_format: the optimizer-state format description (llmc/optim/state_format.h): the formats of this
// build, their sizes and checkpoint dtypes, the alignment they need, the host codecs (bf16: round to nearest even),
// the key optimizer.state_format (default, --set, errors naming it, the resolved-config round trip), and the AdamW
// argument checks that run before anything touches a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/model/model_spec.h"
#include "llmc/optim/adamw.h"
#include "llmc/optim/state_format.h"
#include "llmc/run/config.h"
#include "test/support/error_of.h"

using llmc_test::error_of;
using llmc::StateFormat;

namespace {

nlohmann::json base_config() {
  return nlohmann::json::parse(R"({
    "model": {"preset": "gpt2-tiny"},
    "data": {"train": "data/x/x_train_*.bin"},
    "train": {"micro_batch": 2, "seq_len": 64, "steps": 10}
  })");
}

}  // namespace

TEST(StateFormat, TheFormatsOfThisBuild) {
  EXPECT_EQ(llmc::state_format_names(), (std::vector<std::string>{"fp32", "bf16", "fp8", "fp8_expand"}));
  EXPECT_TRUE(llmc::state_formats().front() == StateFormat::fp32());  // the default first
  EXPECT_TRUE(llmc::OptimizerConfig().state_format == StateFormat::fp32());
  EXPECT_TRUE(StateFormat::fp32() != StateFormat::bf16());
  for (const StateFormat& f : llmc::state_formats()) {
    SCOPED_TRACE(f.name);
    EXPECT_TRUE(llmc::parse_state_format(f.name) == f);
    EXPECT_EQ(llmc::find_state_format(f.name), &f);
    const bool grouped = f == StateFormat::fp8() || f == StateFormat::fp8_expand();
    EXPECT_EQ(f.m.grouped(), grouped);
    EXPECT_EQ(f.m.group_size, grouped ? 128u : 1u);  // element-wise: no metadata, any cut
    EXPECT_EQ(f.v.group_size, grouped ? 128u : 1u);
    EXPECT_EQ(f.m.scales_per_group, f == StateFormat::fp8() ? 1 : f == StateFormat::fp8_expand() ? 3 : 0);
    EXPECT_EQ(f.shard_alignment(), grouped ? 128u : 1u);
  }
}

// Memory: bytes(n) counts the group metadata, for the partial last group too (what a memory breakdown must add up).
TEST(StateFormat, GroupedSizesIncludeTheMetadata) {
  const StateFormat& fp8 = StateFormat::fp8();
  const StateFormat& ex = StateFormat::fp8_expand();
  EXPECT_EQ(fp8.m.bytes(256), 256u + 2 * 4);
  EXPECT_EQ(fp8.m.bytes(300), 300u + 3 * 4);
  EXPECT_EQ(ex.v.bytes(300), 300u + 3 * 3 * 4);
  EXPECT_EQ(ex.v.metadata_bytes(128), 12u);
  EXPECT_EQ(ex.v.codes_bytes(300), 300u);
  // bytes per parameter of m + v: 2 + 8/128 and 2 + 24/128 (COAT: 2.19)
  EXPECT_DOUBLE_EQ((fp8.m.bytes(128000) + fp8.v.bytes(128000)) / 128000.0, 2.0625);
  EXPECT_DOUBLE_EQ((ex.m.bytes(128000) + ex.v.bytes(128000)) / 128000.0, 2.1875);
  EXPECT_STREQ(fp8.m.safetensors_dtype(), "F8_E4M3");
  // a fresh (zero) block decodes to zeros
  const llmc::StoredMoments z = llmc::StoredMoments::zeros(ex, 300);
  std::vector<float> back(300, 1.0f);
  llmc::decode_moment(ex.m, z.m.data(), 300, back.data());
  for (float x : back) EXPECT_EQ(x, 0.0f);
  // the views: metadata first, then the codes
  std::vector<uint8_t> block(ex.m.bytes(300));
  const llmc::MomentView at = llmc::moment_view(ex.m, block.data(), 300, 256);
  EXPECT_EQ(static_cast<uint8_t*>(at.codes), block.data() + 36 + 256);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(at.groups), block.data() + 2 * 12);
  EXPECT_THROW(llmc::moment_view(ex.m, block.data(), 300, 64), llmc::Error);
}

TEST(StateFormat, SizesAndCheckpointDtypes) {
  const StateFormat& fp32 = StateFormat::fp32();
  const StateFormat& bf16 = StateFormat::bf16();
  EXPECT_EQ(fp32.m.code_bytes(), 4u);
  EXPECT_EQ(fp32.v.code_bytes(), 4u);
  EXPECT_EQ(bf16.m.code_bytes(), 2u);
  EXPECT_EQ(bf16.v.code_bytes(), 2u);
  EXPECT_EQ(fp32.m.bytes(1000), 4000u);
  EXPECT_EQ(bf16.v.bytes(1000), 2000u);
  EXPECT_STREQ(fp32.m.safetensors_dtype(), "F32");
  EXPECT_STREQ(bf16.v.safetensors_dtype(), "BF16");
  const llmc::StoredMoments z = llmc::StoredMoments::zeros(bf16, 7);
  EXPECT_EQ(z.m.size(), 14u);
  EXPECT_EQ(z.v.size(), 14u);
}

// The alignment of a grouped format is the least common multiple of its moments' groups.
TEST(StateFormat, AGroupedFormatNeedsGroupAlignedCuts) {
  StateFormat grouped = StateFormat::fp32();
  grouped.m.group_size = 128;
  grouped.v.group_size = 32;
  EXPECT_EQ(grouped.shard_alignment(), 128u);
  grouped.v.group_size = 48;
  EXPECT_EQ(grouped.shard_alignment(), 384u);
}

TEST(StateFormat, UnknownNamesAreErrorsNamingTheKey) {
  EXPECT_EQ(llmc::find_state_format("fp4"), nullptr);
  const std::string msg = error_of([] { llmc::parse_state_format("fp4"); });
  EXPECT_NE(msg.find("optimizer.state_format = 'fp4'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fp32, bf16, fp8, fp8_expand"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { llmc::parse_state_format("FP32"); }).find("optimizer.state_format"), std::string::npos);
}

TEST(StateFormat, ConfigKey) {
  const llmc::RunConfig defaults = llmc::load_config_json(base_config(), {});
  EXPECT_TRUE(defaults.optimizer.state_format == StateFormat::fp32());
  EXPECT_EQ(llmc::config_to_json(defaults)["optimizer"]["state_format"], "fp32");

  const llmc::RunConfig set = llmc::load_config_json(base_config(), {"optimizer.state_format=bf16"});
  EXPECT_TRUE(set.optimizer.state_format == StateFormat::bf16());
  const nlohmann::json resolved = llmc::config_to_json(set);
  EXPECT_EQ(resolved["optimizer"]["state_format"], "bf16");
  EXPECT_TRUE(llmc::load_config_json(resolved, {}).optimizer.state_format == StateFormat::bf16());

  nlohmann::json in_file = base_config();
  in_file["optimizer"]["state_format"] = "bf16";
  EXPECT_TRUE(llmc::load_config_json(in_file, {}).optimizer.state_format == StateFormat::bf16());

  for (const char* bad : {"optimizer.state_format=fp4", "optimizer.state_format=3"}) {
    const std::string msg = error_of([&] { llmc::load_config_json(base_config(), {bad}); });
    EXPECT_NE(msg.find("optimizer.state_format"), std::string::npos) << bad << ": " << msg;
  }
  bool documented = false;
  for (const llmc::ConfigKeyDoc& d : llmc::config_key_docs())
    if (d.key == "optimizer.state_format") {
      documented = true;
      EXPECT_EQ(d.type, "string");
      EXPECT_NE(d.help.find("fp32 | bf16 | fp8 | fp8_expand"), std::string::npos) << d.help;
    }
  EXPECT_TRUE(documented);
}

// encode / decode: fp32 is the identity bit for bit; bf16 rounds to nearest even (ties to the even mantissa) and
// decodes exactly.
TEST(StateFormat, HostCodecs) {
  const std::vector<float> x = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -(1.0f + 0x1p-8f),
                                0.0f,          -0.0f,               1e-30f,                      3.3e38f,
                                0.1f};
  const size_t n = x.size();
  std::vector<uint8_t> codes(StateFormat::fp32().m.bytes(n));
  std::vector<float> back(n);
  llmc::encode_moment(StateFormat::fp32().m, x.data(), n, codes.data());
  EXPECT_EQ(std::memcmp(codes.data(), x.data(), codes.size()), 0);
  llmc::decode_moment(StateFormat::fp32().m, codes.data(), n, back.data());
  EXPECT_EQ(std::memcmp(back.data(), x.data(), n * sizeof(float)), 0);

  const llmc::MomentStorage& b = StateFormat::bf16().m;
  codes.assign(b.bytes(n), 0);
  llmc::encode_moment(b, x.data(), n, codes.data());
  llmc::decode_moment(b, codes.data(), n, back.data());
  EXPECT_EQ(back[0], 1.0f);                  // tie: down to even
  EXPECT_EQ(back[1], 1.0f + 0x1p-6f);        // tie: up to even
  EXPECT_EQ(back[2], 1.0f + 0x1p-7f);        // above the tie: up
  EXPECT_EQ(back[3], -1.0f);
  EXPECT_FALSE(std::signbit(back[4]));
  EXPECT_TRUE(std::signbit(back[5]));
  for (size_t i = 0; i < n; i++) EXPECT_EQ(back[i], llmc::bf16_decode(llmc::bf16_encode(x[i]))) << i;
  // little-endian bf16 codes: the upper half of the float's bits
  uint16_t first;
  std::memcpy(&first, codes.data(), 2);
  EXPECT_EQ(first, 0x3f80);
}

// The optimizer checks its arguments before it allocates anything: these run without a GPU.
TEST(AdamWArguments, AreCheckedBeforeTheGpu) {
  llmc::ModelSpec spec;
  ASSERT_TRUE(llmc::model_preset("gpt2-tiny", &spec));
  const llmc::ParamTable table = llmc::build_param_table(spec);
  const size_t n = table.total_elements;
  llmc::OptimizerConfig c;
  c.beta1 = 1.0;
  std::string msg = error_of([&] { llmc::AdamW opt(table, c, {{{0, n}, true}}); });
  EXPECT_NE(msg.find("optimizer.beta1=1"), std::string::npos) << msg;
  c = llmc::OptimizerConfig();
  c.eps = 0.0;
  msg = error_of([&] { llmc::AdamW opt(table, c, {{{0, n}, true}}); });
  EXPECT_NE(msg.find("optimizer.eps=0"), std::string::npos) << msg;
  c = llmc::OptimizerConfig();
  msg = error_of([&] { llmc::AdamW opt(table, c, {{{0, n + 1}, true}}); });
  EXPECT_NE(msg.find("outside the"), std::string::npos) << msg;
  msg = error_of([&] { llmc::AdamW opt(table, c, {{{64, 64}, true}}); });
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  // a grouped format cannot own a range that cuts a group
  c.state_format.m.group_size = 128;
  msg = error_of([&] { llmc::AdamW opt(table, c, {{{64, n}, true}}); });
  EXPECT_NE(msg.find("groups of 128 elements"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[64, "), std::string::npos) << msg;
}
