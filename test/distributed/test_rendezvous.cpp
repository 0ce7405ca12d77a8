// test/distributed/test_rendezvous: the startup rendezvous (llmc/distributed/rendezvous.h) against someone who is not a
// rank of the job: an impostor that reaches the port first and claims a rank, a forger with the wrong secret, a
// replayed hello, wrongly typed / malformed / truncated / oversize messages, slow senders, a flood of idle connections
// (with and without file descriptors to spare, rank 0's CPU time measured), stale and forged files in the shared
// directory; and what the job itself must get right: the protocol as documented (a hand-made rank with the secret
// gets in), a rank that reconnects, rank 0 reachable only at the job's address, the missing-secret error of a
// multi-host TCP job, secret settings that differ between ranks, and the secret never appearing in a log or an error.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "llmc/distributed/hmac_sha256.h"
#include "llmc/distributed/rendezvous.h"
#include "test/distributed/rendezvous_test_util.h"
#include "test/support/temp_dir.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using llmc_test::free_port;
using llmc_test::kPayload;
using llmc_test::run_ranks;
using llmc_test::specs_for;

namespace {

const std::string kSecret = "5f2d0c8e9a7b4c1d3e6f80a1b2c3d4e5f60718293a4b5c6d7e8f9001a2b3c4d5";
const std::string kOtherSecret = "0000000000000000000000000000000000000000000000000000000000000000";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The lines a rendezvous logs, collected from any thread.
class LogCapture {
 public:
  llmc::RendezvousLog sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(line);
    };
  }
  std::string all() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string s;
    for (const std::string& l : lines_) s += l + "\n";
    return s;
  }
  int count(const std::string& needle) const {
    std::lock_guard<std::mutex> lock(mutex_);
    int n = 0;
    for (const std::string& l : lines_) n += l.find(needle) != std::string::npos;
    return n;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

llmc::RendezvousSpec spec(int rank, int world, double timeout, const std::string& secret, LogCapture* log = nullptr) {
  llmc::RendezvousSpec s = specs_for(world, timeout, {rank}, secret)[0];
  static LogCapture discard;
  s.log = (log ? log : &discard)->sink();
  return s;
}

// "payload:<bytes>", "group:<message>" or "error:<message>".
std::string outcome(const std::function<std::string()>& f) {
  try {
    return "payload:" + f();
  } catch (const llmc::GroupError& e) {
    return std::string("group:") + e.what();
  } catch (const llmc::Error& e) {
    return std::string("error:") + e.what();
  }
}

std::string tcp(const llmc::RendezvousSpec& s, int port, const std::string& status = "") {
  return llmc::tcp_rendezvous(s, "127.0.0.1", port, status, s.rank == 0 ? kPayload : "");
}

// ----- the protocol as rendezvous.h documents it, built by hand

std::string framed(const std::string& text) {
  std::string out(4, '\0');
  const uint32_t n = static_cast<uint32_t>(text.size());
  for (int i = 0; i < 4; i++) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

std::string documented_mac(const std::string& key, const std::vector<std::string>& fields) {
  std::string input;
  auto encode = [&input](const std::string& f) { input += std::to_string(f.size()) + ":" + f + ","; };
  encode("llm8-rendezvous/2");
  for (const std::string& f : fields) encode(f);
  return llmc::to_hex(llmc::hmac_sha256(key, input));
}

json message(const char* kind) { return json{{"magic", "llm8-rendezvous"}, {"version", 2}, {"kind", kind}}; }

json hello_for(const std::string& challenge, const std::string& key, int rank, int world, const std::string& nonce,
               const std::string& status = "") {
  json h = message("hello");
  h["rank"] = rank;
  h["world_size"] = world;
  h["status"] = status;
  h["nonce"] = nonce;
  h["mac"] = documented_mac(key, {"hello", challenge, nonce, std::to_string(rank), std::to_string(world), status});
  return h;
}

// A raw TCP connection to 127.0.0.1:port (retrying the connect for up to 5 s).
class RawConn {
 public:
  explicit RawConn(int port) {
    const auto t0 = std::chrono::steady_clock::now();
    while (seconds_since(t0) < 5) {
      fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return;
      ::close(fd_);
      fd_ = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // An accepted connection (this side plays rank 0).
  struct Adopt {};
  RawConn(Adopt, int fd) : fd_(fd) {}
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  void send_bytes(const std::string& b) { ::send(fd_, b.data(), b.size(), MSG_NOSIGNAL); }
  void send_frame(const std::string& text) { send_bytes(framed(text)); }
  // The next framed message (raw = with its 4-byte header); nullopt when the peer closed or nothing came in time.
  std::optional<std::string> read_frame(double timeout_s, bool raw = false) {
    const auto t0 = std::chrono::steady_clock::now();
    while (seconds_since(t0) < timeout_s) {
      if (buf_.size() >= 4) {
        uint32_t n = 0;
        for (int i = 0; i < 4; i++) n |= uint32_t(static_cast<unsigned char>(buf_[i])) << (8 * i);
        if (buf_.size() >= 4 + size_t(n)) {
          std::string out = raw ? buf_.substr(0, 4 + n) : buf_.substr(4, n);
          buf_.erase(0, 4 + size_t(n));
          return out;
        }
      }
      if (!fill(100)) return std::nullopt;
    }
    return std::nullopt;
  }
  json read_json(double timeout_s) {
    const auto text = read_frame(timeout_s);
    return text ? json::parse(*text, nullptr, false) : json();
  }
  // Whether the peer closes the connection within timeout_s (what it sends meanwhile is dropped).
  bool closed_within(double timeout_s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (seconds_since(t0) < timeout_s)
      if (!fill(100)) return true;
    return false;
  }
  std::string received() const { return buf_; }

 private:
  // Reads what arrives within wait_ms; false when the peer closed.
  bool fill(int wait_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, wait_ms) <= 0) return true;
    char tmp[4096];
    const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buf_.append(tmp, size_t(n));
    return true;
  }
  int fd_ = -1;
  std::string buf_;
};

// Rank 0 in a thread of this process.
class RootThread {
 public:
  explicit RootThread(const llmc::RendezvousSpec& s, int port) : spec_(s) {
    thread_ = std::thread([this, port] { out_ = outcome([&] { return tcp(spec_, port); }); });
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // listening
  }
  std::string join() {
    if (thread_.joinable()) thread_.join();
    return out_;
  }
  ~RootThread() { join(); }

 private:
  llmc::RendezvousSpec spec_;
  std::thread thread_;
  std::string out_;
};

const std::string kNonce = "0123456789abcdef0123456789abcdef";

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// TCP: who gets in

TEST(TcpRendezvousAuth, DocumentedProtocolWithTheSecretGetsIn) {
  // A rank built by hand from the header comment of rendezvous.h: challenge, hello, accepted, verdict, every MAC.
  const int port = free_port();
  LogCapture log;
  RootThread root(spec(0, 2, 20, kSecret, &log), port);
  RawConn c(port);
  ASSERT_TRUE(c.ok());
  const json ch = c.read_json(5);
  ASSERT_EQ(ch.value("kind", ""), "challenge") << ch.dump();
  EXPECT_EQ(ch.value("auth", false), true);
  const std::string challenge = ch.value("challenge", "");
  ASSERT_EQ(challenge.size(), 32u);
  c.send_frame(hello_for(challenge, kSecret, 1, 2, kNonce).dump());
  const json ack = c.read_json(5);
  ASSERT_EQ(ack.value("kind", ""), "accepted") << ack.dump();
  EXPECT_EQ(ack.value("mac", ""), documented_mac(kSecret, {"accepted", challenge, kNonce, "1"}));
  const json verdict = c.read_json(5);
  ASSERT_EQ(verdict.value("kind", ""), "verdict") << verdict.dump();
  EXPECT_TRUE(verdict.value("ok", false));
  EXPECT_EQ(verdict.value("payload", ""), llmc::to_hex(kPayload));
  EXPECT_EQ(verdict.value("mac", ""), documented_mac(kSecret, {"verdict", challenge, kNonce, "1", "1",
                                                               llmc::to_hex(kPayload), "0"}));
  EXPECT_EQ(root.join(), "payload:" + kPayload);
  EXPECT_EQ(log.count("ignored"), 0) << log.all();
}

TEST(TcpRendezvousAuth, ImpostorThatConnectsFirstIsIgnored) {
  const int port = free_port();
  LogCapture log;
  RootThread root(spec(0, 2, 20, kSecret, &log), port);
  // First at the port, claiming rank 1 without the secret: a MAC under the empty key (what a rank without a secret
  // computes), under a guess, and none at all.
  for (const std::optional<std::string> key : {std::optional<std::string>(""), std::optional<std::string>("guess"),
                                               std::optional<std::string>()}) {
    RawConn impostor(port);
    ASSERT_TRUE(impostor.ok());
    const json ch = impostor.read_json(5);
    ASSERT_EQ(ch.value("kind", ""), "challenge");
    json h = hello_for(ch.value("challenge", ""), key.value_or(""), 1, 2, kNonce);
    if (!key) h.erase("mac");
    impostor.send_frame(h.dump());
    const json answer = impostor.read_json(5);
    EXPECT_EQ(answer.value("kind", ""), "rejected") << answer.dump();
    EXPECT_NE(answer.value("error", "").find(key ? "its HMAC does not verify" : "field 'mac' is missing"),
              std::string::npos) << answer.dump();
    EXPECT_TRUE(impostor.closed_within(5));
    EXPECT_EQ(impostor.received().find(llmc::to_hex(kPayload)), std::string::npos);
  }
  // The real rank 1 comes later and gets in.
  const std::string out1 = outcome([&] { return tcp(spec(1, 2, 20, kSecret), port); });
  EXPECT_EQ(out1, "payload:" + kPayload);
  EXPECT_EQ(root.join(), "payload:" + kPayload);
  EXPECT_EQ(log.count("ignored a connection from 127.0.0.1:"), 3) << log.all();
}

TEST(TcpRendezvousAuth, ForgerWithAnotherSecretIsIgnored) {
  const int port = free_port();
  LogCapture log;
  RootThread root(spec(0, 2, 20, kSecret, &log), port);
  // A hand-made hello with a well-formed MAC under the wrong key ...
  {
    RawConn forger(port);
    const json ch = forger.read_json(5);
    forger.send_frame(hello_for(ch.value("challenge", ""), kOtherSecret, 1, 2, kNonce).dump());
    EXPECT_EQ(forger.read_json(5).value("kind", ""), "rejected");
    EXPECT_TRUE(forger.closed_within(5));
  }
  // ... and a real rank started with another secret: it stops at once, saying why; rank 0 carries on.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string forged = outcome([&] { return tcp(spec(1, 2, 20, kOtherSecret), port); });
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_NE(forged.find("error:rank 0 at 127.0.0.1:" + std::to_string(port) + " rejected this rank: rank 0 ignored "
                        "this hello: its HMAC does not verify: not a rank of this job, or another LLM8_RDV_SECRET"),
            std::string::npos) << forged;
  const std::string out1 = outcome([&] { return tcp(spec(1, 2, 20, kSecret), port); });
  EXPECT_EQ(out1, "payload:" + kPayload);
  EXPECT_EQ(root.join(), "payload:" + kPayload);
  EXPECT_EQ(log.count("its HMAC does not verify"), 2) << log.all();
  // Neither secret appears anywhere.
  for (const std::string& text : {log.all(), forged})
    for (const std::string& secret : {kSecret, kOtherSecret}) EXPECT_EQ(text.find(secret), std::string::npos) << text;
}

TEST(TcpRendezvousAuth, ReplayedHelloIsRejected) {
  // Capture a genuine hello of rank 1: a fake rank 0 hands it a challenge.
  const int fake_port = free_port();
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(fake_port));
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  std::string victim_out;
  std::thread victim([&] { victim_out = outcome([&] { return tcp(spec(1, 2, 1.5, kSecret), fake_port); }); });
  pollfd p{lfd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  const std::string old_challenge = "00000000000000000000000000000001";
  std::string captured;
  {
    RawConn fake_root(RawConn::Adopt{}, ::accept(lfd, nullptr, nullptr));
    json ch = message("challenge");
    ch["challenge"] = old_challenge;
    ch["auth"] = true;
    fake_root.send_frame(ch.dump());
    captured = fake_root.read_frame(5, /*raw=*/true).value_or("");
  }
  ::close(lfd);
  victim.join();
  EXPECT_NE(victim_out.find("error:"), std::string::npos) << victim_out;  // it never met the real rank 0
  ASSERT_GT(captured.size(), 4u);
  const json hello = json::parse(captured.substr(4), nullptr, false);
  ASSERT_EQ(hello.value("kind", ""), "hello") << captured;
  // It was valid for the challenge it answered.
  EXPECT_EQ(hello.value("mac", ""), documented_mac(kSecret, {"hello", old_challenge, hello.value("nonce", ""), "1",
                                                             "2", ""}));

  // Replayed to the real rank 0 (which challenges every connection anew): rejected.
  const int port = free_port();
  LogCapture log;
  RootThread root(spec(0, 2, 20, kSecret, &log), port);
  {
    RawConn attacker(port);
    ASSERT_EQ(attacker.read_json(5).value("kind", ""), "challenge");
    attacker.send_bytes(captured);
    const json answer = attacker.read_json(5);
    EXPECT_EQ(answer.value("kind", ""), "rejected") << answer.dump();
    EXPECT_NE(answer.value("error", "").find("its HMAC does not verify"), std::string::npos) << answer.dump();
    EXPECT_TRUE(attacker.closed_within(5));
    EXPECT_EQ(attacker.received().find(llmc::to_hex(kPayload)), std::string::npos);
  }
  EXPECT_EQ(outcome([&] { return tcp(spec(1, 2, 20, kSecret), port); }), "payload:" + kPayload);
  EXPECT_EQ(root.join(), "payload:" + kPayload);
  EXPECT_EQ(log.count("its HMAC does not verify"), 1) << log.all();
}

TEST(TcpRendezvousAuth, RankThatReconnectsKeepsItsPlace) {
  // A rank whose connection broke after it was accepted comes back with the same nonce: not a second process.
  LogCapture log;
  const int port2 = free_port();
  RootThread root3(spec(0, 3, 20, kSecret, &log), port2);
  {
    RawConn first(port2);
    const json ch = first.read_json(5);
    first.send_frame(hello_for(ch.value("challenge", ""), kSecret, 1, 3, kNonce).dump());
    ASSERT_EQ(first.read_json(5).value("kind", ""), "accepted");
  }  // broken
  RawConn again(port2);
  const json ch = again.read_json(5);
  again.send_frame(hello_for(ch.value("challenge", ""), kSecret, 1, 3, kNonce).dump());
  ASSERT_EQ(again.read_json(5).value("kind", ""), "accepted");
  EXPECT_EQ(outcome([&] { return tcp(spec(2, 3, 20, kSecret), port2); }), "payload:" + kPayload);
  const json verdict = again.read_json(5);
  EXPECT_TRUE(verdict.value("ok", false)) << verdict.dump();
  EXPECT_EQ(root3.join(), "payload:" + kPayload);
}

// ------------------------------------------------------------------------------------------------------------------
// TCP: what rank 0 survives

TEST(TcpRendezvousAuth, MalformedMessagesAreIgnored) {
  const int port = free_port();
  LogCapture log;
  RootThread root(spec(0, 2, 30, kSecret, &log), port);
  const json base = hello_for(std::string(32, '0'), "", 1, 2, kNonce);
  auto with = [&](const char* key, const json& value) {
    json h = base;
    h[key] = value;
    return h.dump();
  };
  auto without = [&](const char* key) {
    json h = base;
    h.erase(key);
    return h.dump();
  };
  const std::string deep =
      R"({"magic": "llm8-rendezvous", "x": )" + std::string(3000, '[') + std::string(3000, ']') + "}";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hello world", "not JSON"},
      {"", "not JSON"},
      {"{\"magic\": \"\xff\xfe\"}", "not JSON"},
      {"[1, 2, 3]", "not a JSON object"},
      {"null", "not a JSON object"},
      {"{}", "not an llm8 rendezvous message"},
      {R"({"magic": 5})", "not an llm8 rendezvous message"},
      {deep, "nested too deeply"},
      {with("version", "2"), "field 'version' is not an integer"},
      {with("version", 1), "rendezvous protocol version 1, this build speaks version 2"},
      {with("kind", "verdict"), "a 'verdict' message where a 'hello' was due"},
      {with("kind", 7), "field 'kind' is not a string"},
      {with("rank", "1"), "field 'rank' is not an integer"},
      {with("rank", 1.5), "field 'rank' is not an integer"},
      {with("rank", 1e300), "field 'rank' is not an integer"},
      {with("rank", json::parse("99999999999999999999999")), "field 'rank' is not an integer"},
      {with("rank", 4294967297LL), "field 'rank' is out of range"},
      {with("rank", json::array({1})), "field 'rank' is not an integer"},
      {without("rank"), "field 'rank' is missing"},
      {with("world_size", nullptr), "field 'world_size' is not an integer"},
      {with("status", 5), "field 'status' is not a string"},
      {with("status", json{{"a", 1}}), "field 'status' is not a string"},
      {with("status", std::string(5000, 'x')), "field 'status' has 5000 bytes, more than 4000"},
      {with("nonce", "xyz"), "field 'nonce' is not 32 lowercase hex digits"},
      {with("nonce", "0123456789ABCDEF0123456789ABCDEF"), "field 'nonce' is not 32 lowercase hex digits"},
      {without("mac"), "field 'mac' is missing"},
      {with("mac", 12), "field 'mac' is not a string"},
      {with("mac", std::string(63, 'a')), "field 'mac' is not 64 lowercase hex digits"},
      {with("rank", -5), "its HMAC does not verify"},  // well-typed, so only the MAC stops it
  };
  for (const auto& [text, reason] : cases) {
    RawConn c(port);
    ASSERT_EQ(c.read_json(5).value("kind", ""), "challenge");
    c.send_frame(text);
    const json answer = c.read_json(5);
    EXPECT_EQ(answer.value("kind", ""), "rejected") << reason;
    EXPECT_NE(answer.value("error", "").find(reason), std::string::npos) << answer.dump() << " for " << reason;
    EXPECT_TRUE(c.closed_within(5)) << reason;
  }
  // Frames that never complete, or announce more than a hello may hold.
  {
    RawConn c(port);
    ASSERT_EQ(c.read_json(5).value("kind", ""), "challenge");
    c.send_bytes(std::string("\xff\xff\xff\xff", 4));
    const json answer = c.read_json(5);
    EXPECT_NE(answer.value("error", "").find("a message of more than 16384 bytes"), std::string::npos) << answer;
    EXPECT_TRUE(c.closed_within(5));
  }
  {
    RawConn c(port);
    c.send_bytes(framed(std::string(100, '{')).substr(0, 14));  // truncated, then gone
  }
  {
    RawConn c(port);
    c.send_bytes(std::string("\x05", 1));  // half a length
  }
  { RawConn c(port); }  // connects and leaves
  const std::string out1 = outcome([&] { return tcp(spec(1, 2, 20, kSecret), port); });
  EXPECT_EQ(out1, "payload:" + kPayload);
  EXPECT_EQ(root.join(), "payload:" + kPayload);
  const int total = static_cast<int>(cases.size()) + 4;
  // Each logged (the first 16 one by one, then counted) and counted.
  EXPECT_EQ(log.count("ignored a connection from 127.0.0.1:"), 16) << log.all();
  EXPECT_EQ(log.count(std::to_string(total) + " connections were ignored in all"), 1) << log.all();
}

TEST(TcpRendezvousAuth, SlowSendersAreClosedAfterTheirDeadline) {
  const int port = free_port();
  LogCapture log;
  llmc::RendezvousSpec s0 = spec(0, 3, 30, kSecret, &log);
  s0.stranger_timeout_s = 1.0;
  RootThread root(s0, port);
  RawConn silent(port), two_bytes(port), half_hello(port);
  two_bytes.send_bytes(std::string("\x40\x00", 2));
  half_hello.send_bytes(framed(std::string(200, ' ')).substr(0, 54));
  const auto t0 = std::chrono::steady_clock::now();
  for (RawConn* c : {&silent, &two_bytes, &half_hello}) EXPECT_TRUE(c->closed_within(5));
  const double closed_after = seconds_since(t0);
  EXPECT_GT(closed_after, 0.7);
  EXPECT_LT(closed_after, 3.0);
  // The real ranks, later, get in.
  auto out = run_ranks({spec(1, 3, 20, kSecret), spec(2, 3, 20, kSecret)}, {"", ""},
                       [port](const llmc::RendezvousSpec& s, const std::string&) { return tcp(s, port); });
  for (const std::string& o : out) EXPECT_EQ(o, "payload:" + kPayload);
  EXPECT_EQ(root.join(), "payload:" + kPayload);
  EXPECT_EQ(log.count("no complete hello within 1 s"), 3) << log.all();
}

namespace {

// Rank 0 in a child process (with only a few file descriptors when asked), a flood of idle connections from this
// process, then the real rank 1: it must get in long before the strangers' own deadline (10 s), and rank 0 must
// sleep in poll meanwhile (its CPU time a small part of its wall time).
void flood(int connections, bool few_descriptors) {
  const int port = free_port();
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipefd[0]);
    if (few_descriptors) {  // room for about 20 connections: fewer than kRendezvousMaxStrangers
      int open_fds = 0;
      for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) open_fds++;
      const rlimit rl{rlim_t(open_fds + 24), rlim_t(open_fds + 24)};
      ::setrlimit(RLIMIT_NOFILE, &rl);
    }
    llmc::RendezvousSpec s0 = spec(0, 2, 30, kSecret);
    const auto t0 = std::chrono::steady_clock::now();
    int rc = 3;
    try {
      rc = tcp(s0, port) == kPayload ? 0 : 2;
    } catch (...) {
      rc = 1;
    }
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    const double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    const std::string report = std::to_string(cpu) + " " + std::to_string(seconds_since(t0));
    [[maybe_unused]] const ssize_t w = ::write(pipefd[1], report.data(), report.size());
    ::_exit(rc);
  }
  ::close(pipefd[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<int> idle;
  for (int i = 0; i < connections; i++) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // rank 0 alone with the flood
  const auto t0 = std::chrono::steady_clock::now();
  const std::string out1 = outcome([&] { return tcp(spec(1, 2, 30, kSecret), port); });
  const double joined_after = seconds_since(t0);
  for (const int fd : idle) ::close(fd);
  int status = 0;
  ::waitpid(child, &status, 0);
  char report[128] = {0};
  [[maybe_unused]] const ssize_t r = ::read(pipefd[0], report, sizeof(report) - 1);
  ::close(pipefd[0]);
  double cpu = -1, wall = -1;
  std::sscanf(report, "%lf %lf", &cpu, &wall);
  EXPECT_EQ(out1, "payload:" + kPayload);
  EXPECT_LT(joined_after, 8.0) << "rank 1 got in only when the strangers timed out";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank 0 exit status " << status;
  EXPECT_GT(wall, 1.5);
  EXPECT_LT(cpu, 0.2 * wall) << "rank 0 used " << cpu << " s of CPU in " << wall << " s: it spins";
}

}  // namespace

