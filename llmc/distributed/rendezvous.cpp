// llmc/distributed/rendezvous.cpp: the startup rendezvous over TCP, a shared directory or MPI, its authentication and
// the checks of everything it receives, and the startup-failure report of a rank that cannot run (protocol in
// llmc/distributed/rendezvous.h).

#include "llmc/distributed/rendezvous.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <list>
#include <map>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <nlohmann/json.hpp>
#ifdef LLM8_USE_MPI
#include <mpi.h>
#endif

#include "llmc/distributed/hmac_sha256.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// Messages: encoding, checks of received fields, MACs, the log

namespace {

constexpr const char* kMagic = "llm8-rendezvous";
constexpr int kProtocolVersion = 2;
constexpr const char* kMacTag = "llm8-rendezvous/2";
constexpr size_t kNonceBytes = 16;                 // challenges, sessions and nonces: 32 hex digits
constexpr size_t kNonceHex = 2 * kNonceBytes;
constexpr size_t kMacHex = 64;
constexpr size_t kMaxStatus = 4000;                // bytes of a rank's startup error carried by its hello
constexpr size_t kMaxFailures = 32 << 10;          // bytes of the combined startup errors in a verdict
constexpr size_t kMaxAnswer = 256 << 10;           // a tcp message from rank 0 (the payload, or the errors)
constexpr size_t kMaxPayload = 64 << 10;           // bytes of the payload (the NCCL id has 128)
constexpr size_t kMaxReplyFile = 64 << 20;         // fs: the reply lists every rank
constexpr int kMaxJsonDepth = 4;                   // the deepest message: reply -> ranks -> <k> -> fields
constexpr int kLoggedIgnored = 16;                 // ignored connections / files logged one by one, then counted
constexpr int kMaxAcceptsPerRound = 64;

// Non-root ranks wait this much longer than rank 0 for its answer, so that they hear its verdict (who is missing)
// rather than time out on their own.
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

// Text from elsewhere (a peer's field, a file's content) for a log line or an error: printable ASCII, bounded.
std::string printable(std::string_view s, size_t max_chars = 200) {
  std::string out;
  for (const char ch : s.substr(0, max_chars)) {
    const auto c = static_cast<unsigned char>(ch);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (s.size() > max_chars) out += "...";
  return out;
}

// JSON text of a message we send; invalid UTF-8 in a string (a file name in an error) becomes U+FFFD instead of an
// exception.
std::string text_of(const json& m) { return m.dump(-1, ' ', false, json::error_handler_t::replace); }

// `s` cut to max_bytes and made valid UTF-8, so that the text a MAC covers is the text the peer receives.
std::string wire_text(const std::string& s, size_t max_bytes) {
  const json parsed = json::parse(text_of(json(s.substr(0, max_bytes))), nullptr, /*allow_exceptions=*/false);
  return parsed.is_string() ? parsed.get<std::string>() : printable(s, max_bytes);
}

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

json envelope(const char* kind) { return json{{"magic", kMagic}, {"version", kProtocolVersion}, {"kind", kind}}; }

// A received JSON object whose fields are checked one by one before use; the first problem is kept (for the log).
class Fields {
 public:
  explicit Fields(const json& object) : o_(object) {}

  bool string(const char* key, std::string* out, size_t max_bytes) {
    const json* v = find(key);
    if (!v) return false;
    if (!v->is_string()) return fail(key, "is not a string");
    const std::string& s = v->get_ref<const std::string&>();
    if (s.size() > max_bytes) return fail(key, strformat("has %zu bytes, more than %zu", s.size(), max_bytes));
    *out = s;
    return true;
  }
  // Lowercase hex of exactly `chars` characters.
  bool hex(const char* key, std::string* out, size_t chars) {
    if (!string(key, out, chars)) return false;
    std::string bytes;
    if (out->size() != chars || !from_hex(*out, &bytes))
      return fail(key, strformat("is not %zu lowercase hex digits", chars));
    return true;
  }
  bool integer(const char* key, int* out) {
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
  bool boolean(const char* key, bool* out) {
    const json* v = find(key);
    if (!v) return false;
    if (!v->is_boolean()) return fail(key, "is not true or false");
    *out = v->get<bool>();
    return true;
  }
  bool object(const char* key, const json** out) {
    const json* v = find(key);
    if (!v) return false;
    if (!v->is_object()) return fail(key, "is not an object");
    *out = v;
    return true;
  }
  const std::string& problem() const { return problem_; }

 private:
  const json* find(const char* key) {
    const auto it = o_.find(key);
    if (it == o_.end()) {
      fail(key, "is missing");
      return nullptr;
    }
    return &*it;
  }
  bool fail(const char* key, const std::string& what) {
    if (problem_.empty()) problem_ = strformat("field '%s' %s", key, what.c_str());
    return false;
  }
  const json& o_;
  std::string problem_;
};

// Parses a received message: a JSON object of this protocol and version, of the given kind. false with the reason
// otherwise (nothing here throws, whatever the bytes).
bool parse_message(const std::string& text, const char* kind, json* out, std::string* why) {
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
  std::string magic, got_kind;
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
  if (!f.string("kind", &got_kind, 64)) {
    *why = "malformed message: " + f.problem();
    return false;
  }
  if (got_kind != kind) {
    *why = strformat("a '%s' message where a '%s' was due", printable(got_kind, 64).c_str(), kind);
    return false;
  }
  return true;
}

// The MAC of a message: HMAC-SHA256 under the secret of the tag and the fields, each as <length>:<bytes>, so that no
// two field lists encode alike.
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

// The log of one rendezvous: notes, and the strangers it ignored (each logged up to kLoggedIgnored, then counted).
class RendezvousLogger {
 public:
  explicit RendezvousLogger(const RendezvousSpec& spec) : sink_(spec.log) {}
  void note(const std::string& line) const {
    if (sink_) {
      sink_(line);
    } else {
      std::fprintf(stderr, "%srendezvous: %s\n", error_prefix().c_str(), line.c_str());
      std::fflush(stderr);
    }
  }
  void ignored(const std::string& what, const std::string& why) {
    ignored_++;
    last_ = what + ": " + why;
    if (ignored_ <= kLoggedIgnored) note("ignored " + last_);
    if (ignored_ == kLoggedIgnored + 1) note("more was ignored: counted from here on, not logged one by one");
  }
  // "" or " (N ignored on the way, the last: ...)" for a timeout message.
  std::string summary() const {
    return ignored_ ? strformat(" (%d connection(s) or file(s) were ignored on the way, the last: %s)", ignored_,
                                last_.c_str())
                    : std::string();
  }
  int ignored_count() const { return ignored_; }

 private:
  RendezvousLog sink_;
  int ignored_ = 0;
  std::string last_;
};

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// A hello that passed its checks and its MAC.
struct Hello {
  int rank = -1;
  int world_size = 0;
  std::string status;
  std::string nonce;
};

enum class Admission { kNew, kAgain, kFatal };

// Rank 0's bookkeeping, shared by the TCP and fs variants: who is registered (with the nonce of its process) and
// the disagreements that stop everyone.
struct RootState {
  RendezvousSpec spec;
  std::vector<bool> arrived;
  std::vector<std::string> status, nonce;
  std::string fatal;  // a disagreement among authenticated ranks: stop everyone

  RootState(const RendezvousSpec& s, const std::string& own_status)
      : spec(s), arrived(s.world_size, false), status(s.world_size), nonce(s.world_size) {
    arrived[0] = true;
    status[0] = wire_text(own_status, kMaxStatus);
  }
  // An authenticated hello: registers its rank (kNew), recognises the same process again (kAgain), or sets `fatal`.
  Admission admit(const Hello& h, const std::string& where) {
    if (h.world_size != spec.world_size) {
      fatal = strformat("the world sizes disagree: rank 0 was started for %d processes but rank %d (%s) for %d "
                        "(check WORLD_SIZE / the launcher's process count on every node)",
                        spec.world_size, h.rank, where.c_str(), h.world_size);
      return Admission::kFatal;
    }
    if (h.rank == 0) {
      fatal = strformat("two processes claim rank 0 (the second from %s): check RANK / the launcher", where.c_str());
      return Admission::kFatal;
    }
    if (h.rank < 1 || h.rank >= spec.world_size) {
      fatal = strformat("a process (%s) claims rank %d, outside 1 .. %d of this %d-rank job (check RANK)",
                        where.c_str(), h.rank, spec.world_size - 1, spec.world_size);
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
  std::vector<int> missing() const {
    std::vector<int> m;
    for (int r = 0; r < spec.world_size; r++)
      if (!arrived[r]) m.push_back(r);
    return m;
  }
  bool complete() const { return missing().empty(); }
  // "" when every rank is fine, else the message every rank throws.
  std::string failures() const {
    std::string msg;
    for (int r = 0; r < spec.world_size; r++) {
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
};

// The verdict rank 0 hands out: ok with the payload, or the error every rank throws.
struct Verdict {
  bool ok = false;
  std::string body;  // the payload's hex when ok, else the error
  bool startup_failure = false;
};

Verdict verdict_of(const RootState& st, const std::string& payload) {
  if (const std::string failures = st.failures(); !failures.empty()) return {false, failures, true};
  return {true, to_hex(payload), false};
}

// What a rank does with a verified verdict: returns the payload or throws.
std::string take_verdict(const Verdict& v, const std::string& from) {
  if (!v.ok) throw GroupError(v.body.empty() ? "rank 0 refused this rank without a reason" : v.body);
  std::string payload;
  if (!from_hex(v.body, &payload) || payload.size() > kMaxPayload)
    throw_error("rendezvous: rank 0 (%s) sent a malformed payload", from.c_str());
  return payload;
}

// ------------------------------------------------------------------------------------------------------------------
// TCP sockets

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd = o.fd;
      o.fd = -1;
    }
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// Milliseconds until t (rounded up, so that a wait never ends just before it), between 0 and cap_ms.
int ms_until(Clock::time_point t, int cap_ms) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t - Clock::now()).count();
  if (us <= 0) return 0;
  return static_cast<int>(std::min<long long>(cap_ms, (us + 999) / 1000));
}

std::string frame(const json& message) {
  const std::string text = text_of(message);
  const uint32_t n = static_cast<uint32_t>(text.size());
  std::string out(4, '\0');
  for (int i = 0; i < 4; i++) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

bool send_all(int fd, const std::string& bytes, const Deadline& deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (deadline.passed()) return false;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, deadline.ms_left(200));
  }
  return true;
}

// One attempt, no waiting: for the greeting of a new connection (a few dozen bytes always fit its socket buffer;
// a connection that cannot take them is not worth waiting for).
bool send_now(int fd, const std::string& bytes) {
  const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == static_cast<ssize_t>(bytes.size());
}

// Appends what is readable to buf, at most up to `limit` bytes in buf; returns false when the peer closed or failed.
bool read_available(int fd, std::string& buf, size_t limit) {
  char tmp[4096];
  while (buf.size() < limit) {
    const ssize_t n = ::recv(fd, tmp, std::min(sizeof(tmp), limit - buf.size()), 0);
    if (n > 0) {
      buf.append(tmp, size_t(n));
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
  return true;
}

enum class FrameState { kIncomplete, kComplete, kOversize };

// A complete framed message from the front of buf (removed from it) into text.
FrameState take_frame(std::string& buf, size_t max_bytes, std::string* text) {
  if (buf.size() < 4) return FrameState::kIncomplete;
  uint32_t n = 0;
  for (int i = 0; i < 4; i++) n |= uint32_t(static_cast<unsigned char>(buf[i])) << (8 * i);
  if (n > max_bytes) return FrameState::kOversize;
  if (buf.size() < 4 + size_t(n)) return FrameState::kIncomplete;
  *text = buf.substr(4, n);
  buf.erase(0, 4 + size_t(n));
  return FrameState::kComplete;
}

enum class ReadResult { kMessage, kClosed, kTimeout, kOversize };

// Waits for the next framed message on fd until the deadline.
ReadResult read_frame(int fd, std::string& buf, size_t max_bytes, Clock::time_point deadline, std::string* text) {
  for (;;) {
    const FrameState state = take_frame(buf, max_bytes, text);
    if (state == FrameState::kComplete) return ReadResult::kMessage;
    if (state == FrameState::kOversize) return ReadResult::kOversize;
    const int wait_ms = ms_until(deadline, 1000);
    if (wait_ms == 0) return ReadResult::kTimeout;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, wait_ms) <= 0) continue;
    if (!read_available(fd, buf, 4 + max_bytes)) {
      if (take_frame(buf, max_bytes, text) == FrameState::kComplete) return ReadResult::kMessage;
      return ReadResult::kClosed;
    }
  }
}

std::string address_text(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST] = {0}, port[NI_MAXSERV] = {0};
  if (::getnameinfo(addr, len, host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return std::string(host) + ":" + port;
}

std::string host_text(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST] = {0};
  if (::getnameinfo(addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return "?";
  return host;
}

bool is_loopback_sockaddr(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(addr);
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr->sa_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(addr);
    if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

// Listening sockets on every address MASTER_ADDR resolves to on this host.
std::vector<Fd> listen_on(const std::string& master_addr, int port, std::vector<std::string>* bound) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(master_addr.c_str(), port_text.c_str(), &hints, &res); rc != 0)
    throw_error("rank 0 cannot resolve MASTER_ADDR '%s' to listen on: %s (MASTER_ADDR must name rank 0's host)",
                master_addr.c_str(), ::gai_strerror(rc));
  std::vector<Fd> listeners;
  std::set<std::string> seen;
  std::string failures;
  bool in_use = false, not_here = false;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const std::string host = host_text(ai->ai_addr, ai->ai_addrlen);
    if (!seen.insert(host).second) continue;
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    int err = 0;
    if (fd.fd < 0) {
      err = errno;
    } else {
      int one = 1;
      ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (ai->ai_family == AF_INET6) ::setsockopt(fd.fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
      if (::bind(fd.fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.fd, 1024) != 0) err = errno;
    }
    if (err) {
      in_use |= err == EADDRINUSE;
      not_here |= err == EADDRNOTAVAIL;
      failures += strformat("%s%s: %s", failures.empty() ? "" : "; ", host.c_str(), std::strerror(err));
      continue;
    }
    bound->push_back(host);
    listeners.push_back(std::move(fd));
  }
  ::freeaddrinfo(res);
  if (listeners.empty())
    throw_error("rank 0 cannot listen on MASTER_ADDR=%s MASTER_PORT=%d (%s)%s%s", master_addr.c_str(), port,
                failures.c_str(), in_use ? ": is another job using this port? pick another MASTER_PORT" : "",
                not_here ? ": MASTER_ADDR must be an address of rank 0's host" : "");
  return listeners;
}

// Connects to addr:port, retrying until the deadline; a closed Fd when it never worked. `why` gets the last error.
Fd connect_with_retries(const std::string& addr, int port, const Deadline& deadline, std::string* why) {
  const std::string port_text = std::to_string(port);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(addr.c_str(), port_text.c_str(), &hints, &res);
    if (rc != 0) {
      *why = strformat("cannot resolve MASTER_ADDR '%s': %s", addr.c_str(), ::gai_strerror(rc));
    } else {
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (fd.fd < 0) continue;
        set_nonblocking(fd.fd);
        int r = ::connect(fd.fd, ai->ai_addr, ai->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
          pollfd p{fd.fd, POLLOUT, 0};
          if (::poll(&p, 1, deadline.ms_left(1000)) == 1) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(fd.fd, SOL_SOCKET, SO_ERROR, &err, &len);
            r = err == 0 ? 0 : -1;
            errno = err;
          } else {
            errno = ETIMEDOUT;
            r = -1;
          }
        }
        if (r == 0) {
          ::freeaddrinfo(res);
          int one = 1;
          ::setsockopt(fd.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return fd;
        }
        *why = std::strerror(errno);
      }
      ::freeaddrinfo(res);
    }
    if (deadline.passed()) return Fd();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(200, deadline.ms_left(200))));
  }
}

