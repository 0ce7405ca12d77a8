// test/io/test_safetensors: round trips through our safetensors writer and reader (every dtype, metadata, scalars,
// empty tensors, a multi-MB tensor), element conversions, one hand-crafted corrupt file per validation rule, and
// hostile files: header lengths and tensor extents that lie about the file (refused before anything is allocated,
// within time and memory bounds), deep nesting, duplicate keys at every depth, numbers that overflow, FIFOs and
// directories.
#include <gtest/gtest.h>

#include "test/support/bounded_run.h"
#include "test/support/temp_dir.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <unistd.h>

#include "llmc/core/common.h"
#include "llmc/io/safetensors.h"

namespace fs = std::filesystem;
using llmc::SafetensorsReader;
using llmc::SafetensorsWriter;

namespace {

class SafetensorsTest : public llmc_test::TempDirTest {
 protected:

  // A file with the given header text (length-prefixed, unpadded) followed by `data_bytes` bytes of data.
  std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes) {
    std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; i++) out.put(char((n >> (8 * i)) & 0xff));
    out << header;
    out << std::string(data_bytes, '\x01');
    return p;
  }

  // Expects SafetensorsReader(path) to throw an llmc::Error whose message names the file and contains `phrase`.
  void expect_rejected(const std::string& p, const std::string& phrase) {
    try {
      SafetensorsReader r(p);
      FAIL() << "accepted a corrupt file, expected: " << phrase;
    } catch (const llmc::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      EXPECT_NE(msg.find(phrase), std::string::npos) << msg;
    }
  }

};

template <class T>
std::vector<T> iota_vec(size_t n, T start) {
  std::vector<T> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

}  // namespace

TEST(Dtype, SizesAndUnknown) {
  EXPECT_EQ(llmc::dtype_size("F32"), 4u);
  EXPECT_EQ(llmc::dtype_size("BF16"), 2u);
  EXPECT_EQ(llmc::dtype_size("F16"), 2u);
  EXPECT_EQ(llmc::dtype_size("I32"), 4u);
  EXPECT_EQ(llmc::dtype_size("I64"), 8u);
  EXPECT_EQ(llmc::dtype_size("U8"), 1u);
  EXPECT_EQ(llmc::dtype_size("U16"), 2u);
  EXPECT_EQ(llmc::dtype_size("F8_E4M3"), 1u);
  EXPECT_EQ(llmc::dtype_size("F8_E5M2"), 1u);
  EXPECT_THROW(llmc::dtype_size("Q4"), llmc::Error);
  EXPECT_THROW(llmc::dtype_size("f32"), llmc::Error);
}

