// llmc/run/sampling.h: text generation from a model with the training forward (the same kernels, precision recipe and
// quantisers, so a sample shows what training computes), and the explicit RNG whose whole state is one integer, so
// checkpoints carry it and a resumed run samples the same text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "llmc/io/tokenizer.h"
#include "llmc/model/model.h"

namespace llmc {

// xorshift64*; state() / set_state() for checkpoints.
class SampleRng {
 public:
  explicit SampleRng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }
  uint64_t next_u64() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  double next_unit() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)

 private:
  uint64_t state_;
};

// Draws a token from logits (V) with temperature and top-k (0 = the whole vocabulary); ties broken by token id.
int sample_token(const std::vector<float>& logits, double temperature, int top_k, SampleRng& rng);

struct SampleOptions {
  int tokens = 64;            // tokens to generate after <|endoftext|>
  double temperature = 1.0;
  int top_k = 0;
  int seq_len = 1024;         // the longest context the model sees (the training sequence length)
  // Quantised GEMMs need row counts that are multiples of 16 / 128: the model then runs the training batch shape
  // (batch x seq_len) with the context in row 0, followed by <|endoftext|> padding that causal attention keeps from
  // influencing the positions before it. 0 = run exactly the context (one row).
  int full_batch = 0;
};

// Generates options.tokens tokens after <|endoftext|>, re-running the forward over the context (at most seq_len
// tokens) for each new token, and returns the decoded text.
std::string generate_sample(Model& model, const GPT2Tokenizer& tokenizer, const SampleOptions& options,
                            SampleRng& rng, cudaStream_t stream);

}  // namespace llmc