void require_secret_for(const std::string& master_addr, const RendezvousSpec& spec) {
  if (!spec.secret.empty() || is_loopback_address(master_addr)) return;
  throw_error("MASTER_ADDR=%s is not a loopback address, so the ranks may run on several hosts and the TCP rendezvous "
              "must be authenticated: set %s to the same random value on every rank (%s)", master_addr.c_str(),
              kRendezvousSecretVar, rendezvous_secret_hint().c_str());
}

// ----- TCP, rank 0

// A connection to rank 0: a stranger until its hello authenticates.
struct Client {
  Fd fd;
  std::string where, buf, challenge;
  Clock::time_point since;
  bool authenticated = false;  // sent a hello that verified: hears the verdict
  bool registered = false;     // holds its rank in RootState (the others were a disagreement or are replaced)
  bool drop = false;           // to be removed at the end of this round
  int rank = -1;               // the rank its authenticated hello claims
  std::string nonce;
};

class TcpRoot {
 public:
  TcpRoot(const RendezvousSpec& spec, const std::string& master_addr, int port, const std::string& status)
      : spec_(spec), master_addr_(master_addr), port_(port), deadline_(spec.timeout_s), log_(spec),
        st_(spec, status) {}

  std::string run(const std::string& payload) {
    std::vector<std::string> bound;
    listeners_ = listen_on(master_addr_, port_, &bound);
    std::string where;
    for (const std::string& b : bound) where += (where.empty() ? "" : ", ") + b;
    if (spec_.secret.empty())
      log_.note(strformat("%s is not set: the rendezvous on port %d is not authenticated (any process of this host "
                          "could join it); rank 0 listens on the loopback address(es) %s only", kRendezvousSecretVar,
                          port_, where.c_str()));
    const bool numeric = is_numeric(master_addr_);
    if (!numeric && master_addr_ != "localhost" && is_loopback_address(master_addr_))
      log_.note(strformat("MASTER_ADDR=%s resolves to %s on this host: rank 0 listens there only, so ranks on other "
                          "hosts cannot reach it (set MASTER_ADDR to an address of this host they reach)",
                          master_addr_.c_str(), where.c_str()));
    while (!st_.complete() && st_.fatal.empty()) {
      if (deadline_.passed()) {
        const std::string msg = strformat(
            "rank(s) %s did not join the rendezvous on port %d within parallel.timeout_s = %g s: they did not "
            "start, failed before joining (look for their error lines), or use another MASTER_ADDR / MASTER_PORT / "
            "%s%s", join_ranks(st_.missing()).c_str(), port_, spec_.timeout_s, kRendezvousSecretVar,
            log_.summary().c_str());
        answer_all({false, msg, false});
        throw_error("%s", msg.c_str());
      }
      round();
    }
    if (!st_.fatal.empty()) {
      answer_all({false, st_.fatal, false});
      throw_error("%s", st_.fatal.c_str());
    }
    if (log_.ignored_count() > kLoggedIgnored)
      log_.note(strformat("%d connections were ignored in all", log_.ignored_count()));
    const Verdict v = verdict_of(st_, payload);
    answer_all(v);
    if (!v.ok) throw GroupError(v.body);
    return payload;
  }

