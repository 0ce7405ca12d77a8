// llmc/precision/precision_state.cu: PrecisionState (llmc/precision/precision_state.h): the model-wide per-tensor
// scaling slots, amax histories, the shared quantised scratch and the numerics telemetry.
#include "llmc/precision/precision_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "llmc/core/common.h"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/linear.h"

namespace llmc {

namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

PrecisionState::PrecisionState(const PrecisionRecipe& recipe, DeviceMemory memory)
    : recipe_(recipe), memory_(memory) {
  history_len_ = keeps_amax_history(recipe_) ? recipe_.amax_history_len : 1;
  scratch_bytes_.assign(kScratchCount, 0);
  scratch_floats_.assign(kScratchCount, 0);
}

PrecisionState::~PrecisionState() {
  if (device_memory_) cudaFree(device_memory_);
  if (numerics_) cudaFree(numerics_);
}

int PrecisionState::add(Linear* linear) {
  if (allocated_) throw_error("PrecisionState: linear %s registered after the first forward", linear->name().c_str());
  linears_.push_back(linear);
  return static_cast<int>(linears_.size()) - 1;
}

void PrecisionState::set_random_stream(uint64_t seed, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw_error("PrecisionState: rank %d of %d ranks", rank, world_size);
  seed_ = seed;
  rank_ = rank;
  world_size_ = world_size;
}

void PrecisionState::begin_step(long long step) {
  if (step < 0) throw_error("PrecisionState: step %lld", step);
  step_ = step;
  micro_ = -1;
}

StochasticKey PrecisionState::stochastic_key(int index, LinearRole role) const {
  // tensor = ((micro * world_size + rank) * linears + index) * 3 + role, unique within a step; it wraps only past
  // 2^32 / (3 * linears * world_size) micro-steps of one step. The step itself is the key's own word.
  constexpr uint64_t kRoles = 3;
  const uint64_t micro = static_cast<uint64_t>(std::max<long long>(micro_, 0));
  const uint64_t stream = (micro * world_size_ + rank_) * linears_.size() + static_cast<uint64_t>(index);
  StochasticKey key;
  key.seed = seed_;
  key.step = static_cast<uint32_t>(step_);
  key.tensor = static_cast<uint32_t>(stream * kRoles + static_cast<uint64_t>(role));
  return key;
}

uint32_t PrecisionState::hadamard_signs(int size) const {
  StochasticKey key;
  key.seed = seed_;
  key.step = 0;
  key.tensor = 0xffffffffu;  // a stream of its own: no rounding key reaches it within a step's first 2^32 - 1 numbers
  return random_signs(key, size);
}

uint32_t PrecisionState::rotation_signs(int index, LinearRole role, int size) const {
  return random_signs(stochastic_key(index, role), size);
}

int PrecisionState::new_slot(const std::string& name, ElementFormat f) {
  if (allocated_) throw_error("PrecisionState: slot %s registered after the first forward", name.c_str());
  slot_names_.push_back(name);
  slot_formats_.push_back(static_cast<uint8_t>(f));
  return static_cast<int>(slot_names_.size()) - 1;
}

void PrecisionState::reserve(int which, size_t bytes, size_t scale_floats) {
  scratch_bytes_[which] = std::max(scratch_bytes_[which], bytes);
  scratch_floats_[which] = std::max(scratch_floats_[which], scale_floats);
}

// One allocation: slot arrays (scale, scale_inv, amax, temp amax), formats, the histories, and the scratch buffers.
PrecisionState::Layout PrecisionState::layout() const {
  const size_t np = padded_slots();
  Layout o;
  auto take = [&](size_t b) {
    const size_t at = o.bytes;
    o.bytes += align256(std::max<size_t>(b, 1));
    return at;
  };
  o.scale = take(np * sizeof(float));
  o.scale_inv = take(np * sizeof(float));
  o.amax = take(np * sizeof(float));
  o.formats = take(np);
  o.history = take(np * (size_t)history_len_ * sizeof(float));
  o.slot_bytes = o.bytes;
  o.scratch.resize(kScratchCount);
  o.scales.resize(kScratchCount);
  for (int i = 0; i < kScratchCount; i++) {
    o.scratch[i] = take(scratch_bytes_[i]);
    o.scales[i] = take(scratch_floats_[i] * sizeof(float));
  }
  return o;
}

void PrecisionState::ensure_allocated() {
  if (allocated_) return;
  if (!allocates())
    throw_error("internal error: the precision state of a memory plan (DeviceMemory::Count) cannot run a forward");
  allocated_ = true;
  const size_t n = slot_names_.size(), np = padded_slots();
  const Layout o = layout();
  CUDA_CHECK(cudaMalloc(&device_memory_, o.bytes));
  char* base = static_cast<char*>(device_memory_);
  scale_ = reinterpret_cast<float*>(base + o.scale);
  scale_inv_ = reinterpret_cast<float*>(base + o.scale_inv);
  amax_ = reinterpret_cast<float*>(base + o.amax);
  formats_ = reinterpret_cast<uint8_t*>(base + o.formats);
  history_ = reinterpret_cast<float*>(base + o.history);
  scratch_ptrs_.resize(kScratchCount);
  scratch_scale_ptrs_.resize(kScratchCount);
  for (int i = 0; i < kScratchCount; i++) {
    scratch_ptrs_[i] = reinterpret_cast<uint8_t*>(base + o.scratch[i]);
    scratch_scale_ptrs_[i] = reinterpret_cast<float*>(base + o.scales[i]);
  }
  // Initial state: scale 1, amax 0, empty histories; the inert entries between slots carry their slot's format.
  std::vector<float> ones(np, 1.0f);
  std::vector<uint8_t> formats(np, static_cast<uint8_t>(ElementFormat::E4M3));
  for (size_t i = 0; i < n; i++)
    for (int j = 0; j < kSlotStride; j++) formats[kSlotStride * i + j] = slot_formats_[i];
  CUDA_CHECK(cudaMemcpy(scale_, ones.data(), np * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(scale_inv_, ones.data(), np * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(formats_, formats.data(), np, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(amax_, 0, np * sizeof(float)));
  CUDA_CHECK(cudaMemset(history_, 0, np * history_len_ * sizeof(float)));
  // Scratch: the block-scale padding entries must read as 1 (never written by the quantisers for rows past the
  // tensor); fill every scale scratch with 1 once.
  for (int i = 0; i < kScratchCount; i++) {
    if (scratch_floats_[i] == 0) continue;
    std::vector<float> fill(scratch_floats_[i], 1.0f);
    CUDA_CHECK(cudaMemcpy(scratch_scale_ptrs_[i], fill.data(), fill.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
}

uint8_t* PrecisionState::scratch(int which) {
  ensure_allocated();
  return scratch_ptrs_[which];
}

float* PrecisionState::scratch_scales(int which) {
  ensure_allocated();
  return scratch_scale_ptrs_[which];
}

void PrecisionState::begin_forward(cudaStream_t s) {
  if (slot_names_.empty()) return;  // no per-tensor scales
  ensure_allocated();
  if (recipe_.scaling == ScalingMode::Current) CUDA_CHECK(cudaMemsetAsync(amax_, 0, padded_slots() * sizeof(float), s));
}

void PrecisionState::begin_backward(cudaStream_t s) {
  micro_++;
  begin_forward(s);
}

void PrecisionState::end_step(cudaStream_t s) {
  for (Linear* l : linears_) l->weights_changed();
  if (slot_names_.empty() || !keeps_amax_history(recipe_)) return;
  ensure_allocated();
  const int n = static_cast<int>(kSlotStride * slot_names_.size());  // the inert entries update to themselves
  if (amax_reducer_) amax_reducer_(amax_, n, s);
  fp8_delayed_scaling_update(history_, amax_, scale_, scale_inv_, formats_, n, history_len_, history_pos_,
                             recipe_.amax_compute != "most_recent", recipe_.margin, recipe_.x.scale, s);
  history_pos_ = (history_pos_ + 1) % history_len_;
  steps_recorded_++;
}

void PrecisionState::discard_step(cudaStream_t s) {
  if (slot_names_.empty() || !allocated_) return;
  CUDA_CHECK(cudaMemsetAsync(amax_, 0, padded_slots() * sizeof(float), s));
}

void PrecisionState::weights_changed() {
  for (Linear* l : linears_) l->weights_changed();
}

void PrecisionState::record_numerics(const std::string& name, const QTensor& q, const bf16* x, cudaStream_t s,
                                     const HadamardOption& rotation, Mxfp4Scale mxfp4_scale) {
  if (q.data == nullptr) return;
  double* slot = numerics_slot(name);
  if (slot == nullptr) return;
  quant_stats(slot, q, x, s, rotation, mxfp4_scale);
  numerics_names_.push_back(name);
  numerics_products_.push_back(false);
}

double* PrecisionState::numerics_slot(const std::string& name) {
  if (std::find(numerics_names_.begin(), numerics_names_.end(), name) != numerics_names_.end()) return nullptr;
  if (numerics_ == nullptr) {  // x, w, dy and the three products of every linear
    numerics_capacity_ = static_cast<int>(6 * linears_.size() + 8);
    CUDA_CHECK(cudaMalloc(&numerics_, (size_t)numerics_capacity_ * kQuantStatsSlots * sizeof(double)));
  }
  if ((int)numerics_names_.size() >= numerics_capacity_) return nullptr;
  return numerics_ + numerics_names_.size() * kQuantStatsSlots;
}

template <class T>
void PrecisionState::record_product_numerics(const std::string& name, const T* got, const T* ref, size_t n,
                                             cudaStream_t s) {
  double* slot = numerics_slot(name);
  if (slot == nullptr) return;
  product_error_stats(slot, got, ref, n, s);
  numerics_names_.push_back(name);
  numerics_products_.push_back(true);
}
template void PrecisionState::record_product_numerics<bf16>(const std::string&, const bf16*, const bf16*, size_t,
                                                            cudaStream_t);
template void PrecisionState::record_product_numerics<float>(const std::string&, const float*, const float*, size_t,
                                                             cudaStream_t);

std::vector<TensorNumerics> PrecisionState::collect_numerics(cudaStream_t s) {
  numerics_requested_ = false;
  std::vector<TensorNumerics> out;
  if (numerics_names_.empty()) return out;
  std::vector<double> host(numerics_names_.size() * kQuantStatsSlots);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), numerics_, host.size() * sizeof(double), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < numerics_names_.size(); i++) {
    TensorNumerics t{numerics_names_[i], finish_quant_stats(host.data() + i * kQuantStatsSlots)};
    t.product = numerics_products_[i];
    out.push_back(t);
  }
  numerics_names_.clear();
  numerics_products_.clear();
  // The MXFP4 products' inexact blocks since the last report, on each linear's x entry (then counted afresh).
  for (const Linear* l : linears_) {
    if (l->inexact_blocks_ == nullptr || l->plan_.x.scale != ScaleFormat::E8M0) continue;
    unsigned long long count = 0;
    CUDA_CHECK(cudaMemcpyAsync(&count, l->inexact_blocks_, sizeof count, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemsetAsync(l->inexact_blocks_, 0, sizeof count, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (TensorNumerics& t : out)
      if (t.name == l->name_ + ".x") t.inexact_blocks = static_cast<long long>(count);
  }
  return out;
}

size_t PrecisionState::device_bytes() const { return memory().total(); }

// A recipe without quantised linears allocates nothing here (ensure_allocated runs only with slots or linears).
PrecisionMemory PrecisionState::memory() const {
  PrecisionMemory m;
  if (linears_.empty() && slot_names_.empty()) return m;
  size_t gemm_scratch = 0;  // the GEMM layer keeps its largest FP4 conversion scratch
  for (const Linear* l : linears_) {
    m.weight_caches += l->weight_cache_bytes_;
    m.saved_inputs += l->saved_input_bytes_;
    gemm_scratch = std::max(gemm_scratch, l->gemm_scratch_bytes_);
  }
  const Layout o = layout();
  m.scaling = o.slot_bytes;
  m.scratch = o.bytes - o.slot_bytes + gemm_scratch;
  return m;
}

nlohmann::json PrecisionState::describe() const {
  return {{"slots", slot_names_}, {"history_len", history_len_}, {"history_pos", history_pos_},
          {"steps_recorded", steps_recorded_}};
}

// Checkpoint form: compact (one entry per slot, no inert padding).
void PrecisionState::download(std::vector<float>* scales, std::vector<float>* history) const {
  const size_t n = slot_names_.size(), L = history_len_;
  scales->assign(2 * n, 1.0f);
  history->assign(n * L, 0.0f);
  if (n == 0 || !allocated_) return;
  const size_t np = padded_slots();
  std::vector<float> s(np), si(np), h(np * L);
  CUDA_CHECK(cudaMemcpy(s.data(), scale_, np * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(si.data(), scale_inv_, np * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(h.data(), history_, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    (*scales)[i] = s[kSlotStride * i];
    (*scales)[n + i] = si[kSlotStride * i];
    std::copy(h.begin() + kSlotStride * i * L, h.begin() + (kSlotStride * i + 1) * L, history->begin() + i * L);
  }
}

void PrecisionState::upload(const nlohmann::json& description, const std::vector<float>& scales,
                            const std::vector<float>& history) {
  const size_t n = slot_names_.size(), L = history_len_;
  const std::vector<std::string> names = description.at("slots").get<std::vector<std::string>>();
  if (names != slot_names_ || description.at("history_len").get<int>() != history_len_ ||
      scales.size() != 2 * n || history.size() != n * L)
    throw_error("precision state: the checkpoint's scaling state (%zu tensors, history %d) does not match this "
                "run's recipe (%zu tensors, history %d): resume with the same precision section",
                names.size(), description.at("history_len").get<int>(), n, history_len_);
  ensure_allocated();
  history_pos_ = description.at("history_pos").get<int>();
  steps_recorded_ = description.at("steps_recorded").get<long long>();
  if (n == 0) return;
  const size_t np = padded_slots();
  std::vector<float> s(np, 1.0f), si(np, 1.0f), h(np * L, 0.0f);
  for (size_t i = 0; i < n; i++) {
    s[kSlotStride * i] = scales[i];
    si[kSlotStride * i] = scales[n + i];
    std::copy(history.begin() + i * L, history.begin() + (i + 1) * L, h.begin() + kSlotStride * i * L);
  }
  CUDA_CHECK(cudaMemcpy(scale_, s.data(), np * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(scale_inv_, si.data(), np * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(history_, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(amax_, 0, np * sizeof(float)));
}

}  // namespace llmc
