// test/optim/test_moment_vectors: the FP8 optimizer-state formats against the independent NumPy reference
// (test/optim/gen_moment_vectors.py -> test/optim/data/moment_vectors.txt), bit for bit: the host codecs
// (encode_moment / decode_moment, llmc/optim/state_format.h) on random, all-zero, constant, denormal-range, huge-range,
// mixed-sign and partial-last-group cases, and the CPU reference of the fused AdamW update (test/reference/optim_ref.h,
// the reference of the GPU kernel) over several steps.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/optim/state_format.h"
#include "test/reference/optim_ref.h"

namespace {

const std::string kVectors = std::string(LLM8_SOURCE_DIR) + "/test/optim/data/moment_vectors.txt";

struct Case {
  std::vector<std::string> header;                             // the words after "@"
  std::vector<std::pair<std::string, std::vector<std::string>>> fields;  // in file order
};

std::vector<Case> load_cases() {
  std::ifstream in(kVectors);
  if (!in) throw llmc::Error("cannot open " + kVectors + " (written by test/optim/gen_moment_vectors.py)");
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string w;
    std::vector<std::string> all;
    while (words >> w) all.push_back(w);
    if (all[0] == "@") {
      cases.push_back({std::vector<std::string>(all.begin() + 1, all.end()), {}});
    } else {
      cases.back().fields.push_back({all[0], std::vector<std::string>(all.begin() + 1, all.end())});
    }
  }
  return cases;
}

std::vector<float> floats(const std::vector<std::string>& hex) {
  std::vector<float> out;
  for (const std::string& h : hex) {
    const uint32_t u = static_cast<uint32_t>(std::stoul(h, nullptr, 16));
    float f;
    std::memcpy(&f, &u, 4);
    out.push_back(f);
  }
  return out;
}

std::vector<uint8_t> codes(const std::vector<std::string>& hex) {
  std::vector<uint8_t> out;
  for (const std::string& h : hex) out.push_back(static_cast<uint8_t>(std::stoul(h, nullptr, 16)));
  return out;
}

// The storage block of n elements from its metadata and codes (layout of llmc/optim/state_format.h).
std::vector<uint8_t> block_of(const llmc::MomentStorage& st, size_t n, const std::vector<float>& groups,
                              const std::vector<uint8_t>& c) {
  std::vector<uint8_t> block(st.bytes(n));
  EXPECT_EQ(groups.size() * 4, st.metadata_bytes(n));
  EXPECT_EQ(c.size(), st.codes_bytes(n));
  std::memcpy(block.data(), groups.data(), groups.size() * 4);
  std::memcpy(block.data() + st.metadata_bytes(n), c.data(), c.size());
  return block;
}

std::vector<float> groups_of(const llmc::MomentStorage& st, const std::vector<uint8_t>& block, size_t n) {
  std::vector<float> g(st.metadata_bytes(n) / 4);
  std::memcpy(g.data(), block.data(), g.size() * 4);
  return g;
}
std::vector<uint8_t> codes_of(const llmc::MomentStorage& st, const std::vector<uint8_t>& block, size_t n) {
  return std::vector<uint8_t>(block.begin() + static_cast<long>(st.metadata_bytes(n)), block.end());
}

// Bitwise comparison naming the first differing element.
template <class T>
void expect_bits(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); i++)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << "[" << i << "]: got " << +got[i] << ", NumPy " << +want[i];
      return;
    }
}

}  // namespace

TEST(MomentVectors, HostCodecsMatchNumPy) {
  int seen = 0;
  for (const Case& c : load_cases()) {
    if (c.header[0] != "encode") continue;
    SCOPED_TRACE(c.header[1] + " " + c.header[2]);
    const llmc::MomentStorage& st = llmc::parse_state_format(c.header[1]).m;
    const size_t n = std::stoul(c.header[3]);
    ASSERT_EQ(c.fields.size(), 4u);
    const std::vector<float> values = floats(c.fields[0].second);
    ASSERT_EQ(values.size(), n);
    std::vector<uint8_t> block(st.bytes(n), 0xAB);
    llmc::encode_moment(st, values.data(), n, block.data());
    expect_bits("groups", groups_of(st, block, n), floats(c.fields[1].second));
    expect_bits("codes", codes_of(st, block, n), codes(c.fields[2].second));
    std::vector<float> decoded(n);
    llmc::decode_moment(st, block.data(), n, decoded.data());
    expect_bits("decoded", decoded, floats(c.fields[3].second));
    seen++;
  }
  EXPECT_EQ(seen, 18);
}

TEST(MomentVectors, FusedUpdateReferenceMatchesNumPy) {
  int seen = 0;
  for (const Case& c : load_cases()) {
    if (c.header[0] != "update") continue;
    SCOPED_TRACE(c.header[1] + " " + c.header[2]);
    const llmc::StateFormat& format = llmc::parse_state_format(c.header[1]);
    const size_t n = std::stoul(c.header[3]);
    const int steps = std::stoi(c.header[4]);
    std::map<std::string, std::vector<std::string>> init;
    for (size_t i = 0; i < 6; i++) init[c.fields[i].first] = c.fields[i].second;
    const std::vector<float> hp = floats(init.at("hyper"));
    std::vector<float> master = floats(init.at("master")), params(n);
    std::vector<uint8_t> m = block_of(format.m, n, floats(init.at("m_groups")), codes(init.at("m_codes")));
    std::vector<uint8_t> v = block_of(format.v, n, floats(init.at("v_groups")), codes(init.at("v_codes")));
    size_t at = 6;
    for (int t = 1; t <= steps; t++, at += 8) {
      SCOPED_TRACE(llmc::strformat("step %d", t));
      ASSERT_EQ(c.fields[at].first, "step");
      const std::vector<float> grads = floats(c.fields[at + 1].second);
      llmc::adamw_update_cpu(format, master.data(), params.data(), grads.data(),
                             llmc::moment_view(format.m, m.data(), n, 0), llmc::moment_view(format.v, v.data(), n, 0),
                             n, hp[0], hp[1], hp[2], hp[3], hp[4], t, hp[5]);
      expect_bits("master", master, floats(c.fields[at + 2].second));
      expect_bits("params", params, floats(c.fields[at + 3].second));
      expect_bits("m groups", groups_of(format.m, m, n), floats(c.fields[at + 4].second));
      expect_bits("m codes", codes_of(format.m, m, n), codes(c.fields[at + 5].second));
      expect_bits("v groups", groups_of(format.v, v, n), floats(c.fields[at + 6].second));
      expect_bits("v codes", codes_of(format.v, v, n), codes(c.fields[at + 7].second));
    }
    seen++;
  }
  EXPECT_EQ(seen, 4);
}
