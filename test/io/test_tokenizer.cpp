// test/io/test_tokenizer: GPT-2 decoding with the bundled dev/data/gpt2/encoder.json (run from the repository root):
// vocabulary size and <|endoftext|>, known GPT-2 ids, sequence decoding as concatenation, the 256 byte tokens in
// GPT-2's bytes_to_unicode order (recomputed here independently), tokens holding partial UTF-8 characters decoded
// to raw bytes, invalid ids refused, and broken vocabulary files (missing, not JSON, duplicate / missing / bad ids,
// no <|endoftext|>, characters outside the byte map) refused with llmc::Error naming the file; hostile ones (a token
// string twice, deep nesting, overflowing numbers, FIFOs and devices, a file past the size bound) within time and
// memory bounds.
#include <gtest/gtest.h>

#include "test/support/bounded_run.h"
#include "test/support/temp_dir.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "llmc/core/common.h"
#include "llmc/io/tokenizer.h"
#include "test/support/error_of.h"

namespace fs = std::filesystem;
using llmc_test::thrown_error;

namespace {

const char* kEncoderJson = "dev/data/gpt2/encoder.json";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// GPT-2's bytes_to_unicode() byte order, as in OpenAI's encoder.py: the printable bytes '!'..'~', 0xA1..0xAC,
// 0xAE..0xFF, then every other byte in increasing order. Token id i < 256 is the single byte order[i].
std::vector<int> gpt2_byte_order() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; b++) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; b++) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; b++) bs.push_back(b);
  std::vector<bool> taken(256, false);
  for (int b : bs) taken[b] = true;
  for (int b = 0; b < 256; b++)
    if (!taken[b]) bs.push_back(b);
  return bs;
}

// One tokenizer for the whole suite (encoder.json is 1 MB).
const llmc::GPT2Tokenizer& gpt2() {
  static const llmc::GPT2Tokenizer tok(kEncoderJson);
  return tok;
}

class TokenizerFiles : public llmc_test::TempDirTest {
 protected:

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

};

}  // namespace

TEST(GPT2Tokenizer, VocabularyAndEot) {
  const llmc::GPT2Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eot_token(), 50256);
  EXPECT_EQ(tok.decode(50256), "<|endoftext|>");
  EXPECT_TRUE(tok.is_valid(0));
  EXPECT_TRUE(tok.is_valid(50256));
  EXPECT_FALSE(tok.is_valid(-1));
  EXPECT_FALSE(tok.is_valid(50257));
}

TEST(GPT2Tokenizer, KnownIds) {
  const llmc::GPT2Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.decode(15496), "Hello");
  EXPECT_EQ(tok.decode(995), " world");
  EXPECT_EQ(tok.decode(11), ",");
  EXPECT_EQ(tok.decode(198), "\n");
  EXPECT_EQ(tok.decode(220), " ");
  EXPECT_EQ(tok.decode(262), " the");
  EXPECT_EQ(tok.decode(0), "!");
  // "Hello, world!\n" and the start of a KJV verse, as tokenised by GPT-2.
  EXPECT_EQ(tok.decode(std::vector<int>{15496, 11, 995, 0, 198}), "Hello, world!\n");
  EXPECT_EQ(tok.decode(std::vector<int>{50256, 15496, 995}), "<|endoftext|>Hello world");
  EXPECT_EQ(tok.decode(std::vector<int>{}), "");
}

TEST(GPT2Tokenizer, DecodeVectorIsConcatenation) {
  const llmc::GPT2Tokenizer& tok = gpt2();
  const std::vector<int> ids = {464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 198, 447, 247, 50256, 188};
  std::string expect;
  for (int id : ids) expect += tok.decode(id);
  EXPECT_EQ(tok.decode(ids), expect);
}