TEST(Dtype, HalfConversions) {
  EXPECT_EQ(llmc::bf16_bits_to_float(0x3f80), 1.0f);
  EXPECT_EQ(llmc::bf16_bits_to_float(0xc040), -3.0f);
  EXPECT_EQ(llmc::f16_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(llmc::f16_bits_to_float(0xc000), -2.0f);
  EXPECT_EQ(llmc::f16_bits_to_float(0x7bff), 65504.0f);          // largest normal
  EXPECT_EQ(llmc::f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(llmc::f16_bits_to_float(0x8200), -std::ldexp(1.0f, -15));  // negative subnormal
  EXPECT_TRUE(std::isinf(llmc::f16_bits_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(llmc::f16_bits_to_float(0x7e00)));
  EXPECT_TRUE(std::signbit(llmc::f16_bits_to_float(0x8000)));
}

TEST_F(SafetensorsTest, RoundTripAllDtypesMetadataScalarsEmpty) {
  SafetensorsWriter w;
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-20f, -7.0f};
  std::vector<uint16_t> bf16 = {0x3f80, 0xc040, 0x0000, 0x7f80};
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x0001};
  std::vector<int32_t> i32 = {-1, 2, 2147483647};
  std::vector<int64_t> i64 = {-5, int64_t(1) << 40};
  std::vector<uint8_t> u8 = {0, 1, 255};
  std::vector<uint16_t> u16 = {65535, 7};
  std::vector<uint8_t> e4m3 = {0x38, 0x7e, 0xfe, 0x00};
  std::vector<uint8_t> e5m2 = {0x3c, 0x7b};
  float scalar = 42.0f;
  w.add("f32", "F32", {2, 3}, f32.data(), f32.size() * 4);
  w.add("u8", "U8", {3}, u8.data(), u8.size());  // odd size: later tensors start unaligned
  w.add("bf16", "BF16", {4}, bf16.data(), bf16.size() * 2);
  w.add("f16", "F16", {3}, f16.data(), f16.size() * 2);
  w.add("i32", "I32", {3}, i32.data(), i32.size() * 4);
  w.add("i64", "I64", {2}, i64.data(), i64.size() * 8);
  w.add("u16", "U16", {1, 2}, u16.data(), u16.size() * 2);
  w.add("e4m3", "F8_E4M3", {2, 2}, e4m3.data(), e4m3.size());
  w.add("e5m2", "F8_E5M2", {2}, e5m2.data(), e5m2.size());
  w.add("scalar", "F32", {}, &scalar, sizeof scalar);
  w.add("empty", "F32", {0, 4}, nullptr, 0);
  w.set_metadata("format", "pt");
  w.set_metadata("step", "300");
  const std::string p = path("all.safetensors");
  w.write(p);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  SafetensorsReader r(p);
  EXPECT_EQ(r.path(), p);
  ASSERT_EQ(r.tensors().size(), 11u);
  // File order is insertion order.
  std::vector<std::string> names;
  for (const auto& e : r.tensors()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"f32", "u8", "bf16", "f16", "i32", "i64", "u16", "e4m3", "e5m2",
                                             "scalar", "empty"}));
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("step"), "300");
  // The data section starts 8-byte aligned.
  EXPECT_EQ(r.entry("f32").data_offset % 8, 0u);

  EXPECT_EQ(r.entry("f32").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r.read_as_float("f32"), f32);
  EXPECT_EQ(r.read_as_float("bf16")[1], -3.0f);
  EXPECT_TRUE(std::isinf(r.read_as_float("bf16")[3]));
  EXPECT_EQ(r.read_as_float("f16"), (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24)}));
  std::vector<int32_t> i32_back(3);
  r.read_into("i32", i32_back.data(), i32_back.size() * 4);
  EXPECT_EQ(i32_back, i32);
  std::vector<int64_t> i64_back(2);
  r.read_into("i64", i64_back.data(), 16);
  EXPECT_EQ(i64_back, i64);
  EXPECT_EQ(r.read_bytes("u8"), u8);
  std::vector<uint8_t> u16_bytes = r.read_bytes("u16");
  EXPECT_EQ(0, std::memcmp(u16_bytes.data(), u16.data(), 4));
  EXPECT_EQ(r.read_bytes("e4m3"), e4m3);
  EXPECT_EQ(r.read_bytes("e5m2"), e5m2);
  EXPECT_TRUE(r.entry("scalar").shape.empty());
  EXPECT_EQ(r.entry("scalar").nbytes, 4u);
  EXPECT_EQ(r.read_as_float("scalar"), std::vector<float>{42.0f});
  EXPECT_EQ(r.entry("empty").nbytes, 0u);
  EXPECT_TRUE(r.read_bytes("empty").empty());
  EXPECT_TRUE(r.has("f32"));
  EXPECT_FALSE(r.has("missing"));
}

TEST_F(SafetensorsTest, LargeTensorAndOverwrite) {
  const size_t n = 3u << 20;  // 12 MiB of F32
  std::vector<float> big(n);
  for (size_t i = 0; i < n; i++) big[i] = float(i % 1000003) * 0.5f;
  const std::string p = path("big.safetensors");
  {
    SafetensorsWriter w;
    float one = 1.0f;
    w.add("one", "F32", {1}, &one, 4);
    w.write(p);
  }
  {
    SafetensorsWriter w;
    w.add("big", "F32", {int64_t(n / 1024), 1024}, big.data(), n * 4);
    big[0] = -1.0f;  // the writer copied at add()
    w.write(p);      // replaces the earlier file
  }
  big[0] = 0.0f;
  SafetensorsReader r(p);
  EXPECT_FALSE(r.has("one"));
  std::vector<float> back(n);
  r.read_into("big", back.data(), n * 4);
  EXPECT_EQ(back, big);
}

