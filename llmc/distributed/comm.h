// llmc/distributed/comm.h: the process group of a data-parallel run (one process per GPU):
//   - the NCCL communicator, created non-blocking and polled with a deadline (parallel.timeout_s), aborted when it
//     does not finish, after the startup rendezvous (llmc/distributed/rendezvous.h) handed out its id;
//   - the communication stream and the collectives the trainer uses on it (all-reduce, reduce-scatter, all-gather,
//     point-to-point for gathers), the ordering helpers between the compute stream and the communication stream;
//   - host-side agreement points (barrier, check_all_ok, averages, text gathers), every one a wait with a deadline;
//   - the fatal-error path: an error seen by one rank at a check point stops every rank with a message naming it,
//     and a rank whose peer vanished gives up after parallel.timeout_s (NCCL abort) instead of waiting forever.
//
// World size 1 needs none of this: Comm then does nothing (no MPI, no NCCL, no stream) and every collective is the
// identity, so a single-GPU run behaves exactly as it did before data parallelism existed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "llmc/distributed/launch.h"

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// The process group

enum class DType { F32, F64, BF16, U8, I64 };
enum class ReduceOp { Sum, Max };

class Comm {
 public:
  // World size 1: nothing happens. Otherwise: picks and sets the CUDA device of the local rank, runs the rendezvous
  // (method from parallel.init) and creates the NCCL communicator and the communication stream, all within
  // parallel.timeout_s. Throws GroupError / llmc::Error naming the rank that failed or the peer that never came.
  Comm(const LaunchInfo& launch, const ParallelConfig& parallel);
  ~Comm();  // normal path: destroys the communicator (and finalises MPI); during an exception: aborts NCCL
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return launch_.rank; }
  int world_size() const { return launch_.world_size; }
  int local_rank() const { return launch_.local_rank; }
  bool is_root() const { return launch_.rank == 0; }
  bool distributed() const { return launch_.world_size > 1; }
  int device() const { return device_; }
  const std::string& method() const { return method_; }  // "none", "mpi", "tcp", "fs"
  const LaunchInfo& launch() const { return launch_; }
  double timeout_s() const { return timeout_s_; }
  cudaStream_t stream() const { return stream_; }  // the communication stream (nullptr for world size 1)

  // Ordering between a compute stream and the communication stream (no host synchronisation):
  void comm_waits_for(cudaStream_t compute);  // later work on stream() starts after the work queued on `compute`
  void waits_for_comm(cudaStream_t compute);  // later work on `compute` starts after the work queued on stream()

  // Collectives, queued on stream() (call comm_waits_for first when the inputs come from a compute stream).
  void all_reduce(void* buf, size_t count, DType type, ReduceOp op);  // in place
  // In place: buf holds world_size * count elements; rank r's reduced piece lands at buf + r * count.
  void reduce_scatter(void* buf, size_t count, DType type);
  // In place: buf holds world_size * count elements, rank r's piece at buf + r * count; afterwards every rank has all.
  void all_gather(void* buf, size_t count, DType type);
  void all_gather(const void* send, void* recv, size_t count, DType type);  // out of place
  // Point to point (for gathers to rank 0): inside group_start / group_end.
  void group_start();
  void group_end();
  void send(const void* buf, size_t count, DType type, int peer);
  void recv(void* buf, size_t count, DType type, int peer);

  // Delayed-scaling amax agreement for FP8 recipes (Model::set_amax_reducer): MAX over ranks in place, ordered after
  // the work queued on `s` and before the work queued on `s` later. The identity for world size 1.
  void all_reduce_max_after(float* amax, int count, cudaStream_t s);

  // Host-side waits, each with the deadline parallel.timeout_s; on timeout or an NCCL error the communicator is
  // aborted and llmc::Error names what was being waited for.
  void wait(cudaStream_t s, const char* what);  // the work queued so far on s
  void barrier(const char* what);
  double average(double value, const char* what);  // mean over ranks (the value itself for world size 1)
  double sum(double value, const char* what);
  // Every rank's text, in rank order (just {text} for world size 1).
  std::vector<std::string> all_gather_text(const std::string& text, const char* what);
  // Rank 0's text on every rank.
  std::string broadcast_text(const std::string& text, const char* what);
  // The check point: every rank passes its error ("" = ok). When any rank failed, every rank throws: the failed
  // ones their own message (llmc::Error), the others a GroupError "rank 2 failed while <stage>: <its message>".
  // Costs one 8-byte all-reduce when nobody failed.
  void check_all_ok(const std::string& my_error, const char* stage);

  // Aborts the NCCL communicator (pending collectives end) and arms a backstop that ends the process if it has not
  // exited within min(60, max(10, parallel.timeout_s)) seconds (a rank must never wait forever on a peer that is
  // gone); the backstop prints `reason` (the error being raised) so it is not lost. Idempotent.
  void abort(const std::string& reason = "");
  // A guard for the driver: declared after the objects that own GPU memory, its destructor aborts the communicator
  // when an exception unwinds past it, so that their cudaFree never waits for a collective no peer will finish.
  class AbortGuard {
   public:
    explicit AbortGuard(Comm& comm);
    ~AbortGuard();
    AbortGuard(const AbortGuard&) = delete;
    AbortGuard& operator=(const AbortGuard&) = delete;

   private:
    Comm& comm_;
    int exceptions_;
  };

 private:
  struct Impl;
  void nccl_wait(int result, const char* what);  // handles ncclInProgress of the non-blocking communicator
  void ensure_scratch(size_t bytes);
  cudaEvent_t next_event();

  LaunchInfo launch_;
  std::string method_ = "none";
  double timeout_s_ = 300;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Impl> impl_;
  bool aborted_ = false;
  bool mpi_initialised_here_ = false;
};

}  // namespace llmc
