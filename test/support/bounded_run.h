// test/support/bounded_run.h: running a check whose failure mode was a resource blow-up (a hang on a FIFO, gigabytes
// allocated for a size read from a tiny file, a stack overflow on deep JSON) in a child process with a time limit
// (SIGALRM) and an address-space limit (RLIMIT_AS: the child's current mappings plus a margin, so it also works under
// AddressSanitizer, whose shadow memory is mapped before the limit is set). A hang, a crash or an allocation past the
// limit then fails the test instead of blocking or taking the machine down. Also: FIFOs for the "not a regular file"
// tests.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "llmc/core/common.h"

namespace llmc_test {

// How a bounded run ended.
struct BoundedResult {
  enum class End { LlmcError, Returned, OtherException, Killed } end = End::Killed;
  std::string message;  // the llmc::Error's (or other exception's) message
  int signal = 0;       // End::Killed: the signal (SIGALRM = the time limit)

  bool llmc_error() const { return end == End::LlmcError; }
  std::string describe() const {
    switch (end) {
      case End::LlmcError: return "llmc::Error: " + message;
      case End::Returned: return "returned without an error";
      case End::OtherException: return "another exception (e.g. std::bad_alloc): " + message;
      case End::Killed:
        return signal == SIGALRM ? "did not finish within the time limit (a hang?)"
                                 : "killed by signal " + std::to_string(signal) + " (a crash?)";
    }
    return "?";
  }
};

// The child's mapped address space in bytes (/proc/self/statm, first field in pages).
inline unsigned long long mapped_bytes() {
  unsigned long long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return pages * static_cast<unsigned long long>(::sysconf(_SC_PAGESIZE));
}

// Runs f in a forked child limited to `seconds` of wall time and `extra_bytes` of address space beyond what it has
// mapped at the start. f must not need other threads of the parent (there are none in these tests).
inline BoundedResult run_bounded(const std::function<void()>& f, unsigned seconds = 5,
                                 unsigned long long extra_bytes = 1ull << 30) {
  int fds[2];
  if (::pipe(fds) != 0) {
    ADD_FAILURE() << "pipe failed";
    return {};
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const unsigned long long limit = mapped_bytes() + extra_bytes;
    struct rlimit rl = {static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
    ::setrlimit(RLIMIT_AS, &rl);
    ::alarm(seconds);
    char code = 'R';
    std::string message;
    try {
      f();
    } catch (const llmc::Error& e) {
      code = 'E';
      message = e.what();
    } catch (const std::exception& e) {
      code = 'X';
      message = e.what();
    }
    std::string out = std::string(1, code) + message;
    const char* p = out.data();
    size_t left = out.size();
    while (left > 0) {
      const ssize_t n = ::write(fds[1], p, left);
      if (n <= 0) break;
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  BoundedResult r;
  if (WIFSIGNALED(status) || out.empty()) {
    r.end = BoundedResult::End::Killed;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return r;
  }
  r.message = out.substr(1);
  r.end = out[0] == 'E' ? BoundedResult::End::LlmcError
          : out[0] == 'X' ? BoundedResult::End::OtherException
                          : BoundedResult::End::Returned;
  return r;
}

// Expects f to end, within the bounds, in an llmc::Error whose message holds every one of `parts`.
inline void expect_bounded_error(const std::function<void()>& f, std::initializer_list<std::string> parts,
                                 unsigned seconds = 5, unsigned long long extra_bytes = 1ull << 30) {
  const BoundedResult r = run_bounded(f, seconds, extra_bytes);
  ASSERT_TRUE(r.llmc_error()) << r.describe();
  for (const std::string& p : parts) EXPECT_NE(r.message.find(p), std::string::npos) << "'" << p << "' not in: " << r.message;
}

// Creates a FIFO (named pipe) at path; nothing ever writes to it, so a reader that opens it for reading blocks.
inline void make_fifo(const std::string& path) { ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path; }

}  // namespace llmc_test
