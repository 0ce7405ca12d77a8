// llmc/comm: implementation of the launch detection, the rendezvous (MPI, TCP, shared directory), the NCCL
// communicator with deadlines and the fatal-error path (interface and protocol in comm.h).
#include "llmc/comm.h"

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

#include <nccl.h>
#include <nlohmann/json.hpp>

#ifdef LLM8_USE_MPI
#include <mpi.h>
#endif

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// Errors and output

namespace {
std::atomic<int> g_error_rank{-1};
}

void set_error_rank(int rank, int world_size) { g_error_rank = world_size > 1 ? rank : -1; }

std::string error_prefix() {
  const int r = g_error_rank.load();
  return r >= 0 ? strformat("[rank %d] ", r) : std::string();
}

std::string capture_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return what.empty() ? std::string("unknown error") : what;
  }
  return "";
}

void quiet_stdout_unless(bool keep) {
  if (keep) return;
  std::fflush(stdout);
  const int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::dup2(fd, STDOUT_FILENO);
  ::close(fd);
}

// ------------------------------------------------------------------------------------------------------------------
// Launch detection

const char* process_env(const char* name) { return std::getenv(name); }

namespace {

// The value of an environment variable, nullptr when unset or empty.
const char* env_value(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return (v && *v) ? v : nullptr;
}

int parse_env_int(const char* name, const char* value, int min_value) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || n < min_value || n > 100000000)
    throw_error("environment variable %s='%s' is not %s (fix or unset it; it is read to place this process in the "
                "job)", name, value, min_value > 0 ? "a positive integer" : "a non-negative integer");
  return static_cast<int>(n);
}

struct LaunchSource {
  const char* name;
  const char* rank_var;
  const char* size_var;
  std::vector<const char*> local_vars;  // first one set wins
  const char* local_size_var;           // nullptr = none
};

