// llmc/precision/quantize.cu: the quantiser families of this build (one row each: which encodings it handles, its
// cast, its telemetry) and the dispatch of llmc/precision/quantize.h over them.
#include "llmc/precision/quantize.h"

#include <cmath>

#include "llmc/core/common.h"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/group_quant.h"

namespace llmc {

namespace {

struct QuantizerFamily {
  const char* name;
  const char* encodings;  // what it handles, for errors
  bool (*handles)(const Encoding&);
  void (*quantize)(const QTensor&, const bf16*, const QuantizeArgs&, cudaStream_t);
  void (*stats)(double*, const QTensor&, const bf16*, const HadamardOption&, Mxfp4Scale, cudaStream_t);
  bool fp4_options;  // honours QuantizeArgs' rounding, hadamard, mxfp4_scale and trust_mask (others: the defaults)
};

void quantize_fp8_tensorwise(const QTensor& q, const bf16* src, const QuantizeArgs& args, cudaStream_t stream) {
  switch (args.source) {
    case ScaleSource::Amax:
      if (args.amax_out)
        throw_error("quantize: amax_out records the amax of a cast with a stored scale (delayed scaling); with "
                    "ScaleSource::Amax the amax is already known");
      fp8_quantize_tensorwise_from_amax(q, src, args.amax, args.margin, stream);
      return;
    case ScaleSource::Stored:
      fp8_quantize_tensorwise(q, src, args.amax_out, stream);
      return;
  }
  throw_error("quantize: unknown ScaleSource %d", static_cast<int>(args.source));
}

void quantize_fp8_blockwise(const QTensor& q, const bf16* src, const QuantizeArgs&, cudaStream_t stream) {
  fp8_quantize_blockwise(q, src, stream);
}

// The telemetry of a family whose codes are never rotated and have no MXFP4 scale rule (quant_stats refuses a rotation
// or a rule other than the default for it first).
template <void (*Stats)(double*, const QTensor&, const bf16*, cudaStream_t)>
void unrotated_stats(double* out, const QTensor& q, const bf16* x, const HadamardOption&, Mxfp4Scale,
                     cudaStream_t stream) {
  Stats(out, q, x, stream);
}

const QuantizerFamily kFamilies[] = {
    {"fp8 per-tensor", "e4m3 | e5m2 codes, one fp32 | pow2 scale per tensor", fp8_tensorwise_encoding,
     quantize_fp8_tensorwise, unrotated_stats<fp8_quant_stats>, false},
    {"fp8 block-wise", "e4m3 | e5m2 codes, fp32 | pow2 scales per 1x128 or 128x128 block", fp8_blockwise_encoding,
     quantize_fp8_blockwise, unrotated_stats<fp8_quant_stats>, false},
    {"fp4", "e2m1 codes with e4m3 scales per 1x16 or 16x16 block + fp32 tensor scale (nvfp4), or e8m0 scales per 1x32 "
     "block (mxfp4)", fp4_encoding, fp4_quantize, fp4_quant_stats, true},
    {"fp8 1x16 groups", "e4m3 codes, fp32 scales per 1x16 group (the saved activations' copies)",
     fp8_groups_encoding, fp8_groups_quantize, unrotated_stats<fp8_groups_quant_stats>, false},
};

const QuantizerFamily* find_family(const Encoding& e) {
  if (!encoding_error(e).empty()) return nullptr;
  for (const QuantizerFamily& f : kFamilies)
    if (f.handles(e)) return &f;
  return nullptr;
}

const QuantizerFamily& family_of(const char* who, const Encoding& e) {
  const QuantizerFamily* f = find_family(e);
  if (!f) throw_error("%s: %s", who, quantizer_error(e).c_str());
  return *f;
}

// Every encoding with a name: the element formats x the named block shapes x the scale formats x second level or not.
template <typename F>
void for_each_named_encoding(F&& fn) {
  for (ElementFormat element : kElementFormats)
    for (BlockShape block : kBlockShapes)
      for (ScaleFormat scale : kScaleFormats)
        for (bool tensor_scale : {false, true}) fn(Encoding{element, block, scale, tensor_scale});
}

// The values of `all` that some quantisable named encoding has as its field(e), in the order of `all`.
template <typename T, size_t N, typename Field>
std::vector<T> quantizable(const T (&all)[N], Field field) {
  std::vector<T> out;
  for (const T& value : all) {
    bool any = false;
    for_each_named_encoding([&](const Encoding& e) { any = any || (field(e) == value && find_family(e)); });
    if (any) out.push_back(value);
  }
  return out;
}

}  // namespace

std::string quantizer_error(const Encoding& e) {
  const std::string invalid = encoding_error(e);
  if (!invalid.empty()) return "not an encoding (" + invalid + ")";
  if (find_family(e)) return "";
  std::string have;
  for (const QuantizerFamily& f : kFamilies) have += std::string(have.empty() ? "" : "; ") + f.encodings;
  return "this build has no quantiser for " + encoding_name(e) + " (it quantises " + have + ")";
}

std::vector<ElementFormat> quantizable_element_formats() {
  return quantizable(kElementFormats, [](const Encoding& e) { return e.element; });
}

std::vector<BlockShape> quantizable_block_shapes() {
  return quantizable(kBlockShapes, [](const Encoding& e) { return e.block; });
}

void quantize(const QTensor& q, const bf16* src, const QuantizeArgs& args, cudaStream_t stream) {
  const QuantizerFamily& f = family_of("quantize", q.encoding);
  if (!f.fp4_options && (args.rounding != Rounding::Nearest || args.hadamard.any() ||
                                   args.mxfp4_scale != Mxfp4Scale::Amax || args.trust_mask))
    throw_error("quantize: %s (the %s quantiser) rounds to nearest without a Hadamard transform; stochastic rounding, "
                "Hadamard transforms, Gaussian and range-matched scales and trust masks are options of the fp4 quantisers",
                encoding_name(q.encoding).c_str(), f.name);
  f.quantize(q, src, args, stream);
}

void quant_stats(double* stats_out, const QTensor& q, const bf16* x, cudaStream_t stream,
                 const HadamardOption& rotation, Mxfp4Scale mxfp4_scale) {
  const QuantizerFamily& f = family_of("quant_stats", q.encoding);
  if (rotation.any() && !f.fp4_options)
    throw_error("quant_stats: %s (the %s quantiser) has no rotated copies to measure", encoding_name(q.encoding).c_str(),
                f.name);
  if (mxfp4_scale != Mxfp4Scale::Amax && !f.fp4_options)
    throw_error("quant_stats: %s (the %s quantiser) has no MXFP4 scale rule; pass Mxfp4Scale::Amax (the default)",
                encoding_name(q.encoding).c_str(), f.name);
  f.stats(stats_out, q, x, rotation, mxfp4_scale, stream);
}

QuantStats finish_quant_stats(const double* s) {
  QuantStats out;
  const double elements = s[kStatElements], nonzero = s[kStatNonzero];
  out.amax = s[kStatAmax];
  out.scale = s[kStatScale];
  out.saturated_frac = elements > 0 ? s[kStatSaturated] / elements : 0.0;
  out.underflow_frac = nonzero > 0 ? s[kStatUnderflow] / nonzero : 0.0;
  out.snr_db = s[kStatSumErr2] > 0 ? 10.0 * std::log10(s[kStatSumX2] / s[kStatSumErr2]) : INFINITY;
  out.clipped_frac = elements > 0 ? s[kStatClipped] / elements : 0.0;
  return out;
}

}  // namespace llmc
