// test/precision/fp4_ref_dump.cpp: a command-line face of the C++ FP4 reference (test/reference/fp4_ref.cpp) for
// test/precision/test_fp4_numpy.py, which compares it with the independent NumPy reference. Not a GoogleTest.
//
//   fp4_ref_dump CASES OUT
// CASES (text), per case two lines:
//   case ENCODING ROWS COLS SR SEED STEP TENSOR HSIZE HSIGNS HDATA HDATA_T AMAX DATA DATA_T
//   X0 X1 ... (ROWS * COLS FP32 bit patterns, hex)
// ENCODING: nvfp4 (1x16), nvfp4_2d (16x16 tiles), mxfp4 (1x32), mxfp4_quest (1x32 with QuEST's Gaussian scales and
// the data copy's trust mask), mxfp4_matched (1x32 with Quartet's range-matched backward scales); SR 0 = round to nearest, 1 = stochastic with key
// (SEED, STEP, TENSOR); HSIZE 0 / 16 / 32 with sign word HSIGNS (hex) and which copies it rotates (HDATA, HDATA_T
// 0 / 1); AMAX: "-" (measured) or the FP32 bits (hex) of the NVFP4 tensor amax; DATA, DATA_T: which copies to make.
// OUT (text), per case, for each copy made (suffix "" for data, "_t" for data_t): lines "data HEX", "scale_inv HEX"
// (bytes), "tensor_scale_inv BITS" (NVFP4), "trust_mask HEX" (mxfp4_quest, data: the little-endian words), and for
// a rotated copy "rotated BITS..." (the values hadamard_cpu gives the copy's source (rows, cols) or transposed (cols,
// rows)), then "end".
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"
#include "llmc/precision/encoding.h"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/quantize.h"
#include "test/reference/precision_ref.h"
#include "test/support/ref_dump_io.h"

namespace {

using llmc::Encoding;

Encoding encoding_named(const std::string& name) {
  if (name == "nvfp4") return llmc::kNvfp4Encoding;
  if (name == "nvfp4_2d") return llmc::kNvfp4WeightEncoding;
  if (name == "mxfp4" || name == "mxfp4_quest" || name == "mxfp4_matched") return llmc::kMxfp4Encoding;
  std::fprintf(stderr, "fp4_ref_dump: unknown encoding '%s' (nvfp4, nvfp4_2d, mxfp4, mxfp4_quest, mxfp4_matched)\n",
               name.c_str());
  std::exit(2);
}

// The source of one copy: x (rows, cols), or transposed to (cols, rows), rotated as the quantiser rotates it.
std::vector<float> rotated_copy(const std::vector<float>& x, int rows, int cols, bool transposed, int size,
                                uint32_t signs) {
  std::vector<float> v(x.size());
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      v[transposed ? static_cast<size_t>(c) * rows + r : i] = x[i];
    }
  llmc::hadamard_cpu(v.data(), v.size(), size, signs);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fp4_ref_dump CASES OUT\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  std::ofstream out(argv[2]);
  if (!in || !out) {
    std::fprintf(stderr, "fp4_ref_dump: cannot open %s or %s\n", argv[1], argv[2]);
    return 2;
  }
  std::string tag;
  while (in >> tag) {
    if (tag != "case") {
      std::fprintf(stderr, "fp4_ref_dump: %s: expected 'case', got '%s'\n", argv[1], tag.c_str());
      return 2;
    }
    std::string enc_name, amax_text, signs_text;
    int rows = 0, cols = 0, sr = 0, hdata = 0, hdata_t = 0, want_data = 0, want_data_t = 0;
    uint64_t seed = 0;
    uint32_t step = 0, tensor = 0;
    llmc::QuantizeArgs args;
    in >> enc_name >> rows >> cols >> sr >> seed >> step >> tensor >> args.hadamard.size >> signs_text >> hdata >>
        hdata_t >> amax_text >> want_data >> want_data_t;
    const std::vector<float> x = ref_dump::read_floats(in, static_cast<size_t>(rows) * cols);
    if (!in) {
      std::fprintf(stderr, "fp4_ref_dump: %s: a truncated case\n", argv[1]);
      return 2;
    }
    const Encoding e = encoding_named(enc_name);
    const bool quest = enc_name == "mxfp4_quest";
    if (quest) args.mxfp4_scale = llmc::Mxfp4Scale::Gaussian;
    if (enc_name == "mxfp4_matched") args.mxfp4_scale = llmc::Mxfp4Scale::RangeMatched;
    args.rounding = sr ? llmc::Rounding::Stochastic : llmc::Rounding::Nearest;
    args.sr_key = {seed, step, tensor};
    args.hadamard.signs = static_cast<uint32_t>(std::stoul(signs_text, nullptr, 16));
    args.hadamard.data = hdata != 0;
    args.hadamard.data_t = hdata_t != 0;
    const bool has_amax = amax_text != "-";
    const float amax = has_amax ? llmc::bits_to_float(static_cast<uint32_t>(std::stoul(amax_text, nullptr, 16))) : 0;

    std::vector<uint8_t> data(llmc::code_bytes(e, rows, cols)), scale(llmc::scale_inv_bytes(e, rows, cols));
    std::vector<uint8_t> data_t(llmc::code_bytes(e, cols, rows)), scale_t(llmc::scale_inv_bytes(e, cols, rows));
    llmc::Fp4CpuOut o;
    std::vector<uint32_t> trust(static_cast<size_t>(rows) * ((cols + 31) / 32));
    if (want_data) o.data = data.data(), o.scale_inv = scale.data();
    if (want_data && quest) o.trust_mask = trust.data();
    if (want_data_t) o.data_t = data_t.data(), o.scale_inv_t = scale_t.data();
    llmc::fp4_quantize_cpu(&o, x.data(), rows, cols, e, args, has_amax ? &amax : nullptr);

    const bool nvfp4 = llmc::nvfp4_encoding(e), h = args.hadamard.any();
    out << "case\n";
    if (want_data) {
      ref_dump::put_bytes(out, "data", data);
      ref_dump::put_bytes(out, "scale_inv", scale);
      if (nvfp4) ref_dump::put_floats(out, "tensor_scale_inv", {o.tensor_scale_inv});
      if (quest) {
        std::vector<uint8_t> bytes(trust.size() * 4);
        std::memcpy(bytes.data(), trust.data(), bytes.size());  // little-endian words
        ref_dump::put_bytes(out, "trust_mask", bytes);
      }
      if (h && args.hadamard.data)
        ref_dump::put_floats(out, "rotated", rotated_copy(x, rows, cols, false, args.hadamard.size, args.hadamard.signs));
    }
    if (want_data_t) {
      ref_dump::put_bytes(out, "data_t", data_t);
      ref_dump::put_bytes(out, "scale_inv_t", scale_t);
      if (nvfp4) ref_dump::put_floats(out, "tensor_scale_inv_t", {o.tensor_scale_inv_t});
      if (h && args.hadamard.data_t)
        ref_dump::put_floats(out, "rotated_t", rotated_copy(x, rows, cols, true, args.hadamard.size, args.hadamard.signs));
    }
    out << "end\n";
  }
  return out ? 0 : 1;
}