const std::vector<LaunchSource>& launch_sources() {
  static const std::vector<LaunchSource> sources = {
      {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", {"OMPI_COMM_WORLD_LOCAL_RANK"},
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", {"MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"},
       "MPI_LOCALNRANKS"},
      {"torchrun", "RANK", "WORLD_SIZE", {"LOCAL_RANK"}, "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", {"SLURM_LOCALID"}, nullptr},
  };
  return sources;
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace

LaunchInfo detect_launch(const EnvLookup& env) {
  LaunchInfo info;
  info.hostname = host_name();
  const auto& sources = launch_sources();
  const LaunchSource* chosen = nullptr;
  for (const LaunchSource& s : sources) {
    const char* r = env_value(env, s.rank_var);
    const char* n = env_value(env, s.size_var);
    if (r && n) {
      chosen = &s;
      break;
    }
  }
  // A world size above 1 without its rank cannot be placed; RANK without WORLD_SIZE is a half-set torchrun launch.
  if (!chosen) {
    for (const LaunchSource& s : sources) {
      const char* r = env_value(env, s.rank_var);
      const char* n = env_value(env, s.size_var);
      if (n && !r && parse_env_int(s.size_var, n, 1) > 1)
        throw_error("%s=%s is set but %s is not, so this process cannot tell its rank: start the processes with a "
                    "launcher that sets both (scripts/run_local.sh, torchrun, mpirun, srun), or unset %s for a "
                    "single-GPU run", s.size_var, n, s.rank_var, s.size_var);
      if (r && !n && std::string(s.name) == "torchrun")
        throw_error("RANK=%s is set but WORLD_SIZE is not: set both (and LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or "
                    "neither for a single-GPU run", r);
    }
  }
  if (chosen) {
    info.launcher = chosen->name;
    info.world_size = parse_env_int(chosen->size_var, env_value(env, chosen->size_var), 1);
    info.rank = parse_env_int(chosen->rank_var, env_value(env, chosen->rank_var), 0);
    if (info.rank >= info.world_size)
      throw_error("rank out of range: %s=%d but %s=%d (ranks are 0 .. %d)", chosen->rank_var, info.rank,
                  chosen->size_var, info.world_size, info.world_size - 1);
    // Every other launcher's variables that are set must describe the same job (Slurm's describe the allocation).
    for (const LaunchSource& s : sources) {
      if (&s == chosen || std::string(s.name) == "slurm") continue;
      const char* n = env_value(env, s.size_var);
      if (n && parse_env_int(s.size_var, n, 1) != info.world_size)
        throw_error("the launcher variables disagree on the world size: %s=%d but %s=%s (a variable left over in the "
                    "environment? unset the one that does not belong to this launch)",
                    chosen->size_var, info.world_size, s.size_var, n);
      const char* r = env_value(env, s.rank_var);
      if (n && r && parse_env_int(s.rank_var, r, 0) != info.rank)
        throw_error("the launcher variables disagree on the rank: %s=%d but %s=%s (a variable left over in the "
                    "environment? unset the one that does not belong to this launch)",
                    chosen->rank_var, info.rank, s.rank_var, r);
    }
    const char* local_var = nullptr;
    for (const char* v : chosen->local_vars)
      if (env_value(env, v)) {
        local_var = v;
        break;
      }
    if (local_var) {
      info.local_rank = parse_env_int(local_var, env_value(env, local_var), 0);
    } else if (info.world_size > 1) {
      throw_error("%s is not set, so this process cannot tell which GPU of its node to use (rank %d of %d): the "
                  "launcher must set it%s", chosen->local_vars[0], info.rank, info.world_size,
                  std::string(chosen->name) == "torchrun" ? " (scripts/run_local.sh and torchrun do)" : "");
    }
    if (chosen->local_size_var && env_value(env, chosen->local_size_var))
      info.local_world_size = parse_env_int(chosen->local_size_var, env_value(env, chosen->local_size_var), 1);
    if (info.local_world_size > 0 && info.local_rank >= info.local_world_size)
      throw_error("local rank out of range: %s=%d but %s=%d", local_var ? local_var : "local rank", info.local_rank,
                  chosen->local_size_var, info.local_world_size);
  }
  if (const char* a = env_value(env, "MASTER_ADDR")) info.master_addr = a;
  if (const char* p = env_value(env, "MASTER_PORT")) {
    info.master_port = parse_env_int("MASTER_PORT", p, 1);
    if (info.master_port > 65535) throw_error("environment variable MASTER_PORT='%s' is not a TCP port (1-65535)", p);
  }
  if (const char* j = env_value(env, "LLM8_JOB_ID")) {
    info.job_id = j;
  } else if (const char* sj = env_value(env, "SLURM_JOB_ID")) {
    info.job_id = sj;
    if (const char* step = env_value(env, "SLURM_STEP_ID")) info.job_id += std::string(".") + step;
  }
  return info;
}

int choose_device(const LaunchInfo& launch, int visible_gpus, const char* cuda_visible_devices) {
  const std::string cvd = cuda_visible_devices ? cuda_visible_devices : "";
  const std::string cvd_note = cuda_visible_devices ? " (CUDA_VISIBLE_DEVICES=" + cvd + ")" : "";
  if (visible_gpus <= 0)
    throw_error("no CUDA GPU is visible to rank %d on host %s%s: training needs one NVIDIA GPU per process",
                launch.rank, launch.hostname.c_str(), cvd_note.c_str());
  if (launch.local_rank < visible_gpus) return launch.local_rank;
  // The launcher bound one GPU to each process (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES=<one id> per rank).
  if (visible_gpus == 1 && !cvd.empty() && cvd.find(',') == std::string::npos) return 0;
  throw_error("rank %d has local rank %d, but host %s shows only %d GPU(s)%s: start at most one process per GPU "
              "(e.g. scripts/run_local.sh N with N <= %d)",
              launch.rank, launch.local_rank, launch.hostname.c_str(), visible_gpus, cvd_note.c_str(), visible_gpus);
}

bool built_with_mpi() {
#ifdef LLM8_USE_MPI
  return true;
#else
  return false;
#endif
}

std::string resolve_init_method(const std::string& init, const LaunchInfo& launch, const std::string& fs_path,
                                bool have_mpi) {
  if (init != "auto" && init != "mpi" && init != "tcp" && init != "fs" && init != "none")
    throw_error("parallel.init: unknown method '%s' (auto, mpi, tcp, fs or none)", init.c_str());
  if (launch.world_size == 1) return "none";
  const bool by_mpi = launch.launcher == "mpi" || launch.launcher == "pmi";
  const bool tcp_ready = !launch.master_addr.empty() && launch.master_port > 0;
  const std::string job_hint =
      "set LLM8_JOB_ID to a value shared by the ranks of this job and no other (Slurm's SLURM_JOB_ID is used when "
      "set)";
  if (init == "none")
    throw_error("parallel.init = none, but the launcher started %d processes (this is rank %d, via %s): set "
                "parallel.init to auto, or start a single process", launch.world_size, launch.rank,
                launch.launcher.c_str());
  if (init == "mpi") {
    if (!have_mpi)
      throw_error("parallel.init = mpi, but this build has no MPI: configure with -DLLM8_MPI=ON and an MPI installation "
                  "(apt-get install libopenmpi-dev), or use parallel.init = tcp with MASTER_ADDR and MASTER_PORT");
    if (!by_mpi)
      throw_error("parallel.init = mpi, but this process was not started by mpirun (no OMPI_COMM_WORLD_* or PMI_* "
                  "variables; launcher: %s)", launch.launcher.c_str());
    return "mpi";
  }
  if (init == "tcp") {
    if (!tcp_ready)
      throw_error("parallel.init = tcp needs MASTER_ADDR and MASTER_PORT (rank 0's address and a free port, the same "
                  "on every rank); MASTER_ADDR=%s MASTER_PORT=%s",
                  launch.master_addr.empty() ? "(unset)" : launch.master_addr.c_str(),
                  launch.master_port ? std::to_string(launch.master_port).c_str() : "(unset)");
    return "tcp";
  }
  if (init == "fs") {
    if (fs_path.empty())
      throw_error("parallel.init = fs needs parallel.fs_path: a directory every rank can read and write");
    if (launch.job_id.empty()) throw_error("parallel.init = fs needs a job id: %s", job_hint.c_str());
    return "fs";
  }
  // auto
  if (by_mpi && have_mpi) return "mpi";
  if (tcp_ready) return "tcp";
  if (!fs_path.empty() && !launch.job_id.empty()) return "fs";
  throw_error("%d processes were started (launcher: %s) but there is no way to exchange the NCCL id: set MASTER_ADDR "
              "and MASTER_PORT (tcp), or parallel.fs_path with a job id (fs: %s)%s",
              launch.world_size, launch.launcher.c_str(), job_hint.c_str(),
              by_mpi && !have_mpi ? "; this build has no MPI, so mpirun alone is not enough (scripts/run_mpi.sh sets "
                                    "MASTER_ADDR/MASTER_PORT)"
                                  : "");
}

ParallelConfig bootstrap_parallel_config(const std::string& config_path, const std::vector<std::string>& overrides) {
  ParallelConfig p;
  auto apply = [&p](const std::string& key, const json& v) {
    if (key == "init" && v.is_string()) p.init = v.get<std::string>();
    if (key == "fs_path" && v.is_string()) p.fs_path = v.get<std::string>();
    if (key == "timeout_s" && v.is_number_integer() && v.get<long long>() >= 1 && v.get<long long>() <= 86400 * 7)
      p.timeout_s = v.get<int>();
  };
  std::ifstream in(config_path);
  if (in) {
    std::stringstream text;
    text << in.rdbuf();
    const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
    if (j.is_object() && j.contains("parallel") && j["parallel"].is_object())
      for (auto it = j["parallel"].begin(); it != j["parallel"].end(); ++it) apply(it.key(), it.value());
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (o.rfind("parallel.", 0) != 0 || eq == std::string::npos) continue;
    const std::string key = o.substr(9, eq - 9), value = o.substr(eq + 1);
    json v = json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) v = value;
    apply(key, v);
  }
  return p;
}