TEST(TcpRendezvousAuth, FloodOfIdleConnections) { flood(3 * llmc::kRendezvousMaxStrangers, false); }

TEST(TcpRendezvousAuth, FloodWhileOutOfFileDescriptors) { flood(80, true); }

// ------------------------------------------------------------------------------------------------------------------
// TCP: the secret itself

TEST(TcpRendezvousAuth, MultiHostJobWithoutSecretIsRefused) {
  const int port = free_port();
  for (int rank : {0, 1}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string out = outcome([&] {
      return llmc::tcp_rendezvous(spec(rank, 2, 20, ""), "192.0.2.1", port, "", rank == 0 ? kPayload : "");
    });
    EXPECT_LT(seconds_since(t0), 2.0);
    EXPECT_NE(out.find("error:MASTER_ADDR=192.0.2.1 is not a loopback address, so the ranks may run on several hosts "
                       "and the TCP rendezvous must be authenticated: set LLM8_RDV_SECRET to the same random value on "
                       "every rank"), std::string::npos) << out;
    EXPECT_NE(out.find("/dev/urandom"), std::string::npos) << out;
  }
  // With the secret, rank 0 binds the address the job uses, which is not one of this host's.
  const std::string out = outcome([&] { return llmc::tcp_rendezvous(spec(0, 2, 20, kSecret), "192.0.2.1", port, "",
                                                                    kPayload); });
  EXPECT_NE(out.find("rank 0 cannot listen on MASTER_ADDR=192.0.2.1 MASTER_PORT=" + std::to_string(port)),
            std::string::npos) << out;
}

