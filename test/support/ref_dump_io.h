// test/support/ref_dump_io.h: the text format the reference dump tools (test/precision/fp4_ref_dump.cpp,
// group_ref_dump.cpp) share with their NumPy tests: a labelled line of bytes as one hex string, a labelled line of
// FP32 values as their bit patterns in hex, and reading FP32 bit patterns back. Header-only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "llmc/core/float_rn.cuh"

namespace ref_dump {

// "LABEL 00ff..." (two hex digits per byte)
inline void put_bytes(std::ostream& os, const char* label, const std::vector<uint8_t>& bytes) {
  os << label << ' ';
  char hex[3];
  for (uint8_t b : bytes) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    os << hex;
  }
  os << '\n';
}

// "LABEL 3f800000 ..." (the FP32 bit pattern of each value)
inline void put_floats(std::ostream& os, const char* label, const std::vector<float>& values) {
  os << label;
  char hex[10];
  for (float v : values) {
    std::snprintf(hex, sizeof hex, " %08x", llmc::float_to_bits(v));
    os << hex;
  }
  os << '\n';
}

// n FP32 values given as whitespace-separated hex bit patterns (the stream's failbit set when they run out).
inline std::vector<float> read_floats(std::istream& in, size_t n) {
  std::vector<float> x(n);
  for (float& v : x) {
    std::string word;
    if (!(in >> word)) break;
    v = llmc::bits_to_float(static_cast<uint32_t>(std::stoul(word, nullptr, 16)));
  }
  return x;
}

}  // namespace ref_dump