 private:
  static bool is_numeric(const std::string& addr) {
    unsigned char buf[sizeof(in6_addr)];
    return ::inet_pton(AF_INET, addr.c_str(), buf) == 1 || ::inet_pton(AF_INET6, addr.c_str(), buf) == 1;
  }

  int strangers() const {
    int n = 0;
    for (const Client& c : clients_) n += !c.authenticated && !c.drop;
    return n;
  }
  Client* oldest_stranger() {
    Client* oldest = nullptr;
    for (Client& c : clients_)
      if (!c.authenticated && !c.drop && (!oldest || c.since < oldest->since)) oldest = &c;
    return oldest;
  }
  Clock::time_point stranger_deadline(const Client& c) const {
    return c.since + std::chrono::microseconds(static_cast<long long>(spec_.stranger_timeout_s * 1e6));
  }
  static Clock::time_point grace_end(const Client& c) {
    return c.since + std::chrono::microseconds(static_cast<long long>(kRendezvousStrangerGraceS * 1e6));
  }

  // Closes a stranger's connection, telling it why when it spoke this protocol.
  void reject(Client& c, const std::string& why, bool tell) {
    if (tell) {
      json m = envelope("rejected");
      m["error"] = "rank 0 ignored this hello: " + why;
      send_now(c.fd.fd, frame(m));
    }
    log_.ignored("a connection from " + c.where, why);
    c.drop = true;
  }

