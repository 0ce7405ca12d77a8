// llmc/distributed/rendezvous_protocol.h: what the TCP and fs rendezvous share (the protocol is described in
// llmc/distributed/rendezvous.h): the message envelope, the checks of received messages field by field (nothing here
// throws on hostile input), the MACs, text hygiene for logs and errors, the log of what was ignored, and rank 0's
// registration of ranks and its verdict. Internal to llmc/distributed/rendezvous*.cpp.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/distributed/rendezvous.h"

namespace llmc::rdv {

using json = nlohmann::json;

inline constexpr const char* kMagic = "llm8-rendezvous";
inline constexpr int kProtocolVersion = 2;
inline constexpr size_t kNonceBytes = 16;             // challenges, sessions and nonces: 32 hex digits
inline constexpr size_t kNonceHex = 2 * kNonceBytes;
inline constexpr size_t kMacHex = 64;
inline constexpr size_t kMaxStatus = 4000;            // bytes of a rank's startup error carried by its hello
inline constexpr size_t kMaxAnswer = 256 << 10;       // a tcp message from rank 0 (the payload, or the errors)
inline constexpr size_t kMaxReplyFile = 64 << 20;     // fs: the reply lists every rank
inline constexpr int kLoggedIgnored = 16;             // ignored connections / files logged one by one, then counted

// Non-root ranks wait this much longer than rank 0 for its answer, so that they hear its verdict (who is missing)
// rather than time out on their own.
double reply_grace_s(double timeout_s);

// Lowercase hex to bytes; false for anything else.
bool from_hex(const std::string& hex, std::string* out);
// A new challenge / session / nonce: kNonceBytes from the kernel, in hex.
std::string fresh_nonce();
// Text from elsewhere (a peer's field, a file's content) for a log line or an error: printable ASCII, bounded.
std::string printable(std::string_view s, size_t max_chars = 200);
// JSON text of a message we send; invalid UTF-8 in a string (a file name in an error) becomes U+FFFD instead of an
// exception.
std::string text_of(const json& m);
// `s` cut to max_bytes and made valid UTF-8, so that the text a MAC covers is the text the peer receives.
std::string wire_text(const std::string& s, size_t max_bytes);

// {"magic", "version", "kind"}: the start of every message.
json envelope(const char* kind);

// A received JSON object whose fields are checked one by one before use; the first problem is kept (for the log).
// Each getter is false (and notes why) when the field is missing or not of its type and bounds.
class Fields {
 public:
  explicit Fields(const json& object) : o_(object) {}
  bool string(const char* key, std::string* out, size_t max_bytes);
  bool hex(const char* key, std::string* out, size_t chars);  // lowercase hex of exactly `chars` characters
  bool integer(const char* key, int* out);                     // an integer within +-1e9
  bool boolean(const char* key, bool* out);
  bool object(const char* key, const json** out);
  const std::string& problem() const { return problem_; }

 private:
  const json* find(const char* key);
  bool fail(const char* key, const std::string& what);
  const json& o_;
  std::string problem_;
};

// Parses a received message: a JSON object of this protocol and version (nesting checked before parsing), with its
// kind; parse_message also requires the given kind. false with the reason otherwise.
bool parse_envelope(const std::string& text, json* out, std::string* kind, std::string* why);
bool parse_message(const std::string& text, const char* kind, json* out, std::string* why);

// The MAC of a message: HMAC-SHA256 under the secret of the tag "llm8-rendezvous/2" and the fields, each encoded as
// <length>:<bytes>, so that no two field lists encode alike. mac_matches compares in constant time.
std::string mac_of(const std::string& secret, std::initializer_list<std::string_view> fields);
bool mac_matches(const std::string& secret, const std::string& mac, std::initializer_list<std::string_view> fields);
// The fields of numbers and flags as a MAC covers them.
std::string itos(long long v);
const char* flag(bool b);
// Why a MAC did not verify, for the log and the rejected sender.
const char* mac_failure(const std::string& secret);

// The log of one rendezvous: notes, and the strangers it ignored (each logged up to kLoggedIgnored, then counted).
class RendezvousLogger {
 public:
  explicit RendezvousLogger(const RendezvousSpec& spec) : sink_(spec.log) {}
  void note(const std::string& line) const;
  void ignored(const std::string& what, const std::string& why);
  // "" or " (N ... were ignored on the way, the last: ...)" for a timeout message.
  std::string summary() const;
  int ignored_count() const { return ignored_; }

 private:
  RendezvousLog sink_;
  int ignored_ = 0;
  std::string last_;
};

std::string join_ranks(const std::vector<int>& ranks);

// A hello that passed its checks and its MAC.
struct Hello {
  int rank = -1;
  int world_size = 0;
  std::string status;
  std::string nonce;
};

enum class Admission { kNew, kAgain, kFatal };

// Rank 0's bookkeeping: who is registered (with the nonce of its process) and the disagreements that stop everyone.
struct RootState {
  int world_size;
  std::vector<bool> arrived;
  std::vector<std::string> status, nonce;
  std::string fatal;  // a disagreement among authenticated ranks: stop everyone

  RootState(int world, const std::string& own_status);
  // An authenticated hello: registers its rank (kNew), recognises the same process again (kAgain), or sets `fatal`
  // (world sizes differ, a rank out of range, a second process claiming a rank).
  Admission admit(const Hello& h, const std::string& where);
  std::vector<int> missing() const;
  bool complete() const { return missing().empty(); }
  // "" when every rank is fine, else the message every rank throws (bounded).
  std::string failures() const;
};

// The verdict rank 0 hands out: ok with the payload, or the error every rank throws.
struct Verdict {
  bool ok = false;
  std::string body;  // the payload's hex when ok, else the error
  bool startup_failure = false;
};

Verdict verdict_of(const RootState& st, const std::string& payload);
// What a rank does with a verified verdict: returns the payload or throws (GroupError for an error).
std::string take_verdict(const Verdict& v, const std::string& from);

// The start of every rendezvous: llmc::Error when spec.rank is out of range for spec.world_size; for one process there
// is nobody to meet, so true with *payload = root_payload (or GroupError when its own status is a failure).
bool alone(const RendezvousSpec& spec, const std::string& status, const std::string& root_payload,
           std::string* payload);

}  // namespace llmc::rdv
