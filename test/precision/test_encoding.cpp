// test/precision/test_encoding: the description of a quantised tensor's encoding (llmc/precision/encoding.h): names and
// parsing of scale formats, block shapes and whole encodings, validation, the sizes of codes (packed E2M1 included)
// and of the GEMM-ready scale arrays (the FP8 layouts of llmc/precision/tensor.h, unchanged); which encodings this
// build can quantise (llmc/precision/quantize.h) and multiply (the GEMM mapping of llmc/precision/gemm.h). Host only.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/precision/encoding.h"
#include "llmc/precision/gemm.h"
#include "llmc/precision/quantize.h"

using namespace llmc;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const Encoding kE4M3Tensor{ElementFormat::E4M3, kWholeTensor};
const Encoding kE5M2Tensor{ElementFormat::E5M2, kWholeTensor};
const Encoding kE4M3Rows{ElementFormat::E4M3, kBlock1x128, ScaleFormat::Pow2FP32};
const Encoding kE5M2Rows{ElementFormat::E5M2, kBlock1x128, ScaleFormat::Pow2FP32};
const Encoding kE4M3Tiles{ElementFormat::E4M3, kBlock128x128, ScaleFormat::Pow2FP32};
const Encoding kNvfp4{ElementFormat::E2M1, kBlock1x16, ScaleFormat::E4M3, true};
const Encoding kMxfp4{ElementFormat::E2M1, kBlock1x32, ScaleFormat::E8M0};
const Encoding kCoatGroups{ElementFormat::E4M3, kBlock1x16};

// Every encoding with a name.
std::vector<Encoding> named_encodings() {
  std::vector<Encoding> out;
  for (ElementFormat element : kElementFormats)
    for (BlockShape block : kBlockShapes)
      for (ScaleFormat scale : kScaleFormats)
        for (bool tensor_scale : {false, true}) out.push_back({element, block, scale, tensor_scale});
  return out;
}

}  // namespace

TEST(Encoding, ScaleFormatAndBlockShapeNames) {
  EXPECT_STREQ(scale_format_name(ScaleFormat::FP32), "fp32");
  EXPECT_STREQ(scale_format_name(ScaleFormat::Pow2FP32), "pow2");
  EXPECT_STREQ(scale_format_name(ScaleFormat::E8M0), "e8m0");
  EXPECT_STREQ(scale_format_name(ScaleFormat::E4M3), "e4m3");
  EXPECT_EQ(scale_format_bytes(ScaleFormat::FP32), 4);
  EXPECT_EQ(scale_format_bytes(ScaleFormat::Pow2FP32), 4);
  EXPECT_EQ(scale_format_bytes(ScaleFormat::E8M0), 1);
  EXPECT_EQ(scale_format_bytes(ScaleFormat::E4M3), 1);
  for (ScaleFormat f : kScaleFormats) {
    ScaleFormat parsed = f == ScaleFormat::FP32 ? ScaleFormat::E8M0 : ScaleFormat::FP32;
    ASSERT_TRUE(parse_scale_format(scale_format_name(f), &parsed));
    EXPECT_EQ(parsed, f);
  }
  EXPECT_EQ(block_shape_name(kWholeTensor), "tensor");
  EXPECT_EQ(block_shape_name(kBlock1x128), "1x128");
  EXPECT_EQ(block_shape_name(kBlock128x128), "128x128");
  EXPECT_EQ(block_shape_name(kBlock1x16), "1x16");
  EXPECT_EQ(block_shape_name(kBlock1x32), "1x32");
  EXPECT_EQ(block_shape_name(kBlock16x16), "16x16");
  for (BlockShape b : kBlockShapes) {
    BlockShape parsed{7, 7};
    ASSERT_TRUE(parse_block_shape(block_shape_name(b), &parsed)) << block_shape_name(b);
    EXPECT_EQ(parsed, b);
  }
  BlockShape b = kBlock1x128;
  ScaleFormat f = ScaleFormat::E8M0;
  EXPECT_FALSE(parse_block_shape("128", &b));
  EXPECT_FALSE(parse_block_shape("1x64", &b));
  EXPECT_FALSE(parse_block_shape("Tensor", &b));
  EXPECT_FALSE(parse_scale_format("FP32", &f));
  EXPECT_EQ(b, kBlock1x128);  // untouched on failure
  EXPECT_EQ(f, ScaleFormat::E8M0);
}

