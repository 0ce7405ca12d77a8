// llmc/precision/linear.cu: Linear, one layer's fprop / dgrad / wgrad under its plan (llmc/precision/linear.h); the
// model-wide scaling slots and scratch it uses are llmc/precision/precision_state's.
//
// Quantised data flow of one linear (N = out_features, K = in_features, M = rows = B*T):
//   forward   w (N, K) --quantise once per optimizer step--> Wq (N, K) + Wᵀq (K, N)            [cached]
//             (cache_weight_transpose false: only Wq is cached; backward transposes it into scratch 3, which gives
//             the same codes, since Wq and Wᵀq share their per-tensor or 128x128 scales)
//             x (M, K) --quantise--> Xq (M, K) [scratch 0]  (+ Xᵀq (K, M) kept for wgrad when save_quantized_input)
//             out (M, N) = Xq · Wqᵀ (+ bias) (GELU: into pre_gelu, then gelu kernel or the GELU_AUX epilogue)
//   backward  dy (M, N) --quantise--> dYq (M, N) [scratch 0] + dYᵀq (N, M) [scratch 1]
//             dx (M, K) = dYq · (Wᵀq)ᵀ       (DGELU: then the gelu backward kernel on dx)
//             dw (N, K) += dYᵀq · (Xᵀq)ᵀ     (Xᵀq saved, or quantised now from the BF16 x [scratch 2])
// Per-tensor scales: current scaling reads the amax the producer kernel reported (or measures it), turns it into a
// scale on the device and casts; delayed scaling casts with the scale from the amax history and records this
// tensor's amax for the next update (in the first step, before any history exists, it scales from the current amax).
// Block scales come from each block's own amax inside the block quantiser. Every quantisation goes through the one
// dispatch point, llmc/precision/quantize.h. Where a role's two copies have different encodings (the plan's x / x_t,
// w / w_t, dy / dy_t: precision.tensorwise_products), each copy is quantised by a pass of its own, the whole-tensor
// one with the role's per-tensor slot; otherwise one pass writes both.
// FP4 plans use the same flow: E2M1 codes packed two per byte with their one-byte block scales, NVFP4's FP32 tensor
// scales in this layer's small scalar piece (tensor_scales_); dy may be rounded stochastically (both copies, from
// the precision state's keyed random stream), and the transposed copies of x and dy, the operands of wgrad, may be
// rotated by the run's random Hadamard transform along the tokens: (dYᵀH)(XᵀH)ᵀ = dYᵀX, so the product needs no
// inverse. The weight is never rotated (fprop and dgrad read it). The NVFP4 copies a product consumes at once (x for
// fprop, dy for dgrad, dy's transposed copy for wgrad) are written by the quantiser as their BF16 values, which the
// product reads as they are; the stored ones (the weights, x's saved transposed copy) stay codes and are expanded.
// Quartet plans (requantize_backward) keep the forward's own codes instead and re-quantise them in backward:
//   forward   R = H32, or H32·F with the run's random signs F (precision.forward_signs)
//             w (N, K) --R along K, Gaussian / amax scales, trust mask Mw--> Wq (N, K)             [cached]
//             x (M, K) --the same--> Xq (M, K) + Mx                                              [saved]
//             out (M, N) = Xq · Wqᵀ                       (the rotations cancel: R is orthogonal)
//   backward  S = fresh random signs (seed, step, micro-step, linear); every re-quantisation range-matched, RTN/SR
//             dy (M, N) --H32·S along N--> dYq [scratch 0];  --H32·S along M--> dYᵀq (N, M) [scratch 1]
//             Wq --decoded as loaded, H32·S along N--> Wᵀq (K, N) [scratch 3]      (fp4_requantize)
//             dx (M, K) = R⁻¹ = F·H32 along K of (16/9 · dYq · (Wᵀq)ᵀ ⊙ Mx)   (product in FP32 [scratch 4])
//             Xq --decoded as loaded, H32·S along M--> Xᵀq (K, M) [scratch 2]
//             dw (N, K) += R⁻¹ along K of (16/9 · dYᵀq · (Xᵀq)ᵀ ⊙ Mw)
#include "llmc/precision/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "llmc/core/common.h"
#include "llmc/kernels/gelu.h"
#include "llmc/kernels/reduce.h"
#include "llmc/precision/fp4_codec.cuh"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/gemm.h"
#include "llmc/precision/quantize.h"