// ------------------------------------------------------------------------------------------------------------------
// Rendezvous helpers

namespace {

using Clock = std::chrono::steady_clock;

struct Deadline {
  Clock::time_point at;
  explicit Deadline(double seconds)
      : at(Clock::now() + std::chrono::microseconds(static_cast<long long>(seconds * 1e6))) {}
  bool passed() const { return Clock::now() >= at; }
  // Milliseconds left, capped (for poll), at least 0.
  int ms_left(int cap_ms) const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now()).count();
    return static_cast<int>(std::max<long long>(0, std::min<long long>(left, cap_ms)));
  }
};

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
                      uint64_t(Clock::now().time_since_epoch().count()));
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

#ifdef LLM8_USE_MPI
namespace {

bool mpi_init_if_needed() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return false;
  MPI_Init(nullptr, nullptr);
  return true;
}

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

namespace {

// The rendezvous of `method` ("tcp", "fs", "mpi"); for mpi, MPI must be initialised.
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

}  // namespace

void report_startup_failure(const LaunchInfo& launch, const ParallelConfig& parallel, const std::string& error) {
  if (launch.world_size <= 1) return;
  try {
    const std::string method = resolve_init_method(parallel.init, launch, parallel.fs_path, built_with_mpi());
#ifdef LLM8_USE_MPI
    const bool mpi_here = method == "mpi" && mpi_init_if_needed();
#endif
    try {
      run_rendezvous(method, launch, parallel, error.empty() ? "unknown error" : error, "");
    } catch (...) {
    }
#ifdef LLM8_USE_MPI
    if (mpi_here) MPI_Finalize();
#endif
  } catch (...) {
  }
}

