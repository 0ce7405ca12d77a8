// llmc/core/file_io.cpp: the whole-transfer loops of llmc/core/file_io.h.
#include "llmc/core/file_io.h"

#include <errno.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace llmc {

namespace {

constexpr size_t kMaxCall = size_t(1) << 30;  // bytes per read / write call

// One loop for the three: call(done, len) transfers up to len bytes after the first `done` ones.
template <typename Call>
IoResult transfer(size_t n, bool write, Call call) {
  IoResult r;
  r.write = write;
  size_t done = 0;
  while (done < n) {
    const ssize_t got = call(done, std::min(n - done, kMaxCall));
    if (got > 0) {
      done += static_cast<size_t>(got);
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      if (got < 0)
        r.error = errno;
      else
        r.ended = true;
      break;
    }
  }
  return r;
}

}  // namespace

const char* IoResult::what() const {
  if (error != 0) return std::strerror(error);
  if (ended) return write ? "no byte written" : "end of file";
  return "no error";
}

IoResult read_fully(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  return transfer(n, false, [&](size_t done, size_t len) { return ::read(fd, p + done, len); });
}

IoResult pread_fully(int fd, void* buf, size_t n, uint64_t offset) {
  char* p = static_cast<char*>(buf);
  return transfer(n, false, [&](size_t done, size_t len) {
    return ::pread(fd, p + done, len, static_cast<off_t>(offset + done));
  });
}

IoResult write_fully(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  return transfer(n, true, [&](size_t done, size_t len) { return ::write(fd, p + done, len); });
}

}  // namespace llmc
