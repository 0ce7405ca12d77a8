// llmc/distributed/rendezvous.cpp: the startup rendezvous over TCP, a shared directory or MPI, and the startup-failure
// report of a rank that cannot run (protocol in llmc/distributed/rendezvous.h).

#include "llmc/distributed/rendezvous.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>
#include <nlohmann/json.hpp>
#ifdef LLM8_USE_MPI
#include <mpi.h>
#endif

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// Rendezvous helpers

namespace {



constexpr const char* kMagic = "llm8-rendezvous";
constexpr int kProtocolVersion = 1;
constexpr size_t kMaxMessage = size_t(1) << 20;
// Non-root ranks wait this much longer than rank 0 for its answer, so that they hear its verdict (who is missing)
// rather than time out on their own.
double reply_grace_s(double timeout_s) { return std::min(10.0, timeout_s); }

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string from_hex(const std::string& hex) {
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2) throw_error("rendezvous: malformed payload (odd hex length)");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); i++) {
    const int hi = val(hex[2 * i]), lo = val(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) throw_error("rendezvous: malformed payload (not hex)");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

json hello_message(const RendezvousSpec& spec, const std::string& status) {
  return json{{"magic", kMagic}, {"version", kProtocolVersion}, {"rank", spec.rank},
              {"world_size", spec.world_size}, {"status", status}};
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Rank 0's bookkeeping, shared by the TCP and fs variants.
struct RootState {
  RendezvousSpec spec;
  std::vector<bool> arrived;
  std::vector<std::string> status;
  std::string fatal;  // a disagreement: stop everyone

  RootState(const RendezvousSpec& s, const std::string& own_status) : spec(s), arrived(s.world_size, false),
                                                                       status(s.world_size) {
    arrived[0] = true;
    status[0] = own_status;
  }
  // Validates a hello; returns the rank it claims (-1 when it is not ours and should be ignored); sets `fatal`.
  int accept(const json& hello, const std::string& where) {
    if (!hello.is_object() || hello.value("magic", "") != kMagic) return -1;
    if (hello.value("version", 0) != kProtocolVersion) {
      fatal = strformat("a process at %s speaks rendezvous version %d, rank 0 version %d: every rank must run the "
                        "same llm8 build", where.c_str(), hello.value("version", 0), kProtocolVersion);
      return -1;
    }
    const int r = hello.value("rank", -1), n = hello.value("world_size", -1);
    if (n != spec.world_size) {
      fatal = strformat("the world sizes disagree: rank 0 was started for %d processes but rank %d (%s) for %d "
                        "(check WORLD_SIZE / the launcher's process count on every node)",
                        spec.world_size, r, where.c_str(), n);
      return -1;
    }
    if (r < 1 || r >= spec.world_size) {
      fatal = strformat("a process (%s) claims rank %d, outside 1 .. %d of this %d-rank job (check RANK)",
                        where.c_str(), r, spec.world_size - 1, spec.world_size);
      return -1;
    }
    if (arrived[r]) {
      fatal = strformat("two processes claim rank %d (the second from %s): check RANK / the launcher", r,
                        where.c_str());
      return -1;
    }
    arrived[r] = true;
    status[r] = hello.value("status", "");
    return r;
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
    for (int r = 0; r < spec.world_size; r++)
      if (!status[r].empty()) msg += (msg.empty() ? "" : "; ") + strformat("rank %d failed during startup: %s", r,
                                                                            status[r].c_str());
    return msg;
  }
};

// ----- TCP sockets

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

bool send_message(int fd, const json& message, const Deadline& deadline) {
  const std::string text = message.dump();
  const uint32_t n = static_cast<uint32_t>(text.size());
  std::string frame(4, '\0');
  for (int i = 0; i < 4; i++) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return send_all(fd, frame + text, deadline);
}

// Appends what is readable; returns false when the peer closed or failed.
bool read_available(int fd, std::string& buf) {
  char tmp[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
    if (n > 0) {
      buf.append(tmp, size_t(n));
      if (buf.size() > kMaxMessage + 4) return false;
      continue;
    }
    if (n == 0) return false;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
}

// A complete framed message from buf (removed from it), or nullopt.
bool take_message(std::string& buf, json* out, bool* malformed) {
  *malformed = false;
  if (buf.size() < 4) return false;
  uint32_t n = 0;
  for (int i = 0; i < 4; i++) n |= uint32_t(static_cast<unsigned char>(buf[i])) << (8 * i);
  if (n > kMaxMessage) {
    *malformed = true;
    return false;
  }
  if (buf.size() < 4 + size_t(n)) return false;
  *out = json::parse(buf.substr(4, n), nullptr, /*allow_exceptions=*/false);
  buf.erase(0, 4 + size_t(n));
  if (out->is_discarded()) *malformed = true;
  return !*malformed;
}

std::string peer_name(const sockaddr_storage& addr) {
  char host[NI_MAXHOST] = {0}, port[NI_MAXSERV] = {0};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return std::string(host) + ":" + port;
}

Fd listen_on(int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(nullptr, port_text.c_str(), &hints, &res); rc != 0)
    throw_error("rank 0 cannot listen on port %d: %s", port, ::gai_strerror(rc));
  // Prefer a dual-stack IPv6 socket (accepts IPv4 too), else IPv4.
  std::vector<addrinfo*> order;
  for (addrinfo* ai = res; ai; ai = ai->ai_next)
    if (ai->ai_family == AF_INET6) order.push_back(ai);
  for (addrinfo* ai = res; ai; ai = ai->ai_next)
    if (ai->ai_family == AF_INET) order.push_back(ai);
  std::string last_error = "no address";
  Fd result;
  for (addrinfo* ai : order) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1, zero = 0;
    ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) ::setsockopt(fd.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (::bind(fd.fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.fd, 1024) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    set_nonblocking(fd.fd);
    result = std::move(fd);
    break;
  }
  ::freeaddrinfo(res);
  if (result.fd < 0)
    throw_error("rank 0 cannot listen on MASTER_PORT %d: %s (is another job using this port? pick another "
                "MASTER_PORT)", port, last_error.c_str());
  return result;
}

// Connects to addr:port, retrying until the deadline; -1 (closed Fd) when it never worked. `why` gets the last error.
Fd connect_with_retries(const std::string& addr, int port, const Deadline& deadline, std::string* why) {
  const std::string port_text = std::to_string(port);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
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

json reply_for(const RootState& st, const std::string& payload) {
  const std::string failures = st.failures();
  if (!failures.empty()) return json{{"ok", false}, {"error", failures}, {"startup_failure", true}};
  return json{{"ok", true}, {"payload", to_hex(payload)}};
}

}  // namespace

std::string tcp_rendezvous(const RendezvousSpec& spec, const std::string& master_addr, int master_port,
                           const std::string& status, const std::string& root_payload) {
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size)
    throw_error("rendezvous: rank %d is out of range for world size %d", spec.rank, spec.world_size);
  if (spec.world_size == 1) {
    if (!status.empty()) throw GroupError("rank 0 failed during startup: " + status);
    return root_payload;
  }
  if (spec.rank == 0) {
    const Deadline deadline(spec.timeout_s);
    Fd listener = listen_on(master_port);
    RootState st(spec, status);
    struct Client {
      Fd fd;
      std::string buf, where;
      int rank = -1;          // accepted rank
      bool ours = false;      // sent a hello of this protocol (accepted or refused): it hears the verdict
    };
    std::vector<Client> clients;
    auto answer_all = [&](const json& reply) {
      const Deadline send_deadline(5.0);
      for (Client& c : clients)
        if (c.ours) send_message(c.fd.fd, reply, send_deadline);
    };
    while (!st.complete() && st.fatal.empty()) {
      if (deadline.passed()) {
        const std::string msg = strformat(
            "rank(s) %s did not join the rendezvous on port %d within parallel.timeout_s = %g s: they did not "
            "start, failed before joining (look for their error lines), or use another MASTER_ADDR / MASTER_PORT",
            join_ranks(st.missing()).c_str(), master_port, spec.timeout_s);
        answer_all(json{{"ok", false}, {"error", msg}});
        throw_error("%s", msg.c_str());
      }
      std::vector<pollfd> pfds{{listener.fd, POLLIN, 0}};
      for (Client& c : clients) pfds.push_back({c.fd.fd, POLLIN, 0});
      ::poll(pfds.data(), pfds.size(), deadline.ms_left(200));
      for (;;) {  // accept everything pending
        sockaddr_storage addr{};
        socklen_t len = sizeof(addr);
        const int fd = ::accept(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len);
        if (fd < 0) break;
        set_nonblocking(fd);
        Client c;
        c.fd = Fd(fd);
        c.where = peer_name(addr);
        clients.push_back(std::move(c));
      }
      // Read the hellos. A connection that is not one of ours (wrong magic, garbage, closed before its hello) is
      // dropped; a rank that said hello and then went away simply will not hear the verdict.
      for (size_t i = 0; i < clients.size() && st.fatal.empty();) {
        Client& c = clients[i];
        if (c.rank > 0) {
          i++;
          continue;
        }
        bool keep = read_available(c.fd.fd, c.buf);
        json hello;
        bool malformed = false;
        if (take_message(c.buf, &hello, &malformed)) {
          c.rank = st.accept(hello, c.where);
          c.ours = c.rank > 0 || !st.fatal.empty();
          keep = c.ours;
        } else if (malformed) {
          keep = false;
        }
        if (keep) {
          i++;
        } else {
          clients.erase(clients.begin() + static_cast<long>(i));
        }
      }
    }
    if (!st.fatal.empty()) {
      answer_all(json{{"ok", false}, {"error", st.fatal}});
      throw_error("%s", st.fatal.c_str());
    }
    answer_all(reply_for(st, root_payload));
    if (const std::string failures = st.failures(); !failures.empty()) throw GroupError(failures);
    return root_payload;
  }

  // rank > 0
  const Deadline deadline(spec.timeout_s);
  std::string why = "no answer";
  Fd fd = connect_with_retries(master_addr, master_port, deadline, &why);
  if (fd.fd < 0)
    throw_error("could not reach rank 0 at MASTER_ADDR=%s MASTER_PORT=%d within parallel.timeout_s = %g s (%s): is "
                "rank 0 running (look for its error line), with the same MASTER_ADDR / MASTER_PORT, and is the port "
                "open between the nodes?", master_addr.c_str(), master_port, spec.timeout_s, why.c_str());
  if (!send_message(fd.fd, hello_message(spec, status), deadline))
    throw_error("lost the connection to rank 0 at %s:%d while joining the rendezvous", master_addr.c_str(),
                master_port);
  const Deadline reply_deadline(spec.timeout_s + reply_grace_s(spec.timeout_s));
  std::string buf;
  while (true) {
    json reply;
    bool malformed = false;
    const bool alive = read_available(fd.fd, buf);
    if (take_message(buf, &reply, &malformed)) {
      if (reply.value("ok", false)) return from_hex(reply.value("payload", ""));
      throw GroupError(reply.value("error", std::string("rank 0 refused this rank without a reason")));
    }
    if (malformed) throw_error("rendezvous: rank 0 at %s:%d sent a malformed answer", master_addr.c_str(), master_port);
    if (!alive)
      throw_error("rank 0 at %s:%d closed the rendezvous connection without an answer (it probably failed: look for "
                  "its error line)", master_addr.c_str(), master_port);
    if (reply_deadline.passed())
      throw_error("rank 0 at %s:%d accepted this rank but gave no answer within %g s (it waits until every rank has "
                  "joined: did all %d start?)", master_addr.c_str(), master_port, spec.timeout_s + reply_grace_s(spec.timeout_s), spec.world_size);
    pollfd p{fd.fd, POLLIN, 0};
    ::poll(&p, 1, reply_deadline.ms_left(200));
  }
}

// ----- shared directory

namespace {

std::string fs_prefix(const std::string& dir, const std::string& job_id) {
  std::string safe;
  for (char c : job_id) safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
  return (fs::path(dir) / ("llm8-" + safe)).string();
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = strformat("%s.tmp.%d", path.c_str(), static_cast<int>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw_error("rendezvous: cannot write %s: %s", tmp.c_str(), std::strerror(errno));
    out << text;
    out.flush();
    if (!out) throw_error("rendezvous: cannot write %s: %s", tmp.c_str(), std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_error("rendezvous: cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), std::strerror(err));
  }
}

// The JSON in a file; a discarded json when it does not exist or does not parse.
json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return json(json::value_t::discarded);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
}

std::string random_nonce() {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid()) ^
                      uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  return strformat("%016llx", static_cast<unsigned long long>(gen()));
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
  const std::string prefix = fs_prefix(dir, job_id);
  const std::string reply_path = prefix + ".reply";
  auto hello_path = [&](int r) { return strformat("%s.hello.%d", prefix.c_str(), r); };

  if (spec.rank == 0) {
    const Deadline deadline(spec.timeout_s);
    ::unlink(reply_path.c_str());  // a stale answer of an earlier job with the same id
    RootState st(spec, status);
    std::map<std::string, std::string> nonces;
    auto answer = [&](json reply) {
      reply["nonces"] = nonces;
      write_file_atomically(reply_path, reply.dump());
    };
    while (!st.complete() && st.fatal.empty()) {
      for (int r = 1; r < spec.world_size && st.fatal.empty(); r++) {
        if (st.arrived[r]) continue;
        const json hello = read_json_file(hello_path(r));
        if (!hello.is_object()) continue;
        nonces[std::to_string(r)] = hello.value("nonce", "");  // it hears the verdict, accepted or refused
        const int got = st.accept(hello, hello_path(r));
        if (got >= 0 && got != r)
          st.fatal = strformat("%s claims rank %d (check RANK)", hello_path(r).c_str(), got);
      }
      // A hello for a rank beyond the world is a disagreement too.
      for (const auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string name = entry.path().string();
        const std::string head = prefix + ".hello.";
        if (name.rfind(head, 0) != 0 || name.find(".tmp.") != std::string::npos) continue;
        const std::string tail = name.substr(head.size());
        if (!tail.empty() && tail.size() < 9 && std::all_of(tail.begin(), tail.end(), ::isdigit) &&
            std::stoll(tail) >= spec.world_size) {
          const json stray = read_json_file(name);
          if (stray.is_object()) nonces[tail] = stray.value("nonce", "");
          st.fatal = strformat("%s: a process claims rank %s, outside 0 .. %d of this %d-rank job (check RANK and "
                               "WORLD_SIZE)", name.c_str(), tail.c_str(), spec.world_size - 1, spec.world_size);
        }
      }
      if (st.complete() || !st.fatal.empty()) break;
      if (deadline.passed()) {
        const std::string msg = strformat(
            "rank(s) %s did not join the rendezvous in %s within parallel.timeout_s = %g s: they did not start, "
            "failed before joining (look for their error lines), use another parallel.fs_path or job id, or the "
            "directory is not shared between the nodes", join_ranks(st.missing()).c_str(), dir.c_str(),
            spec.timeout_s);
        answer(json{{"ok", false}, {"error", msg}});
        throw_error("%s", msg.c_str());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!st.fatal.empty()) {
      answer(json{{"ok", false}, {"error", st.fatal}});
      throw_error("%s", st.fatal.c_str());
    }
    answer(reply_for(st, root_payload));
    for (int r = 1; r < spec.world_size; r++) ::unlink(hello_path(r).c_str());
    if (const std::string failures = st.failures(); !failures.empty()) throw GroupError(failures);
    return root_payload;
  }

  // rank > 0
  const std::string nonce = random_nonce();
  json hello = hello_message(spec, status);
  hello["nonce"] = nonce;
  write_file_atomically(hello_path(spec.rank), hello.dump());
  const Deadline deadline(spec.timeout_s + reply_grace_s(spec.timeout_s));
  while (true) {
    const json reply = read_json_file(reply_path);
    if (!reply.is_discarded() && reply.is_object() && reply.contains("nonces") && reply["nonces"].is_object() &&
        reply["nonces"].value(std::to_string(spec.rank), "") == nonce) {
      if (reply.value("ok", false)) return from_hex(reply.value("payload", ""));
      throw GroupError(reply.value("error", std::string("rank 0 refused this rank without a reason")));
    }
    if (deadline.passed()) {
      ::unlink(hello_path(spec.rank).c_str());
      throw_error("rank 0 did not answer through %s within %g s: is rank 0 running (look for its error line) with the "
                  "same parallel.fs_path and job id '%s', and is the directory shared between the nodes?",
                  dir.c_str(), spec.timeout_s + reply_grace_s(spec.timeout_s), job_id.c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void fs_rendezvous_cleanup(const std::string& dir, const std::string& job_id) {
  ::unlink((fs_prefix(dir, job_id) + ".reply").c_str());
}

// ----- MPI

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
