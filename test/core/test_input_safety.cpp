// test/core/test_input_safety: the helpers every reader of outside input uses (llmc/core/input_safety): parse_json
// (documents and values like nlohmann's parser, comments only when allowed, the nesting limit at any depth and for
// 200 KB of brackets within time and memory bounds, duplicate keys at several depths with their path and line, number
// overflow with the key, syntax errors with line and column, the error kinds), check_json_depth on built documents,
// open_regular_file / read_regular_file / read_json_file (regular files read whole; FIFOs, directories and devices
// refused without blocking; the size bound checked before reading) and the checked arithmetic.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "llmc/core/common.h"
#include "llmc/core/input_safety.h"
#include "test/support/bounded_run.h"
#include "test/support/temp_dir.h"

using llmc::JsonError;
using nlohmann::json;

namespace {

// The JsonError parse_json throws for text (fails the test when it parses).
JsonError parse_error_of(const std::string& text, const llmc::JsonReadOptions& options = {}) {
  try {
    llmc::parse_json(text, "src", options);
  } catch (const JsonError& e) {
    return e;
  }
  ADD_FAILURE() << "parsed: " << text;
  return JsonError(JsonError::Kind::Syntax, "");
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(ParseJson, GivesTheSameDocumentsAsNlohmann) {
  for (const char* text : {"{}", "[]", "1", "-2", "18446744073709551615", "1.5e300", "\"x\"", "null", "true",
                           R"({"a": [1, 2.5, "s", null, false, {"b": {"c": []}}], "d": {"e": -7}})",
                           R"([[], [[]], {"k": [{"k": 1}]}])", "\"\\u00e9\""}) {
    EXPECT_EQ(llmc::parse_json(text, "src"), json::parse(text)) << text;
  }
  const json j = llmc::parse_json("18446744073709551615", "src");
  EXPECT_TRUE(j.is_number_unsigned());
  EXPECT_TRUE(llmc::parse_json("-1", "src").is_number_integer());
}

TEST(ParseJson, CommentsOnlyWhenAllowed) {
  const std::string text = "// head\n{\"a\": 1 /* inner */}\n";
  llmc::JsonReadOptions options;
  options.allow_comments = true;
  EXPECT_EQ(llmc::parse_json(text, "src", options), json::parse("{\"a\": 1}"));
  EXPECT_EQ(parse_error_of(text).kind, JsonError::Kind::Syntax);
}

TEST(ParseJson, SyntaxErrorsNameTheSourceLineAndColumn) {
  const JsonError e = parse_error_of("{\n  \"a\": 1,,\n}");
  EXPECT_EQ(e.kind, JsonError::Kind::Syntax);
  EXPECT_TRUE(contains(e.what(), "src: invalid JSON: parse error at line 2, column")) << e.what();
  EXPECT_FALSE(contains(e.what(), "[json.exception")) << e.what();
  EXPECT_EQ(parse_error_of("").kind, JsonError::Kind::Syntax);
  EXPECT_EQ(parse_error_of("{\"a\": 1} trailing").kind, JsonError::Kind::Syntax);
  EXPECT_EQ(parse_error_of("[NaN]").kind, JsonError::Kind::Syntax);
}

TEST(ParseJson, NestingLimitAtEveryDepth) {
  llmc::JsonReadOptions options;
  options.max_depth = 3;
  EXPECT_NO_THROW(llmc::parse_json("[[[1]]]", "src", options));
  EXPECT_NO_THROW(llmc::parse_json(R"({"a": {"b": [1]}})", "src", options));
  const JsonError arrays = parse_error_of("[[[[1]]]]", options);
  EXPECT_EQ(arrays.kind, JsonError::Kind::TooDeep);
  EXPECT_TRUE(contains(arrays.what(), "src: JSON nested deeper than 3 levels at '[0][0][0]'")) << arrays.what();
  const JsonError objects = parse_error_of("{\"a\": {\"b\": {\n\"c\": {}}}}", options);
  EXPECT_TRUE(contains(objects.what(), "nested deeper than 3 levels (line 2) at 'a.b.c'")) << objects.what();
  // The default limit, and 200 KB of brackets: an error within a second, no stack overflow, nothing big allocated.
  EXPECT_NO_THROW(llmc::parse_json(std::string(64, '[') + std::string(64, ']'), "src"));
  EXPECT_EQ(parse_error_of(std::string(65, '[') + std::string(65, ']')).kind, JsonError::Kind::TooDeep);
  llmc_test::expect_bounded_error([] { llmc::parse_json(std::string(200000, '['), "src"); },
                                  {"src: JSON nested deeper than 64 levels"}, /*seconds=*/1, /*extra_bytes=*/64ull << 20);
  std::string objects_deep;
  for (int i = 0; i < 40000; i++) objects_deep += "{\"k\":";
  llmc_test::expect_bounded_error([&] { llmc::parse_json(objects_deep, "src"); }, {"nested deeper than 64 levels"},
                                  /*seconds=*/1, /*extra_bytes=*/64ull << 20);
}

TEST(ParseJson, DuplicateKeysAtEveryDepthWithPathAndLine) {
  const JsonError top = parse_error_of("{\"a\": 1,\n\"a\": 2}");
  EXPECT_EQ(top.kind, JsonError::Kind::DuplicateKey);
  EXPECT_TRUE(contains(top.what(), "src: duplicate key 'a' (line 2)")) << top.what();
  const JsonError nested = parse_error_of("{\"train\": {\"lr\": 1,\n\n\"lr\": 1}}");
  EXPECT_TRUE(contains(nested.what(), "duplicate key 'train.lr' (line 3)")) << nested.what();
  const JsonError in_array = parse_error_of(R"({"x": [{"a": 1}, {"b": {"c": 1, "c": 1}}]})");
  EXPECT_TRUE(contains(in_array.what(), "duplicate key 'x[1].b.c'")) << in_array.what();
  EXPECT_FALSE(contains(in_array.what(), "(line")) << "one-line text has no line: " << in_array.what();
  // The same key in different objects is fine; duplicates are allowed when asked for (the last wins, as nlohmann).
  EXPECT_NO_THROW(llmc::parse_json(R"({"a": {"k": 1}, "b": {"k": 2}, "k": [{"k": 1}, {"k": 2}]})", "src"));
  llmc::JsonReadOptions lenient;
  lenient.reject_duplicate_keys = false;
  EXPECT_EQ(llmc::parse_json(R"({"a": 1, "a": 2})", "src", lenient), json::parse(R"({"a": 2})"));
}

TEST(ParseJson, NumberOverflowNamesTheKey) {
  for (const char* number : {"1e309", "-1e309", "9e99999"}) {
    const JsonError e = parse_error_of(std::string("{\"train\": {\n\"lr\": ") + number + "}}");
    EXPECT_EQ(e.kind, JsonError::Kind::NumberOverflow);
    EXPECT_TRUE(contains(e.what(), std::string("src: the number ") + number + " of 'train.lr' (line 2) does not fit"))
        << e.what();
  }
  EXPECT_TRUE(contains(parse_error_of("[0, 1, 1e999]").what(), "the number 1e999 of '[2]'"));
  EXPECT_TRUE(contains(parse_error_of("1e400").what(), "src: the number 1e400 does not fit a 64-bit float"));
  // Integers past 64 bits become doubles (nlohmann's rule), which is not an overflow.
  EXPECT_TRUE(llmc::parse_json("123456789012345678901234567890", "src").is_number_float());
}

TEST(CheckJsonDepth, BuiltDocumentsWithoutRecursion) {
  json deep = json::array();
  json* inner = &deep;
  for (int i = 1; i < 100000; i++) {
    inner->push_back(json::object());
    inner = &inner->back();
    (*inner)["k"] = json::array();
    inner = &(*inner)["k"];
  }
  try {
    llmc::check_json_depth(deep, "built");
    FAIL() << "a document 200000 levels deep passed";
  } catch (const JsonError& e) {
    EXPECT_EQ(e.kind, JsonError::Kind::TooDeep);
    EXPECT_TRUE(contains(e.what(), "built: JSON nested deeper than 64 levels")) << e.what();
  }
  EXPECT_NO_THROW(llmc::check_json_depth(json::parse(std::string(64, '[') + std::string(64, ']')), "ok"));
  EXPECT_THROW(llmc::check_json_depth(json::parse("[[[1]]]"), "three", 2), JsonError);
  EXPECT_NO_THROW(llmc::check_json_depth(json(5), "scalar", 0));
}

class RegularFiles : public llmc_test::TempDirTest {};

TEST_F(RegularFiles, ReadsRegularFilesWhole) {
  const std::string file = path("f.json");
  std::ofstream(file) << "{\"a\": [1, 2]}";
  EXPECT_EQ(llmc::read_regular_file(file, "test file", 100), "{\"a\": [1, 2]}");
  EXPECT_EQ(llmc::read_json_file(file, "test file", 100), json::parse("{\"a\": [1, 2]}"));
  uint64_t size = 0;
  const int fd = llmc::open_regular_file(file, "test file", &size);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(size, 13u);
  EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0) << "the descriptor must be blocking";
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  ::close(fd);
  // A symbolic link to a regular file is a regular file.
  ASSERT_EQ(::symlink(file.c_str(), path("link").c_str()), 0);
  EXPECT_EQ(llmc::read_regular_file(path("link"), "test file", 100).size(), 13u);
  // Errors name the file (and the JSON errors the path as their source).
  std::ofstream(path("dup.json")) << "{\"a\": 1,\n\"a\": 2}";
  try {
    llmc::read_json_file(path("dup.json"), "test file", 100);
    FAIL();
  } catch (const llmc::Error& e) {
    EXPECT_TRUE(contains(e.what(), path("dup.json") + ": duplicate key 'a' (line 2)")) << e.what();
  }
}

TEST_F(RegularFiles, TheSizeBoundComesBeforeReading) {
  const std::string file = path("big");
  std::ofstream(file) << std::string(1000, 'x');
  try {
    llmc::read_regular_file(file, "config file", 999, " (hint)");
    FAIL();
  } catch (const llmc::Error& e) {
    EXPECT_TRUE(contains(e.what(), "config file '" + file + "' is 1000 bytes, more than the 999 bytes")) << e.what();
    EXPECT_TRUE(contains(e.what(), "(hint)")) << e.what();
  }
  // A sparse file claiming 64 GiB: refused at once, nothing allocated.
  const std::string sparse = path("sparse");
  const int fd = ::open(sparse.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(64ull << 30)), 0);
  ::close(fd);
  llmc_test::expect_bounded_error([&] { llmc::read_regular_file(sparse, "test file", 1u << 20); },
                                  {"is 68719476736 bytes, more than the 1048576 bytes"}, 1, 64ull << 20);
}