TEST(Encoding, NamesAndParsing) {
  EXPECT_EQ(encoding_name(kE4M3Tensor), "e4m3 tensor");
  EXPECT_EQ(encoding_name(kE4M3Rows), "e4m3 1x128 pow2 scales");
  EXPECT_EQ(encoding_name(kE4M3Tiles), "e4m3 128x128 pow2 scales");
  EXPECT_EQ(encoding_name(kNvfp4), "e2m1 1x16 e4m3 scales + fp32 tensor scale");
  EXPECT_EQ(encoding_name(kMxfp4), "e2m1 1x32 e8m0 scales");
  EXPECT_EQ(encoding_name(kCoatGroups), "e4m3 1x16");
  // Every named encoding, valid or not, reads back from its name.
  int n = 0;
  for (const Encoding& e : named_encodings()) {
    Encoding parsed{ElementFormat::E5M2, kBlock16x16, ScaleFormat::E8M0, true};
    if (parsed == e) parsed.tensor_scale = false;
    ASSERT_TRUE(parse_encoding(encoding_name(e), &parsed)) << encoding_name(e);
    EXPECT_EQ(parsed, e) << encoding_name(e);
    n++;
  }
  EXPECT_EQ(n, 3 * 6 * 4 * 2);
  Encoding e = kMxfp4;
  for (const char* bad : {"", "e4m3", "e4m3 1x64", "fp8 tensor", "e4m3 tensor fp32 scales", "e4m3 tensor pow2",
                          "e4m3 tensor pow2 scales extra", "e4m3 tensor + tensor scale"})
    EXPECT_FALSE(parse_encoding(bad, &e)) << bad;
  EXPECT_EQ(e, kMxfp4);  // untouched on failure
}

TEST(Encoding, Validation) {
  for (const Encoding& e : {kE4M3Tensor, kE4M3Rows, kE4M3Tiles, kNvfp4, kMxfp4, kCoatGroups})
    EXPECT_EQ(encoding_error(e), "") << encoding_name(e);
  EXPECT_TRUE(contains(encoding_error({ElementFormat::E4M3, BlockShape{2, 128}}), "neither 1xN nor NxN"));
  EXPECT_TRUE(contains(encoding_error({ElementFormat::E4M3, BlockShape{128, 64}}), "neither 1xN nor NxN"));
  EXPECT_TRUE(contains(encoding_error({ElementFormat::E4M3, BlockShape{0, 16}}), "neither 1xN nor NxN"));
  EXPECT_TRUE(contains(encoding_error({ElementFormat::E4M3, kWholeTensor, ScaleFormat::E8M0}),
                       "a whole-tensor scale is FP32"));
  EXPECT_TRUE(contains(encoding_error({ElementFormat::E2M1, kWholeTensor, ScaleFormat::FP32, true}),
                       "second-level tensor scale"));
  EXPECT_TRUE(kE4M3Tensor.per_tensor() && !kE4M3Rows.per_tensor());
  EXPECT_TRUE(kE4M3Rows.pow2_scales() && !kE4M3Tensor.pow2_scales() && !kMxfp4.pow2_scales());
}

// Sizes of the codes: one byte per FP8 code, two E2M1 codes per byte (every row starts on a byte).
TEST(Encoding, CodeBytes) {
  EXPECT_EQ(code_bytes(kE4M3Tensor, 1000, 784), 1000u * 784u);
  EXPECT_EQ(code_bytes(kE5M2Rows, 784, 1000), 784u * 1000u);
  EXPECT_EQ(code_bytes(kNvfp4, 1000, 784), 1000u * 392u);
  EXPECT_EQ(code_bytes(kMxfp4, 3, 7), 3u * 4u);  // 7 codes: 3.5 bytes, rounded up per row
  EXPECT_EQ(code_bytes(kE4M3Tensor, 0, 784), 0u);
  EXPECT_EQ(code_bytes(kE4M3Tensor, size_t(1) << 20, 1 << 14), size_t(1) << 34);  // no int overflow
  EXPECT_THROW(code_bytes(kE4M3Tensor, -1, 16), Error);
  EXPECT_THROW(code_bytes({ElementFormat::E4M3, BlockShape{3, 5}}, 16, 16), Error);  // not an encoding
}

