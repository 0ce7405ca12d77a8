// llmc/optim/state_format.cpp: the table of optimizer-state formats and their host codecs (llmc/optim/state_format.h).
#include "llmc/optim/state_format.h"

#include <cstdint>
#include <cstring>
#include <numeric>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"

namespace llmc {

namespace {

// What one element type is on the host: its code size, its checkpoint dtype and its codec.
struct ElementCodec {
  MomentElement element;
  size_t bytes;
  const char* dtype;
  void (*encode)(const float* values, size_t n, void* codes);
  void (*decode)(const void* codes, size_t n, float* values);
};

void encode_f32(const float* values, size_t n, void* codes) { std::memcpy(codes, values, n * sizeof(float)); }
void decode_f32(const void* codes, size_t n, float* values) { std::memcpy(values, codes, n * sizeof(float)); }
void encode_bf16(const float* values, size_t n, void* codes) {
  uint16_t* out = static_cast<uint16_t*>(codes);
  for (size_t i = 0; i < n; i++) out[i] = bf16_encode(values[i]);
}
void decode_bf16(const void* codes, size_t n, float* values) {
  const uint16_t* in = static_cast<const uint16_t*>(codes);
  for (size_t i = 0; i < n; i++) values[i] = bf16_decode(in[i]);
}

const ElementCodec& codec(MomentElement element) {
  static const ElementCodec codecs[] = {
      {MomentElement::F32, sizeof(float), "F32", encode_f32, decode_f32},
      {MomentElement::BF16, sizeof(uint16_t), "BF16", encode_bf16, decode_bf16},
  };
  for (const ElementCodec& c : codecs)
    if (c.element == element) return c;
  throw_error("internal error: unknown moment element type %d", static_cast<int>(element));
}

}  // namespace

size_t MomentStorage::code_bytes() const { return codec(element).bytes; }
const char* MomentStorage::safetensors_dtype() const { return codec(element).dtype; }

size_t StateFormat::shard_alignment() const { return std::lcm(m.group_size, v.group_size); }

const std::vector<StateFormat>& state_formats() {
  static const std::vector<StateFormat> formats = {
      {StateFormat::Id::FP32, "fp32", {MomentElement::F32, 1, 0}, {MomentElement::F32, 1, 0}},
      {StateFormat::Id::BF16, "bf16", {MomentElement::BF16, 1, 0}, {MomentElement::BF16, 1, 0}},
  };
  return formats;
}

const StateFormat& StateFormat::fp32() { return state_formats()[0]; }
const StateFormat& StateFormat::bf16() { return state_formats()[1]; }

std::vector<std::string> state_format_names() {
  std::vector<std::string> names;
  for (const StateFormat& f : state_formats()) names.push_back(f.name);
  return names;
}

const StateFormat* find_state_format(const std::string& name) {
  for (const StateFormat& f : state_formats())
    if (name == f.name) return &f;
  return nullptr;
}

const StateFormat& parse_state_format(const std::string& name) {
  if (const StateFormat* f = find_state_format(name)) return *f;
  std::string valid;
  for (const StateFormat& f : state_formats()) valid += std::string(valid.empty() ? "" : ", ") + f.name;
  throw_error("optimizer.state_format = '%s' is not a state format of this build: use one of %s", name.c_str(),
              valid.c_str());
}

void encode_moment(const MomentStorage& storage, const float* values, size_t n, void* codes) {
  codec(storage.element).encode(values, n, codes);
}

void decode_moment(const MomentStorage& storage, const void* codes, size_t n, float* values) {
  codec(storage.element).decode(codes, n, values);
}

}  // namespace llmc