TEST_F(RegularFiles, FifosDirectoriesAndDevicesAreRefusedWithoutBlocking) {
  const std::string fifo = path("pipe");
  llmc_test::make_fifo(fifo);
  for (const auto& [p, kind] : {std::pair<std::string, std::string>{fifo, "a FIFO (named pipe)"},
                                {dir_, "a directory"},
                                {"/dev/null", "a character device"}}) {
    llmc_test::expect_bounded_error([&] { llmc::open_regular_file(p, "model file"); },
                                    {"model file '" + p + "' is " + kind + ", not a regular file"}, 2);
    llmc_test::expect_bounded_error([&] { llmc::read_regular_file(p, "model file", 1 << 20); }, {kind}, 2);
    llmc_test::expect_bounded_error([&] { llmc::check_regular_file(p, "model file"); }, {kind}, 2);
  }
  // A symbolic link to a FIFO is refused too.
  ASSERT_EQ(::symlink(fifo.c_str(), path("to_pipe").c_str()), 0);
  llmc_test::expect_bounded_error([&] { llmc::read_json_file(path("to_pipe"), "config file", 1 << 20); },
                                  {"is a FIFO (named pipe)"}, 2);
  // A missing file: "cannot open", with the hint.
  try {
    llmc::open_regular_file(path("missing"), "data shard", nullptr, " (hint: prepare it)");
    FAIL();
  } catch (const llmc::Error& e) {
    EXPECT_TRUE(contains(e.what(), "cannot open data shard '" + path("missing") + "': No such file or directory "
                                   "(hint: prepare it)")) << e.what();
  }
}