TEST_F(SafetensorsTest, MovedBufferIsTaken) {
  std::vector<uint8_t> bytes = {1, 2, 3, 4};
  SafetensorsWriter w;
  w.add("x", "U8", {4}, std::move(bytes));
  w.write(path("m.safetensors"));
  EXPECT_EQ(SafetensorsReader(path("m.safetensors")).read_bytes("x"), (std::vector<uint8_t>{1, 2, 3, 4}));
}

TEST_F(SafetensorsTest, ReaderApiErrors) {
  SafetensorsWriter w;
  std::vector<int32_t> v = {1, 2};
  w.add("ints", "I32", {2}, v.data(), 8);
  const std::string p = path("api.safetensors");
  w.write(p);
  SafetensorsReader r(p);
  try {
    r.entry("nope");
    FAIL();
  } catch (const llmc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos);
  }
  std::vector<int32_t> small(1);
  EXPECT_THROW(r.read_into("ints", small.data(), 4), llmc::Error);
  EXPECT_THROW(r.read_as_float("ints"), llmc::Error);  // I32 is not a float type
  EXPECT_THROW(SafetensorsReader(path("does_not_exist.safetensors")), llmc::Error);
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  SafetensorsWriter w;
  float f[2] = {0, 0};
  w.add("a", "F32", {2}, f, 8);
  EXPECT_THROW(w.add("a", "F32", {2}, f, 8), llmc::Error);        // duplicate
  EXPECT_THROW(w.add("b", "F32", {3}, f, 8), llmc::Error);        // nbytes != prod(shape) * 4
  EXPECT_THROW(w.add("c", "F33", {2}, f, 8), llmc::Error);        // unknown dtype
  EXPECT_THROW(w.add("d", "F32", {-2}, f, 8), llmc::Error);       // negative dim
  EXPECT_THROW(w.add("", "F32", {2}, f, 8), llmc::Error);         // empty name
  EXPECT_THROW(w.add("__metadata__", "F32", {2}, f, 8), llmc::Error);
  EXPECT_THROW(w.write(path("no_such_dir/x.safetensors")), llmc::Error);
}

