// llmc/distributed/launch.h: what the launcher says about this process (mpirun, srun or torchrun-style variables,
// checked for consistency: detect_launch), which GPU it uses (choose_device), how its ranks will meet
// (resolve_init_method over parallel.init), and the per-process error output of a data-parallel run (the
// "[rank R] " prefix, check-point error capture, quiet stdout on ranks > 0).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "llmc/core/common.h"

namespace llmc {

// The parallel section of a run config (run/config.h holds it; the schema there documents every key).
struct ParallelConfig {
  std::string init = "auto";      // auto | mpi | tcp | fs | none
  int zero_stage = 1;             // 0 = replicate optimizer state, 1 = shard it (ZeRO-1)
  std::string fs_path = "";       // shared directory for the fs init method
  int timeout_s = 300;            // how long to wait for peers before failing
};

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
  std::string rendezvous_secret;  // LLM8_RDV_SECRET ("" when unset): the key that authenticates the tcp / fs
                                  // rendezvous (llmc/distributed/rendezvous.h); never printed
};

// The environment variable of the rendezvous secret, its minimum length, and how to set it (for error messages).
constexpr const char* kRendezvousSecretVar = "LLM8_RDV_SECRET";
constexpr size_t kRendezvousSecretMinChars = 32;
std::string rendezvous_secret_hint();

// Looks up an environment variable (nullptr when unset); tests pass their own map.
using EnvLookup = std::function<const char*(const char*)>;
const char* process_env(const char* name);

// Reads the launcher's variables. A source counts when both its rank and size variables are set; the first of
// Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), PMI (PMI_RANK/SIZE, MPI_LOCALRANKID), torchrun
// (RANK/WORLD_SIZE/LOCAL_RANK) and Slurm (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID) wins. llmc::Error when a value is
// not a non-negative integer, the rank is out of range, the local rank is missing, a world size is set without its
// rank (WORLD_SIZE=2 but no RANK), or the MPI / PMI / torchrun variables that are set disagree with each other
// (Slurm's variables describe the allocation, which mpirun or torchrun may subdivide, so they are compared only when
// nothing else is set). LLM8_RDV_SECRET, when set, must have at least kRendezvousSecretMinChars characters (the error
// gives its length, never its value).
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

// A wall-clock deadline (every wait for a peer has one: parallel.timeout_s).
struct Deadline {
  std::chrono::steady_clock::time_point at;
  explicit Deadline(double seconds)
      : at(std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<long long>(seconds * 1e6))) {}
  bool passed() const { return std::chrono::steady_clock::now() >= at; }
  // Milliseconds left, capped (for poll), at least 0.
  int ms_left(int cap_ms) const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - std::chrono::steady_clock::now()).count();
    return static_cast<int>(std::max<long long>(0, std::min<long long>(left, cap_ms)));
  }
};

}  // namespace llmc