TEST(CheckedArithmetic, OverflowNamesTheOperands) {
  EXPECT_EQ(llmc::checked_mul(1ll << 31, 1ll << 31, "a * b"), 1ll << 62);
  EXPECT_EQ(llmc::checked_add(INT64_MAX - 1, 1, "a + b"), INT64_MAX);
  EXPECT_EQ(llmc::checked_round_up(50257, 128, "v"), 50304);
  EXPECT_EQ(llmc::checked_round_up(50304, 128, "v"), 50304);
  try {
    llmc::checked_mul(1ll << 32, 1ll << 31, "train.micro_batch * train.seq_len");
    FAIL();
  } catch (const llmc::Error& e) {
    EXPECT_STREQ(e.what(), "train.micro_batch * train.seq_len = 4294967296 * 2147483648 does not fit in 64 bits");
  }
  EXPECT_THROW(llmc::checked_mul(-(1ll << 62), 4, "x"), llmc::Error);
  EXPECT_THROW(llmc::checked_add(INT64_MAX, 1, "x"), llmc::Error);
  EXPECT_THROW(llmc::checked_round_up(INT64_MAX - 1, 128, "x"), llmc::Error);
  EXPECT_THROW(llmc::checked_round_up(5, 0, "x"), llmc::Error);
}