namespace llmc {

namespace {

// Whether an operand encoded e, quantised along a direction of `length` elements, is handed to its product as the
// quantiser's BF16 values (QTensor::values) instead of codes the product would expand: NVFP4 1x16 copies that a
// product consumes at once (x for fprop, dy for dgrad, dy's transposed copy for wgrad), whole blocks.
bool values_operand(const Encoding& e, int length) { return e == kNvfp4Encoding && length % 16 == 0; }

}  // namespace

namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// Linear

Linear::Linear(PrecisionState& state, std::string name, LinearKind kind, int layer, int out_features, int in_features,
               const LinearPlan& plan, int max_rows)
    : state_(state), name_(std::move(name)), kind_(kind), layer_(layer), N_(out_features), K_(in_features),
      max_rows_(max_rows), plan_(plan) {
  if (!plan_.quantized) return;
  if ((plan_.dy_stochastic_rounding || plan_.wgrad_hadamard != 0) &&
      (plan_.x.element != ElementFormat::E2M1 || plan_.dy.element != ElementFormat::E2M1))
    throw_error("%s: stochastic rounding and the wgrad Hadamard transform need FP4 x and dy (validate the recipe "
                "first)", name_.c_str());
  if (N_ % kQuantGemmAlign != 0 || K_ % kQuantGemmAlign != 0)
    throw_error("%s: quantised GEMMs need in/out features that are multiples of %d (got %d x %d); keep this layer in "
                "BF16 (precision.bf16_layers) or change the model shape", name_.c_str(), kQuantGemmAlign, N_, K_);
  const bool quartet = plan_.requantize_backward;
  if (quartet && (!mxfp4_encoding(plan_.x) || !mxfp4_encoding(plan_.w) || !mxfp4_encoding(plan_.dy) ||
                  !plan_.save_quantized_input))
    throw_error("%s: Quartet's backward needs MXFP4 x, w, dy and saved quantised inputs (validate the recipe first)",
                name_.c_str());
  if (quartet && (N_ % kGaussianBlock != 0 || K_ % kGaussianBlock != 0))
    throw_error("%s: Quartet's rotations and scales take whole blocks of %d along in/out features (got %d x %d); keep "
                "this layer in BF16 (precision.bf16_layers) or change the model shape", name_.c_str(), kGaussianBlock,
                N_, K_);
  // A per-tensor slot for each role with a whole-tensor copy (one of its copies, with precision.tensorwise_products).
  const Encoding& xe = plan_.x;
  const Encoding& we = plan_.w;
  const Encoding& dye = plan_.dy;
  const Encoding& xte = plan_.x_t;
  const Encoding& wte = plan_.w_t;
  const Encoding& dyte = plan_.dy_t;
  if (xe.per_tensor() || xte.per_tensor()) x_slot_ = state_.new_slot(name_ + ".x", xe.element);
  if (we.per_tensor() || wte.per_tensor()) w_slot_ = state_.new_slot(name_ + ".w", we.element);
  if (dye.per_tensor() || dyte.per_tensor()) dy_slot_ = state_.new_slot(name_ + ".dy", dye.element);
  if (quartet && (xte != xe || wte != we || dyte != dye))
    throw_error("%s: Quartet's backward re-quantises the forward's codes: its copies share their roles' encodings",
                name_.c_str());
  split_weight_ = wte != we;
  if (!plan_.cache_weights && (quartet || we.element == ElementFormat::E2M1 || wte.element == ElementFormat::E2M1))
    throw_error("%s: only FP8 weights are re-quantised without a cache (validate the recipe first)", name_.c_str());
  if (split_weight_ && !plan_.cache_weight_transpose)
    throw_error("%s: the weight's two copies have different encodings (%s, %s), so the transposed one cannot be made "
                "from the row codes: keep the transposed weight cached (validate the recipe first)", name_.c_str(),
                encoding_name(we).c_str(), encoding_name(wte).c_str());
  // One allocation: the weight codes (N, K) + transposed (K, N), their block scales, and the saved input's
  // transposed codes (K, M_max) + block scales.
  wq_.rows = N_;
  wq_.cols = K_;
  wq_.encoding = we;
  wq_t_.rows = N_;
  wq_t_.cols = K_;
  wq_t_.encoding = wte;
  x_saved_.rows = max_rows_;
  x_saved_.cols = K_;
  x_saved_.encoding = xte;
  const size_t w_bytes = align256(code_bytes(we, N_, K_));
  const size_t wt_bytes = align256(code_bytes(wte, K_, N_));
  // Quartet keeps no transposed copies: Wq (N, K) and Xq (M_max, K) with their scales and trust masks.
  const size_t w_scales = (!we.per_tensor() ? align256(scale_inv_bytes(we, N_, K_)) : 0) +
                          (!quartet && !wte.per_tensor() ? align256(scale_inv_bytes(wte, K_, N_)) : 0);
  const bool masks = quartet && plan_.trust_mask;
  const size_t w_mask_bytes = masks ? align256(sizeof(uint32_t) * N_ * (K_ / kGaussianBlock)) : 0;
  const size_t x_mask_bytes = masks ? align256(sizeof(uint32_t) * max_rows_ * (K_ / kGaussianBlock)) : 0;
  const bool save = plan_.save_quantized_input;
  const int saved_rows = quartet ? max_rows_ : K_, saved_cols = quartet ? K_ : max_rows_;  // Xq or Xᵀq
  const size_t x_bytes = save ? align256(code_bytes(xte, saved_rows, saved_cols)) : 0;
  const size_t x_scales = save && !xte.per_tensor() ? align256(scale_inv_bytes(xte, saved_rows, saved_cols)) : 0;
  const bool cache_w = plan_.cache_weights;
  const bool cache_t = cache_w && plan_.cache_weight_transpose && !quartet;
  const bool fp4 = xe.element == ElementFormat::E2M1 || we.element == ElementFormat::E2M1 ||
                   dye.element == ElementFormat::E2M1;
  constexpr size_t kInexactOffset = 64;  // bytes: after the tensor scales
  static_assert(kTensorScaleSlots * sizeof(float) <= kInexactOffset, "FP4 scalars overlap");
  const size_t scalars = fp4 ? align256(kInexactOffset + sizeof(unsigned long long)) : 0;
  weight_cache_bytes_ = cache_w ? w_bytes + (cache_t ? wt_bytes : 0) + w_scales + w_mask_bytes + scalars : 0;
  saved_input_bytes_ = x_bytes + x_scales + x_mask_bytes;
  const size_t total = weight_cache_bytes_ + saved_input_bytes_;
  memory_bytes_ = total;
  if (state_.allocates()) {
    CUDA_CHECK(cudaMalloc(&memory_, total));
    char* p = static_cast<char*>(memory_);
    // The transposed copy lives in wq_ (one quantisation writes both) unless its encoding differs (then in wq_t_).
    QTensor& wt = split_weight_ ? wq_t_ : wq_;
    if (cache_w) {  // else quantize_weight_into_scratch() points them at scratch before every cast
      wq_.data = reinterpret_cast<uint8_t*>(p);
      p += w_bytes;
      if (cache_t) {
        wt.data_t = reinterpret_cast<uint8_t*>(p);
        p += wt_bytes;
      }
      if (!we.per_tensor()) {
        wq_.scale_inv = reinterpret_cast<float*>(p);
        p += align256(scale_inv_bytes(we, N_, K_));
      }
      if (!quartet && !wte.per_tensor()) {
        wt.scale_inv_t = reinterpret_cast<float*>(p);
        p += align256(scale_inv_bytes(wte, K_, N_));
      }
    }
    if (masks) {
      w_mask_ = reinterpret_cast<uint32_t*>(p);
      p += w_mask_bytes;
      x_mask_ = reinterpret_cast<uint32_t*>(p);
      p += x_mask_bytes;
    }
    if (save) {
      (quartet ? x_saved_.data : x_saved_.data_t) = reinterpret_cast<uint8_t*>(p);
      p += x_bytes;
      if (!xte.per_tensor()) (quartet ? x_saved_.scale_inv : x_saved_.scale_inv_t) = reinterpret_cast<float*>(p);
      p += x_scales;
    }
    if (fp4) {
      CUDA_CHECK(cudaMemset(p, 0, scalars));
      tensor_scales_ = reinterpret_cast<float*>(p);
      inexact_blocks_ = reinterpret_cast<unsigned long long*>(p + kInexactOffset);
      if (we.tensor_scale) {
        wq_.tensor_scale_inv = tensor_scales_ + kTsWeight;
        wq_.tensor_scale_inv_t = tensor_scales_ + kTsWeightT;
      }
      if (xte.tensor_scale) x_saved_.tensor_scale_inv_t = tensor_scales_ + kTsSavedInputT;
    }
  }
  // The FP4 products convert their operands into the GEMM layer's scratch (0 for FP8): fprop x·wᵀ, dgrad dy·w,
  // wgrad dyᵀ·x at the largest M.
  // An NVFP4 operand consumed at once brings its values (values_operand): no part of its own there.
  if (fp4) {
    const int M = max_rows_;
    gemm_scratch_bytes_ = std::max({quant_gemm_scratch_bytes(xe, we, M, N_, K_, values_operand(xe, K_)),
                                    quant_gemm_scratch_bytes(dye, wte, M, K_, N_, values_operand(dye, N_)),
                                    quant_gemm_scratch_bytes(dyte, xte, N_, K_, M, values_operand(dyte, M))});
  }
  // Shared scratch this layer needs at its largest M (codes, or an NVFP4 operand's BF16 values, in bytes; scales in
  // entries).
  const int M = max_rows_;
  auto operand_bytes = [](const Encoding& e, int rows, int cols) {
    return e == kNvfp4Encoding ? static_cast<size_t>(rows) * cols * sizeof(bf16) : code_bytes(e, rows, cols);
  };
  state_.reserve(kScratchRows, std::max(operand_bytes(xe, M, K_), operand_bytes(dye, M, N_)),
                 std::max(!xe.per_tensor() ? scale_inv_count(xe, M, K_) : 0,
                          !dye.per_tensor() ? scale_inv_count(dye, M, N_) : 0));
  state_.reserve(kScratchRowsT, operand_bytes(dyte, N_, M), !dyte.per_tensor() ? scale_inv_count(dyte, N_, M) : 0);
  if (quartet) {  // the re-quantised weight and input (scales included), the FP32 products
    state_.reserve(kScratchWeightT, code_bytes(we, K_, N_), scale_inv_count(we, K_, N_));
    state_.reserve(kScratchInputT, code_bytes(xe, K_, M), scale_inv_count(xe, K_, M));
    state_.reserve(kScratchProduct, sizeof(float) * std::max((size_t)N_ * K_, (size_t)M * K_), 0);
  } else {
    if (!cache_w) {  // the row codes and the transposed ones with their scales, in every forward and backward
      state_.reserve(kScratchWeight, code_bytes(we, N_, K_), !we.per_tensor() ? scale_inv_count(we, N_, K_) : 0);
      state_.reserve(kScratchWeightT, code_bytes(wte, K_, N_), !wte.per_tensor() ? scale_inv_count(wte, K_, N_) : 0);
    } else if (!cache_t) {
      state_.reserve(kScratchWeightT, code_bytes(we, K_, N_), 0);
    }
    if (!save)
      state_.reserve(kScratchInputT, code_bytes(xte, K_, M), !xte.per_tensor() ? scale_inv_count(xte, K_, M) : 0);
  }
  index_ = state_.add(this);
}

Linear::~Linear() {
  if (memory_) cudaFree(memory_);
}

float* Linear::x_amax_slot() const {
  if (!plan_.quantized || x_slot_ < 0 || plan_.scaling != ScalingMode::Current) return nullptr;
  return state_.amax_ptr(x_slot_);
}

float* Linear::dy_amax_slot() const {
  if (!plan_.quantized || dy_slot_ < 0 || plan_.scaling != ScalingMode::Current) return nullptr;
  return state_.amax_ptr(dy_slot_);
}

HadamardOption Linear::forward_rotation() const {
  if (!plan_.requantize_backward || plan_.forward_hadamard == 0) return HadamardOption{};
  const uint32_t signs = plan_.forward_random_signs ? state_.hadamard_signs(plan_.forward_hadamard) : 0u;
  return HadamardOption{plan_.forward_hadamard, signs, true, false};
}

Mxfp4Scale Linear::forward_mxfp4_scale() const {
  return plan_.requantize_backward && plan_.forward_gaussian_scales ? Mxfp4Scale::Gaussian : Mxfp4Scale::Amax;
}

QuantizeArgs Linear::block_args(LinearRole role, const QTensor& q, uint32_t* trust_mask) const {
  QuantizeArgs args;
  if (plan_.requantize_backward) {  // Quartet's forward of x and w (its backward sets its own arguments)
    if (role == LinearRole::Dy) throw_error("%s: Quartet's backward quantises dy itself", name_.c_str());
    args.mxfp4_scale = forward_mxfp4_scale();
    args.hadamard = forward_rotation();
    args.trust_mask = plan_.trust_mask ? trust_mask : nullptr;
    return args;
  }
  if (role == LinearRole::Dy && plan_.dy_stochastic_rounding) {
    args.rounding = Rounding::Stochastic;
    args.sr_key = state_.stochastic_key(index_, role);
  }
  if (role != LinearRole::W && plan_.wgrad_hadamard != 0 && (q.data_t != nullptr || q.values_t != nullptr)) {
    args.hadamard.size = plan_.wgrad_hadamard;
    args.hadamard.signs = state_.hadamard_signs(plan_.wgrad_hadamard);
    args.hadamard.data_t = true;
  }
  return args;
}

QuantGemmOptions Linear::gemm_options() const {
  QuantGemmOptions g;
  g.inexact_blocks = inexact_blocks_;
  return g;
}

// Quantises a BF16 tensor src (rows, cols) into q (whose data / data_t / scales are set by the caller) with the
// per-tensor slot `slot` or with block scales. amax_ready: the producer already wrote the amax into the slot.
void Linear::quantize_operand(QTensor& q, int slot, const bf16* src, bool amax_ready, bool training, LinearRole role,
                              cudaStream_t s, uint32_t* trust_mask) {
  QuantizeArgs args = q.encoding.per_tensor() ? QuantizeArgs() : block_args(role, q, trust_mask);
  args.margin = plan_.margin;
  if (q.encoding.per_tensor()) {
    float* amax = state_.amax_ptr(slot);
    q.scale = state_.scale_ptr(slot);
    q.scale_inv = state_.scale_inv_ptr(slot);
    const size_t n = (size_t)q.rows * q.cols;
    if (plan_.scaling == ScalingMode::Current) {
      // Current scaling: the scale from this tensor's amax (measured here unless its producer did), computed inside
      // the cast's launch.
      if (!amax_ready) {
        CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
        amax_bf16(amax, src, n, s);
      }
      args.source = ScaleSource::Amax;
      args.amax = amax;
    } else if (!state_.history_started()) {
      // The first step of delayed scaling has no history yet: scale from this tensor's amax, measured into a
      // temporary (the slot accumulates the step's amax for the history).
      float* current = state_.temp_amax();
      CUDA_CHECK(cudaMemsetAsync(current, 0, sizeof(float), s));
      amax_bf16(current, src, n, s);
      if (training) amax_bf16(amax, src, n, s);  // record for the history
      args.source = ScaleSource::Amax;
      args.amax = current;
    } else {
      // Delayed: the scale was set from the history; record this tensor's amax (training only) while casting.
      args.source = ScaleSource::Stored;
      args.amax_out = training ? amax : nullptr;
    }
  }
  quantize(q, src, args, s);
}

void Linear::quantize_weight_into_scratch(const bf16* w, bool training, cudaStream_t s) {
  // The transposed copy is written by the same cast as the row codes unless its encoding differs (then by its own).
  wq_.data = state_.scratch(kScratchWeight);
  wq_.scale_inv = plan_.w.per_tensor() ? nullptr : state_.scratch_scales(kScratchWeight);
  QTensor& wt = split_weight_ ? wq_t_ : wq_;
  wt.data_t = state_.scratch(kScratchWeightT);
  wt.scale_inv_t = plan_.w_t.per_tensor() ? nullptr : state_.scratch_scales(kScratchWeightT);
  quantize_operand(wq_, w_slot_, w, /*amax_ready=*/false, training, LinearRole::W, s);
  if (split_weight_) quantize_operand(wq_t_, w_slot_, w, /*amax_ready=*/false, training, LinearRole::W, s);
}

void Linear::forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int M, bool training, cudaStream_t s,
                     const ForwardOptions& opt) {
  if (M > max_rows_) throw_error("%s: %d rows, planned for at most %d", name_.c_str(), M, max_rows_);
  if (opt.residual != nullptr && !adds_residual())
    throw_error("%s: this precision plan cannot add a residual in its product (check adds_residual() first)",
                name_.c_str());
  if (!plan_.quantized) {
    matmul_forward(out, x, w, bias, M, N_, K_, s, opt.pre_gelu, opt.residual);
    if (opt.out_amax) amax_bf16(opt.out_amax, out, (size_t)M * N_, s);
    return;
  }
  const int need = std::max({quant_gemm_dim_multiple(plan_.x), quant_gemm_dim_multiple(plan_.x_t),
                             quant_gemm_dim_multiple(plan_.dy), quant_gemm_dim_multiple(plan_.dy_t)});
  if (M % need != 0)
    throw_error("%s: quantised GEMMs need the rows (B*T = %d) to be a multiple of %d", name_.c_str(), M, need);
  state_.ensure_allocated();

  // The weight: once per optimizer step (codes + transposed codes; for 128x128 tiles both share the tile scales).
  // Delayed scaling records the weight's amax while casting, so a cache an evaluation forward built (which records
  // nothing) is rebuilt by the first training forward: same codes, and the step's amax recorded as in a run without
  // that evaluation (resumed runs then match uninterrupted ones bit for bit).
  const bool unrecorded =
      training && !weight_cache_recorded_ && plan_.scaling == ScalingMode::Delayed && plan_.w.per_tensor();
  // Quartet's forward codes are of x and w rotated along K: their telemetry measures the rotated values.
  const HadamardOption rotation = forward_rotation();
  if (!plan_.cache_weights) {
    // No cache: the weight's codes into scratch for this product (the cache's codes: same source, scale and cast).
    quantize_weight_into_scratch(w, training, s);
    weight_cache_valid_ = true;
  } else if (!weight_cache_valid_ || unrecorded) {
    // Without a cached transpose the cast still writes one (into scratch, discarded): that also fills the 128x128
    // transposed scales, which are kept.
    if (!plan_.cache_weight_transpose) wq_.data_t = state_.scratch(kScratchWeightT);
    quantize_operand(wq_, w_slot_, w, /*amax_ready=*/false, training, LinearRole::W, s, w_mask_);
    if (split_weight_) quantize_operand(wq_t_, w_slot_, w, /*amax_ready=*/false, training, LinearRole::W, s);
    if (!plan_.cache_weight_transpose) wq_.data_t = nullptr;
    weight_cache_valid_ = true;
    weight_cache_recorded_ = training;
  }
  // The weight's telemetry on a requested step, from the codes this forward uses (once per step: record_numerics
  // takes each name once), also when an evaluation or a sample since the optimizer step built them.
  const Mxfp4Scale forward_scale = forward_mxfp4_scale();
  if (training && state_.numerics_requested())
    state_.record_numerics(name_ + ".w", wq_, w, s, rotation, forward_scale);
  // The input: row codes for fprop; the transposed copy for wgrad when it is saved quantised.
  QTensor xq;
  xq.rows = M;
  xq.cols = K_;
  xq.encoding = plan_.x;
  xq.data = state_.scratch(kScratchRows);
  if (!xq.encoding.per_tensor()) xq.scale_inv = state_.scratch_scales(kScratchRows);
  if (xq.encoding.tensor_scale) xq.tensor_scale_inv = tensor_scales_ + kTsInput;
  const bool save = training && plan_.save_quantized_input;
  // The saved transposed copy comes from the same quantisation as the row codes when their encodings agree, else
  // from a quantisation of its own (xs).
  const bool split_saved = save && !plan_.requantize_backward && plan_.x_t != plan_.x;
  QTensor xs;
  if (save && plan_.requantize_backward) {  // Quartet saves the forward's own codes (and trust mask)
    xq.data = x_saved_.data;
    xq.scale_inv = x_saved_.scale_inv;
  } else if (save) {
    QTensor& t = split_saved ? xs : xq;
    t.rows = M;
    t.cols = K_;
    t.encoding = plan_.x_t;
    t.data_t = x_saved_.data_t;
    t.scale_inv_t = x_saved_.scale_inv_t;
    t.tensor_scale_inv_t = x_saved_.tensor_scale_inv_t;
  }
  // An NVFP4 x reaches its product as the quantiser's BF16 values; its codes are written only for the telemetry.
  const bool x_numerics = training && state_.numerics_requested();
  uint8_t* telemetry_codes = nullptr;
  if (xq.data != nullptr && !(save && plan_.requantize_backward) && values_operand(xq.encoding, K_)) {
    xq.values = reinterpret_cast<bf16*>(state_.scratch(kScratchRows));
    xq.data = nullptr;
    if (x_numerics) {
      CUDA_CHECK(cudaMallocAsync(&telemetry_codes, code_bytes(xq.encoding, M, K_), s));
      xq.data = telemetry_codes;
    }
  }
  quantize_operand(xq, x_slot_, x, opt.x_amax_ready, training, LinearRole::X, s,
                   save && plan_.requantize_backward ? x_mask_ : nullptr);
  if (split_saved) quantize_operand(xs, x_slot_, x, opt.x_amax_ready, training, LinearRole::X, s);
  if (save) {
    const QTensor& t = split_saved ? xs : xq;
    x_saved_.rows = M;
    x_saved_.scale = t.scale;
    x_saved_.scale_inv = t.scale_inv;  // per-tensor: the slot's scale_inv (blocks use scale_inv_t)
    have_saved_input_ = true;
  } else {
    have_saved_input_ = false;
  }
  if (x_numerics) state_.record_numerics(name_ + ".x", xq, x, s, rotation, forward_scale);
  if (telemetry_codes != nullptr) CUDA_CHECK(cudaFreeAsync(telemetry_codes, s));

  // The GEMM with as much of the bias / GELU as the epilogue supports for this combination (block scales support
  // neither; then the bias is added and the GELU applied by our kernels, which also report the output amax).
  const QuantOperand A = quant_operand(xq, false), B = quant_operand(wq_, false);
  // Product telemetry: the pre-activation x·wᵀ + bias against the BF16 product of the unquantised x and w.
  const bool measure_product = training && state_.product_numerics_requested();
  auto measure_fprop = [&](const bf16* product) {
    const size_t n = (size_t)M * N_;
    bf16* ref = nullptr;
    CUDA_CHECK(cudaMallocAsync(&ref, n * sizeof(bf16), s));
    matmul_forward(ref, x, w, bias, M, N_, K_, s);
    state_.record_product_numerics(name_ + ".fprop", product, ref, n, s);
    CUDA_CHECK(cudaFreeAsync(ref, s));
  };
  QuantGemmOptions g = gemm_options();
  g.fast_accum = plan_.fast_accum_fprop;
  g.bias = bias;
  g.pre_gelu = opt.pre_gelu;
  if (opt.pre_gelu != nullptr && matmul_quant_supported(false, A, B, M, N_, K_, g)) {
    matmul_quant(out, A, B, M, N_, K_, g, s);  // out = gelu(pre_gelu), pre_gelu = x·wᵀ + bias
    if (opt.out_amax) amax_bf16(opt.out_amax, out, (size_t)M * N_, s);
    if (measure_product) measure_fprop(opt.pre_gelu);
    return;
  }
  g.pre_gelu = nullptr;
  const bool fused_bias = bias != nullptr && matmul_quant_supported(false, A, B, M, N_, K_, g);
  if (!fused_bias) g.bias = nullptr;
  bf16* gemm_out = opt.pre_gelu != nullptr ? opt.pre_gelu : out;
  matmul_quant(gemm_out, A, B, M, N_, K_, g, s);
  float* gemm_out_amax = opt.pre_gelu != nullptr ? nullptr : opt.out_amax;
  if (bias != nullptr && !fused_bias) {
    add_bias(gemm_out, bias, M, N_, s, gemm_out_amax);
  } else if (gemm_out_amax != nullptr) {
    amax_bf16(gemm_out_amax, gemm_out, (size_t)M * N_, s);
  }
  if (measure_product) measure_fprop(gemm_out);
  if (opt.pre_gelu != nullptr) gelu_forward(out, opt.pre_gelu, (size_t)M * N_, s, opt.out_amax);
}

