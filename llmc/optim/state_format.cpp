// llmc/optim/state_format.cpp: the table of optimizer-state formats and their host codecs (llmc/optim/state_format.h).
#include "llmc/optim/state_format.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/optim/moment_storage.cuh"

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
// Element by element through a scalar codec: BF16, and E4M3 codes on their own (the grouped storages scale them; see
// encode_grouped).
template <typename Code, Code (*encode)(float)>
void encode_each(const float* values, size_t n, void* codes) {
  Code* out = static_cast<Code*>(codes);
  for (size_t i = 0; i < n; i++) out[i] = encode(values[i]);
}
template <typename Code, float (*decode)(Code)>
void decode_each(const void* codes, size_t n, float* values) {
  const Code* in = static_cast<const Code*>(codes);
  for (size_t i = 0; i < n; i++) values[i] = decode(in[i]);
}
uint8_t e4m3_code(float x) { return e4m3_encode(x); }
float e4m3_value(uint8_t code) { return e4m3_decode(code); }

const ElementCodec& codec(MomentElement element) {
  static const ElementCodec codecs[] = {
      {MomentElement::F32, sizeof(float), "F32", encode_f32, decode_f32},
      {MomentElement::BF16, sizeof(uint16_t), "BF16", encode_each<uint16_t, bf16_encode>,
       decode_each<uint16_t, bf16_decode>},
      {MomentElement::E4M3, sizeof(uint8_t), "F8_E4M3", encode_each<uint8_t, e4m3_code>,
       decode_each<uint8_t, e4m3_value>},
  };
  for (const ElementCodec& c : codecs)
    if (c.element == element) return c;
  throw_error("internal error: unknown moment element type %d", static_cast<int>(element));
}

// A grouped moment, group by group, with the storage's own quantiser (llmc/optim/moment_storage.cuh).
template <class Storage>
void encode_grouped(const MomentStorage& st, const float* values, size_t n, void* block) {
  const MomentView view = moment_view(st, block, n, 0);
  auto* codes = static_cast<typename Storage::Code*>(view.codes);
  for (size_t g = 0, b = 0; b < n; g++, b += st.group_size)
    encode_group<Storage>(values + b, std::min(st.group_size, n - b), codes + b,
                          view.groups + g * Storage::kScalesPerGroup);
}
template <class Storage>
void decode_grouped(const MomentStorage& st, const void* block, size_t n, float* values) {
  const MomentView view = moment_view(st, const_cast<void*>(block), n, 0);
  const auto* codes = static_cast<const typename Storage::Code*>(view.codes);
  for (size_t g = 0, b = 0; b < n; g++, b += st.group_size)
    decode_group<Storage>(codes + b, view.groups + g * Storage::kScalesPerGroup, std::min(st.group_size, n - b),
                          values + b);
}

}  // namespace

MomentView moment_view(const MomentStorage& storage, void* block, size_t n, size_t offset) {
  if (offset % storage.group_size != 0 || offset > n)
    throw_error("internal error: moment offset %zu is not a group boundary (groups of %zu) inside %zu elements",
                offset, storage.group_size, n);
  uint8_t* base = static_cast<uint8_t*>(block);
  MomentView view;
  view.codes = base + storage.metadata_bytes(n) + storage.codes_bytes(offset);
  if (storage.grouped())
    view.groups = reinterpret_cast<float*>(base) + offset / storage.group_size * storage.scales_per_group;
  return view;
}

size_t MomentStorage::code_bytes() const { return codec(element).bytes; }
const char* MomentStorage::safetensors_dtype() const { return codec(element).dtype; }

size_t StateFormat::shard_alignment() const { return std::lcm(m.group_size, v.group_size); }

const std::vector<StateFormat>& state_formats() {
  static const std::vector<StateFormat> formats = {
      {StateFormat::Id::FP32, "fp32", {MomentElement::F32, 1, 0}, {MomentElement::F32, 1, 0}},
      {StateFormat::Id::BF16, "bf16", {MomentElement::BF16, 1, 0}, {MomentElement::BF16, 1, 0}},
      {StateFormat::Id::FP8, "fp8",
       {MomentElement::E4M3, kMomentGroupSize, Fp8Moments::kScalesPerGroup, MomentScaling::GroupMax},
       {MomentElement::E4M3, kMomentGroupSize, Fp8Moments::kScalesPerGroup, MomentScaling::GroupMax}},
      {StateFormat::Id::FP8_EXPAND, "fp8_expand",
       {MomentElement::E4M3, kMomentGroupSize, Fp8ExpandMoments::kScalesPerGroup, MomentScaling::RangeExpansion},
       {MomentElement::E4M3, kMomentGroupSize, Fp8ExpandMoments::kScalesPerGroup, MomentScaling::RangeExpansion}},
  };
  return formats;
}

static const StateFormat& state_format_by_id(StateFormat::Id id) {
  for (const StateFormat& f : state_formats())
    if (f.id == id) return f;
  throw_error("internal error: state format %d is not in state_formats()", static_cast<int>(id));
}
const StateFormat& StateFormat::fp32() { return state_format_by_id(Id::FP32); }
const StateFormat& StateFormat::bf16() { return state_format_by_id(Id::BF16); }
const StateFormat& StateFormat::fp8() { return state_format_by_id(Id::FP8); }
const StateFormat& StateFormat::fp8_expand() { return state_format_by_id(Id::FP8_EXPAND); }

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

namespace {
// The one switch over moment scalings: plain() for ungrouped storage, grouped(Storage{}) with the grouped codec type.
template <class Plain, class Grouped>
void dispatch_scaling(const MomentStorage& storage, Plain&& plain, Grouped&& grouped) {
  switch (storage.scaling) {
    case MomentScaling::None: plain(); return;
    case MomentScaling::GroupMax: grouped(Fp8Moments{}); return;
    case MomentScaling::RangeExpansion: grouped(Fp8ExpandMoments{}); return;
  }
  throw_error("internal error: unknown moment scaling %d", static_cast<int>(storage.scaling));
}
}  // namespace

void encode_moment(const MomentStorage& storage, const float* values, size_t n, void* block) {
  dispatch_scaling(
      storage, [&] { codec(storage.element).encode(values, n, block); },
      [&](auto kind) { encode_grouped<decltype(kind)>(storage, values, n, block); });
}

void decode_moment(const MomentStorage& storage, const void* block, size_t n, float* values) {
  dispatch_scaling(
      storage, [&] { codec(storage.element).decode(block, n, values); },
      [&](auto kind) { decode_grouped<decltype(kind)>(storage, block, n, values); });
}

}  // namespace llmc
