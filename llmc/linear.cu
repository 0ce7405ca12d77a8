// llmc/linear.cu: Linear (one layer's fprop / dgrad / wgrad under its plan) and PrecisionState (the model-wide FP8
// scaling slots, amax histories, shared FP8 scratch and telemetry). See llmc/linear.h.
//
// FP8 data flow of one linear (N = out_features, K = in_features, M = rows = B*T):
//   forward   w (N, K) --quantise once per optimizer step--> Wq (N, K) + Wᵀq (K, N)            [cached]
//             (cache_weight_transpose false: only Wq is cached; backward transposes it into scratch 3, which gives
//             the same codes, since Wq and Wᵀq share their per-tensor or 128x128 scales)
//             x (M, K) --quantise--> Xq (M, K) [scratch 0]  (+ Xᵀq (K, M) kept for wgrad when save_fp8_input)
//             out (M, N) = Xq · Wqᵀ (+ bias) (GELU: into pre_gelu, then gelu kernel or the GELU_AUX epilogue)
//   backward  dy (M, N) --quantise--> dYq (M, N) [scratch 0] + dYᵀq (N, M) [scratch 1]
//             dx (M, K) = dYq · (Wᵀq)ᵀ       (DGELU: then the gelu backward kernel on dx)
//             dw (N, K) += dYᵀq · (Xᵀq)ᵀ     (Xᵀq saved, or quantised now from the BF16 x [scratch 2])
// Per-tensor scales: current scaling reads the amax the producer kernel reported (or measures it), turns it into a
// scale on the device and casts; delayed scaling casts with the scale from the amax history and records this
// tensor's amax for the next update (in the first step, before any history exists, it scales from the current amax).
// Block scales come from each block's own amax inside fp8_quantize_blockwise.
#include "llmc/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "llmc/common.h"
#include "llmc/gemm.h"
#include "llmc/kernels.h"