TEST(TcpRendezvousAuth, ListensOnlyOnTheAddressOfTheJob) {
  // A loopback MASTER_ADDR: the port is closed on this host's other addresses.
  std::string other;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i && other.empty(); i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
        const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
        if ((ntohl(a->sin_addr.s_addr) >> 24) != 127) {
          char text[INET_ADDRSTRLEN] = {0};
          ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
          other = text;
        }
      }
    ::freeifaddrs(ifs);
  }
  if (other.empty()) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  const int port = free_port();
  RootThread root(spec(0, 2, 20, kSecret), port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, other.c_str(), &addr.sin_addr);
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << "rank 0 answers on " << other;
  ::close(fd);
  EXPECT_EQ(outcome([&] { return tcp(spec(1, 2, 20, kSecret), port); }), "payload:" + kPayload);
  EXPECT_EQ(root.join(), "payload:" + kPayload);
}

TEST(TcpRendezvousAuth, LoopbackWithoutSecretIsUnauthenticatedAndSaysSo) {
  const int port = free_port();
  LogCapture log;
  auto out = run_ranks({spec(0, 2, 20, "", &log), spec(1, 2, 20, "", &log)}, {"", ""},
                       [port](const llmc::RendezvousSpec& s, const std::string&) { return tcp(s, port); });
  for (const std::string& o : out) EXPECT_EQ(o, "payload:" + kPayload);
  EXPECT_EQ(log.count("LLM8_RDV_SECRET is not set: the rendezvous on port " + std::to_string(port) +
                      " is not authenticated (any process of this host could join it); rank 0 listens on the "
                      "loopback address(es) 127.0.0.1 only"), 1) << log.all();
}

