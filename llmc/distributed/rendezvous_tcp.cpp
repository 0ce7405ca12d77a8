// llmc/distributed/rendezvous_tcp.cpp: the TCP rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT, challenges
// every connection and registers the authenticated hellos within bounds (connections, sizes, time, no busy loop);
// the other ranks connect, answer the challenge and wait for the verdict (protocol in llmc/distributed/rendezvous.h).

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <set>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "llmc/distributed/rendezvous.h"
#include "llmc/distributed/rendezvous_protocol.h"

namespace llmc {

using namespace rdv;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kMaxAcceptsPerRound = 64;

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
        st_(spec.world_size, status) {}

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
        const int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        if (err == EINTR || err == ECONNABORTED) continue;
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
          // Out of descriptors: make room from the strangers, else wait (the listener stays readable: never spin).
          Client* oldest = oldest_stranger();
          if (oldest && now >= grace_end(*oldest)) {
            reject(*oldest, "dropped: this process ran out of file descriptors", /*tell=*/false);
            sweep();
            continue;
          }
          if (!out_of_descriptors_logged_) {
            log_.note(strformat("out of file descriptors (%s): new connections wait", std::strerror(err)));
            out_of_descriptors_logged_ = true;
          }
        }
        accept_paused_until_ = now + std::chrono::milliseconds(100);  // also after any other error: never spin
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
    if (!parse_envelope(text, &a, &kind, &why)) {
      // why says what it is not
    } else if (kind == "rejected") {
      Fields rf(a);
      std::string error;
      rf.string("error", &error, kMaxAnswer);
      throw_error("rank 0 at %s rejected this rank: %s", rank0.c_str(),
                  error.empty() ? "no reason given" : printable(error, 1000).c_str());
    } else if (kind == "accepted") {
      Fields af(a);
      int rank = -1;
      std::string mac;
      if (af.integer("rank", &rank) && af.hex("mac", &mac, kMacHex) && rank == spec.rank &&
          mac_matches(spec.secret, mac, {"accepted", challenge, nonce, itos(rank)})) {
        accepted = true;
        continue;
      }
      why = "an acceptance that does not verify";
    } else if (kind == "verdict") {
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
    } else {
      why = strformat("a '%s' message", printable(kind, 64).c_str());
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
  if (std::string payload; rdv::alone(spec, status, root_payload, &payload)) return payload;
  require_secret_for(master_addr, spec);
  if (spec.rank == 0) return TcpRoot(spec, master_addr, master_port, status).run(root_payload);
  return tcp_join(spec, master_addr, master_port, status);
}

}  // namespace llmc