void Linear::backward(bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w, int M, cudaStream_t s,
                      const BackwardOptions& opt) {
  if (M > max_rows_) throw_error("%s: %d rows, planned for at most %d", name_.c_str(), M, max_rows_);
  if (opt.x_pre_gelu != nullptr && opt.accumulate_dx)
    throw_error("%s: the GELU backward cannot accumulate into dx", name_.c_str());
  if (!plan_.quantized) {
    if (dx != nullptr) {
      matmul_dgrad(dx, dy, w, M, N_, K_, opt.accumulate_dx, s, opt.x_pre_gelu);
      if (opt.dx_amax) amax_bf16(opt.dx_amax, dx, (size_t)M * K_, s);
    }
    if (x == nullptr) throw_error("%s: BF16 backward needs the layer input", name_.c_str());
    matmul_wgrad(dw, dy, x, M, N_, K_, /*accumulate=*/true, s);
    return;
  }
  if (opt.accumulate_dx)
    throw_error("%s: quantised dgrad overwrites dx (accumulate_dx is not supported with a quantised plan)",
                name_.c_str());
  if (!weight_cache_valid_) throw_error("%s: backward before forward (no quantised weight)", name_.c_str());
  if (plan_.requantize_backward) {
    backward_requantized(dx, dw, dy, M, s, opt);
    return;
  }
  if (!plan_.cache_weights && dx != nullptr) {  // dgrad's weight codes again (scratch holds another linear's now)
    if (w == nullptr)
      throw_error("%s: precision.cache_weights = false quantises the weight again in backward: pass it", name_.c_str());
    quantize_weight_into_scratch(w, /*training=*/false, s);
  }

  // dy: row codes (dgrad) and transposed codes (wgrad) in one pass, or in two when their encodings differ (dyq_t).
  const bool split_dy = plan_.dy_t != plan_.dy;
  QTensor dyq, dyq_t;
  dyq.rows = dyq_t.rows = M;
  dyq.cols = dyq_t.cols = N_;
  dyq.encoding = plan_.dy;
  dyq_t.encoding = plan_.dy_t;
  QTensor& t = split_dy ? dyq_t : dyq;
  dyq.data = dx != nullptr ? state_.scratch(kScratchRows) : nullptr;
  t.data_t = state_.scratch(kScratchRowsT);
  if (!dyq.encoding.per_tensor()) dyq.scale_inv = state_.scratch_scales(kScratchRows);
  if (!t.encoding.per_tensor()) t.scale_inv_t = state_.scratch_scales(kScratchRowsT);
  if (dyq.encoding.tensor_scale) dyq.tensor_scale_inv = tensor_scales_ + kTsDy;
  if (t.encoding.tensor_scale) t.tensor_scale_inv_t = tensor_scales_ + kTsDyT;
  // NVFP4 copies reach their products as the quantiser's BF16 values; dy's codes are written only for the telemetry.
  const bool dy_numerics = state_.numerics_requested() && dyq.data != nullptr;
  uint8_t* telemetry_codes = nullptr;
  if (dyq.data != nullptr && values_operand(dyq.encoding, N_)) {
    dyq.values = reinterpret_cast<bf16*>(state_.scratch(kScratchRows));
    dyq.data = nullptr;
    if (dy_numerics) {
      CUDA_CHECK(cudaMallocAsync(&telemetry_codes, code_bytes(dyq.encoding, M, N_), s));
      dyq.data = telemetry_codes;
    }
  }
  if (values_operand(t.encoding, M)) {
    t.values_t = reinterpret_cast<bf16*>(state_.scratch(kScratchRowsT));
    t.data_t = nullptr;
  }
  if (!split_dy || dyq.data != nullptr || dyq.values != nullptr)
    quantize_operand(dyq, dy_slot_, dy, opt.dy_amax_ready, /*training=*/true, LinearRole::Dy, s);
  if (split_dy) quantize_operand(dyq_t, dy_slot_, dy, opt.dy_amax_ready, /*training=*/true, LinearRole::Dy, s);
  if (dy_numerics) state_.record_numerics(name_ + ".dy", dyq, dy, s);
  if (telemetry_codes != nullptr) CUDA_CHECK(cudaFreeAsync(telemetry_codes, s));

  // dgrad: dx (M, K) = dYq (M, N) · Wᵀq (K, N)ᵀ
  if (dx != nullptr) {
    QTensor wt = split_weight_ ? wq_t_ : wq_;
    if (plan_.cache_weights && !plan_.cache_weight_transpose) {
      wt.data_t = state_.scratch(kScratchWeightT);
      fp8_transpose_codes(wt.data_t, wq_.data, N_, K_, s);
    }
    const QuantGemmOptions g = gemm_options();
    matmul_quant(dx, quant_operand(dyq, false), quant_operand(wt, true), M, K_, N_, g, s);
    if (opt.x_pre_gelu != nullptr)
      gelu_backward_inplace(dx, opt.x_pre_gelu, (size_t)M * K_, s, opt.dx_amax);
    else if (opt.dx_amax)
      amax_bf16(opt.dx_amax, dx, (size_t)M * K_, s);
    if (state_.product_numerics_requested() && w != nullptr) {  // against the BF16 dgrad (with its DGELU)
      const size_t n = (size_t)M * K_;
      bf16* ref = nullptr;
      CUDA_CHECK(cudaMallocAsync(&ref, n * sizeof(bf16), s));
      matmul_dgrad(ref, dy, w, M, N_, K_, /*accumulate=*/false, s, opt.x_pre_gelu);
      state_.record_product_numerics(name_ + ".dgrad", dx, ref, n, s);
      CUDA_CHECK(cudaFreeAsync(ref, s));
    }
  }

  // wgrad: dw (N, K) += dYᵀq (N, M) · Xᵀq (K, M)ᵀ
  QTensor xt;
  if (have_saved_input_ && x_saved_.rows == M) {
    xt = x_saved_;
  } else {
    if (x == nullptr)
      throw_error("%s: the input was not saved quantised by a training forward of %d rows and no BF16 input was "
                  "given", name_.c_str(), M);
    xt.rows = M;
    xt.cols = K_;
    xt.encoding = plan_.x_t;
    xt.data_t = state_.scratch(kScratchInputT);
    QuantizeArgs args;
    if (!xt.encoding.per_tensor()) {
      xt.scale_inv_t = state_.scratch_scales(kScratchInputT);
      if (xt.encoding.tensor_scale) xt.tensor_scale_inv_t = tensor_scales_ + kTsInputT;
      args = block_args(LinearRole::X, xt);
      quantize(xt, x, args, s);
    } else if (plan_.x.per_tensor()) {
      // the forward's per-tensor x scale (same micro-step) without measuring the amax again
      xt.scale = state_.scale_ptr(x_slot_);
      xt.scale_inv = state_.scale_inv_ptr(x_slot_);
      args.source = ScaleSource::Stored;
      quantize(xt, x, args, s);
    } else {
      // the forward's row codes had block scales: this copy's whole-tensor scale from x's amax, measured now
      quantize_operand(xt, x_slot_, x, /*amax_ready=*/false, /*training=*/true, LinearRole::X, s);
    }
  }
  QuantGemmOptions g = gemm_options();
  g.accumulate = true;
  const QuantOperand dyt_operand = quant_operand(split_dy ? dyq_t : dyq, true), xt_operand = quant_operand(xt, true);
  matmul_quant(dw, dyt_operand, xt_operand, N_, K_, M, g, s);
  if (state_.product_numerics_requested() && x != nullptr) {
    // This micro-step's quantised dyᵀ·x alone (dw holds the sum of the micro-steps) against the BF16 operands'; its
    // own inexact-block counter, so that the telemetry counts each product once.
    const size_t n = (size_t)N_ * K_;
    float *product = nullptr, *ref = nullptr;
    unsigned long long* inexact = nullptr;
    CUDA_CHECK(cudaMallocAsync(&product, n * sizeof(float), s));
    CUDA_CHECK(cudaMallocAsync(&ref, n * sizeof(float), s));
    CUDA_CHECK(cudaMallocAsync(&inexact, sizeof(unsigned long long), s));
    CUDA_CHECK(cudaMemsetAsync(inexact, 0, sizeof(unsigned long long), s));
    QuantGemmOptions alone = gemm_options();
    alone.inexact_blocks = inexact;
    matmul_quant(product, dyt_operand, xt_operand, N_, K_, M, alone, s);
    matmul_wgrad(ref, dy, x, M, N_, K_, /*accumulate=*/false, s);
    state_.record_product_numerics(name_ + ".wgrad", product, ref, n, s);
    CUDA_CHECK(cudaFreeAsync(product, s));
    CUDA_CHECK(cudaFreeAsync(ref, s));
    CUDA_CHECK(cudaFreeAsync(inexact, s));
  }
}