TEST_F(SafetensorsTest, CorruptFilesAreRejected) {
  {
    std::string p = path("short.safetensors");
    std::ofstream(p, std::ios::binary) << "abc";
    expect_rejected(p, "too short");
  }
  {
    std::string p = path("len.safetensors");
    std::ofstream out(p, std::ios::binary);
    uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
    out.close();
    expect_rejected(p, "beyond the end of the file");
  }
  expect_rejected(write_raw("notjson.safetensors", "{\"a\": [", 0), "header: invalid JSON");
  expect_rejected(write_raw("array.safetensors", "[1, 2]", 0), "not a JSON object");
  expect_rejected(write_raw("overlap.safetensors",
                            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            12),
                  "overlaps");
  expect_rejected(write_raw("gap.safetensors",
                            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                            12),
                  "gap");
  expect_rejected(write_raw("oob.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                  "out of bounds");
  expect_rejected(write_raw("trailing.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
                  "belong to no tensor");
  expect_rejected(write_raw("nbytes.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                  "need 3 elements");
  expect_rejected(write_raw("dtype.safetensors", R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8),
                  "unknown dtype 'F31'");
  expect_rejected(write_raw("dup.safetensors",
                            R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                            R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                            2),
                  "header: duplicate key 'a'");
  expect_rejected(write_raw("meta.safetensors", R"({"__metadata__":{"k":1}})", 0), "not a string");
  expect_rejected(write_raw("offs.safetensors", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
                  "data_offsets");
  expect_rejected(write_raw("negshape.safetensors", R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
                  "shape");
  expect_rejected(write_raw("backwards.safetensors", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}})", 1),
                  "end before begin");
}

TEST_F(SafetensorsTest, TruncatedWrittenFileIsRejected) {
  std::vector<float> v(100, 1.0f);
  SafetensorsWriter w;
  w.add("v", "F32", {100}, v.data(), 400);
  const std::string p = path("trunc.safetensors");
  w.write(p);
  fs::resize_file(p, fs::file_size(p) - 1);
  expect_rejected(p, "out of bounds");
}

TEST_F(SafetensorsTest, EmptyFileWithOnlyMetadata) {
  SafetensorsWriter w;
  w.set_metadata("only", "meta");
  w.write(path("meta_only.safetensors"));
  SafetensorsReader r(path("meta_only.safetensors"));
  EXPECT_TRUE(r.tensors().empty());
  EXPECT_EQ(r.metadata().at("only"), "meta");
}

// Interoperability with the python `safetensors` package (skipped when python3, numpy, ml_dtypes or safetensors is
// missing): python parses and checks a file we wrote, then writes one that we read back.
TEST_F(SafetensorsTest, PythonPackageInterop) {
  if (std::system("python3 -c 'import numpy, ml_dtypes, safetensors' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with numpy, ml_dtypes and safetensors is not available";

  const std::string ours = path("ours.safetensors");
  const std::string theirs = path("theirs.safetensors");
  std::vector<float> f32 = {1.0f, -2.5f, 3.25f, 4.0f, 5.0f, 6.0f};
  std::vector<uint16_t> bf16 = {0x3f80, 0xc040};  // 1, -3
  std::vector<uint8_t> e4m3 = {0x38};             // 1.0 in E4M3
  std::vector<int64_t> i64 = {7, -8};
  float scalar = 9.5f;
  SafetensorsWriter w;
  w.add("layer.weight", "F32", {2, 3}, f32.data(), 24);
  w.add("e4m3", "F8_E4M3", {1}, e4m3.data(), 1);
  w.add("bf16", "BF16", {2}, bf16.data(), 4);
  w.add("i64", "I64", {2}, i64.data(), 16);
  w.add("scalar", "F32", {}, &scalar, 4);
  w.add("empty", "F32", {0, 3}, nullptr, 0);
  w.set_metadata("format", "pt");
  w.write(ours);

  const std::string script = path("interop.py");
  std::ofstream(script) << R"PY(
import struct, sys
import numpy as np, ml_dtypes, safetensors
from safetensors import safe_open
from safetensors.numpy import save_file
ours, theirs = sys.argv[1], sys.argv[2]
got = {name: t for name, t in safetensors.deserialize(open(ours, "rb").read())}
def check(name, dtype, shape, array):
    t = got[name]
    assert t["dtype"] == dtype and list(t["shape"]) == shape, (name, t["dtype"], t["shape"])
    assert bytes(t["data"]) == np.ascontiguousarray(array).tobytes(), name
check("layer.weight", "F32", [2, 3], np.array([[1, -2.5, 3.25], [4, 5, 6]], np.float32))
check("bf16", "BF16", [2], np.array([1, -3], ml_dtypes.bfloat16))
check("e4m3", "F8_E4M3", [1], np.array([1], ml_dtypes.float8_e4m3fn))
check("i64", "I64", [2], np.array([7, -8], np.int64))
check("scalar", "F32", [], np.array(9.5, np.float32))
check("empty", "F32", [0, 3], np.zeros((0, 3), np.float32))
assert safe_open(ours, "numpy").metadata() == {"format": "pt"}
save_file({"w": np.arange(12, dtype=np.float32).reshape(3, 4),
           "h": np.array([0.5, -1.5], np.float16),
           "b": np.array([2, -0.25], ml_dtypes.bfloat16),
           "f8": np.array([1, -2], ml_dtypes.float8_e5m2),
           "u16": np.array([65535, 1], np.uint16),
           "s": np.array(3, np.int32),
           "z": np.zeros((2, 0), np.float32)}, theirs, metadata={"source": "python"})
)PY";
  const std::string cmd = "python3 " + script + " " + ours + " " + theirs;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "python could not read our file or write its own: " << cmd;

  SafetensorsReader r(theirs);
  EXPECT_EQ(r.metadata().at("source"), "python");
  EXPECT_EQ(r.tensors().size(), 7u);
  std::vector<float> expected_w(12);
  std::iota(expected_w.begin(), expected_w.end(), 0.0f);
  EXPECT_EQ(r.read_as_float("w"), expected_w);
  EXPECT_EQ(r.entry("w").shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(r.read_as_float("h"), (std::vector<float>{0.5f, -1.5f}));
  EXPECT_EQ(r.read_as_float("b"), (std::vector<float>{2.0f, -0.25f}));
  EXPECT_EQ(r.entry("f8").dtype, "F8_E5M2");
  EXPECT_EQ(r.read_bytes("f8"), (std::vector<uint8_t>{0x3c, 0xc0}));  // E5M2: 1.0 = 0x3c, -2.0 = 0xc0
  std::vector<uint16_t> u16(2);
  r.read_into("u16", u16.data(), 4);
  EXPECT_EQ(u16, (std::vector<uint16_t>{65535, 1}));
  int32_t s = 0;
  r.read_into("s", &s, 4);
  EXPECT_EQ(s, 3);
  EXPECT_TRUE(r.entry("s").shape.empty());
  EXPECT_EQ(r.entry("z").nbytes, 0u);
}

TEST_F(SafetensorsTest, LyingHeaderLengthsAndExtentsAllocateNothing) {
  // A header length of 2^63 - 1, and of 90 MB, in files of a few bytes: refused from the file size before the header
  // is read or allocated.
  for (uint64_t claimed : {uint64_t(INT64_MAX), uint64_t(90) << 20, uint64_t(200) << 20}) {
    const std::string p = path("lying_" + std::to_string(claimed) + ".safetensors");
    {
      std::ofstream out(p, std::ios::binary);
      for (int i = 0; i < 8; i++) out.put(char((claimed >> (8 * i)) & 0xff));
      out << "{}";
    }
    llmc_test::expect_bounded_error([&] { SafetensorsReader r(p); }, {p, "beyond the end of the file"}, 1, 64ull << 20);
  }
  // A tensor whose shape and offsets claim far more than the file holds.
  const std::string huge = write_raw("huge_tensor.safetensors",
                                     R"({"a":{"dtype":"F32","shape":[4611686018427387904],)"
                                     R"("data_offsets":[0,18446744073709551615]}})",
                                     8);
  llmc_test::expect_bounded_error([&] { SafetensorsReader r(huge); }, {huge, "out of bounds"}, 1, 64ull << 20);
  const std::string shape = write_raw("shape_overflow.safetensors",
                                      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],)"
                                      R"("data_offsets":[0,8]}})",
                                      8);
  llmc_test::expect_bounded_error([&] { SafetensorsReader r(shape); }, {shape, "invalid shape"}, 1, 64ull << 20);
  const std::string wide = write_raw("shape_wide.safetensors",
                                     R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})", 8);
  llmc_test::expect_bounded_error([&] { SafetensorsReader r(wide); }, {wide, "invalid shape"}, 1, 64ull << 20);
}

TEST_F(SafetensorsTest, HostileHeaderJson) {
  // Nesting: 100 KB of brackets in a metadata value.
  const std::string deep =
      write_raw("deep.safetensors", "{\"__metadata__\": {\"k\": " + std::string(100000, '[') + "}}", 0);
  llmc_test::expect_bounded_error([&] { SafetensorsReader r(deep); }, {deep, "header: JSON nested deeper than 64"}, 2);
  // Duplicate keys inside an entry and inside the metadata (the top level is covered above).
  expect_rejected(write_raw("dup_field.safetensors",
                            R"({"a":{"dtype":"U8","shape":[1],"dtype":"F32","data_offsets":[0,1]}})", 1),
                  "header: duplicate key 'a.dtype'");
  expect_rejected(write_raw("dup_meta.safetensors", R"({"__metadata__":{"k":"1","k":"2"}})", 0),
                  "header: duplicate key '__metadata__.k'");
  // A number that does not fit a double.
  expect_rejected(write_raw("overflow.safetensors", R"({"a":{"dtype":"U8","shape":[1e999],"data_offsets":[0,1]}})", 1),
                  "the number 1e999 of 'a.shape[0]' does not fit");
}

TEST_F(SafetensorsTest, FifosAndDirectoriesAreRefusedWithoutBlocking) {
  const std::string fifo = path("weights.safetensors");
  llmc_test::make_fifo(fifo);
  llmc_test::expect_bounded_error([&] { SafetensorsReader r(fifo); },
                                  {"safetensors file '" + fifo + "' is a FIFO (named pipe), not a regular file"}, 2);
  llmc_test::expect_bounded_error([&] { SafetensorsReader r(dir_); }, {dir_, "is a directory"}, 2);
  llmc_test::expect_bounded_error([&] { SafetensorsReader r(path("missing.safetensors")); },
                                  {"cannot open safetensors file", "missing.safetensors"}, 2);
}
