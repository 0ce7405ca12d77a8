// llmc/optim/state_format.h: how the AdamW moments m and v are stored, as a value chosen at run time
// (optimizer.state_format). This one description drives the optimizer's allocation (llmc/optim/adamw.h), the choice of
// the update kernel's instantiation (llmc/optim/adamw_update.h, its only dispatch point), the checkpoint tensors and
// their dtype (llmc/io/optimizer_files) and the conversion of a checkpoint's moments to the run's format on load.
// Host code only.
//
// A moment is stored as codes of one element type, in groups of `group_size` consecutive elements of the flat
// parameter buffer that share `scales_per_group` FP32 metadata values. The formats of this build are element-wise
// (group_size 1, no metadata); a grouped format (COAT: E4M3 codes in groups of 128 with scale, expansion exponent and
// centre per group, reference/fp8_recipes.md §1.1) is one more table entry, its element type, its kernel storage
// (llmc/optim/moment_storage.cuh) and its host codec, and it can only be cut at group boundaries: shard_alignment()
// is the element alignment every owned range and every shard boundary must have.
//
//   fp32   m and v in FP32: the default, and the bits of every run before the key existed
//   bf16   m and v in BF16, rounded to nearest even after every update (the update itself runs in FP32)
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace llmc {

enum class MomentElement { F32, BF16 };

// The storage of one moment.
struct MomentStorage {
  MomentElement element = MomentElement::F32;
  size_t group_size = 1;     // consecutive elements sharing the scale metadata (1: element-wise)
  int scales_per_group = 0;  // FP32 metadata values per group (0: none)

  size_t code_bytes() const;              // bytes of one element's code
  size_t bytes(size_t n) const { return n * code_bytes(); }  // codes of n elements
  const char* safetensors_dtype() const;  // the dtype of its checkpoint tensor: "F32", "BF16"
};

struct StateFormat {
  enum class Id { FP32, BF16 };
  Id id = Id::FP32;
  const char* name = "fp32";  // the value of optimizer.state_format
  MomentStorage m, v;

  // The element alignment the format needs of owned ranges and shard boundaries (1 for element-wise formats).
  size_t shard_alignment() const;
  bool operator==(const StateFormat& o) const { return id == o.id; }
  bool operator!=(const StateFormat& o) const { return id != o.id; }

  static const StateFormat& fp32();  // the default
  static const StateFormat& bf16();
};

// Every format of this build, the default first.
const std::vector<StateFormat>& state_formats();
std::vector<std::string> state_format_names();
// The format named `name`: nullptr when this build has none (find), llmc::Error naming optimizer.state_format and the
// valid names (parse).
const StateFormat* find_state_format(const std::string& name);
const StateFormat& parse_state_format(const std::string& name);

// Host codecs of one moment: n values to / from its stored codes (bf16: round to nearest even, as the update kernel
// rounds). For the element-wise formats of this build; a grouped format adds its metadata here.
void encode_moment(const MomentStorage& storage, const float* values, size_t n, void* codes);
void decode_moment(const MomentStorage& storage, const void* codes, size_t n, float* values);

}  // namespace llmc