// ------------------------------------------------------------------------------------------------------------------
// The process group

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::U8: return ncclUint8;
    case DType::I64: return ncclInt64;
  }
  return ncclFloat32;
}

size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::U8: return 1;
    case DType::I64: return 8;
  }
  return 4;
}

constexpr int kEventRing = 128;

// Ends the process `seconds` from now unless it has exited: nothing may keep a rank alive forever after a fatal error.
// It prints the error that started the shutdown (when known), since main() never got to print it.
void arm_exit_backstop(double seconds, const std::string& reason) {
  static std::atomic<bool> armed{false};
  if (armed.exchange(true)) return;
  const std::string prefix = error_prefix();
  std::thread([seconds, prefix, reason]() {
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<long long>(seconds * 1000)));
    if (!reason.empty()) std::fprintf(stderr, "%serror: %s\n", prefix.c_str(), reason.c_str());
    std::fprintf(stderr, "%serror: still running %g s after a fatal error (a collective or CUDA call did not return): "
                 "exiting\n", prefix.c_str(), seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
}

}  // namespace

struct Comm::Impl {
  ncclComm_t nccl = nullptr;
  std::vector<cudaEvent_t> events;
  int next_event = 0;
  void* dev_scratch = nullptr;
  void* host_scratch = nullptr;  // pinned
  size_t scratch_bytes = 0;
};

Comm::Comm(const LaunchInfo& launch, const ParallelConfig& parallel)
    : launch_(launch), timeout_s_(parallel.timeout_s), impl_(std::make_unique<Impl>()) {
  if (launch_.world_size <= 1) return;
  method_ = resolve_init_method(parallel.init, launch_, parallel.fs_path, built_with_mpi());
  // NVLink SHARP (NVLS) stays off unless the user asks for it explicitly (see the launchers and README).
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
#ifdef LLM8_USE_MPI
  if (method_ == "mpi") mpi_initialised_here_ = mpi_init_if_needed();
#endif
  // This rank's startup status: a GPU of its own, and (rank 0) the NCCL unique id.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::string status = capture_error([&]() {
    device_ = choose_device(launch_, cuda_device_count(), std::getenv("CUDA_VISIBLE_DEVICES"));
    CUDA_CHECK(cudaSetDevice(device_));
    if (launch_.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  });
  std::string payload;
  try {
    payload = run_rendezvous(method_, launch_, parallel, status,
                             std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } catch (...) {
#ifdef LLM8_USE_MPI
    if (mpi_initialised_here_) MPI_Finalize();
    mpi_initialised_here_ = false;
#endif
    if (!status.empty()) throw Error(status);  // this rank's own problem, in its own words
    throw;
  }
  if (payload.size() != sizeof(id))
    throw_error("rendezvous: the NCCL id from rank 0 has %zu bytes, expected %zu (different NCCL versions?)",
                payload.size(), sizeof(id));
  std::memcpy(&id, payload.data(), sizeof(id));

  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  impl_->events.resize(kEventRing);
  for (cudaEvent_t& e : impl_->events) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  // NCCL, non-blocking so that a peer that never arrives becomes a timeout instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t rc = ncclCommInitRankConfig(&impl_->nccl, launch_.world_size, id, launch_.rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    const std::string last = ncclGetLastError(impl_->nccl);
    if (impl_->nccl) ncclCommAbort(impl_->nccl);
    impl_->nccl = nullptr;
    throw_error("NCCL communicator setup failed on rank %d: %s%s%s", launch_.rank, ncclGetErrorString(rc),
                last.empty() ? "" : ": ", last.c_str());
  }
  const Deadline deadline(timeout_s_);
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(impl_->nccl, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress || deadline.passed()) {
      const std::string last = ncclGetLastError(impl_->nccl);
      const std::string msg =
          state != ncclInProgress
              ? strformat("NCCL communicator setup failed on rank %d: %s%s%s", launch_.rank, ncclGetErrorString(state),
                          last.empty() ? "" : ": ", last.c_str())
              : strformat("NCCL communicator setup did not finish within parallel.timeout_s = %g s on rank %d: a peer "
                          "did not join or cannot be reached (look for other ranks' error lines; NCCL_DEBUG=INFO "
                          "shows the transport)", timeout_s_, launch_.rank);
      arm_exit_backstop(std::max(10.0, std::min(60.0, timeout_s_)), msg);
      ncclCommAbort(impl_->nccl);
      impl_->nccl = nullptr;
      throw Error(msg);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (method_ == "fs" && launch_.rank == 0) fs_rendezvous_cleanup(parallel.fs_path, launch_.job_id);
  ensure_scratch(4096);
}