TEST(GPT2Tokenizer, ByteTokensFollowBytesToUnicode) {
  const llmc::GPT2Tokenizer& tok = gpt2();
  const std::vector<int> order = gpt2_byte_order();
  ASSERT_EQ(order.size(), 256u);
  for (int id = 0; id < 256; id++) {
    const std::string bytes = tok.decode(id);
    ASSERT_EQ(bytes.size(), 1u) << "id " << id;
    EXPECT_EQ(static_cast<unsigned char>(bytes[0]), order[id]) << "id " << id;
  }
  // Hand-checked points of the map.
  EXPECT_EQ(tok.decode(0), std::string("\x21", 1));    // '!'
  EXPECT_EQ(tok.decode(93), std::string("\x7e", 1));   // '~'
  EXPECT_EQ(tok.decode(94), std::string("\xa1", 1));   // first of 0xA1..0xAC
  EXPECT_EQ(tok.decode(105), std::string("\xac", 1));
  EXPECT_EQ(tok.decode(106), std::string("\xae", 1));  // 0xAD is skipped
  EXPECT_EQ(tok.decode(187), std::string("\xff", 1));
  EXPECT_EQ(tok.decode(188), std::string("\x00", 1));  // the shifted bytes start with 0x00
  EXPECT_EQ(tok.decode(198), std::string("\n", 1));    // 0x0A
  EXPECT_EQ(tok.decode(220), std::string(" ", 1));     // 0x20
  EXPECT_EQ(tok.decode(221), std::string("\x7f", 1));
  EXPECT_EQ(tok.decode(254), std::string("\xa0", 1));
  EXPECT_EQ(tok.decode(255), std::string("\xad", 1));
}

TEST(GPT2Tokenizer, PartialUtf8TokensAreRawBytes) {
  const llmc::GPT2Tokenizer& tok = gpt2();
  // Single bytes >= 0x80 are not UTF-8 on their own: id 157 is the lead byte 0xE1, id 187 is 0xFF.
  EXPECT_EQ(tok.decode(157), std::string("\xe1", 1));
  // Multi-byte tokens that hold part of a character: "\xe2\x80" (the start of U+2019 etc.), " \xf0\x9f" (emoji
  // start), "\xe0\xb9".
  EXPECT_EQ(tok.decode(447), std::string("\xe2\x80", 2));
  EXPECT_EQ(tok.decode(12520), std::string(" \xf0\x9f", 3));
  EXPECT_EQ(tok.decode(31479), std::string("\xe0\xb9", 2));
  // Together the pieces form whole characters: 447 + 247 = U+2019 (right single quotation mark).
  EXPECT_EQ(tok.decode(std::vector<int>{447, 247}), "\xe2\x80\x99");
}

TEST(GPT2Tokenizer, InvalidIds) {
  const llmc::GPT2Tokenizer& tok = gpt2();
  for (int id : {-1, 50257, 1 << 30, -2147483647 - 1}) {
    const std::string msg = thrown_error([&] { tok.decode(id); });
    EXPECT_TRUE(contains(msg, std::to_string(id))) << msg;
  }
  EXPECT_THROW(tok.decode(std::vector<int>{15496, 50257}), llmc::Error);
  EXPECT_THROW(tok.decode(std::vector<int>{-1}), llmc::Error);
}

TEST_F(TokenizerFiles, TinyValidVocabulary) {
  // "!" = byte 0x21, "\u0120" (Ġ) = byte 0x20, "\u0100" (Ā) = byte 0x00.
  const std::string path = write("tiny.json", R"({"!": 0, "\u0120a": 1, "<|endoftext|>": 2, "\u0100": 3})");
  llmc::GPT2Tokenizer tok(path);
  EXPECT_EQ(tok.vocab_size(), 4);
  EXPECT_EQ(tok.eot_token(), 2);
  EXPECT_EQ(tok.decode(1), " a");
  EXPECT_EQ(tok.decode(3), std::string("\0", 1));
  EXPECT_EQ(tok.decode(std::vector<int>{0, 1, 2}), "! a<|endoftext|>");
  EXPECT_THROW(tok.decode(4), llmc::Error);
}