  // One round: close strangers past their time, wait for input (or a connection, when there is room), read it,
  // accept new connections.
  void round() {
    const Clock::time_point now = Clock::now();
    for (Client& c : clients_)
      if (!c.authenticated && !c.drop && now >= stranger_deadline(c))
        reject(c, strformat("no complete hello within %g s", spec_.stranger_timeout_s), /*tell=*/false);
    sweep();

    // Room for a new connection: under the cap, or the oldest stranger has had its grace period (it is dropped).
    Client* oldest = oldest_stranger();
    const bool full = strangers() >= kRendezvousMaxStrangers;
    const bool accepting = now >= accept_paused_until_ && (!full || (oldest && now >= grace_end(*oldest)));
    Clock::time_point wake = deadline_.at;
    for (const Client& c : clients_)
      if (!c.authenticated) wake = std::min(wake, stranger_deadline(c));
    if (!accepting) wake = std::min(wake, std::max(accept_paused_until_, full && oldest ? grace_end(*oldest) : now));

    std::vector<pollfd> pfds;
    if (accepting)
      for (const Fd& l : listeners_) pfds.push_back({l.fd, POLLIN, 0});
    const size_t first_client = pfds.size();
    std::vector<Client*> polled;
    for (Client& c : clients_)
      if (c.fd.fd >= 0) {
        pfds.push_back({c.fd.fd, POLLIN, 0});
        polled.push_back(&c);
      }
    const int rc = ::poll(pfds.data(), pfds.size(), std::max(1, ms_until(wake, 1000)));
    if (rc <= 0) return;
    for (size_t i = 0; i < polled.size() && st_.fatal.empty(); i++)
      if (pfds[first_client + i].revents) serve(*polled[i]);
    sweep();
    if (!st_.fatal.empty() || st_.complete()) return;
    for (size_t i = 0; i < first_client; i++)
      if (pfds[i].revents) accept_from(listeners_[i].fd);
  }

  void sweep() { clients_.remove_if([](const Client& c) { return c.drop; }); }

  void accept_from(int listener) {
    for (int n = 0; n < kMaxAcceptsPerRound; n++) {
      const Clock::time_point now = Clock::now();
      if (strangers() >= kRendezvousMaxStrangers) {
        Client* oldest = oldest_stranger();
        if (!oldest || now < grace_end(*oldest)) return;  // the rest waits in the listen queue
        reject(*oldest, strformat("dropped: more than %d connections without a hello at once",
                                  kRendezvousMaxStrangers), /*tell=*/false);
        sweep();
      }
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      const int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: make room from the strangers, else wait a little (never spin on a listener that
          // stays readable).
          Client* oldest = oldest_stranger();
          if (oldest && now >= grace_end(*oldest)) {
            reject(*oldest, "dropped: this process ran out of file descriptors", /*tell=*/false);
            sweep();
            continue;
          }
          if (!out_of_descriptors_logged_) {
            log_.note(strformat("out of file descriptors (%s): new connections wait", std::strerror(errno)));
            out_of_descriptors_logged_ = true;
          }
          accept_paused_until_ = now + std::chrono::milliseconds(100);
        }
        return;
      }
      Client c;
      c.fd = Fd(fd);
      c.where = address_text(reinterpret_cast<const sockaddr*>(&addr), len);
      c.since = now;
      c.challenge = fresh_nonce();
      json greeting = envelope("challenge");
      greeting["challenge"] = c.challenge;
      greeting["auth"] = !spec_.secret.empty();
      if (!send_now(c.fd.fd, frame(greeting))) {
        log_.ignored("a connection from " + c.where, "it could not take the challenge");
        continue;
      }
      int one = 1;
      ::setsockopt(c.fd.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      clients_.push_back(std::move(c));
    }
  }

  // Input on a connection: an authenticated rank's (ignored; its close noted) or a stranger's hello.
  void serve(Client& c) {
    if (c.authenticated) {
      std::string scratch;
      if (!read_available(c.fd.fd, scratch, 4096)) c.fd.reset();  // it went away: it will not hear the verdict
      return;
    }
    const bool alive = read_available(c.fd.fd, c.buf, 4 + kRendezvousMaxHello);
    std::string text;
    switch (take_frame(c.buf, kRendezvousMaxHello, &text)) {
      case FrameState::kOversize:
        reject(c, strformat("a message of more than %zu bytes", kRendezvousMaxHello), /*tell=*/true);
        return;
      case FrameState::kIncomplete:
        if (!alive)
          reject(c, c.buf.empty() ? "closed without a hello" : "closed in the middle of its hello", /*tell=*/false);
        return;
      case FrameState::kComplete:
        hello(c, text);
        return;
    }
  }

  void hello(Client& c, const std::string& text) {
    json m;
    std::string why;
    if (!parse_message(text, "hello", &m, &why)) return reject(c, why, /*tell=*/true);
    Fields f(m);
    Hello h;
    std::string mac;
    if (!f.integer("rank", &h.rank) || !f.integer("world_size", &h.world_size) ||
        !f.string("status", &h.status, kMaxStatus) || !f.hex("nonce", &h.nonce, kNonceHex) ||
        !f.hex("mac", &mac, kMacHex))
      return reject(c, "malformed hello: " + f.problem(), /*tell=*/true);
    if (!mac_matches(spec_.secret, mac, {"hello", c.challenge, h.nonce, itos(h.rank), itos(h.world_size), h.status}))
      return reject(c, mac_failure(spec_.secret), /*tell=*/true);
    c.authenticated = true;
    c.rank = h.rank;
    c.nonce = h.nonce;
    switch (st_.admit(h, c.where)) {
      case Admission::kFatal:
        return;  // it hears the verdict with the others
      case Admission::kAgain:  // the same process on a new connection (its last one broke): the new one replaces it
        for (Client& old : clients_)
          if (&old != &c && old.registered && old.rank == h.rank) old.drop = true;
        break;
      case Admission::kNew:
        break;
    }
    c.registered = true;
    json ack = envelope("accepted");
    ack["rank"] = h.rank;
    ack["mac"] = mac_of(spec_.secret, {"accepted", c.challenge, c.nonce, itos(c.rank)});
    if (!send_all(c.fd.fd, frame(ack), Deadline(2.0))) c.fd.reset();  // it reconnects with the same nonce
  }

