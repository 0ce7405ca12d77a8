// llmc/comm: the process group of a data-parallel run (one process per GPU). This module owns
//   - what the launcher says about this process: mpirun (Open MPI), srun (Slurm) or torchrun-style variables
//     (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), checked for consistency (detect_launch);
//   - which GPU the process uses (its local rank: choose_device);
//   - the startup rendezvous: every rank reports its startup status (ok, or the error that stops it) and rank 0
//     hands out the NCCL unique id, over MPI, over TCP to rank 0 (MASTER_ADDR:MASTER_PORT) or through a shared
//     directory (parallel.fs_path); parallel.init = auto | mpi | tcp | fs | none picks the method;
//   - the NCCL communicator, created non-blocking and polled with a deadline (parallel.timeout_s), aborted when it
//     does not finish;
//   - the communication stream and the collectives the trainer uses on it (all-reduce, reduce-scatter, all-gather,
//     point-to-point for gathers), the ordering helpers between the compute stream and the communication stream;
//   - host-side agreement points (barrier, check_all_ok, averages, text gathers), every one a wait with a deadline;
//   - the fatal-error path: every rank prints "[rank R] error: ..." (error_prefix), an error seen by one rank at a
//     check point stops every rank with a message naming it, and a rank whose peer vanished gives up after
//     parallel.timeout_s (NCCL abort) instead of waiting forever.
//
// World size 1 needs none of this: Comm then does nothing (no MPI, no NCCL, no stream) and every collective is the
// identity, so a single-GPU run behaves exactly as it did before data parallelism existed.
//
// Rendezvous protocol (TCP; the fs variant exchanges the same JSON through files):
//   rank k > 0 connects to MASTER_ADDR:MASTER_PORT (retrying until the deadline) and sends
//     {"magic": "llm8-rendezvous", "version": 1, "rank": k, "world_size": N, "status": "" | "<error message>"}
//   rank 0 listens on MASTER_PORT, collects one hello per rank (rejecting disagreeing world sizes, ranks out of range,
//   duplicate ranks at once) and answers every rank with {"ok": true, "payload": "<hex>"} or
//   {"ok": false, "error": "..."}. Messages are a 4-byte little-endian length followed by the JSON text.
// fs: rank k writes <fs_path>/llm8-<job>.hello.<k> (with a random nonce), rank 0 answers in <fs_path>/llm8-<job>.reply
// (listing the nonces it answered, so a stale reply of an earlier job is never taken); every file is written to a
// temporary name and renamed. <job> is LLM8_JOB_ID, else SLURM_JOB_ID[.SLURM_STEP_ID]: the ranks of one job must share
// it and no two jobs may.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "llmc/common.h"
#include "llmc/config.h"

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// The launch: what the environment says about this process.

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;             // rank among the processes of this node: picks the GPU
  int local_world_size = 0;       // processes on this node; 0 = not known
  std::string launcher = "none";  // "none", "mpi" (OMPI_COMM_WORLD_*), "pmi" (PMI_*), "torchrun" (RANK/WORLD_SIZE),
                                  // "slurm" (SLURM_PROCID/SLURM_NTASKS)
  std::string master_addr;        // MASTER_ADDR ("" when unset)
  int master_port = 0;            // MASTER_PORT (0 when unset)
  std::string job_id;             // LLM8_JOB_ID, else SLURM_JOB_ID[.SLURM_STEP_ID] ("" when neither is set)
  std::string hostname;
};

// Looks up an environment variable (nullptr when unset); tests pass their own map.
using EnvLookup = std::function<const char*(const char*)>;
const char* process_env(const char* name);

// Reads the launcher's variables. A source counts when both its rank and size variables are set; the first of
// Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), PMI (PMI_RANK/SIZE, MPI_LOCALRANKID), torchrun
// (RANK/WORLD_SIZE/LOCAL_RANK) and Slurm (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID) wins. llmc::Error when a value is
// not a non-negative integer, the rank is out of range, the local rank is missing, a world size is set without its
// rank (WORLD_SIZE=2 but no RANK), or the MPI / PMI / torchrun variables that are set disagree with each other
// (Slurm's variables describe the allocation, which mpirun or torchrun may subdivide, so they are compared only when
// nothing else is set).
LaunchInfo detect_launch(const EnvLookup& env = process_env);

