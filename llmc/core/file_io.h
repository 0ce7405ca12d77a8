// llmc/core/file_io.h: whole transfers on POSIX file descriptors: read or write exactly n bytes (at the file position
// or at an offset), retrying interrupted and short calls, in calls of at most 1 GiB. Every reader and writer of the
// project (checkpoints, safetensors, shards, llm.c files, configs, the rendezvous files, /dev/urandom) loops here once
// and words its own error from the result. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llmc {

// How a whole transfer ended.
struct IoResult {
  int error = 0;       // errno of the call that failed, 0 if none did
  bool ended = false;  // a read met the end of the file, or a write wrote nothing, before the n bytes
  bool write = false;  // the transfer was a write
  bool ok() const { return error == 0 && !ended; }
  const char* what() const;  // strerror(error), "end of file" (a read) or "no byte written" (a write)
};

IoResult read_fully(int fd, void* buf, size_t n);                     // from the file position
IoResult pread_fully(int fd, void* buf, size_t n, uint64_t offset);   // from offset (the position is unchanged)
IoResult write_fully(int fd, const void* buf, size_t n);              // at the file position

}  // namespace llmc
