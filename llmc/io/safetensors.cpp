// llmc/io/safetensors.cpp: implementation of the safetensors reader (validate the header, pread tensor data) and the atomic
// writer. Format description in safetensors.h.
#include "llmc/io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/core/file_io.h"
#include "llmc/core/input_safety.h"

namespace llmc {

using json = nlohmann::json;

namespace {

constexpr size_t kHeaderLengthBytes = 8;               // the u64 N at the start of the file
constexpr size_t kMaxHeaderBytes = 100u * 1024 * 1024;  // same limit as the python package
constexpr size_t kHeaderAlignment = 8;                  // data section starts at a multiple of 8 bytes
const char* const kMetadataKey = "__metadata__";

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void write_all(int fd, const void* data, size_t nbytes, const std::string& path) {
  const IoResult written = write_fully(fd, data, nbytes);
  if (!written.ok())
    throw_error("safetensors: cannot write %s: %s (hint: is the disk full?)", path.c_str(), written.what());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some file systems do not allow opening directories
  ::fsync(fd);
  ::close(fd);
}

void check_tensor_name(const std::string& name, const char* where) {
  if (name.empty()) throw_error("safetensors: %s: empty tensor name", where);
  if (name == kMetadataKey) throw_error("safetensors: %s: '%s' is reserved for metadata", where, kMetadataKey);
}

}  // namespace

// ----------------------------------------------------------------------------------------------------------------
// dtypes and element conversions

size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},     {"BF16", 2},    {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},      {"U64", 8},     {"U32", 4},     {"U16", 2},     {"U8", 1},
      {"BOOL", 1}};
  auto it = sizes.find(dtype);
  if (it == sizes.end())
    throw_error("safetensors: unknown dtype '%s' (known: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 "
                "U8 BOOL)",
                dtype.c_str());
  return it->second;
}

size_t shape_numel(const std::vector<int64_t>& shape) {
  size_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) throw_error("safetensors: negative dimension %lld in a tensor shape", (long long)d);
    if (d != 0 && numel > std::numeric_limits<size_t>::max() / size_t(d))
      throw_error("safetensors: tensor shape overflows the element count");
    numel *= size_t(d);
  }
  return numel;
}