TEST(TcpRendezvousAuth, SecretSettingsThatDifferStopAtOnce) {
  for (const bool root_has_secret : {true, false}) {
    const int port = free_port();
    RootThread root(spec(0, 2, 1.5, root_has_secret ? kSecret : ""), port);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string out1 = outcome([&] { return tcp(spec(1, 2, 20, root_has_secret ? "" : kSecret), port); });
    EXPECT_LT(seconds_since(t0), 2.0);
    EXPECT_NE(out1.find(root_has_secret ? "has LLM8_RDV_SECRET but this rank does not: every rank needs the same "
                                          "LLM8_RDV_SECRET"
                                        : "does not have LLM8_RDV_SECRET but this rank has one"),
              std::string::npos) << out1;
    EXPECT_NE(root.join().find("rank(s) 1 did not join"), std::string::npos);
  }
}

TEST(TcpRendezvousAuth, LoopbackAddresses) {
  EXPECT_TRUE(llmc::is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(llmc::is_loopback_address("127.3.2.1"));
  EXPECT_TRUE(llmc::is_loopback_address("::1"));
  EXPECT_TRUE(llmc::is_loopback_address("localhost"));
  EXPECT_FALSE(llmc::is_loopback_address("192.0.2.1"));
  EXPECT_FALSE(llmc::is_loopback_address("10.1.2.3"));
  EXPECT_FALSE(llmc::is_loopback_address("::ffff:10.1.2.3"));
  EXPECT_FALSE(llmc::is_loopback_address(""));
}

// ------------------------------------------------------------------------------------------------------------------
// Shared directory

class FsRendezvousAuth : public llmc_test::TempDirTest {
 protected:
  void write(const std::string& name, const std::string& text) {
    std::ofstream f(path(name), std::ios::binary);
    f << text;
  }
  llmc_test::RankFn fs_with(const std::string& job) {
    return [this, job](const llmc::RendezvousSpec& s, const std::string& status) {
      return llmc::fs_rendezvous(s, dir_, job, status, s.rank == 0 ? kPayload : "");
    };
  }
  // A hello of rank 1 for `session`, valid under `key` (the documented fields).
  static std::string fs_hello(const std::string& job, const std::string& session, const std::string& key) {
    json h = message("hello");
    h["rank"] = 1;
    h["world_size"] = 2;
    h["status"] = "";
    h["session"] = session;
    h["nonce"] = kNonce;
    h["mac"] = documented_mac(key, {"fs-hello", job, session, kNonce, "1", "2", ""});
    return h.dump();
  }
};

TEST_F(FsRendezvousAuth, StaleHelloFilesOfAnEarlierRunAreIgnored) {
  const std::string old_session = "00000000000000000000000000000042";
  const std::vector<std::string> stale = {
      R"({"magic": "llm8-rendezvous", "version": 1, "rank": 1, "world_size": 2, "status": "", "nonce": "x"})",
      fs_hello("job", old_session, kSecret),  // a complete, valid hello: of another session
      R"({"magic": "llm8-rendezvous", "version": 2, "kind": "hello", "rank": "1"})",
  };
  for (const std::string& text : stale) {
    LogCapture log;
    write("llm8-job.hello.1", text);
    write("llm8-job.hello.7", text);  // a rank beyond the world: not a disagreement either
    const std::string out = outcome([&] { return llmc::fs_rendezvous(spec(0, 2, 1.0, kSecret, &log), dir_, "job", "",
                                                                     kPayload); });
    EXPECT_NE(out.find("error:rank(s) 1 did not join the rendezvous"), std::string::npos) << out;
    EXPECT_EQ(log.count("ignored " + path("llm8-job.hello.1")), 1) << log.all();
    EXPECT_EQ(log.count("ignored " + path("llm8-job.hello.7")), 1) << log.all();
  }
  fs::remove(path("llm8-job.hello.7"));
  write("llm8-job.hello.1", stale[1]);
  const std::string timeout = outcome([&] { return llmc::fs_rendezvous(spec(0, 2, 0.5, kSecret), dir_, "job", "",
                                                                       kPayload); });
  EXPECT_NE(timeout.find("written for another rendezvous session"), std::string::npos) << timeout;
  // With the stale files (and a stale session file) still there, the real rank 1 gets in, starting first or last.
  for (const std::vector<int>& order : {std::vector<int>{1, 0}, std::vector<int>{0, 1}}) {
    write("llm8-job.hello.1", stale[1]);
    json old = message("session");
    old["session"] = old_session;
    old["auth"] = true;
    old["mac"] = documented_mac(kSecret, {"session", "job", old_session});
    write("llm8-job.session", old.dump());
    std::vector<llmc::RendezvousSpec> specs;
    for (int r : order) specs.push_back(spec(r, 2, 20, kSecret));
    auto out = run_ranks(specs, {"", ""}, fs_with("job"));
    for (const std::string& o : out) EXPECT_EQ(o, "payload:" + kPayload);
  }
}

TEST_F(FsRendezvousAuth, WrongSecretAndForgedFilesAreIgnored) {
  // A rank with another secret: rank 0 ignores its hello, the rank ignores rank 0's session; both time out saying so.
  LogCapture log0, log1;
  auto out = run_ranks({spec(0, 2, 1.0, kSecret, &log0), spec(1, 2, 1.0, kOtherSecret, &log1)}, {"", ""},
                       fs_with("job"));
  EXPECT_NE(out[0].find("rank(s) 1 did not join"), std::string::npos) << out[0];
  EXPECT_NE(out[1].find("rank 0 did not answer through"), std::string::npos) << out[1];
  EXPECT_NE(out[1].find("its HMAC does not verify"), std::string::npos) << out[1];
  // A forged reply and a forged session file (no secret to sign them) are not taken.
  json reply = message("reply");
  reply["session"] = kNonce;
  reply["ok"] = true;
  reply["payload"] = llmc::to_hex("forged");
  reply["startup_failure"] = false;
  write("llm8-forged.reply", reply.dump());
  json session = message("session");
  session["session"] = kNonce;
  session["auth"] = true;
  session["mac"] = std::string(64, 'f');
  write("llm8-forged.session", session.dump());
  LogCapture log2;
  const std::string o1 =
      outcome([&] { return llmc::fs_rendezvous(spec(1, 2, 0.5, kSecret, &log2), dir_, "forged", "", ""); });
  EXPECT_NE(o1.find("error:rank 0 did not answer"), std::string::npos) << o1;
  EXPECT_EQ(log2.count("its HMAC does not verify"), 1) << log2.all();
  for (const std::string& text : {out[0], out[1], o1, log0.all(), log1.all(), log2.all()})
    for (const std::string& secret : {kSecret, kOtherSecret}) EXPECT_EQ(text.find(secret), std::string::npos);
}

TEST_F(FsRendezvousAuth, MalformedAndUnusableFilesAreIgnored) {
  const std::vector<std::string> bad = {
      "", "not json", "[]", std::string(20000, ' ') + "{}",
      R"({"magic": "llm8-rendezvous", "version": 2, "kind": "hello", "rank": 1, "world_size": "2"})",
      R"({"magic": "llm8-rendezvous", "version": 2, "kind": "hello", "rank": 1.0, "world_size": 2})",
      "{\"a\":" + std::string(2000, '[') + std::string(2000, ']') + "}",
  };
  for (const std::string& text : bad) {
    write("llm8-bad.hello.1", text);
    LogCapture log;
    const std::string out =
        outcome([&] { return llmc::fs_rendezvous(spec(0, 2, 0.3, kSecret, &log), dir_, "bad", "", kPayload); });
    EXPECT_NE(out.find("error:rank(s) 1 did not join"), std::string::npos) << out;
    EXPECT_EQ(log.count("ignored " + path("llm8-bad.hello.1")), 1) << log.all();
  }
  // A FIFO where a hello belongs: refused without blocking.
  fs::remove(path("llm8-bad.hello.1"));
  ASSERT_EQ(::mkfifo(path("llm8-bad.hello.1").c_str(), 0600), 0);
  LogCapture log;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string out =
      outcome([&] { return llmc::fs_rendezvous(spec(0, 2, 0.3, kSecret, &log), dir_, "bad", "", kPayload); });
  EXPECT_LT(seconds_since(t0), 3.0);
  EXPECT_EQ(log.count("not a regular file"), 1) << log.all();
}

TEST_F(FsRendezvousAuth, FilesArePrivateAndCleanedUp) {
  auto out = run_ranks(specs_for(2, 20, {}, kSecret), {"", ""}, fs_with("job"));
  for (const std::string& o : out) EXPECT_EQ(o, "payload:" + kPayload);
  for (const char* name : {"llm8-job.session", "llm8-job.reply"}) {
    ASSERT_TRUE(fs::exists(path(name))) << name;
    EXPECT_EQ(fs::status(path(name)).permissions() & (fs::perms::group_all | fs::perms::others_all), fs::perms::none)
        << name;
    std::ifstream f(path(name));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.find(kSecret), std::string::npos);
  }
  llmc::fs_rendezvous_cleanup(dir_, "job");
  EXPECT_TRUE(fs::is_empty(dir_));
}
