// llmc/io/tokenizer.cpp: implementation of GPT2Tokenizer (encoder.json -> id -> bytes through GPT-2's byte <-> unicode map).
#include "llmc/io/tokenizer.h"

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/core/input_safety.h"

namespace llmc {

namespace {

constexpr uint64_t kMaxEncoderJsonBytes = 64u << 20;  // GPT-2's encoder.json is 1 MB

// GPT-2's bytes_to_unicode(), inverted: unicode code point -> byte. Printable bytes ('!'..'~', 0xA1..0xAC,
// 0xAE..0xFF) stand for themselves; the other 68 bytes, in increasing order, are shifted to 256, 257, ...
// Returns a table indexed by code point (0..323) holding the byte, or -1 where no byte maps there.
std::vector<int> unicode_to_byte_table() {
  std::vector<int> table(256 + 68, -1);
  int next_shifted = 256;
  for (int b = 0; b < 256; b++) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[printable ? b : next_shifted++] = b;
  }
  return table;
}

// Decodes UTF-8 into code points; returns false on malformed input.
bool utf8_to_code_points(const std::string& s, std::vector<int>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (length == 0 || i + length > s.size()) return false;
    int cp = length == 1 ? c : c & (0x7F >> length);
    for (int k = 1; k < length; k++) {
      const unsigned char cont = static_cast<unsigned char>(s[i + k]);
      if ((cont >> 6) != 0x2) return false;
      cp = (cp << 6) | (cont & 0x3F);
    }
    out.push_back(cp);
    i += length;
  }
  return true;
}

}  // namespace

GPT2Tokenizer::GPT2Tokenizer(const std::string& encoder_json_path) : path_(encoder_json_path) {
  // A regular file of bounded size, JSON with the nesting limit and no token string twice (nlohmann would keep the
  // last id of a duplicate silently).
  const nlohmann::json encoder = read_json_file(
      encoder_json_path, "tokenizer file", kMaxEncoderJsonBytes, {},
      " (hint: the GPT-2 vocabulary is bundled as dev/data/gpt2/encoder.json; set data.tokenizer to its path)");
  if (!encoder.is_object() || encoder.empty())
    throw_error("tokenizer: '%s' is not a GPT-2 encoder.json (expected an object mapping token strings to ids)",
                encoder_json_path.c_str());

  const std::vector<int> unicode_to_byte = unicode_to_byte_table();
  token_bytes_.assign(encoder.size(), std::string());
  std::vector<bool> seen(encoder.size(), false);
  std::vector<int> code_points;
  for (auto it = encoder.begin(); it != encoder.end(); ++it) {
    const std::string& token_string = it.key();
    if (!it.value().is_number_integer())
      throw_error("tokenizer: '%s': the id of token %s is not an integer", encoder_json_path.c_str(),
                  nlohmann::json(token_string).dump().c_str());
    const long long id = it.value().get<long long>();
    if (id < 0 || id >= static_cast<long long>(encoder.size()) || seen[id])
      throw_error("tokenizer: '%s': token %s has id %lld, but ids must be 0..%zu, each used once",
                  encoder_json_path.c_str(), nlohmann::json(token_string).dump().c_str(), id, encoder.size() - 1);
    seen[id] = true;
    if (!utf8_to_code_points(token_string, code_points))
      throw_error("tokenizer: '%s': token %lld is not valid UTF-8", encoder_json_path.c_str(), id);
    std::string bytes;
    for (int cp : code_points) {
      if (cp < 0 || cp >= static_cast<int>(unicode_to_byte.size()) || unicode_to_byte[cp] < 0)
        throw_error("tokenizer: '%s': token %lld holds the character U+%04X, which is not in GPT-2's byte map (is "
                    "this a GPT-2 byte-level vocabulary?)", encoder_json_path.c_str(), id, cp);
      bytes.push_back(static_cast<char>(unicode_to_byte[cp]));
    }
    token_bytes_[id] = bytes;
    if (token_string == "<|endoftext|>") eot_token_ = static_cast<int>(id);
  }
  if (eot_token_ < 0)
    throw_error("tokenizer: '%s' has no \"<|endoftext|>\" token (is this a GPT-2 encoder.json?)",
                encoder_json_path.c_str());
}

std::string GPT2Tokenizer::decode(int token) const {
  if (!is_valid(token))
    throw_error("tokenizer: token id %d is outside the vocabulary of %d tokens in '%s' (hint: check is_valid() "
                "before decoding padded-vocabulary ids)", token, vocab_size(), path_.c_str());
  return token_bytes_[token];
}

std::string GPT2Tokenizer::decode(const std::vector<int>& tokens) const {
  std::string text;
  for (int token : tokens) text += decode(token);
  return text;
}

}  // namespace llmc
