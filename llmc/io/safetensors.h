// llmc/io/safetensors.h: our own reader and writer of the safetensors format (no third-party code).
//
// File layout (all integers little-endian):
//   u64 N                      length of the JSON header in bytes
//   N bytes of JSON            {"name": {"dtype": "F32", "shape": [768, 3072], "data_offsets": [begin, end]}, ...,
//                               "__metadata__": {"key": "value", ...}}   (metadata values are strings)
//                              padded with spaces so that the data section starts at a multiple of 8 bytes
//   data section               the tensors' bytes, row-major; data_offsets are relative to the start of this section
//
// The reader validates the whole header up front: the path is a regular file (a FIFO is refused, never opened for
// reading), the file is long enough for the header length it states (checked before the header is read or allocated,
// and at most 100 MB), the header parses (nesting at most 64 levels, no key twice at any depth), every entry has a
// known dtype, nbytes == prod(shape) * dtype_size, and the entries tile the data section exactly (no overlaps, no gaps,
// nothing out of bounds). Every problem is an llmc::Error that names the file.
// Tensor data is read on demand with pread; read_into reads straight into the caller's buffer (no second copy), so
// multi-GB checkpoints are never held twice in memory.
//
// The writer keeps tensors in insertion order (that is the "file order" of the written file), copies the data at
// add() time (or takes ownership of a moved-in buffer), and writes atomically: path + ".tmp", fsync, rename, fsync of
// the parent directory. Files written here load with the python `safetensors` package and vice versa.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace llmc {

struct TensorEntry {
  std::string name;
  std::string dtype;            // "F32", "BF16", "F16", "I32", "I64", "U8", "U16", "F8_E4M3", "F8_E5M2", ...
  std::vector<int64_t> shape;   // empty = scalar (one element)
  size_t data_offset;           // absolute byte offset of the tensor's data in the file
  size_t nbytes;                // prod(shape) * dtype_size(dtype)
};

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);  // validates everything; llmc::Error naming the file on any problem
  const std::vector<TensorEntry>& tensors() const;      // in file order (ascending data offset)
  bool has(const std::string& name) const;
  const TensorEntry& entry(const std::string& name) const;  // llmc::Error naming tensor and file if absent
  std::vector<uint8_t> read_bytes(const std::string& name) const;
  void read_into(const std::string& name, void* dst, size_t nbytes) const;  // nbytes must equal the entry's
  // Bytes [byte_offset, byte_offset + nbytes) of a tensor's data (a slice of a flat tensor, e.g. one rank's range
  // of an optimizer shard); llmc::Error when the range goes past the tensor.
  void read_range(const std::string& name, size_t byte_offset, void* dst, size_t nbytes) const;
  std::vector<float> read_as_float(const std::string& name) const;  // F32/BF16/F16 → float
  const std::map<std::string, std::string>& metadata() const;
  const std::string& path() const;

 private:
  struct File;                   // the open file descriptor, shared by copies of the reader
  std::string path_;
  std::shared_ptr<File> file_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
  void read_at(size_t offset, void* dst, size_t nbytes, const std::string& what) const;
};

class SafetensorsWriter {
 public:
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, const void* data, size_t nbytes);
  // Same, taking ownership of the buffer (avoids a copy of large host tensors).
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, std::vector<uint8_t>&& data);
  void set_metadata(const std::string& key, const std::string& value);
  void write(const std::string& path) const;  // atomic: write path + ".tmp", fsync, rename; data copied at add()

 private:
  struct Pending {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

size_t dtype_size(const std::string& dtype);  // bytes per element; llmc::Error for unknown dtypes

// Number of elements of a shape (1 for a scalar); llmc::Error for negative dimensions or overflow.
size_t shape_numel(const std::vector<int64_t>& shape);

// Element conversions used by read_as_float (exposed for tests and other modules).
float bf16_bits_to_float(uint16_t bits);
float f16_bits_to_float(uint16_t bits);

}  // namespace llmc