  // The verdict to every authenticated connection still open, each with its own MAC.
  void answer_all(const Verdict& v) {
    const Deadline send_deadline(5.0);
    for (Client& c : clients_) {
      if (!c.authenticated || c.drop || c.fd.fd < 0) continue;
      json m = envelope("verdict");
      m["ok"] = v.ok;
      m[v.ok ? "payload" : "error"] = v.body;
      m["startup_failure"] = v.startup_failure;
      m["mac"] = mac_of(spec_.secret, {"verdict", c.challenge, c.nonce, itos(c.rank), flag(v.ok), v.body,
                                       flag(v.startup_failure)});
      send_all(c.fd.fd, frame(m), send_deadline);
    }
  }

  const RendezvousSpec& spec_;
  const std::string master_addr_;
  const int port_;
  const Deadline deadline_;
  RendezvousLogger log_;
  RootState st_;
  std::vector<Fd> listeners_;
  std::list<Client> clients_;
  Clock::time_point accept_paused_until_{};
  bool out_of_descriptors_logged_ = false;
};

// ----- TCP, rank k > 0

// One connection's worth of the exchange: the payload, or (returning false) why it is worth connecting again.
// Throws for a verdict, a rejection, a secret setting that differs from rank 0's, and a connection that broke after
// rank 0 registered this rank. The challenge may take until the deadline (a connection waits in rank 0's listen queue
// while rank 0 has no room); the answer to the hello comes at once from a live rank 0.
bool tcp_join_once(const RendezvousSpec& spec, int fd, const std::string& rank0, const std::string& nonce,
                   const std::string& status, const Deadline& deadline, std::string* payload, std::string* retry_why) {
  const Deadline answer_deadline(spec.timeout_s + reply_grace_s(spec.timeout_s));
  std::string buf, text, why;
  json m;
  switch (read_frame(fd, buf, kMaxAnswer, deadline.at, &text)) {
    case ReadResult::kMessage: break;
    case ReadResult::kClosed: *retry_why = "rank 0 closed the connection before its challenge"; return false;
    case ReadResult::kTimeout: *retry_why = "no challenge from rank 0"; return false;
    case ReadResult::kOversize: *retry_why = "an oversize message instead of rank 0's challenge"; return false;
  }
  if (!parse_message(text, "challenge", &m, &why)) {
    *retry_why = "the process there is not rank 0 of this rendezvous: " + why;
    return false;
  }
  Fields cf(m);
  std::string challenge;
  bool rank0_auth = false;
  if (!cf.hex("challenge", &challenge, kNonceHex) || !cf.boolean("auth", &rank0_auth)) {
    *retry_why = "a malformed challenge: " + cf.problem();
    return false;
  }
  if (rank0_auth != !spec.secret.empty())
    throw_error("rank 0 at %s %s %s but this rank %s: every rank needs the same %s (%s)", rank0.c_str(),
                rank0_auth ? "has" : "does not have", kRendezvousSecretVar, rank0_auth ? "does not" : "has one",
                kRendezvousSecretVar, rendezvous_secret_hint().c_str());
  json hello = envelope("hello");
  hello["rank"] = spec.rank;
  hello["world_size"] = spec.world_size;
  hello["status"] = status;
  hello["nonce"] = nonce;
  hello["mac"] = mac_of(spec.secret, {"hello", challenge, nonce, itos(spec.rank), itos(spec.world_size), status});
  const Clock::time_point attempt_end =
      std::min(deadline.at, Clock::now() + std::chrono::microseconds(
                                                static_cast<long long>(spec.stranger_timeout_s * 1e6)));
  const double attempt_left_s = std::chrono::duration<double>(attempt_end - Clock::now()).count();
  if (!send_all(fd, frame(hello), Deadline(std::max(0.0, attempt_left_s)))) {
    *retry_why = "lost the connection to rank 0 while sending the hello";
    return false;
  }
  bool accepted = false;
  for (;;) {
    why.clear();
    const ReadResult r = read_frame(fd, buf, kMaxAnswer, accepted ? answer_deadline.at : attempt_end, &text);
    if (r != ReadResult::kMessage) {
      if (!accepted) {
        *retry_why = r == ReadResult::kClosed ? "rank 0 closed the connection before accepting the hello"
                                              : "no answer to the hello";
        return false;
      }
      if (r == ReadResult::kClosed)
        throw_error("rank 0 at %s closed the rendezvous connection without an answer (it probably failed: look for its "
                    "error line)", rank0.c_str());
      if (r == ReadResult::kTimeout)
        throw_error("rank 0 at %s accepted this rank but gave no answer within %g s (it waits until every rank has "
                    "joined: did all %d start?)", rank0.c_str(), spec.timeout_s + reply_grace_s(spec.timeout_s),
                    spec.world_size);
      throw_error("rendezvous: rank 0 at %s sent an oversize answer", rank0.c_str());
    }
    json a;
    std::string kind;
    if (json_depth(text) <= kMaxJsonDepth) a = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (a.is_object() && a.contains("kind") && a["kind"].is_string()) kind = a["kind"].get<std::string>();
    if (kind == "rejected" && parse_message(text, "rejected", &a, &why)) {
      Fields rf(a);
      std::string error;
      rf.string("error", &error, kMaxAnswer);
      throw_error("rank 0 at %s rejected this rank: %s", rank0.c_str(),
                  error.empty() ? "no reason given" : printable(error, 1000).c_str());
    }
    if (kind == "accepted" && parse_message(text, "accepted", &a, &why)) {
      Fields af(a);
      int rank = -1;
      std::string mac;
      if (af.integer("rank", &rank) && af.hex("mac", &mac, kMacHex) && rank == spec.rank &&
          mac_matches(spec.secret, mac, {"accepted", challenge, nonce, itos(rank)})) {
        accepted = true;
        continue;
      }
      why = "an acceptance that does not verify";
    } else if (kind == "verdict" && parse_message(text, "verdict", &a, &why)) {
      Fields vf(a);
      Verdict v;
      std::string mac;
      if (vf.boolean("ok", &v.ok) && vf.string(v.ok ? "payload" : "error", &v.body, kMaxAnswer) &&
          vf.boolean("startup_failure", &v.startup_failure) && vf.hex("mac", &mac, kMacHex) &&
          mac_matches(spec.secret, mac, {"verdict", challenge, nonce, itos(spec.rank), flag(v.ok), v.body,
                                         flag(v.startup_failure)})) {
        *payload = take_verdict(v, rank0);
        return true;
      }
      why = vf.problem().empty() ? std::string("a verdict that does not verify")
                                 : "a malformed verdict: " + vf.problem();
    } else if (why.empty()) {
      why = "a message that is not part of the rendezvous";
    }
    if (accepted) throw_error("rendezvous: rank 0 at %s sent %s", rank0.c_str(), why.c_str());
    *retry_why = why;
    return false;
  }
}

