// llmc/core/input_safety.h: reading what comes from outside the program (run configs, --set values, token shards,
// model and checkpoint files, Hugging Face directories) without trusting it. One place for:
//   - JSON: parsed with a nesting limit checked while parsing (before anything walks the document recursively: copies,
//     dumps and comparisons of nlohmann::json recurse), a key given twice in one object refused naming the key and the
//     line, a number that does not fit a double reported with its key, syntax errors with line and column;
//   - files: anything that is not a regular file (a FIFO would block the reader forever, a device never ends, a
//     directory is not a file) refused before it is opened for reading, and a file's size bounded before anything is
//     allocated for its contents;
//   - 64-bit checked arithmetic for sizes derived from input (an overflow is an llmc::Error naming the operands);
//   - the largest model and batch sizes any input may describe.
// Every problem is an llmc::Error whose message names the source (a file path, "--set 'train.lr=...'") and, for JSON,
// the key ("train.lr") and the line.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"

namespace llmc {

// The largest sizes llm8 accepts from any input: config keys, llm.c model headers, Hugging Face config.json. Generous
// (each far beyond today's largest open models) but finite: every size derived from them (padded vocabulary,
// parameter counts, tokens per step, activation and logit bytes) fits in 64 bits, and no reader allocates for a size
// no machine could hold.
namespace size_limits {
constexpr int64_t kLayers = 1024;                       // model.n_layer
constexpr int64_t kHeads = 1024;                        // model.n_head, model.n_kv_head
constexpr int64_t kEmbd = 65536;                        // model.n_embd
constexpr int64_t kFfnHidden = 262144;                  // model.ffn_hidden (4 * kEmbd: gpt2's derived width fits)
constexpr int64_t kVocab = 16777216;                    // model.vocab_size (2^24)
constexpr int64_t kPaddedVocabMultiple = 65536;         // model.padded_vocab_multiple
constexpr int64_t kSeqLen = 1048576;                    // model.max_seq_len, train.seq_len (2^20)
constexpr int64_t kMicroBatch = 65536;                  // train.micro_batch
constexpr int64_t kMicroBatchTokens = 16777216;         // train.micro_batch * train.seq_len (2^24 tokens per GPU)
constexpr int64_t kGlobalBatchTokens = 1099511627776;   // train.global_batch_tokens (2^40)
constexpr int64_t kGradAccumSteps = 16777216;           // micro-steps per optimizer step (2^24)
constexpr int64_t kSteps = 1000000000;                  // train.steps and every step count or interval
constexpr int64_t kCount = 1000000;                     // eval.batches, sample.tokens, checkpoint.keep, histories
}  // namespace size_limits

// ------------------------------------------------------------------------------------------------------------------
// JSON

constexpr int kMaxJsonDepth = 64;  // nested objects / arrays; llm8's own documents need at most 6

struct JsonReadOptions {
  bool allow_comments = false;        // "//" and "/* */" (run configs allow them)
  bool reject_duplicate_keys = true;  // a key twice in one object is an error (nlohmann would keep the last silently)
  int max_depth = kMaxJsonDepth;
};

// What parse_json throws: an llmc::Error that also says what went wrong (callers that take non-JSON text as a
// string, like --set, tell a syntax error from the rest).
struct JsonError : Error {
  enum class Kind { Syntax, TooDeep, DuplicateKey, NumberOverflow };
  JsonError(Kind k, const std::string& message) : Error(message), kind(k) {}
  Kind kind;
};

// Parses JSON text from outside; `source` names it in every error. llmc::Error for:
//   invalid syntax      "<source>: invalid JSON: parse error at line 2, column 20: syntax error while parsing ..."
//   deep nesting        "<source>: JSON nested deeper than 64 levels (line 3) at 'a.b'"
//   a duplicate key     "<source>: duplicate key 'train.lr' (line 12)"
//   a number overflow   "<source>: the number 1e309 of 'train.lr' (line 3) does not fit a 64-bit float"
// Key paths join object keys with '.' and array positions as [i] ("precision.bf16_layers[2]"); the line is left out
// for text of one line.
nlohmann::json parse_json(const std::string& text, const std::string& source, const JsonReadOptions& options = {});

// Checks, without recursion, that a JSON value built elsewhere nests at most max_depth levels; a JsonError (TooDeep)
// naming source otherwise. For documents that did not come through parse_json, before anything walks them recursively.
void check_json_depth(const nlohmann::json& j, const std::string& source, int max_depth = kMaxJsonDepth);

// ------------------------------------------------------------------------------------------------------------------
// Files

// Opens path for reading, refusing (before the open) anything that is not a regular file after following symbolic
// links: "<what> '<path>' is a FIFO (named pipe), not a regular file". The open itself is non-blocking and the opened
// file is checked again, so a path swapped for a FIFO in between is refused too; the returned descriptor is blocking
// and close-on-exec, the caller closes it. *size (when given) receives the file size. A file that cannot be opened is
// "cannot open <what> '<path>': <reason><hint>".
int open_regular_file(const std::string& path, const std::string& what, uint64_t* size = nullptr,
                      const std::string& hint = "");

// The same check without opening: llmc::Error unless path is an existing regular file.
void check_regular_file(const std::string& path, const std::string& what, const std::string& hint = "");

// The whole contents of a regular file of at most max_bytes (a larger one is refused before anything is read or
// allocated for it, naming the limit).
std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                              const std::string& hint = "");

// read_regular_file + parse_json with the path as the source.
nlohmann::json read_json_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                              const JsonReadOptions& options = {}, const std::string& hint = "");

// ------------------------------------------------------------------------------------------------------------------
// Checked 64-bit arithmetic. `what` names the operands for the error, e.g. "train.micro_batch * train.seq_len":
// "train.micro_batch * train.seq_len = 65536 * 1099511627776 does not fit in 64 bits".

int64_t checked_mul(int64_t a, int64_t b, const std::string& what);
int64_t checked_add(int64_t a, int64_t b, const std::string& what);
// a rounded up to a multiple of m (m >= 1)
int64_t checked_round_up(int64_t a, int64_t m, const std::string& what);

}  // namespace llmc
