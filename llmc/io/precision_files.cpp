// llmc/io/precision_files.cpp: the precision state on disk (llmc/io/precision_files.h).
#include "llmc/io/precision_files.h"

#include <cstdint>
#include <vector>

#include "llmc/io/safetensors.h"

namespace llmc {

void write_precision_state(const std::string& path, const PrecisionState& state) {
  std::vector<float> scales, history;
  state.download(&scales, &history);
  SafetensorsWriter writer;
  writer.add("scales", "F32", {static_cast<int64_t>(scales.size())}, scales.data(), scales.size() * sizeof(float));
  writer.add("amax_history", "F32", {static_cast<int64_t>(history.size())}, history.data(),
             history.size() * sizeof(float));
  writer.set_metadata("format", "llm8");
  writer.set_metadata("content", "fp8 scaling state");
  writer.write(path);
}

void read_precision_state(const std::string& path, const nlohmann::json& description, PrecisionState& state) {
  SafetensorsReader reader(path);
  std::vector<float> scales(reader.entry("scales").nbytes / sizeof(float)),
      history(reader.entry("amax_history").nbytes / sizeof(float));
  reader.read_into("scales", scales.data(), scales.size() * sizeof(float));
  reader.read_into("amax_history", history.data(), history.size() * sizeof(float));
  state.upload(description, scales, history);
}

}  // namespace llmc