std::string tcp_join(const RendezvousSpec& spec, const std::string& master_addr, int master_port,
                     const std::string& status) {
  const Deadline deadline(spec.timeout_s);
  const std::string nonce = fresh_nonce();  // this process's, on every connection
  const std::string sent_status = wire_text(status, kMaxStatus);
  const std::string rank0 = strformat("%s:%d", master_addr.c_str(), master_port);
  RendezvousLogger log(spec);
  std::string last_problem;
  for (;;) {
    std::string why = "no answer";
    Fd fd = connect_with_retries(master_addr, master_port, deadline, &why);
    if (fd.fd < 0)
      throw_error("could not reach rank 0 at MASTER_ADDR=%s MASTER_PORT=%d within parallel.timeout_s = %g s (%s): is "
                  "rank 0 running (look for its error line), with the same MASTER_ADDR / MASTER_PORT, and is the port "
                  "open between the nodes?", master_addr.c_str(), master_port, spec.timeout_s,
                  last_problem.empty() ? why.c_str() : (last_problem + "; then: " + why).c_str());
    std::string payload;
    if (tcp_join_once(spec, fd.fd, rank0, nonce, sent_status, deadline, &payload, &last_problem)) return payload;
    if (deadline.passed())
      throw_error("could not join the rendezvous of rank 0 at MASTER_ADDR=%s MASTER_PORT=%d within parallel.timeout_s "
                  "= %g s: %s", master_addr.c_str(), master_port, spec.timeout_s, last_problem.c_str());
    log.note(strformat("connecting to rank 0 at %s again: %s", rank0.c_str(), last_problem.c_str()));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(200, deadline.ms_left(200))));
  }
}

}  // namespace

bool is_loopback_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool all = res != nullptr;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) all = all && is_loopback_sockaddr(ai->ai_addr);
  ::freeaddrinfo(res);
  return all;
}

std::string tcp_rendezvous(const RendezvousSpec& spec, const std::string& master_addr, int master_port,
                           const std::string& status, const std::string& root_payload) {
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size)
    throw_error("rendezvous: rank %d is out of range for world size %d", spec.rank, spec.world_size);
  if (spec.world_size == 1) {
    if (!status.empty()) throw GroupError("rank 0 failed during startup: " + status);
    return root_payload;
  }
  require_secret_for(master_addr, spec);
  if (spec.rank == 0) return TcpRoot(spec, master_addr, master_port, status).run(root_payload);
  return tcp_join(spec, master_addr, master_port, status);
}

// ------------------------------------------------------------------------------------------------------------------
// Shared directory