// The CUDA device of a process: its local rank, or 0 when the launcher made exactly one GPU visible to each process
// (CUDA_VISIBLE_DEVICES names one device while several processes share the node). llmc::Error naming the host and the
// counts when the local rank has no GPU of its own.
int choose_device(const LaunchInfo& launch, int visible_gpus, const char* cuda_visible_devices);

// Whether this build has MPI (LLM8_USE_MPI).
bool built_with_mpi();

// parallel.init resolved for this launch: "none" (one process), "mpi", "tcp" or "fs". auto = mpi when started by
// mpirun / a PMI launcher and built with MPI, else tcp when MASTER_ADDR and MASTER_PORT are set, else fs when
// parallel.fs_path is set. llmc::Error when the method cannot work here (e.g. tcp without MASTER_PORT).
std::string resolve_init_method(const std::string& init, const LaunchInfo& launch, const std::string& fs_path,
                                bool have_mpi);

// The parallel section for a rank whose config failed to load: read leniently from the config file and the
// parallel.* --set overrides (anything unreadable keeps its default), so that the rank can still join the
// rendezvous and tell the others why it stops.
ParallelConfig bootstrap_parallel_config(const std::string& config_path, const std::vector<std::string>& overrides);

// ------------------------------------------------------------------------------------------------------------------
// Errors and output

// An error every rank knows about (a check point or the rendezvous found that some rank failed): each rank prints it
// and exits; nobody needs to be killed.
struct GroupError : Error {
  using Error::Error;
};

// "[rank 3] " once set_error_rank was called with a world size above 1; "" otherwise. main() prints
// error_prefix() + "error: " + message.
void set_error_rank(int rank, int world_size);
std::string error_prefix();

// Runs f and returns its llmc::Error / std::exception message, or "" when it returned normally. For check points:
// every rank runs its part, then check_all_ok tells all of them whether anyone failed.
std::string capture_error(const std::function<void()>& f);

// Sends this process's stdout to /dev/null (rank > 0 prints nothing but errors; LLM8_ALL_RANKS_PRINT=1 keeps it).
void quiet_stdout_unless(bool keep);

// ------------------------------------------------------------------------------------------------------------------
// Rendezvous (CPU only; tested with several processes on one machine)

struct RendezvousSpec {
  int rank = 0;
  int world_size = 1;
  double timeout_s = 300;
};

// Every rank brings `status` ("" = ok, else its error message); rank 0 brings `root_payload` (bytes). Returns the
// payload on every rank. Throws GroupError when any rank reported an error ("rank 1 failed during startup: ..."),
// llmc::Error for a disagreement (world sizes, rank out of range, two processes with the same rank) or when a peer
// does not arrive within timeout_s (naming the missing ranks, or rank 0's address).
std::string tcp_rendezvous(const RendezvousSpec& spec, const std::string& master_addr, int master_port,
                           const std::string& status, const std::string& root_payload);
std::string fs_rendezvous(const RendezvousSpec& spec, const std::string& dir, const std::string& job_id,
                          const std::string& status, const std::string& root_payload);
// Removes rank 0's reply file once every rank is past the rendezvous (called after NCCL is up).
void fs_rendezvous_cleanup(const std::string& dir, const std::string& job_id);

// A rank that cannot run (its config did not load) still joins the rendezvous with its error so that every rank
// stops at once with a message naming it. Returns normally (the caller rethrows its own error). Best effort: any
// problem here (no peer, bad parallel settings) is swallowed, the launcher or the peers' timeout end the job.
void report_startup_failure(const LaunchInfo& launch, const ParallelConfig& parallel, const std::string& error);

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