Comm::~Comm() {
  if (launch_.world_size <= 1) return;
  const bool unwinding = std::uncaught_exceptions() > 0;
  if (impl_->nccl) {
    if (unwinding || aborted_) {
      abort();
    } else {
      // Orderly: finish pending work, then free. A finalize that cannot finish (a peer vanished) becomes an abort.
      ncclResult_t rc = ncclCommFinalize(impl_->nccl);
      const Deadline deadline(timeout_s_);
      while (rc == ncclInProgress || rc == ncclSuccess) {
        ncclResult_t state = ncclInProgress;
        ncclCommGetAsyncError(impl_->nccl, &state);
        if (state != ncclInProgress) break;
        if (deadline.passed()) {
          abort();
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (impl_->nccl) ncclCommDestroy(impl_->nccl);
      impl_->nccl = nullptr;
    }
  }
  if (!aborted_) {
    for (cudaEvent_t e : impl_->events) cudaEventDestroy(e);
    if (impl_->dev_scratch) cudaFree(impl_->dev_scratch);
    if (impl_->host_scratch) cudaFreeHost(impl_->host_scratch);
    if (stream_) cudaStreamDestroy(stream_);
  }
#ifdef LLM8_USE_MPI
  if (mpi_initialised_here_ && !unwinding && !aborted_) MPI_Finalize();
#endif
}

void Comm::abort(const std::string& reason) {
  if (launch_.world_size <= 1 || aborted_) return;
  aborted_ = true;
  arm_exit_backstop(std::max(10.0, std::min(60.0, timeout_s_)), reason);
  if (impl_->nccl) ncclCommAbort(impl_->nccl);
  impl_->nccl = nullptr;
}

Comm::AbortGuard::AbortGuard(Comm& comm) : comm_(comm), exceptions_(std::uncaught_exceptions()) {}
Comm::AbortGuard::~AbortGuard() {
  if (std::uncaught_exceptions() > exceptions_) comm_.abort();
}

void Comm::nccl_wait(int result, const char* what) {
  const ncclResult_t r = static_cast<ncclResult_t>(result);
  if (r == ncclSuccess) return;
  if (r == ncclInProgress) {
    const Deadline deadline(timeout_s_);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      ncclCommGetAsyncError(impl_->nccl, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) return nccl_wait(state, what);
      if (deadline.passed()) {
        const std::string msg = strformat("NCCL could not queue the %s within parallel.timeout_s = %g s (rank %d)",
                                          what, timeout_s_, launch_.rank);
        abort(msg);
        throw Error(msg);
      }
      std::this_thread::yield();
    }
  }
  const std::string last = impl_->nccl ? ncclGetLastError(impl_->nccl) : "";
  const std::string msg = strformat("NCCL error during the %s on rank %d: %s%s%s (a peer rank probably failed: look "
                                    "for its error line)", what, launch_.rank, ncclGetErrorString(r),
                                    last.empty() ? "" : ": ", last.c_str());
  abort(msg);
  throw Error(msg);
}

cudaEvent_t Comm::next_event() {
  cudaEvent_t e = impl_->events[impl_->next_event];
  impl_->next_event = (impl_->next_event + 1) % kEventRing;
  return e;
}

void Comm::comm_waits_for(cudaStream_t compute) {
  if (!distributed()) return;
  cudaEvent_t e = next_event();
  CUDA_CHECK(cudaEventRecord(e, compute));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, e, 0));
}

