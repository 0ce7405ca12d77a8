// llmc/io/tokenizer.h: GPT-2 decoding (token ids -> bytes) from the bundled encoder.json, for printing samples.
// GPT-2's vocabulary stores every token as a string of "byte characters" (the reversible byte <-> unicode map of
// OpenAI's encoder.py); decoding maps each character back to its byte. A token may hold a partial UTF-8 character,
// so decode(int) returns raw bytes; decode(vector) concatenates the bytes of the whole sequence. Decode only.
#pragma once

#include <string>
#include <vector>

namespace llmc {

class GPT2Tokenizer {
 public:
  // Loads encoder.json (token string -> id). Throws llmc::Error naming the file if it is missing, not a regular file,
  // larger than 64 MiB, not JSON (or JSON nested deeper than 64 levels, or with a token string twice), or not a
  // GPT-2-style vocabulary (ids must be 0..N-1, each once; "<|endoftext|>" must be present).
  explicit GPT2Tokenizer(const std::string& encoder_json_path);

  std::string decode(int token) const;                     // the token's bytes; llmc::Error if !is_valid(token)
  std::string decode(const std::vector<int>& tokens) const;  // concatenated bytes; llmc::Error on an invalid id
  int eot_token() const { return eot_token_; }             // <|endoftext|>, 50256 for GPT-2
  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }  // 50257 for GPT-2
  bool is_valid(int token) const { return token >= 0 && token < vocab_size(); }

 private:
  std::string path_;
  std::vector<std::string> token_bytes_;  // (vocab_size,) id -> bytes
  int eot_token_ = -1;
};

}  // namespace llmc