float bf16_bits_to_float(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

float f16_bits_to_float(uint16_t bits) {
  uint32_t sign = uint32_t(bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  uint32_t u;
  if (exponent == 0x1f) {  // inf / nan
    u = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    u = sign;
  } else {  // subnormal: mantissa * 2^-24, exact in float
    float f = float(mantissa) * 5.9604644775390625e-8f;
    std::memcpy(&u, &f, sizeof u);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ----------------------------------------------------------------------------------------------------------------
// Reader

struct SafetensorsReader::File {
  int fd = -1;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path), file_(std::make_shared<File>()) {
  const char* p = path.c_str();
  uint64_t size = 0;
  file_->fd = open_regular_file(path, "safetensors file", &size);
  const size_t file_size = size_t(size);

  if (file_size < kHeaderLengthBytes)
    throw_error("safetensors: %s is too short (%zu bytes; a safetensors file starts with an 8-byte header length)", p,
                file_size);
  uint8_t length_bytes[kHeaderLengthBytes];
  read_at(0, length_bytes, kHeaderLengthBytes, "header length");
  uint64_t header_len = 0;
  for (size_t i = 0; i < kHeaderLengthBytes; i++) header_len |= uint64_t(length_bytes[i]) << (8 * i);
  if (header_len > file_size - kHeaderLengthBytes)
    throw_error("safetensors: %s: header length %llu goes beyond the end of the file (%zu bytes): truncated or not a "
                "safetensors file",
                p, (unsigned long long)header_len, file_size);
  if (header_len > kMaxHeaderBytes)
    throw_error("safetensors: %s: header length %llu exceeds the %zu-byte limit", p, (unsigned long long)header_len,
                kMaxHeaderBytes);

  std::string header(header_len, '\0');
  read_at(kHeaderLengthBytes, header.data(), header_len, "header");
  const size_t data_start = kHeaderLengthBytes + header_len;
  const size_t data_size = file_size - data_start;

  // Parse with the nesting limit, refusing a name (or any key) given twice: nlohmann would keep the last one.
  const json j = parse_json(header, "safetensors: " + path + ": header");
  if (!j.is_object()) throw_error("safetensors: %s: header is not a JSON object", p);

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) throw_error("safetensors: %s: %s is not an object", p, kMetadataKey);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw_error("safetensors: %s: metadata value of '%s' is not a string", p, m.key().c_str());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) throw_error("safetensors: %s: entry '%s' is not an object", p, name.c_str());
    if (!v.contains("dtype") || !v["dtype"].is_string())
      throw_error("safetensors: %s: tensor '%s' has no string 'dtype'", p, name.c_str());
    if (!v.contains("shape") || !v["shape"].is_array())
      throw_error("safetensors: %s: tensor '%s' has no 'shape' array", p, name.c_str());
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      throw_error("safetensors: %s: tensor '%s' needs 'data_offsets': [begin, end]", p, name.c_str());
    TensorEntry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    size_t elem_size;
    try {
      elem_size = dtype_size(e.dtype);
    } catch (const Error&) {
      throw_error("safetensors: %s: tensor '%s' has unknown dtype '%s'", p, name.c_str(), e.dtype.c_str());
    }
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned())
        throw_error("safetensors: %s: tensor '%s' has a shape entry that is not a non-negative integer", p, name.c_str());
      e.shape.push_back(d.get<int64_t>());
    }
    const json& offsets = v["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      throw_error("safetensors: %s: tensor '%s' has data_offsets that are not non-negative integers", p, name.c_str());
    uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (end < begin)
      throw_error("safetensors: %s: tensor '%s' has data_offsets [%llu, %llu] with end before begin", p, name.c_str(),
                  (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
      throw_error("safetensors: %s: tensor '%s' data_offsets [%llu, %llu] are out of bounds (data section is %zu "
                  "bytes): file truncated?",
                  p, name.c_str(), (unsigned long long)begin, (unsigned long long)end, data_size);
    size_t numel;
    try {
      numel = shape_numel(e.shape);
    } catch (const Error&) {
      throw_error("safetensors: %s: tensor '%s' has an invalid shape", p, name.c_str());
    }
    e.nbytes = size_t(end - begin);
    if (numel > std::numeric_limits<size_t>::max() / elem_size || numel * elem_size != e.nbytes)
      throw_error("safetensors: %s: tensor '%s' has %zu bytes but its shape and dtype %s need %zu elements x %zu bytes",
                  p, name.c_str(), e.nbytes, e.dtype.c_str(), numel, elem_size);
    e.data_offset = data_start + size_t(begin);
    tensors_.push_back(std::move(e));
  }

  // The entries must tile the data section: sorted by offset, each begins where the previous ended.
  std::stable_sort(tensors_.begin(), tensors_.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.data_offset != b.data_offset ? a.data_offset < b.data_offset : a.nbytes < b.nbytes;
  });
  size_t expected = data_start;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& e : tensors_) {
    if (e.data_offset < expected)
      throw_error("safetensors: %s: tensor '%s' overlaps tensor '%s'", p, e.name.c_str(),
                  previous ? previous->name.c_str() : "?");
    if (e.data_offset > expected)
      throw_error("safetensors: %s: gap of %zu bytes in the data section before tensor '%s'", p,
                  e.data_offset - expected, e.name.c_str());
    expected = e.data_offset + e.nbytes;
    previous = &e;
  }
  if (expected != file_size)
    throw_error("safetensors: %s: %zu bytes at the end of the data section belong to no tensor", p,
                file_size - expected);
  for (size_t i = 0; i < tensors_.size(); i++) index_[tensors_[i].name] = i;
}

void SafetensorsReader::read_at(size_t offset, void* dst, size_t nbytes, const std::string& what) const {
  const IoResult r = pread_fully(file_->fd, dst, nbytes, offset);
  if (r.ended)
    throw_error("safetensors: %s: unexpected end of file while reading %s (file truncated after opening?)",
                path_.c_str(), what.c_str());
  if (!r.ok()) throw_error("safetensors: %s: read error in %s: %s", path_.c_str(), what.c_str(), r.what());
}

const std::vector<TensorEntry>& SafetensorsReader::tensors() const { return tensors_; }

bool SafetensorsReader::has(const std::string& name) const { return index_.count(name) != 0; }

const TensorEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw_error("safetensors: %s has no tensor '%s' (it has %zu tensors)", path_.c_str(), name.c_str(),
                tensors_.size());
  return tensors_[it->second];
}

std::vector<uint8_t> SafetensorsReader::read_bytes(const std::string& name) const {
  const TensorEntry& e = entry(name);
  std::vector<uint8_t> bytes(e.nbytes);
  read_at(e.data_offset, bytes.data(), e.nbytes, "tensor '" + name + "'");
  return bytes;
}

void SafetensorsReader::read_into(const std::string& name, void* dst, size_t nbytes) const {
  const TensorEntry& e = entry(name);
  if (nbytes != e.nbytes)
    throw_error("safetensors: %s: tensor '%s' has %zu bytes (%s), but the destination holds %zu bytes", path_.c_str(),
                name.c_str(), e.nbytes, e.dtype.c_str(), nbytes);
  read_at(e.data_offset, dst, nbytes, "tensor '" + name + "'");
}