void Comm::waits_for_comm(cudaStream_t compute) {
  if (!distributed()) return;
  cudaEvent_t e = next_event();
  CUDA_CHECK(cudaEventRecord(e, stream_));
  CUDA_CHECK(cudaStreamWaitEvent(compute, e, 0));
}

static void require_comm(bool ok, const char* what) {
  if (!ok) throw_error("internal error: %s on an aborted or absent NCCL communicator", what);
}

void Comm::all_reduce(void* buf, size_t count, DType type, ReduceOp op) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "all-reduce");
  nccl_wait(ncclAllReduce(buf, buf, count, nccl_type(type), op == ReduceOp::Sum ? ncclSum : ncclMax, impl_->nccl,
                          stream_), "all-reduce");
}

void Comm::reduce_scatter(void* buf, size_t count, DType type) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "reduce-scatter");
  char* base = static_cast<char*>(buf);
  nccl_wait(ncclReduceScatter(base, base + size_t(launch_.rank) * count * dtype_bytes(type), count, nccl_type(type),
                              ncclSum, impl_->nccl, stream_), "reduce-scatter");
}

void Comm::all_gather(void* buf, size_t count, DType type) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "all-gather");
  char* base = static_cast<char*>(buf);
  nccl_wait(ncclAllGather(base + size_t(launch_.rank) * count * dtype_bytes(type), base, count, nccl_type(type),
                          impl_->nccl, stream_), "all-gather");
}

void Comm::all_gather(const void* send, void* recv, size_t count, DType type) {
  if (count == 0) return;
  if (!distributed()) {
    if (send != recv) CUDA_CHECK(cudaMemcpy(recv, send, count * dtype_bytes(type), cudaMemcpyDeviceToDevice));
    return;
  }
  require_comm(impl_->nccl, "all-gather");
  nccl_wait(ncclAllGather(send, recv, count, nccl_type(type), impl_->nccl, stream_), "all-gather");
}

void Comm::group_start() {
  if (distributed()) nccl_wait(ncclGroupStart(), "group start");
}
void Comm::group_end() {
  if (distributed()) nccl_wait(ncclGroupEnd(), "grouped send/receive");
}
void Comm::send(const void* buf, size_t count, DType type, int peer) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "send");
  nccl_wait(ncclSend(buf, count, nccl_type(type), peer, impl_->nccl, stream_), "send");
}
void Comm::recv(void* buf, size_t count, DType type, int peer) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "receive");
  nccl_wait(ncclRecv(buf, count, nccl_type(type), peer, impl_->nccl, stream_), "receive");
}

void Comm::all_reduce_max_after(float* amax, int count, cudaStream_t s) {
  if (!distributed() || count <= 0) return;
  comm_waits_for(s);
  all_reduce(amax, static_cast<size_t>(count), DType::F32, ReduceOp::Max);
  waits_for_comm(s);
}

void Comm::wait(cudaStream_t s, const char* what) {
  if (!distributed()) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  if (aborted_) throw_error("%s: the NCCL communicator was aborted after an earlier error", what);
  cudaEvent_t e = next_event();
  CUDA_CHECK(cudaEventRecord(e, s));
  const Deadline deadline(timeout_s_);
  int polls = 0;
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    ncclResult_t state = ncclSuccess;
    if (impl_->nccl) ncclCommGetAsyncError(impl_->nccl, &state);
    if (state != ncclSuccess && state != ncclInProgress) nccl_wait(state, what);
    if (deadline.passed()) {
      const std::string msg = strformat("%s did not complete within parallel.timeout_s = %g s: another rank probably "
                                        "failed or stopped (look for its '[rank N] error' line), or it is far slower "
                                        "than this one", what, timeout_s_);
      abort(msg);
      throw Error(msg);
    }
    // Spin briefly (most waits are short), then sleep in small steps.
    if (++polls > 200) std::this_thread::sleep_for(std::chrono::microseconds(polls > 2000 ? 1000 : 50));
  }
}

