// llmc/distributed/rendezvous.h: the startup rendezvous of a data-parallel run. Every rank reports its startup status
// (ok, or the error that stops it) and rank 0 hands out a payload (the NCCL unique id), over MPI, over TCP to rank 0
// (MASTER_ADDR:MASTER_PORT) or through a shared directory (parallel.fs_path). CPU only; tested with several
// processes on one machine.
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

#include <string>

#include "llmc/distributed/launch.h"

namespace llmc {

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

// The rendezvous of `method` ("tcp", "fs", "mpi") for this launch and parallel section; for mpi, MPI must be
// initialised (mpi_init_if_needed).
std::string run_rendezvous(const std::string& method, const LaunchInfo& launch, const ParallelConfig& parallel,
                           const std::string& status, const std::string& root_payload);
// MPI_Init when this build has MPI and nobody initialised it yet: true when this call did (the caller finalises);
// false without MPI.
bool mpi_init_if_needed();
void mpi_finalize();

}  // namespace llmc