namespace {

std::string fs_prefix(const std::string& dir, const std::string& job_id) {
  std::string safe;
  for (char c : job_id) safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
  return (fs::path(dir) / ("llm8-" + safe)).string();
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = strformat("%s.tmp.%d", path.c_str(), static_cast<int>(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw_error("rendezvous: cannot write %s: %s", tmp.c_str(), std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw_error("rendezvous: cannot write %s: %s", tmp.c_str(), std::strerror(err));
    }
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_error("rendezvous: cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), std::strerror(err));
  }
}

enum class FileRead { kMissing, kOk, kNotUsable };

// A small regular file's content; kNotUsable (with why) for anything else: never blocks (a FIFO), never reads more
// than max_bytes.
FileRead read_small_file(const std::string& path, size_t max_bytes, std::string* out, std::string* why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return FileRead::kMissing;
    *why = std::strerror(errno);
    return FileRead::kNotUsable;
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || size_t(st.st_size) > max_bytes) {
    *why = S_ISREG(st.st_mode) ? strformat("%lld bytes, more than %zu", static_cast<long long>(st.st_size), max_bytes)
                               : std::string("not a regular file");
    ::close(fd);
    return FileRead::kNotUsable;
  }
  out->clear();
  char tmp[4096];
  for (;;) {
    const ssize_t n = ::read(fd, tmp, sizeof(tmp));
    if (n > 0) {
      out->append(tmp, size_t(n));
      if (out->size() > max_bytes) break;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  ::close(fd);
  if (out->size() > max_bytes) {
    *why = strformat("more than %zu bytes", max_bytes);
    return FileRead::kNotUsable;
  }
  return FileRead::kOk;
}

// A session file: rank 0's proof of the current rendezvous. "" with why when the file is absent or does not verify.
std::string read_session(const std::string& path, const RendezvousSpec& spec, const std::string& job_id,
                         std::string* why) {
  std::string text;
  switch (read_small_file(path, kRendezvousMaxHello, &text, why)) {
    case FileRead::kMissing:
      *why = "rank 0 has not published " + path + " yet";
      return "";
    case FileRead::kNotUsable:
      *why = path + ": " + *why;
      return "";
    case FileRead::kOk:
      break;
  }
  json m;
  if (!parse_message(text, "session", &m, why)) {
    *why = path + ": " + *why;
    return "";
  }
  Fields f(m);
  std::string session, mac;
  bool auth = false;
  if (!f.hex("session", &session, kNonceHex) || !f.boolean("auth", &auth) || !f.hex("mac", &mac, kMacHex)) {
    *why = path + ": malformed: " + f.problem();
    return "";
  }
  if (auth != !spec.secret.empty()) {
    *why = strformat("%s says rank 0 %s %s but this rank %s: every rank needs the same %s", path.c_str(),
                     auth ? "has" : "does not have", kRendezvousSecretVar, auth ? "does not" : "has one",
                     kRendezvousSecretVar);
    return "";
  }
  if (!mac_matches(spec.secret, mac, {"session", job_id, session})) {
    *why = path + ": " + mac_failure(spec.secret);
    return "";
  }
  return session;
}

class FsRoot {
 public:
  FsRoot(const RendezvousSpec& spec, const std::string& dir, const std::string& job_id, const std::string& status)
      : spec_(spec), dir_(dir), job_(job_id), prefix_(fs_prefix(dir, job_id)), log_(spec), st_(spec, status),
        seen_(spec.world_size) {}

  std::string run(const std::string& payload) {
    const Deadline deadline(spec_.timeout_s);
    ::unlink((prefix_ + ".reply").c_str());  // a stale answer of an earlier job with the same id
    session_ = fresh_nonce();
    json s = envelope("session");
    s["session"] = session_;
    s["auth"] = !spec_.secret.empty();
    s["mac"] = mac_of(spec_.secret, {"session", job_, session_});
    write_file_atomically(prefix_ + ".session", text_of(s));
    while (!st_.complete() && st_.fatal.empty()) {
      for (int r = 1; r < spec_.world_size && st_.fatal.empty(); r++) look_at(r);
      if (st_.fatal.empty()) look_for_strays();
      if (st_.complete() || !st_.fatal.empty()) break;
      if (deadline.passed()) {
        const std::string msg = strformat(
            "rank(s) %s did not join the rendezvous in %s within parallel.timeout_s = %g s: they did not start, "
            "failed before joining (look for their error lines), use another parallel.fs_path, job id or %s, or the "
            "directory is not shared between the nodes%s", join_ranks(st_.missing()).c_str(), dir_.c_str(),
            spec_.timeout_s, kRendezvousSecretVar, log_.summary().c_str());
        answer({false, msg, false});
        throw_error("%s", msg.c_str());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!st_.fatal.empty()) {
      answer({false, st_.fatal, false});
      throw_error("%s", st_.fatal.c_str());
    }
    const Verdict v = verdict_of(st_, payload);
    answer(v);
    for (int r = 1; r < spec_.world_size; r++) ::unlink(hello_path(r).c_str());
    if (!v.ok) throw GroupError(v.body);
    return payload;
  }

 private:
  std::string hello_path(int r) const { return strformat("%s.hello.%d", prefix_.c_str(), r); }

  // Logs a file once per content.
  void ignore(const std::string& path, const std::string& text, const std::string& why) {
    if (logged_.insert(path + "\n" + to_hex(sha256(text))).second) log_.ignored(path, why);
  }

  // Reads a hello file; true with the hello when it is of this session and verifies.
  bool read_hello(const std::string& path, Hello* h, std::string* text) {
    std::string why;
    switch (read_small_file(path, kRendezvousMaxHello, text, &why)) {
      case FileRead::kMissing: return false;
      case FileRead::kNotUsable: ignore(path, why, why); return false;
      case FileRead::kOk: break;
    }
    json m;
    if (!parse_message(*text, "hello", &m, &why)) {
      ignore(path, *text, why);
      return false;
    }
    Fields f(m);
    std::string session, mac;
    if (!f.integer("rank", &h->rank) || !f.integer("world_size", &h->world_size) ||
        !f.string("status", &h->status, kMaxStatus) || !f.hex("session", &session, kNonceHex) ||
        !f.hex("nonce", &h->nonce, kNonceHex) || !f.hex("mac", &mac, kMacHex)) {
      ignore(path, *text, "malformed hello: " + f.problem());
      return false;
    }
    if (session != session_) {
      ignore(path, *text, "written for another rendezvous session (left by an earlier job with this id, or written "
                          "by a rank that has not read the new session file yet)");
      return false;
    }
    if (!mac_matches(spec_.secret, mac, {"fs-hello", job_, session, h->nonce, itos(h->rank), itos(h->world_size),
                                         h->status})) {
      ignore(path, *text, mac_failure(spec_.secret));
      return false;
    }
    return true;
  }

  void look_at(int r) {
    const std::string path = hello_path(r);
    Hello h;
    std::string text;
    if (!read_hello(path, &h, &text) || text == seen_[r]) return;
    seen_[r] = text;
    if (h.rank != r) {
      st_.fatal = strformat("%s claims rank %d (check RANK)", path.c_str(), h.rank);
      return;
    }
    // It hears the verdict (a second claim of a rank does not displace the first).
    if (st_.admit(h, path) != Admission::kFatal || !nonces_.count(r)) nonces_[r] = h.nonce;
  }

  // A hello of this session for a rank beyond the world is a disagreement too.
  void look_for_strays() {
    std::error_code ec;
    const std::string head = prefix_ + ".hello.";
    for (const auto& entry : fs::directory_iterator(dir_, ec)) {
      const std::string name = entry.path().string();
      if (name.rfind(head, 0) != 0 || name.find(".tmp.") != std::string::npos) continue;
      const std::string tail = name.substr(head.size());
      if (tail.empty() || tail.size() >= 9 || !std::all_of(tail.begin(), tail.end(), ::isdigit) ||
          std::stoll(tail) < spec_.world_size)
        continue;
      Hello h;
      std::string text;
      if (!read_hello(name, &h, &text)) continue;
      nonces_.emplace(static_cast<int>(std::stoll(tail)), h.nonce);  // it hears the verdict
      st_.fatal = strformat("%s: a process claims rank %s, outside 0 .. %d of this %d-rank job (check RANK and "
                            "WORLD_SIZE)", name.c_str(), tail.c_str(), spec_.world_size - 1, spec_.world_size);
    }
  }

  void answer(const Verdict& v) {
    json reply = envelope("reply");
    reply["session"] = session_;
    reply["ok"] = v.ok;
    reply[v.ok ? "payload" : "error"] = v.body;
    reply["startup_failure"] = v.startup_failure;
    json ranks = json::object();
    for (const auto& [r, nonce] : nonces_)
      ranks[std::to_string(r)] = {{"nonce", nonce},
                                  {"mac", mac_of(spec_.secret, {"fs-reply", job_, session_, itos(r), nonce, flag(v.ok),
                                                                v.body, flag(v.startup_failure)})}};
    reply["ranks"] = ranks;
    write_file_atomically(prefix_ + ".reply", text_of(reply));
  }

  const RendezvousSpec& spec_;
  const std::string dir_, job_, prefix_;
  RendezvousLogger log_;
  RootState st_;
  std::string session_;
  std::vector<std::string> seen_;     // the last hello file of each rank taken into account
  std::map<int, std::string> nonces_;  // authenticated hellos: they hear the verdict
  std::set<std::string> logged_;
};

// Rank k's side: the reply of this session for this nonce, when it is there and verifies.
bool read_fs_reply(const RendezvousSpec& spec, const std::string& path, const std::string& job_id,
                   const std::string& session, const std::string& nonce, Verdict* v) {
  std::string text, why;
  if (read_small_file(path, kMaxReplyFile, &text, &why) != FileRead::kOk) return false;
  json m;
  if (!parse_message(text, "reply", &m, &why)) return false;
  Fields f(m);
  std::string got_session, mac, got_nonce;
  const json* ranks = nullptr;
  if (!f.hex("session", &got_session, kNonceHex) || got_session != session || !f.boolean("ok", &v->ok) ||
      !f.string(v->ok ? "payload" : "error", &v->body, kMaxReplyFile) ||
      !f.boolean("startup_failure", &v->startup_failure) || !f.object("ranks", &ranks))
    return false;
  const auto mine = ranks->find(std::to_string(spec.rank));
  if (mine == ranks->end() || !mine->is_object()) return false;
  Fields entry(*mine);
  return entry.hex("nonce", &got_nonce, kNonceHex) && got_nonce == nonce && entry.hex("mac", &mac, kMacHex) &&
         mac_matches(spec.secret, mac, {"fs-reply", job_id, session, itos(spec.rank), nonce, flag(v->ok), v->body,
                                        flag(v->startup_failure)});
}

std::string fs_join(const RendezvousSpec& spec, const std::string& dir, const std::string& job_id,
                    const std::string& status) {
  const std::string prefix = fs_prefix(dir, job_id);
  const std::string hello_path = strformat("%s.hello.%d", prefix.c_str(), spec.rank);
  const std::string nonce = fresh_nonce();
  const std::string sent_status = wire_text(status, kMaxStatus);
  const Deadline deadline(spec.timeout_s + reply_grace_s(spec.timeout_s));
  RendezvousLogger log(spec);
  std::string session, problem, logged_problem;
  while (true) {
    std::string why;
    const std::string current = read_session(prefix + ".session", spec, job_id, &why);
    if (!current.empty() && current != session) {  // a new rendezvous of rank 0: (re)write the hello for it
      session = current;
      json hello = envelope("hello");
      hello["rank"] = spec.rank;
      hello["world_size"] = spec.world_size;
      hello["status"] = sent_status;
      hello["session"] = session;
      hello["nonce"] = nonce;
      hello["mac"] = mac_of(spec.secret, {"fs-hello", job_id, session, nonce, itos(spec.rank), itos(spec.world_size),
                                          sent_status});
      write_file_atomically(hello_path, text_of(hello));
    }
    if (current.empty()) {
      problem = why;
      if (problem != logged_problem && problem.find("has not published") == std::string::npos) {
        log.ignored("a session file", problem);
        logged_problem = problem;
      }
    }
    Verdict v;
    if (!session.empty() && read_fs_reply(spec, prefix + ".reply", job_id, session, nonce, &v))
      return take_verdict(v, prefix + ".reply");
    if (deadline.passed()) {
      ::unlink(hello_path.c_str());
      throw_error("rank 0 did not answer through %s within %g s: is rank 0 running (look for its error line) with the "
                  "same parallel.fs_path, job id '%s' and %s, and is the directory shared between the nodes?%s",
                  dir.c_str(), spec.timeout_s + reply_grace_s(spec.timeout_s), job_id.c_str(), kRendezvousSecretVar,
                  problem.empty() ? "" : (" (last seen: " + problem + ")").c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

std::string fs_rendezvous(const RendezvousSpec& spec, const std::string& dir, const std::string& job_id,
                          const std::string& status, const std::string& root_payload) {
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size)
    throw_error("rendezvous: rank %d is out of range for world size %d", spec.rank, spec.world_size);
  if (spec.world_size == 1) {
    if (!status.empty()) throw GroupError("rank 0 failed during startup: " + status);
    return root_payload;
  }
  if (job_id.empty()) throw_error("parallel.init = fs needs a job id (LLM8_JOB_ID or SLURM_JOB_ID)");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    throw_error("parallel.fs_path %s is not a directory and cannot be created%s%s", dir.c_str(), ec ? ": " : "",
                ec ? ec.message().c_str() : "");
  if (spec.rank == 0) return FsRoot(spec, dir, job_id, status).run(root_payload);
  return fs_join(spec, dir, job_id, status);
}

void fs_rendezvous_cleanup(const std::string& dir, const std::string& job_id) {
  const std::string prefix = fs_prefix(dir, job_id);
  ::unlink((prefix + ".reply").c_str());
  ::unlink((prefix + ".session").c_str());
}

// ------------------------------------------------------------------------------------------------------------------
// MPI

bool mpi_init_if_needed() {
#ifdef LLM8_USE_MPI
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return false;
  MPI_Init(nullptr, nullptr);
  return true;
#else
  return false;
#endif
}

void mpi_finalize() {
#ifdef LLM8_USE_MPI
  MPI_Finalize();
#endif
}

#ifdef LLM8_USE_MPI
namespace {

std::string mpi_rendezvous(const RendezvousSpec& spec, const std::string& status, const std::string& root_payload) {
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size != spec.world_size || rank != spec.rank)
    throw_error("MPI says this is rank %d of %d, but the launcher variables say rank %d of %d", rank, size, spec.rank,
                spec.world_size);
  int len = static_cast<int>(status.size());
  std::vector<int> lens(size), displs(size);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; r++) {
    displs[r] = total;
    total += lens[r];
  }
  std::string all(static_cast<size_t>(std::max(total, 1)), '\0');
  MPI_Allgatherv(status.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, MPI_COMM_WORLD);
  std::string failures;
  for (int r = 0; r < size; r++)
    if (lens[r] > 0)
      failures += (failures.empty() ? "" : "; ") +
                  strformat("rank %d failed during startup: %s", r, all.substr(displs[r], lens[r]).c_str());
  if (!failures.empty()) throw GroupError(failures);
  int plen = static_cast<int>(root_payload.size());
  MPI_Bcast(&plen, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string payload = rank == 0 ? root_payload : std::string(static_cast<size_t>(plen), '\0');
  MPI_Bcast(payload.data(), plen, MPI_CHAR, 0, MPI_COMM_WORLD);
  return payload;
}

}  // namespace
#endif

std::string run_rendezvous(const std::string& method, const LaunchInfo& launch, const ParallelConfig& parallel,
                           const std::string& status, const std::string& root_payload) {
  RendezvousSpec spec;
  spec.rank = launch.rank;
  spec.world_size = launch.world_size;
  spec.timeout_s = parallel.timeout_s;
  spec.secret = launch.rendezvous_secret;
  if (method == "tcp") return tcp_rendezvous(spec, launch.master_addr, launch.master_port, status, root_payload);
  if (method == "fs") return fs_rendezvous(spec, parallel.fs_path, launch.job_id, status, root_payload);
#ifdef LLM8_USE_MPI
  if (method == "mpi") return mpi_rendezvous(spec, status, root_payload);
#endif
  throw_error("internal error: no rendezvous method '%s'", method.c_str());
}

void report_startup_failure(const LaunchInfo& launch, const ParallelConfig& parallel, const std::string& error) {
  if (launch.world_size <= 1) return;
  try {
    const std::string method = resolve_init_method(parallel.init, launch, parallel.fs_path, built_with_mpi());
    const bool mpi_here = method == "mpi" && mpi_init_if_needed();
    try {
      run_rendezvous(method, launch, parallel, error.empty() ? "unknown error" : error, "");
    } catch (...) {
    }
    if (mpi_here) mpi_finalize();
  } catch (...) {
  }
}

}  // namespace llmc