void Comm::ensure_scratch(size_t bytes) {
  if (bytes <= impl_->scratch_bytes) return;
  bytes = std::max(bytes, impl_->scratch_bytes * 2);
  if (impl_->dev_scratch) CUDA_CHECK(cudaFree(impl_->dev_scratch));
  if (impl_->host_scratch) CUDA_CHECK(cudaFreeHost(impl_->host_scratch));
  impl_->dev_scratch = impl_->host_scratch = nullptr;
  CUDA_CHECK(cudaMalloc(&impl_->dev_scratch, bytes));
  CUDA_CHECK(cudaMallocHost(&impl_->host_scratch, bytes));
  impl_->scratch_bytes = bytes;
}

void Comm::barrier(const char* what) {
  if (!distributed()) return;
  sum(0.0, what);
}

double Comm::sum(double value, const char* what) {
  if (!distributed()) return value;
  ensure_scratch(sizeof(double));
  double* host = static_cast<double*>(impl_->host_scratch);
  *host = value;
  CUDA_CHECK(cudaMemcpyAsync(impl_->dev_scratch, host, sizeof(double), cudaMemcpyHostToDevice, stream_));
  all_reduce(impl_->dev_scratch, 1, DType::F64, ReduceOp::Sum);
  CUDA_CHECK(cudaMemcpyAsync(host, impl_->dev_scratch, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  wait(stream_, what);
  return *host;
}

double Comm::average(double value, const char* what) {
  if (!distributed()) return value;
  return sum(value, what) / launch_.world_size;
}

std::vector<std::string> Comm::all_gather_text(const std::string& text, const char* what) {
  if (!distributed()) return {text};
  const size_t n = static_cast<size_t>(launch_.world_size);
  // 1. lengths
  ensure_scratch(n * sizeof(int64_t));
  int64_t* lens = static_cast<int64_t*>(impl_->host_scratch);
  lens[launch_.rank] = static_cast<int64_t>(text.size());
  int64_t* dev_lens = static_cast<int64_t*>(impl_->dev_scratch);
  CUDA_CHECK(cudaMemcpyAsync(dev_lens + launch_.rank, lens + launch_.rank, sizeof(int64_t), cudaMemcpyHostToDevice,
                             stream_));
  all_gather(dev_lens, 1, DType::I64);
  CUDA_CHECK(cudaMemcpyAsync(lens, dev_lens, n * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_));
  wait(stream_, what);
  std::vector<int64_t> lengths(lens, lens + n);
  const size_t slot = static_cast<size_t>(std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end())));
  // 2. the texts, one slot per rank
  ensure_scratch(n * slot);
  char* host = static_cast<char*>(impl_->host_scratch);
  char* dev = static_cast<char*>(impl_->dev_scratch);
  std::memset(host + size_t(launch_.rank) * slot, 0, slot);
  std::memcpy(host + size_t(launch_.rank) * slot, text.data(), text.size());
  CUDA_CHECK(cudaMemcpyAsync(dev + size_t(launch_.rank) * slot, host + size_t(launch_.rank) * slot, slot,
                             cudaMemcpyHostToDevice, stream_));
  all_gather(dev, slot, DType::U8);
  CUDA_CHECK(cudaMemcpyAsync(host, dev, n * slot, cudaMemcpyDeviceToHost, stream_));
  wait(stream_, what);
  std::vector<std::string> out(n);
  for (size_t r = 0; r < n; r++) out[r].assign(host + r * slot, static_cast<size_t>(lengths[r]));
  return out;
}

std::string Comm::broadcast_text(const std::string& text, const char* what) {
  if (!distributed()) return text;
  return all_gather_text(launch_.rank == 0 ? text : std::string(), what)[0];
}

void Comm::check_all_ok(const std::string& my_error, const char* stage) {
  if (!distributed()) {
    if (!my_error.empty()) throw Error(my_error);
    return;
  }
  // One 8-byte all-reduce in the common case (nobody failed); the messages are gathered only when someone did.
  if (sum(my_error.empty() ? 0.0 : 1.0, stage) == 0.0) return;
  const std::vector<std::string> errors = all_gather_text(my_error, stage);
  std::string failures;
  for (size_t r = 0; r < errors.size(); r++)
    if (!errors[r].empty())
      failures += (failures.empty() ? "" : "; ") + strformat("rank %zu failed while %s: %s", r, stage,
                                                             errors[r].c_str());
  if (failures.empty()) return;
  if (!my_error.empty()) throw Error(my_error);
  throw GroupError(failures);
}

}  // namespace llmc
