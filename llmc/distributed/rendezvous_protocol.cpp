// llmc/distributed/rendezvous_protocol.cpp: the pieces the TCP and fs rendezvous share: checks of received messages,
// MACs, text hygiene, the log, rank 0's registration and verdict (llmc/distributed/rendezvous_protocol.h).

#include "llmc/distributed/rendezvous_protocol.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "llmc/distributed/hmac_sha256.h"

namespace llmc::rdv {

namespace {

constexpr const char* kMacTag = "llm8-rendezvous/2";
constexpr size_t kMaxFailures = 32 << 10;  // bytes of the combined startup errors in a verdict
constexpr size_t kMaxPayload = 64 << 10;   // bytes of the payload (the NCCL id has 128)
constexpr int kMaxJsonDepth = 4;           // the deepest message: reply -> ranks -> <k> -> fields

// The deepest nesting of arrays and objects in JSON text, counted without parsing it.
int json_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
  return deepest;
}

}  // namespace

double reply_grace_s(double timeout_s) { return std::min(10.0, timeout_s); }

bool from_hex(const std::string& hex, std::string* out) {
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2) return false;
  out->assign(hex.size() / 2, '\0');
  for (size_t i = 0; i < out->size(); i++) {
    const int hi = val(hex[2 * i]), lo = val(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<char>(hi * 16 + lo);
  }
  return true;
}

std::string fresh_nonce() { return to_hex(random_bytes(kNonceBytes)); }

std::string printable(std::string_view s, size_t max_chars) {
  std::string out;
  for (const char ch : s.substr(0, max_chars)) {
    const auto c = static_cast<unsigned char>(ch);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (s.size() > max_chars) out += "...";
  return out;
}

std::string text_of(const json& m) { return m.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string wire_text(const std::string& s, size_t max_bytes) {
  const json parsed = json::parse(text_of(json(s.substr(0, max_bytes))), nullptr, /*allow_exceptions=*/false);
  return parsed.is_string() ? parsed.get<std::string>() : printable(s, max_bytes);
}

json envelope(const char* kind) { return json{{"magic", kMagic}, {"version", kProtocolVersion}, {"kind", kind}}; }

bool Fields::string(const char* key, std::string* out, size_t max_bytes) {
  const json* v = find(key);
  if (!v) return false;
  if (!v->is_string()) return fail(key, "is not a string");
  const std::string& s = v->get_ref<const std::string&>();
  if (s.size() > max_bytes) return fail(key, strformat("has %zu bytes, more than %zu", s.size(), max_bytes));
  *out = s;
  return true;
}

bool Fields::hex(const char* key, std::string* out, size_t chars) {
  if (!string(key, out, chars)) return false;
  std::string bytes;
  if (out->size() != chars || !from_hex(*out, &bytes))
    return fail(key, strformat("is not %zu lowercase hex digits", chars));
  return true;
}

bool Fields::integer(const char* key, int* out) {
  const json* v = find(key);
  if (!v) return false;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > 1000000000u) return fail(key, "is out of range");
    *out = static_cast<int>(u);
    return true;
  }
  if (!v->is_number_integer()) return fail(key, "is not an integer");
  const int64_t i = v->get<int64_t>();
  if (i < -1000000000 || i > 1000000000) return fail(key, "is out of range");
  *out = static_cast<int>(i);
  return true;
}

bool Fields::boolean(const char* key, bool* out) {
  const json* v = find(key);
  if (!v) return false;
  if (!v->is_boolean()) return fail(key, "is not true or false");
  *out = v->get<bool>();
  return true;
}

bool Fields::object(const char* key, const json** out) {
  const json* v = find(key);
  if (!v) return false;
  if (!v->is_object()) return fail(key, "is not an object");
  *out = v;
  return true;
}

const json* Fields::find(const char* key) {
  const auto it = o_.find(key);
  if (it == o_.end()) {
    fail(key, "is missing");
    return nullptr;
  }
  return &*it;
}

bool Fields::fail(const char* key, const std::string& what) {
  if (problem_.empty()) problem_ = strformat("field '%s' %s", key, what.c_str());
  return false;
}

bool parse_envelope(const std::string& text, json* out, std::string* kind, std::string* why) {
  if (json_depth(text) > kMaxJsonDepth) {
    *why = "not a rendezvous message (JSON nested too deeply)";
    return false;
  }
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object()) {
    *why = out->is_discarded() ? "not JSON" : "not a JSON object";
    return false;
  }
  Fields f(*out);
  std::string magic;
  int version = 0;
  if (!f.string("magic", &magic, 64) || magic != kMagic) {
    *why = "not an llm8 rendezvous message";
    return false;
  }
  if (!f.integer("version", &version)) {
    *why = "malformed message: " + f.problem();
    return false;
  }
  if (version != kProtocolVersion) {
    *why = strformat("rendezvous protocol version %d, this build speaks version %d: every rank must run the same "
                     "llm8 build", version, kProtocolVersion);
    return false;
  }
  if (!f.string("kind", kind, 64)) {
    *why = "malformed message: " + f.problem();
    return false;
  }
  return true;
}