namespace llmc {

namespace {

// Scratch buffers shared by every linear (a linear's quantised operands live only during its own products).
enum ScratchId : int {
  kScratchRows = 0,      // Xq (M, K) in forward; dYq (M, N) in backward
  kScratchRowsT = 1,     // dYᵀq (N, M)
  kScratchInputT = 2,    // Xᵀq (K, M) quantised in backward when the input was not saved as FP8
  kScratchWeightT = 3,   // Wᵀq (K, N) when the plan does not cache it (made by the weight cast, then in backward)
  kScratchCount = 4,
};

bool is_block(ScaleGranularity g) { return g != ScaleGranularity::Tensor; }

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// Linear

Linear::Linear(PrecisionState& state, std::string name, LinearKind kind, int layer, int out_features, int in_features,
               const LinearPlan& plan, int max_rows)
    : state_(state), name_(std::move(name)), kind_(kind), layer_(layer), N_(out_features), K_(in_features),
      max_rows_(max_rows), plan_(plan) {
  if (!plan_.fp8) return;
  if (N_ % 16 != 0 || K_ % 16 != 0)
    throw_error("%s: FP8 GEMMs need in/out features that are multiples of 16 (got %d x %d); keep this layer in BF16 "
                "(precision.bf16_layers) or change the model shape", name_.c_str(), N_, K_);
  if (plan_.x.granularity == ScaleGranularity::Tensor) {
    x_slot_ = state_.new_slot(name_ + ".x", plan_.x.format);
    w_slot_ = state_.new_slot(name_ + ".w", plan_.w.format);
    dy_slot_ = state_.new_slot(name_ + ".dy", plan_.dy.format);
  }
  // One allocation: the weight codes (N, K) + transposed (K, N), their block scales, and the saved input's
  // transposed codes (K, M_max) + block scales.
  wq_.rows = N_;
  wq_.cols = K_;
  wq_.format = plan_.w.format;
  wq_.granularity = plan_.w.granularity;
  x_saved_.rows = max_rows_;
  x_saved_.cols = K_;
  x_saved_.format = plan_.x.format;
  x_saved_.granularity = plan_.x.granularity;
  const size_t w_bytes = align256((size_t)N_ * K_);
  const size_t w_scales = is_block(plan_.w.granularity)
                              ? align256(scale_inv_floats(plan_.w.granularity, N_, K_) * sizeof(float)) +
                                    align256(scale_inv_floats(plan_.w.granularity, K_, N_) * sizeof(float))
                              : 0;
  const bool save = plan_.save_fp8_input;
  const size_t x_bytes = save ? align256((size_t)K_ * max_rows_) : 0;
  const size_t x_scales =
      save && is_block(plan_.x.granularity)
          ? align256(scale_inv_floats(plan_.x.granularity, K_, max_rows_) * sizeof(float))
          : 0;
  const bool cache_t = plan_.cache_weight_transpose;
  const size_t total = (cache_t ? 2 : 1) * w_bytes + w_scales + x_bytes + x_scales;
  CUDA_CHECK(cudaMalloc(&memory_, total));
  memory_bytes_ = total;
  char* p = static_cast<char*>(memory_);
  wq_.data = reinterpret_cast<uint8_t*>(p);
  p += w_bytes;
  if (cache_t) {
    wq_.data_t = reinterpret_cast<uint8_t*>(p);
    p += w_bytes;
  }
  if (is_block(plan_.w.granularity)) {
    wq_.scale_inv = reinterpret_cast<float*>(p);
    p += align256(scale_inv_floats(plan_.w.granularity, N_, K_) * sizeof(float));
    wq_.scale_inv_t = reinterpret_cast<float*>(p);
    p += align256(scale_inv_floats(plan_.w.granularity, K_, N_) * sizeof(float));
  }
  if (save) {
    x_saved_.data_t = reinterpret_cast<uint8_t*>(p);
    p += x_bytes;
    if (is_block(plan_.x.granularity)) x_saved_.scale_inv_t = reinterpret_cast<float*>(p);
  }
  // Shared scratch this layer needs at its largest M.
  const size_t M = max_rows_;
  state_.reserve(kScratchRows, std::max(M * K_, M * N_), is_block(plan_.x.granularity)
                                                              ? std::max(scale_inv_floats(plan_.x.granularity, M, K_),
                                                                         scale_inv_floats(plan_.dy.granularity, M, N_))
                                                              : 0);
  state_.reserve(kScratchRowsT, M * N_,
                 is_block(plan_.dy.granularity) ? scale_inv_floats(plan_.dy.granularity, N_, M) : 0);
  if (!cache_t) state_.reserve(kScratchWeightT, (size_t)N_ * K_, 0);
  if (!save)
    state_.reserve(kScratchInputT, M * K_,
                   is_block(plan_.x.granularity) ? scale_inv_floats(plan_.x.granularity, K_, M) : 0);
  state_.add(this);
}

Linear::~Linear() { cudaFree(memory_); }

float* Linear::x_amax_slot() const {
  if (!plan_.fp8 || x_slot_ < 0 || plan_.scaling != ScalingMode::Current) return nullptr;
  return state_.amax_ptr(x_slot_);
}

float* Linear::dy_amax_slot() const {
  if (!plan_.fp8 || dy_slot_ < 0 || plan_.scaling != ScalingMode::Current) return nullptr;
  return state_.amax_ptr(dy_slot_);
}

// Quantises a BF16 tensor src (rows, cols) into q (whose data / data_t / scales are set by the caller) with the
// per-tensor slot `slot` or with block scales. amax_ready: the producer already wrote the amax into the slot.
void Linear::quantize(QTensor& q, int slot, const bf16* src, bool amax_ready, bool training, cudaStream_t s) {
  if (is_block(q.granularity)) {
    fp8_quantize_blockwise(q, src, plan_.pow2_scales, s);
    return;
  }
  float* scale = state_.scale_ptr(slot);
  float* scale_inv = state_.scale_inv_ptr(slot);
  float* amax = state_.amax_ptr(slot);
  q.scale = scale;
  q.scale_inv = scale_inv;
  const size_t n = (size_t)q.rows * q.cols;
  if (plan_.scaling == ScalingMode::Current) {
    // Current scaling: the scale from this tensor's amax (measured here unless its producer did), computed inside
    // the cast's launch.
    if (!amax_ready) {
      CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
      amax_bf16(amax, src, n, s);
    }
    fp8_quantize_tensorwise_from_amax(q, src, amax, plan_.margin, plan_.pow2_scales, s);
  } else if (!state_.history_started()) {
    // The first step of delayed scaling has no history yet: scale from this tensor's amax, measured into a temporary
    // (the slot accumulates the step's amax for the history).
    float* current = state_.temp_amax();
    CUDA_CHECK(cudaMemsetAsync(current, 0, sizeof(float), s));
    amax_bf16(current, src, n, s);
    if (training) amax_bf16(amax, src, n, s);  // record for the history
    fp8_quantize_tensorwise_from_amax(q, src, current, plan_.margin, plan_.pow2_scales, s);
  } else {
    // Delayed: the scale was set from the history; record this tensor's amax (training only) while casting.
    fp8_quantize_tensorwise(q, src, training ? amax : nullptr, s);
  }
}

void Linear::forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int M, bool training, cudaStream_t s,
                     const ForwardOptions& opt) {
  if (M > max_rows_) throw_error("%s: %d rows, planned for at most %d", name_.c_str(), M, max_rows_);
  if (opt.residual != nullptr && !adds_residual())
    throw_error("%s: this precision plan cannot add a residual in its product (check adds_residual() first)",
                name_.c_str());
  if (!plan_.fp8) {
    matmul_forward(out, x, w, bias, M, N_, K_, s, opt.pre_gelu, opt.residual);
    if (opt.out_amax) amax_bf16(opt.out_amax, out, (size_t)M * N_, s);
    return;
  }
  const int need = is_block(plan_.x.granularity) ? 128 : 16;
  if (M % need != 0)
    throw_error("%s: FP8 GEMMs need the rows (B*T = %d) to be a multiple of %d", name_.c_str(), M, need);
  state_.ensure_allocated();

  // The weight: once per optimizer step (codes + transposed codes; for 128x128 tiles both share the tile scales).
  // Delayed scaling records the weight's amax while casting, so a cache an evaluation forward built (which records
  // nothing) is rebuilt by the first training forward: same codes, and the step's amax recorded as in a run without
  // that evaluation (resumed runs then match uninterrupted ones bit for bit).
  const bool unrecorded = training && !weight_cache_recorded_ && plan_.scaling == ScalingMode::Delayed &&
                          plan_.w.granularity == ScaleGranularity::Tensor;
  if (!weight_cache_valid_ || unrecorded) {
    // Without a cached transpose the cast still writes one (into scratch, discarded): that also fills the 128x128
    // transposed scales, which are kept.
    if (!plan_.cache_weight_transpose) wq_.data_t = state_.scratch(kScratchWeightT);
    quantize(wq_, w_slot_, w, /*amax_ready=*/false, training, s);
    if (!plan_.cache_weight_transpose) wq_.data_t = nullptr;
    weight_cache_valid_ = true;
    weight_cache_recorded_ = training;
    if (state_.numerics_requested()) state_.record_numerics(name_ + ".w", wq_, w, s);
  }
  // The input: row codes for fprop; the transposed copy for wgrad when it is saved as FP8.
  QTensor xq;
  xq.rows = M;
  xq.cols = K_;
  xq.format = plan_.x.format;
  xq.granularity = plan_.x.granularity;
  xq.data = state_.scratch(kScratchRows);
  if (is_block(xq.granularity)) xq.scale_inv = state_.scratch_scales(kScratchRows);
  const bool save = training && plan_.save_fp8_input;
  if (save) {
    xq.data_t = x_saved_.data_t;
    xq.scale_inv_t = x_saved_.scale_inv_t;
  }
  quantize(xq, x_slot_, x, opt.x_amax_ready, training, s);
  if (save) {
    x_saved_.rows = M;
    x_saved_.scale = xq.scale;
    x_saved_.scale_inv = xq.scale_inv;  // per-tensor: the slot's scale_inv (blocks use scale_inv_t)
    have_saved_input_ = true;
  } else {
    have_saved_input_ = false;
  }
  if (training && state_.numerics_requested()) state_.record_numerics(name_ + ".x", xq, x, s);

  // The GEMM with as much of the bias / GELU as the epilogue supports for this combination (block scales support
  // neither; then the bias is added and the GELU applied by our kernels, which also report the output amax).
  const Fp8Operand A = fp8_operand(xq, false), B = fp8_operand(wq_, false);
  Fp8GemmOptions g;
  g.fast_accum = plan_.fast_accum_fprop;
  g.bias = bias;
  g.pre_gelu = opt.pre_gelu;
  if (opt.pre_gelu != nullptr && matmul_fp8_supported(false, A, B, M, N_, K_, g)) {
    matmul_fp8(out, A, B, M, N_, K_, g, s);  // out = gelu(pre_gelu), pre_gelu = x·wᵀ + bias
    if (opt.out_amax) amax_bf16(opt.out_amax, out, (size_t)M * N_, s);
    return;
  }
  g.pre_gelu = nullptr;
  const bool fused_bias = bias != nullptr && matmul_fp8_supported(false, A, B, M, N_, K_, g);
  if (!fused_bias) g.bias = nullptr;
  bf16* gemm_out = opt.pre_gelu != nullptr ? opt.pre_gelu : out;
  matmul_fp8(gemm_out, A, B, M, N_, K_, g, s);
  float* gemm_out_amax = opt.pre_gelu != nullptr ? nullptr : opt.out_amax;
  if (bias != nullptr && !fused_bias) {
    add_bias(gemm_out, bias, M, N_, s, gemm_out_amax);
  } else if (gemm_out_amax != nullptr) {
    amax_bf16(gemm_out_amax, gemm_out, (size_t)M * N_, s);
  }
  if (opt.pre_gelu != nullptr) gelu_forward(out, opt.pre_gelu, (size_t)M * N_, s, opt.out_amax);
}

void Linear::backward(bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w, int M, cudaStream_t s,
                      const BackwardOptions& opt) {
  if (M > max_rows_) throw_error("%s: %d rows, planned for at most %d", name_.c_str(), M, max_rows_);
  if (opt.x_pre_gelu != nullptr && opt.accumulate_dx)
    throw_error("%s: the GELU backward cannot accumulate into dx", name_.c_str());
  if (!plan_.fp8) {
    if (dx != nullptr) {
      matmul_dgrad(dx, dy, w, M, N_, K_, opt.accumulate_dx, s, opt.x_pre_gelu);
      if (opt.dx_amax) amax_bf16(opt.dx_amax, dx, (size_t)M * K_, s);
    }
    if (x == nullptr) throw_error("%s: BF16 backward needs the layer input", name_.c_str());
    matmul_wgrad(dw, dy, x, M, N_, K_, /*accumulate=*/true, s);
    return;
  }
  if (opt.accumulate_dx)
    throw_error("%s: FP8 dgrad overwrites dx (accumulate_dx is not supported with an FP8 plan)", name_.c_str());
  if (!weight_cache_valid_) throw_error("%s: backward before forward (no quantised weight)", name_.c_str());

  // dy: row codes (dgrad) and transposed codes (wgrad) in one pass.
  QTensor dyq;
  dyq.rows = M;
  dyq.cols = N_;
  dyq.format = plan_.dy.format;
  dyq.granularity = plan_.dy.granularity;
  dyq.data = dx != nullptr ? state_.scratch(kScratchRows) : nullptr;
  dyq.data_t = state_.scratch(kScratchRowsT);
  if (is_block(dyq.granularity)) {
    dyq.scale_inv = state_.scratch_scales(kScratchRows);
    dyq.scale_inv_t = state_.scratch_scales(kScratchRowsT);
  }
  quantize(dyq, dy_slot_, dy, opt.dy_amax_ready, /*training=*/true, s);
  if (state_.numerics_requested() && dyq.data != nullptr) state_.record_numerics(name_ + ".dy", dyq, dy, s);

  // dgrad: dx (M, K) = dYq (M, N) · Wᵀq (K, N)ᵀ
  if (dx != nullptr) {
    QTensor wt = wq_;
    if (!plan_.cache_weight_transpose) {
      wt.data_t = state_.scratch(kScratchWeightT);
      fp8_transpose_codes(wt.data_t, wq_.data, N_, K_, s);
    }
    Fp8GemmOptions g;
    matmul_fp8(dx, fp8_operand(dyq, false), fp8_operand(wt, true), M, K_, N_, g, s);
    if (opt.x_pre_gelu != nullptr)
      gelu_backward_inplace(dx, opt.x_pre_gelu, (size_t)M * K_, s, opt.dx_amax);
    else if (opt.dx_amax)
      amax_bf16(opt.dx_amax, dx, (size_t)M * K_, s);
  }

  // wgrad: dw (N, K) += dYᵀq (N, M) · Xᵀq (K, M)ᵀ
  QTensor xt;
  if (have_saved_input_ && x_saved_.rows == M) {
    xt = x_saved_;
  } else {
    if (x == nullptr)
      throw_error("%s: the input was not saved as FP8 by a training forward of %d rows and no BF16 input was given",
                  name_.c_str(), M);
    xt.rows = M;
    xt.cols = K_;
    xt.format = plan_.x.format;
    xt.granularity = plan_.x.granularity;
    xt.data_t = state_.scratch(kScratchInputT);
    if (is_block(xt.granularity)) {
      xt.scale_inv_t = state_.scratch_scales(kScratchInputT);
      fp8_quantize_blockwise(xt, x, plan_.pow2_scales, s);
    } else {
      // the forward's per-tensor x scale (same micro-step) without measuring the amax again
      xt.scale = state_.scale_ptr(x_slot_);
      xt.scale_inv = state_.scale_inv_ptr(x_slot_);
      fp8_quantize_tensorwise(xt, x, nullptr, s);
    }
  }
  Fp8GemmOptions g;
  g.accumulate = true;
  matmul_fp8(dw, fp8_operand(dyq, true), fp8_operand(xt, true), N_, K_, M, g, s);
}

// ------------------------------------------------------------------------------------------------------------------
// PrecisionState

PrecisionState::PrecisionState(const PrecisionRecipe& recipe) : recipe_(recipe) {
  history_len_ = recipe_.fp8 && recipe_.scaling == ScalingMode::Delayed ? recipe_.amax_history_len : 1;
  scratch_bytes_.assign(kScratchCount, 0);
  scratch_floats_.assign(kScratchCount, 0);
}

PrecisionState::~PrecisionState() {
  cudaFree(device_memory_);
  cudaFree(numerics_);
}

void PrecisionState::add(Linear* linear) {
  if (allocated_) throw_error("PrecisionState: linear %s registered after the first forward", linear->name().c_str());
  linears_.push_back(linear);
}

int PrecisionState::new_slot(const std::string& name, Fp8Format f) {
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
void PrecisionState::ensure_allocated() {
  if (allocated_) return;
  allocated_ = true;
  const size_t n = slot_names_.size(), np = padded_slots();
  size_t bytes = 0;
  auto take = [&](size_t b) {
    const size_t at = bytes;
    bytes += align256(std::max<size_t>(b, 1));
    return at;
  };
  const size_t o_scale = take(np * sizeof(float)), o_scale_inv = take(np * sizeof(float));
  const size_t o_amax = take(np * sizeof(float)), o_formats = take(np);
  const size_t o_history = take(np * (size_t)history_len_ * sizeof(float));
  std::vector<size_t> o_scratch(kScratchCount), o_scales(kScratchCount);
  for (int i = 0; i < kScratchCount; i++) {
    o_scratch[i] = take(scratch_bytes_[i]);
    o_scales[i] = take(scratch_floats_[i] * sizeof(float));
  }
  CUDA_CHECK(cudaMalloc(&device_memory_, bytes));
  char* base = static_cast<char*>(device_memory_);
  scale_ = reinterpret_cast<float*>(base + o_scale);
  scale_inv_ = reinterpret_cast<float*>(base + o_scale_inv);
  amax_ = reinterpret_cast<float*>(base + o_amax);
  formats_ = reinterpret_cast<uint8_t*>(base + o_formats);
  history_ = reinterpret_cast<float*>(base + o_history);
  scratch_ptrs_.resize(kScratchCount);
  scratch_scale_ptrs_.resize(kScratchCount);
  for (int i = 0; i < kScratchCount; i++) {
    scratch_ptrs_[i] = reinterpret_cast<uint8_t*>(base + o_scratch[i]);
    scratch_scale_ptrs_[i] = reinterpret_cast<float*>(base + o_scales[i]);
  }
  // Initial state: scale 1, amax 0, empty histories; the inert entries between slots carry their slot's format.
  std::vector<float> ones(np, 1.0f);
  std::vector<uint8_t> formats(np, static_cast<uint8_t>(Fp8Format::E4M3));
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
  if (!recipe_.fp8 || slot_names_.empty()) return;
  ensure_allocated();
  if (recipe_.scaling == ScalingMode::Current) CUDA_CHECK(cudaMemsetAsync(amax_, 0, padded_slots() * sizeof(float), s));
}

void PrecisionState::begin_backward(cudaStream_t s) { begin_forward(s); }

void PrecisionState::end_step(cudaStream_t s) {
  for (Linear* l : linears_) l->weights_changed();
  if (!recipe_.fp8 || slot_names_.empty() || recipe_.scaling != ScalingMode::Delayed) return;
  ensure_allocated();
  const int n = static_cast<int>(kSlotStride * slot_names_.size());  // the inert entries update to themselves
  if (amax_reducer_) amax_reducer_(amax_, n, s);
  fp8_delayed_scaling_update(history_, amax_, scale_, scale_inv_, formats_, n, history_len_, history_pos_,
                             recipe_.amax_compute != "most_recent", recipe_.margin, recipe_.pow2_scales, s);
  history_pos_ = (history_pos_ + 1) % history_len_;
  steps_recorded_++;
}

void PrecisionState::discard_step(cudaStream_t s) {
  if (!recipe_.fp8 || slot_names_.empty() || !allocated_) return;
  CUDA_CHECK(cudaMemsetAsync(amax_, 0, padded_slots() * sizeof(float), s));
}

void PrecisionState::weights_changed() {
  for (Linear* l : linears_) l->weights_changed();
}

void PrecisionState::record_numerics(const std::string& name, const QTensor& q, const bf16* x, cudaStream_t s) {
  if (q.data == nullptr) return;
  if (std::find(numerics_names_.begin(), numerics_names_.end(), name) != numerics_names_.end()) return;
  if (numerics_ == nullptr) {
    numerics_capacity_ = static_cast<int>(3 * linears_.size() + 8);
    CUDA_CHECK(cudaMalloc(&numerics_, (size_t)numerics_capacity_ * kQuantStatsSlots * sizeof(double)));
  }
  if ((int)numerics_names_.size() >= numerics_capacity_) return;
  fp8_quant_stats(numerics_ + numerics_names_.size() * kQuantStatsSlots, q, x, s);
  numerics_names_.push_back(name);
}

std::vector<TensorNumerics> PrecisionState::collect_numerics(cudaStream_t s) {
  numerics_requested_ = false;
  std::vector<TensorNumerics> out;
  if (numerics_names_.empty()) return out;
  std::vector<double> host(numerics_names_.size() * kQuantStatsSlots);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), numerics_, host.size() * sizeof(double), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < numerics_names_.size(); i++)
    out.push_back({numerics_names_[i], finish_quant_stats(host.data() + i * kQuantStatsSlots)});
  numerics_names_.clear();
  return out;
}

size_t PrecisionState::device_bytes() const {
  size_t bytes = 0;
  for (const Linear* l : linears_) bytes += l->memory_bytes_;
  for (int i = 0; i < kScratchCount; i++) bytes += align256(scratch_bytes_[i]) + align256(scratch_floats_[i] * 4);
  return bytes + padded_slots() * (13 + (size_t)history_len_ * 4);
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
    throw_error("precision state: the checkpoint's FP8 scaling state (%zu tensors, history %d) does not match this "
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