TEST_F(TokenizerFiles, BrokenFilesNameTheFile) {
  struct Case {
    const char* name;
    std::string text;
  };
  const std::vector<Case> cases = {
      {"not_json.json", "{\"!\": 0, "},
      {"garbage.json", "this is not json"},
      {"empty.json", ""},
      {"array.json", "[1, 2, 3]"},
      {"empty_object.json", "{}"},
      {"duplicate_id.json", R"({"!": 0, "a": 0, "<|endoftext|>": 1})"},
      {"missing_id.json", R"({"!": 0, "a": 2, "<|endoftext|>": 3})"},  // 3 tokens, id 1 missing
      {"negative_id.json", R"({"!": -1, "<|endoftext|>": 0})"},
      {"string_id.json", R"({"!": "0", "<|endoftext|>": 1})"},
      {"no_eot.json", R"({"!": 0, "a": 1})"},
      {"not_a_byte.json", R"({"\u4e2d": 0, "<|endoftext|>": 1})"},  // U+4E2D is not in GPT-2's byte map
      {"raw_space.json", R"({" a": 0, "<|endoftext|>": 1})"},        // a raw space is not a byte character either
  };
  for (const Case& c : cases) {
    const std::string path = write(c.name, c.text);
    const std::string msg = thrown_error([&] { llmc::GPT2Tokenizer tok(path); });
    EXPECT_TRUE(contains(msg, path)) << c.name << ": " << msg;
  }
  const std::string missing = dir_ + "/missing/encoder.json";
  const std::string msg = thrown_error([&] { llmc::GPT2Tokenizer tok(missing); });
  EXPECT_TRUE(contains(msg, missing)) << msg;
  const std::string directory = thrown_error([&] { llmc::GPT2Tokenizer tok(dir_); });
  EXPECT_TRUE(contains(directory, dir_)) << directory;
}

TEST_F(TokenizerFiles, HostileFilesAreRefusedWithinBounds) {
  // A token string given twice (nlohmann kept the last id silently), at the line it is on.
  const std::string dup = write("dup_token.json", "{\"!\": 0,\n\"<|endoftext|>\": 1,\n\"!\": 2}");
  EXPECT_TRUE(contains(thrown_error([&] { llmc::GPT2Tokenizer tok(dup); }), dup + ": duplicate key '!' (line 3)"));
  // Deep nesting, and a number that does not fit.
  const std::string deep = write("deep.json", "{\"!\": " + std::string(100000, '[') + "}");
  llmc_test::expect_bounded_error([&] { llmc::GPT2Tokenizer tok(deep); }, {deep, "nested deeper than 64 levels"}, 2);
  const std::string overflow = write("overflow.json", R"({"!": 1e999, "<|endoftext|>": 1})");
  EXPECT_TRUE(contains(thrown_error([&] { llmc::GPT2Tokenizer tok(overflow); }), "the number 1e999 of '!'"));
  // An id past the vocabulary: refused before anything is sized by it.
  const std::string big_id = write("big_id.json", R"({"!": 9223372036854775807, "<|endoftext|>": 1})");
  llmc_test::expect_bounded_error([&] { llmc::GPT2Tokenizer tok(big_id); }, {big_id, "ids must be 0..1"}, 2,
                                  64ull << 20);
  // A FIFO or a device as data.tokenizer: refused at once instead of blocking or reading forever.
  llmc_test::make_fifo(dir_ + "/encoder.fifo");
  llmc_test::expect_bounded_error([&] { llmc::GPT2Tokenizer tok(dir_ + "/encoder.fifo"); },
                                  {"tokenizer file '" + dir_ + "/encoder.fifo' is a FIFO (named pipe), not a regular file"},
                                  2);
  llmc_test::expect_bounded_error([&] { llmc::GPT2Tokenizer tok("/dev/zero"); }, {"/dev/zero", "character device"}, 2);
  // A file past the size bound (sparse: nothing is written or read).
  const std::string huge = dir_ + "/huge.json";
  std::ofstream(huge) << "{}";
  fs::resize_file(huge, 65ull << 20);
  llmc_test::expect_bounded_error([&] { llmc::GPT2Tokenizer tok(huge); }, {huge, "more than the 67108864 bytes"}, 2,
                                  64ull << 20);
}