bool parse_message(const std::string& text, const char* kind, json* out, std::string* why) {
  std::string got_kind;
  if (!parse_envelope(text, out, &got_kind, why)) return false;
  if (got_kind != kind) {
    *why = strformat("a '%s' message where a '%s' was due", printable(got_kind, 64).c_str(), kind);
    return false;
  }
  return true;
}

std::string mac_of(const std::string& secret, std::initializer_list<std::string_view> fields) {
  auto encode = [](std::string& out, std::string_view f) {
    out += std::to_string(f.size());
    out += ':';
    out.append(f);
    out += ',';
  };
  std::string input;
  encode(input, kMacTag);
  for (const std::string_view f : fields) encode(input, f);
  return to_hex(hmac_sha256(secret, input));
}

bool mac_matches(const std::string& secret, const std::string& mac, std::initializer_list<std::string_view> fields) {
  return constant_time_equal(mac_of(secret, fields), mac);
}

std::string itos(long long v) { return std::to_string(v); }
const char* flag(bool b) { return b ? "1" : "0"; }

const char* mac_failure(const std::string& secret) {
  return secret.empty() ? "its HMAC does not verify (rank 0 has no LLM8_RDV_SECRET: the sender has one, or is no rank "
                          "of this job)"
                        : "its HMAC does not verify: not a rank of this job, or another LLM8_RDV_SECRET";
}

void RendezvousLogger::note(const std::string& line) const {
  if (sink_) {
    sink_(line);
  } else {
    std::fprintf(stderr, "%srendezvous: %s\n", error_prefix().c_str(), line.c_str());
    std::fflush(stderr);
  }
}

void RendezvousLogger::ignored(const std::string& what, const std::string& why) {
  ignored_++;
  last_ = what + ": " + why;
  if (ignored_ <= kLoggedIgnored) note("ignored " + last_);
  if (ignored_ == kLoggedIgnored + 1) note("more was ignored: counted from here on, not logged one by one");
}

std::string RendezvousLogger::summary() const {
  return ignored_ ? strformat(" (%d connection(s) or file(s) were ignored on the way, the last: %s)", ignored_,
                              last_.c_str())
                  : std::string();
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

RootState::RootState(int world, const std::string& own_status)
    : world_size(world), arrived(world, false), status(world), nonce(world) {
  arrived[0] = true;
  status[0] = wire_text(own_status, kMaxStatus);
}

Admission RootState::admit(const Hello& h, const std::string& where) {
  if (h.world_size != world_size) {
    fatal = strformat("the world sizes disagree: rank 0 was started for %d processes but rank %d (%s) for %d "
                      "(check WORLD_SIZE / the launcher's process count on every node)",
                      world_size, h.rank, where.c_str(), h.world_size);
    return Admission::kFatal;
  }
  if (h.rank == 0) {
    fatal = strformat("two processes claim rank 0 (the second from %s): check RANK / the launcher", where.c_str());
    return Admission::kFatal;
  }
  if (h.rank < 1 || h.rank >= world_size) {
    fatal = strformat("a process (%s) claims rank %d, outside 1 .. %d of this %d-rank job (check RANK)",
                      where.c_str(), h.rank, world_size - 1, world_size);
    return Admission::kFatal;
  }
  if (arrived[h.rank]) {
    if (nonce[h.rank] == h.nonce) return Admission::kAgain;
    fatal = strformat("two processes claim rank %d (the second from %s): check RANK / the launcher", h.rank,
                      where.c_str());
    return Admission::kFatal;
  }
  arrived[h.rank] = true;
  status[h.rank] = h.status;
  nonce[h.rank] = h.nonce;
  return Admission::kNew;
}

std::vector<int> RootState::missing() const {
  std::vector<int> m;
  for (int r = 0; r < world_size; r++)
    if (!arrived[r]) m.push_back(r);
  return m;
}

std::string RootState::failures() const {
  std::string msg;
  for (int r = 0; r < world_size; r++) {
    if (status[r].empty()) continue;
    const std::string one = strformat("rank %d failed during startup: %s", r, status[r].c_str());
    if (msg.size() + one.size() > kMaxFailures) {
      msg += "; ... (more ranks failed)";
      break;
    }
    msg += (msg.empty() ? "" : "; ") + one;
  }
  return msg;
}

Verdict verdict_of(const RootState& st, const std::string& payload) {
  if (const std::string failures = st.failures(); !failures.empty()) return {false, failures, true};
  return {true, to_hex(payload), false};
}

std::string take_verdict(const Verdict& v, const std::string& from) {
  if (!v.ok) throw GroupError(v.body.empty() ? "rank 0 refused this rank without a reason" : v.body);
  std::string payload;
  if (!from_hex(v.body, &payload) || payload.size() > kMaxPayload)
    throw_error("rendezvous: rank 0 (%s) sent a malformed payload", from.c_str());
  return payload;
}

bool alone(const RendezvousSpec& spec, const std::string& status, const std::string& root_payload,
           std::string* payload) {
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size)
    throw_error("rendezvous: rank %d is out of range for world size %d", spec.rank, spec.world_size);
  if (spec.world_size > 1) return false;
  if (!status.empty()) throw GroupError("rank 0 failed during startup: " + status);
  *payload = root_payload;
  return true;
}

}  // namespace llmc::rdv