// The GEMM-ready layouts of the FP8 encodings are tensor.h's (the values cuBLASLt reads).
TEST(Encoding, Fp8ScaleLayoutsAreTheGemmReadyOnes) {
  EXPECT_EQ(scale_inv_count(kE4M3Tensor, 1000, 784), 1u);
  EXPECT_EQ(scale_inv_ld(kE4M3Tensor, 1000, 784), 1);
  // 1x128: (ceil(cols / 128), round_up(rows, 4))
  EXPECT_EQ(scale_inv_ld(kE4M3Rows, 1000, 784), 1000);
  EXPECT_EQ(scale_inv_count(kE4M3Rows, 1000, 784), 7u * 1000u);
  EXPECT_EQ(scale_inv_ld(kE4M3Rows, 1001, 784), 1004);
  EXPECT_EQ(scale_inv_count(kE4M3Rows, 1001, 784), 7u * 1004u);
  EXPECT_EQ(scale_inv_count(kE4M3Rows, 16, 16), 16u);
  // the transposed copy of a (1001, 784) 1x128 tensor: (ceil(1001 / 128), round_up(784, 4)) = (8, 784)
  EXPECT_EQ(scale_inv_ld(kE4M3Rows, 784, 1001), 784);
  EXPECT_EQ(scale_inv_count(kE4M3Rows, 784, 1001), 8u * 784u);
  EXPECT_EQ(scale_inv_count(kE4M3Rows, 768, 1001), 8u * 768u);
  // 128x128: (ceil(rows / 128), round_up(ceil(cols / 128), 4))
  EXPECT_EQ(scale_inv_ld(kE4M3Tiles, 1000, 784), 8);
  EXPECT_EQ(scale_inv_count(kE4M3Tiles, 1000, 784), 8u * 8u);
  EXPECT_EQ(scale_inv_ld(kE4M3Tiles, 256, 3072), 24);
  EXPECT_EQ(scale_inv_count(kE4M3Tiles, 256, 3072), 2u * 24u);
  EXPECT_EQ(scale_inv_ld(kE4M3Tiles, 3072, 256), 4);
  EXPECT_EQ(scale_inv_count(kE4M3Tiles, 3072, 256), 24u * 4u);
  EXPECT_EQ(scale_inv_count(kE4M3Tiles, 2304, 768), 18u * 8u);
  EXPECT_EQ(scale_inv_count(kE4M3Tiles, 768, 2304), 6u * 20u);
  EXPECT_EQ(scale_inv_count(kE4M3Tiles, 16, 16), 4u);
  EXPECT_EQ(scale_inv_count(kE4M3Rows, 0, 128), 0u);
  EXPECT_EQ(scale_inv_bytes(kE4M3Rows, 1000, 784), 4u * 7u * 1000u);  // FP32 scales
  EXPECT_THROW(scale_inv_count(kE4M3Rows, -1, 128), Error);
  EXPECT_THROW(scale_inv_ld(kE4M3Tiles, 16, -16), Error);
  // Large: sizes do not overflow int arithmetic.
  EXPECT_EQ(scale_inv_count(kE4M3Rows, 1 << 30, 1 << 14), size_t(128) << 30);
}

// The same layouts for the blocks the FP4 and COAT encodings declare, with their 1-byte scales.
TEST(Encoding, SmallBlockScaleSizes) {
  EXPECT_EQ(scale_inv_ld(kNvfp4, 1001, 784), 1004);
  EXPECT_EQ(scale_inv_count(kNvfp4, 1001, 784), 49u * 1004u);  // ceil(784 / 16) = 49 blocks along a row
  EXPECT_EQ(scale_inv_bytes(kNvfp4, 1001, 784), 49u * 1004u);  // E4M3 scales: one byte each
  EXPECT_EQ(scale_inv_count(kMxfp4, 1000, 784), 25u * 1000u);  // ceil(784 / 32) = 25
  EXPECT_EQ(scale_inv_bytes(kMxfp4, 1000, 784), 25u * 1000u);
  EXPECT_EQ(scale_inv_bytes(kCoatGroups, 1000, 784), 4u * 49u * 1000u);  // FP32 group scales
  const Encoding tiles16{ElementFormat::E2M1, kBlock16x16, ScaleFormat::E4M3, true};
  EXPECT_EQ(scale_inv_ld(tiles16, 1000, 784), 52);                // round_up(49, 4)
  EXPECT_EQ(scale_inv_count(tiles16, 1000, 784), 63u * 52u);      // ceil(1000 / 16) = 63 tile rows
}