void SafetensorsReader::read_range(const std::string& name, size_t byte_offset, void* dst, size_t nbytes) const {
  const TensorEntry& e = entry(name);
  if (byte_offset > e.nbytes || nbytes > e.nbytes - byte_offset)
    throw_error("safetensors: %s: bytes [%zu, %zu) are outside tensor '%s' (%zu bytes)", path_.c_str(), byte_offset,
                byte_offset + nbytes, name.c_str(), e.nbytes);
  read_at(e.data_offset + byte_offset, dst, nbytes, "tensor '" + name + "'");
}

std::vector<float> SafetensorsReader::read_as_float(const std::string& name) const {
  const TensorEntry& e = entry(name);
  const size_t numel = e.nbytes / dtype_size(e.dtype);
  std::vector<float> out(numel);
  if (e.dtype == "F32") {
    read_at(e.data_offset, out.data(), e.nbytes, "tensor '" + name + "'");
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    std::vector<uint16_t> bits(numel);
    read_at(e.data_offset, bits.data(), e.nbytes, "tensor '" + name + "'");
    const bool is_bf16 = e.dtype == "BF16";
    for (size_t i = 0; i < numel; i++) out[i] = is_bf16 ? bf16_bits_to_float(bits[i]) : f16_bits_to_float(bits[i]);
  } else {
    throw_error("safetensors: %s: tensor '%s' has dtype %s; read_as_float handles F32, BF16 and F16 (use read_bytes)",
                path_.c_str(), name.c_str(), e.dtype.c_str());
  }
  return out;
}

const std::map<std::string, std::string>& SafetensorsReader::metadata() const { return metadata_; }

const std::string& SafetensorsReader::path() const { return path_; }

// ----------------------------------------------------------------------------------------------------------------
// Writer

void SafetensorsWriter::add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                            const void* data, size_t nbytes) {
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  if (nbytes > 0 && data == nullptr) throw_error("safetensors: tensor '%s': null data for %zu bytes", name.c_str(), nbytes);
  add(name, dtype, std::move(shape), std::vector<uint8_t>(bytes, bytes + nbytes));
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t>&& data) {
  check_tensor_name(name, "add");
  for (const Pending& t : tensors_)
    if (t.name == name) throw_error("safetensors: tensor '%s' added twice", name.c_str());
  const size_t elem_size = dtype_size(dtype);
  const size_t numel = shape_numel(shape);
  if (numel * elem_size != data.size())
    throw_error("safetensors: tensor '%s': %zu bytes given but shape and dtype %s need %zu", name.c_str(), data.size(),
                dtype.c_str(), numel * elem_size);
  tensors_.push_back(Pending{name, dtype, std::move(shape), std::move(data)});
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

void SafetensorsWriter::write(const std::string& path) const {
  // Header: metadata first, then tensors in insertion order with contiguous offsets.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header[kMetadataKey] = meta;
  }
  size_t offset = 0;
  for (const Pending& t : tensors_) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = t.dtype;
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.data.size()};
    header[t.name] = entry;
    offset += t.data.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw_error("safetensors: cannot write %s: a tensor name or metadata string is not valid UTF-8 (%s)", path.c_str(),
                e.what());
  }
  text.append(round_up(kHeaderLengthBytes + text.size(), kHeaderAlignment) - kHeaderLengthBytes - text.size(), ' ');
  uint8_t length_bytes[kHeaderLengthBytes];
  for (size_t i = 0; i < kHeaderLengthBytes; i++) length_bytes[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  const std::string tmp_path = path + ".tmp";
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw_error("safetensors: cannot create %s: %s (hint: does the directory exist and is it writable?)",
                tmp_path.c_str(), std::strerror(errno));
  try {
    write_all(fd, length_bytes, kHeaderLengthBytes, tmp_path);
    write_all(fd, text.data(), text.size(), tmp_path);
    for (const Pending& t : tensors_) write_all(fd, t.data.data(), t.data.size(), tmp_path);
    if (::fsync(fd) != 0) throw_error("safetensors: fsync of %s failed: %s", tmp_path.c_str(), std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp_path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp_path.c_str());
    throw_error("safetensors: closing %s failed: %s", tmp_path.c_str(), std::strerror(errno));
  }
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_path.c_str());
    throw_error("safetensors: cannot rename %s to %s: %s", tmp_path.c_str(), path.c_str(), std::strerror(err));
  }
  fsync_dir(parent_dir(path));
}

}  // namespace llmc
