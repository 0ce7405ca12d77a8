// llmc/distributed/rendezvous_fs.cpp: the rendezvous through a shared directory: rank 0 publishes a session, takes
// the hello files of that session that verify and writes the reply; the other ranks write their hello for the current
// session and take the reply that names their nonce (protocol in llmc/distributed/rendezvous.h).

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "llmc/core/file_io.h"
#include "llmc/distributed/hmac_sha256.h"
#include "llmc/distributed/rendezvous.h"
#include "llmc/distributed/rendezvous_protocol.h"

namespace fs = std::filesystem;

namespace llmc {

using namespace rdv;

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
  const IoResult written = write_fully(fd, text.data(), text.size());
  ::close(fd);
  if (!written.ok()) {
    ::unlink(tmp.c_str());
    throw_error("rendezvous: cannot write %s: %s", tmp.c_str(), written.what());
  }
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
      : spec_(spec), dir_(dir), job_(job_id), prefix_(fs_prefix(dir, job_id)), log_(spec),
        st_(spec.world_size, status) {}

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
      for (int r = 1; r < spec_.world_size && st_.fatal.empty(); r++)
        if (!st_.arrived[r]) look_at(r);
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
    if (!read_hello(path, &h, &text)) return;
    nonces_[r] = h.nonce;  // it hears the verdict, registered or refused
    if (h.rank != r) {
      st_.fatal = strformat("%s claims rank %d (check RANK)", path.c_str(), h.rank);
      return;
    }
    st_.admit(h, path);
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
  std::map<int, std::string> nonces_;  // the ranks of authenticated hellos: they hear the verdict
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
  if (std::string payload; rdv::alone(spec, status, root_payload, &payload)) return payload;
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

}  // namespace llmc
