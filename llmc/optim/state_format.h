// llmc/optim/state_format.h: how the AdamW moments m and v are stored, as a value chosen at run time
// (optimizer.state_format). This one description drives the optimizer's allocation (llmc/optim/adamw.h), the choice of
// the update kernel's instantiation (llmc/optim/adamw_update.h, its only dispatch point), the checkpoint tensors and
// their dtype (llmc/io/optimizer_files) and the conversion of a checkpoint's moments to the run's format on load.
// Host code only.
//
// A moment is stored as codes of one element type, in groups of `group_size` consecutive elements of the flat
// parameter buffer that share `scales_per_group` FP32 metadata values. An element-wise format has group_size 1 and no
// metadata; a grouped format can only be cut at group boundaries: shard_alignment() is the element alignment every
// owned range and every shard boundary must have. Groups are counted from element 0 of the flat buffer, so a range
// that starts on a group boundary holds whole groups, except that the last group of the buffer may be partial.
//
// The storage of n elements of one moment is one byte block (MomentStorage::bytes(n)), laid out as
//   [metadata: num_groups(n) groups x scales_per_group FP32 values][codes: n codes of code_bytes() each]
// (element-wise formats: the codes only, exactly the FP32 / BF16 arrays of the builds before grouped formats).
// moment_view() gives the two pointers of the elements from a group-aligned offset on.
//
//   fp32        m and v in FP32: the default, and the bits of every run before the key existed
//   bf16        m and v in BF16, rounded to nearest even after every update (the update itself runs in FP32)
//   fp8         m and v as E4M3 codes in groups of 128 with one FP32 scale per group, s = (max|x| + 1e-20) / 448,
//               x = code * s (COAT's per-group baseline)
//   fp8_expand  m and v as E4M3 codes in groups of 128 with COAT's Dynamic Range Expansion: per group a scale s, an
//               exponent k and a centre c (three FP32 values), x = sign(q s) |q s|^(1/k) c
// The quantisers of the two FP8 formats (the exact formulas, the clamp of k, what a zero / constant group stores) are
// llmc/optim/moment_storage.cuh: the one copy the update kernel, the host codecs below and the CPU reference use.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace llmc {

enum class MomentElement { F32, BF16, E4M3 };
// How a grouped moment's metadata scales its codes (llmc/optim/moment_storage.cuh has the formulas).
enum class MomentScaling {
  None,            // element-wise: the codes are the values
  GroupMax,        // one scale per group from max|x| (fp8)
  RangeExpansion,  // scale, exponent k and centre c per group (fp8_expand: COAT's Dynamic Range Expansion)
};

// Elements per group of the grouped formats (COAT's G).
constexpr size_t kMomentGroupSize = 128;

// Where the elements of one moment lie from some group-aligned offset on: their codes and (grouped formats) the
// metadata of their groups, scales_per_group floats per group.
struct MomentView {
  void* codes = nullptr;
  float* groups = nullptr;  // nullptr for element-wise formats
};

// The storage of one moment.
struct MomentStorage {
  MomentElement element = MomentElement::F32;
  size_t group_size = 1;     // consecutive elements sharing the scale metadata (1: element-wise)
  int scales_per_group = 0;  // FP32 metadata values per group (0: none)
  MomentScaling scaling = MomentScaling::None;

  bool grouped() const { return scales_per_group > 0; }
  size_t code_bytes() const;  // bytes of one element's code
  size_t num_groups(size_t n) const { return grouped() ? (n + group_size - 1) / group_size : 0; }
  size_t metadata_bytes(size_t n) const { return num_groups(n) * static_cast<size_t>(scales_per_group) * 4; }
  size_t codes_bytes(size_t n) const { return n * code_bytes(); }
  // Everything n elements of this moment take (the metadata included): what to allocate, copy and count as memory.
  size_t bytes(size_t n) const { return metadata_bytes(n) + codes_bytes(n); }
  const char* safetensors_dtype() const;  // the dtype of its codes' checkpoint tensor: "F32", "BF16", "F8_E4M3"
};

// The codes and group metadata of the elements [offset, n) of the storage block `block` of n elements (layout at the
// top of this file). offset must be a multiple of the group size (llmc::Error otherwise).
MomentView moment_view(const MomentStorage& storage, void* block, size_t n, size_t offset);

struct StateFormat {
  enum class Id { FP32, BF16, FP8, FP8_EXPAND };
  Id id = Id::FP32;
  const char* name = "fp32";  // the value of optimizer.state_format
  MomentStorage m, v;

  // The element alignment the format needs of owned ranges and shard boundaries (1 for element-wise formats).
  size_t shard_alignment() const;
  bool operator==(const StateFormat& o) const { return id == o.id; }
  bool operator!=(const StateFormat& o) const { return id != o.id; }

  static const StateFormat& fp32();  // the default
  static const StateFormat& bf16();
  static const StateFormat& fp8();
  static const StateFormat& fp8_expand();
};

// Every format of this build, the default first.
const std::vector<StateFormat>& state_formats();
std::vector<std::string> state_format_names();
// The format named `name`: nullptr when this build has none (find), llmc::Error naming optimizer.state_format and the
// valid names (parse).
const StateFormat* find_state_format(const std::string& name);
const StateFormat& parse_state_format(const std::string& name);

// Host codecs of one moment: n values to / from its storage block of bytes(n) (bf16: round to nearest even, as the
// update kernel rounds; the FP8 formats: each group of 128 fitted and quantised exactly as the update kernel does
// after its update, the values being finite). The groups start at element 0 of `values`.
void encode_moment(const MomentStorage& storage, const float* values, size_t n, void* block);
void decode_moment(const MomentStorage& storage, const void* block, size_t n, float* values);

}  // namespace llmc