// Which encodings this build quantises, and the error for one it does not.
TEST(Encoding, QuantizersOfThisBuild) {
  for (const Encoding& e : {kE4M3Tensor, kE5M2Tensor, kE4M3Rows, kE5M2Rows, kE4M3Tiles,
                            Encoding{ElementFormat::E5M2, kBlock128x128}, Encoding{ElementFormat::E4M3, kBlock1x128},
                            kNvfp4, kMxfp4, Encoding{ElementFormat::E2M1, kBlock16x16, ScaleFormat::E4M3, true},
                            kCoatGroups})
    EXPECT_TRUE(has_quantizer(e)) << encoding_name(e) << ": " << quantizer_error(e);
  for (const Encoding& e : {Encoding{ElementFormat::E5M2, kBlock1x16}, Encoding{ElementFormat::E4M3, kBlock1x128, ScaleFormat::E8M0},
                            Encoding{ElementFormat::E2M1, kBlock1x16, ScaleFormat::E8M0},
                            Encoding{ElementFormat::E4M3, kBlock1x128, ScaleFormat::FP32, true}}) {
    const std::string why = quantizer_error(e);
    EXPECT_TRUE(contains(why, "no quantiser for " + encoding_name(e))) << why;
    EXPECT_TRUE(contains(why, "e4m3 | e5m2 codes")) << why;  // says what it does quantise
  }
  EXPECT_TRUE(contains(quantizer_error({ElementFormat::E4M3, BlockShape{2, 128}}), "not an encoding"));
  // The config choices: the element formats and block shapes some quantiser takes.
  EXPECT_EQ(quantizable_element_formats(),
            (std::vector<ElementFormat>{ElementFormat::E4M3, ElementFormat::E5M2, ElementFormat::E2M1}));
  EXPECT_EQ(quantizable_block_shapes(), (std::vector<BlockShape>{kWholeTensor, kBlock1x128, kBlock128x128, kBlock1x16,
                                                                 kBlock1x32, kBlock16x16}));
}

// The GEMM mapping of pairs of encodings, as the recipes ask it (no device needed).
TEST(Encoding, GemmMapping) {
  EXPECT_EQ(quant_gemm_operands_error(kE4M3Tensor, "x", kE4M3Tensor, "w"), "");
  EXPECT_EQ(quant_gemm_operands_error(kE5M2Tensor, "dy", kE4M3Tensor, "w"), "");
  EXPECT_EQ(quant_gemm_operands_error(kE4M3Rows, "x", kE4M3Tiles, "w"), "");
  EXPECT_EQ(quant_gemm_operands_error(kE5M2Rows, "dy", kE4M3Rows, "x"), "");
  EXPECT_TRUE(contains(quant_gemm_operands_error(kE4M3Tensor, "x", kE4M3Tiles, "w"),
                       "cannot mix per-tensor and block scales"));
  EXPECT_TRUE(contains(quant_gemm_operands_error(kE4M3Tiles, "x", kE4M3Tiles, "w"), "x and w are both 128x128"));
  EXPECT_TRUE(contains(quant_gemm_operands_error(kE5M2Tensor, "dy", kE5M2Tensor, "x"), "dy and x are both e5m2"));
  EXPECT_TRUE(contains(quant_gemm_operands_error(kNvfp4, "A", kE4M3Tensor, "B"), "A is e2m1 1x16"));
  EXPECT_TRUE(contains(quant_gemm_operands_error(kE4M3Tensor, "A", kCoatGroups, "B"), "B is e4m3 1x16"));
  EXPECT_EQ(quant_gemm_min_compute_capability(kE4M3Tensor, kE4M3Tensor), 89);
  EXPECT_EQ(quant_gemm_min_compute_capability(kE4M3Rows, kE4M3Tiles), 90);
  EXPECT_EQ(quant_gemm_dim_multiple(kE4M3Tensor), 16);
  EXPECT_EQ(quant_gemm_dim_multiple(kE4M3Rows), 128);
  EXPECT_EQ(quant_gemm_dim_multiple(kE4M3Tiles), 128);
  EXPECT_EQ(quant_gemm_dim_multiple(kMxfp4), 16);  // the MXFP4 product's M and N (fp4_gemm.h)
}