void Linear::backward_requantized(bf16* dx, float* dw, const bf16* dy, int M, cudaStream_t s,
                                  const BackwardOptions& opt) {
  if (!have_saved_input_ || x_saved_.rows != M)
    throw_error("%s: Quartet's backward re-quantises the input codes its training forward saved, and no training "
                "forward of %d rows saved them", name_.c_str(), M);
  const int h = plan_.backward_hadamard;
  const uint32_t signs = h != 0 ? state_.rotation_signs(index_, LinearRole::Dy, h) : 0u;
  const HadamardOption rotation = forward_rotation();  // the forward's, undone by the epilogues
  // Every backward operand: range-matched scales, the plan's rounding, the micro-step's rotation along the product's
  // inner dimension (the same S on both operands of a product, so it cancels).
  auto args_for = [&](LinearRole role, bool data, bool data_t) {
    QuantizeArgs a;
    a.mxfp4_scale = Mxfp4Scale::RangeMatched;
    if (plan_.dy_stochastic_rounding) {
      a.rounding = Rounding::Stochastic;
      a.sr_key = state_.stochastic_key(index_, role);
    }
    if (h != 0) a.hadamard = HadamardOption{h, signs, data, data_t};
    return a;
  };
  // dy along N (dgrad) and along the tokens (wgrad), one pass.
  QTensor dyq;
  dyq.rows = M;
  dyq.cols = N_;
  dyq.encoding = plan_.dy;
  dyq.data = dx != nullptr ? state_.scratch(kScratchRows) : nullptr;
  dyq.scale_inv = state_.scratch_scales(kScratchRows);
  dyq.data_t = state_.scratch(kScratchRowsT);
  dyq.scale_inv_t = state_.scratch_scales(kScratchRowsT);
  const QuantizeArgs dy_args = args_for(LinearRole::Dy, true, true);
  quantize(dyq, dy, dy_args, s);
  if (state_.numerics_requested() && dyq.data != nullptr)
    state_.record_numerics(name_ + ".dy", dyq, dy, s, dy_args.hadamard, dy_args.mxfp4_scale);

  float* product = reinterpret_cast<float*>(state_.scratch(kScratchProduct));
  const float factor = kRangeMatchProductFactor;
  // dgrad: dx (M, K) = the inverse forward rotation along K of (16/9 · dYq (M, N) · Wᵀq (K, N)ᵀ ⊙ Mx)
  if (dx != nullptr) {
    QTensor wt;
    wt.rows = N_;
    wt.cols = K_;
    wt.encoding = plan_.w;
    wt.data_t = state_.scratch(kScratchWeightT);
    wt.scale_inv_t = state_.scratch_scales(kScratchWeightT);
    fp4_requantize(wt, wq_, args_for(LinearRole::W, false, true), s);  // the saved Wq (N, K) along N
    matmul_quant(product, quant_operand(dyq, false), quant_operand(wt, true), M, K_, N_, gemm_options(), s);
    mxfp4_gradient_epilogue(dx, nullptr, product, plan_.trust_mask ? x_mask_ : nullptr, M, K_, factor,
                            rotation.size, rotation.signs, s);
    if (opt.x_pre_gelu != nullptr)
      gelu_backward_inplace(dx, opt.x_pre_gelu, (size_t)M * K_, s, opt.dx_amax);
    else if (opt.dx_amax)
      amax_bf16(opt.dx_amax, dx, (size_t)M * K_, s);
  }
  // wgrad: dw (N, K) += the inverse forward rotation along K of (16/9 · dYᵀq (N, M) · Xᵀq (K, M)ᵀ ⊙ Mw)
  QTensor xt;
  xt.rows = M;
  xt.cols = K_;
  xt.encoding = plan_.x;
  xt.data_t = state_.scratch(kScratchInputT);
  xt.scale_inv_t = state_.scratch_scales(kScratchInputT);
  fp4_requantize(xt, x_saved_, args_for(LinearRole::X, false, true), s);  // the saved Xq (M, K) along M
  matmul_quant(product, quant_operand(dyq, true), quant_operand(xt, true), N_, K_, M, gemm_options(), s);
  mxfp4_gradient_epilogue(nullptr, dw, product, plan_.trust_mask ? w_mask_ : nullptr, N_, K_, factor,
                          rotation.size, rotation.signs, s);
}

}  // namespace llmc
