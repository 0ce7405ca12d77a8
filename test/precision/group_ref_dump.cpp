// test/precision/group_ref_dump.cpp: a command-line face of the C++ reference of the FP8 1x16 group copies
// (test/reference/group_quant_ref.cpp) for test/precision/test_group_numpy.py, which compares it with an independent
// NumPy / ml_dtypes reference. Not a GoogleTest.
//
//   group_ref_dump CASES OUT
// CASES (text), per case two lines:
//   case ROWS COLS
//   X0 X1 ... (ROWS * COLS FP32 bit patterns, hex; cols a multiple of 16)
// OUT (text), per case: "codes HEX" (rows * cols E4M3 bytes), "scale_inv BITS..." (the FP32 dequant scales,
// (cols / 16, round_up(rows, 4)) with padding), "group_amax BITS..." (FP32, same layout), "dequantized BITS..."
// (rows * cols FP32 values of fp8_groups_dequantize_cpu), then "end".
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "test/reference/group_quant_ref.h"
#include "test/support/ref_dump_io.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: group_ref_dump CASES OUT\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  std::ofstream out(argv[2]);
  if (!in || !out) {
    std::fprintf(stderr, "group_ref_dump: cannot open %s or %s\n", argv[1], argv[2]);
    return 2;
  }
  std::string tag;
  while (in >> tag) {
    if (tag != "case") {
      std::fprintf(stderr, "group_ref_dump: %s: expected 'case', got '%s'\n", argv[1], tag.c_str());
      return 2;
    }
    int rows = 0, cols = 0;
    in >> rows >> cols;
    const std::vector<float> x = ref_dump::read_floats(in, static_cast<size_t>(rows) * cols);
    if (!in) {
      std::fprintf(stderr, "group_ref_dump: %s: a truncated case\n", argv[1]);
      return 2;
    }
    const llmc::Fp8GroupsCpu g = llmc::fp8_groups_quantize_cpu(x.data(), rows, cols);
    out << "case\n";
    ref_dump::put_bytes(out, "codes", g.codes);
    ref_dump::put_floats(out, "scale_inv", g.scale_inv);
    ref_dump::put_floats(out, "group_amax", g.group_amax);
    ref_dump::put_floats(out, "dequantized",
                         llmc::fp8_groups_dequantize_cpu(g.codes.data(), g.scale_inv.data(), rows, cols));
    out << "end\n";
  }
  return 0;
}
