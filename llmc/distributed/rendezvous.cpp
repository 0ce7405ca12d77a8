// llmc/distributed/rendezvous.cpp: the rendezvous of a launch (run_rendezvous picks tcp, fs or MPI), the MPI
// variant, and the startup-failure report of a rank that cannot run (protocol in llmc/distributed/rendezvous.h; the
// tcp and fs variants are rendezvous_tcp.cpp and rendezvous_fs.cpp).

#include "llmc/distributed/rendezvous.h"

#include <algorithm>
#include <string>
#include <vector>
#ifdef LLM8_USE_MPI
#include <mpi.h>
#endif

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// MPI

bool mpi_init_if_needed() {
#ifdef LLM8_USE_MPI
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return false;
  MPI_Init(nullptr, nullptr);
  return true;
#else
  return false;
#endif
}

void mpi_finalize() {
#ifdef LLM8_USE_MPI
  MPI_Finalize();
#endif
}

#ifdef LLM8_USE_MPI
namespace {

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

std::string run_rendezvous(const std::string& method, const LaunchInfo& launch, const ParallelConfig& parallel,
                           const std::string& status, const std::string& root_payload) {
  RendezvousSpec spec;
  spec.rank = launch.rank;
  spec.world_size = launch.world_size;
  spec.timeout_s = parallel.timeout_s;
  spec.secret = launch.rendezvous_secret;
  if (method == "tcp") return tcp_rendezvous(spec, launch.master_addr, launch.master_port, status, root_payload);
  if (method == "fs") return fs_rendezvous(spec, parallel.fs_path, launch.job_id, status, root_payload);
#ifdef LLM8_USE_MPI
  if (method == "mpi") return mpi_rendezvous(spec, status, root_payload);
#endif
  throw_error("internal error: no rendezvous method '%s'", method.c_str());
}

void report_startup_failure(const LaunchInfo& launch, const ParallelConfig& parallel, const std::string& error) {
  if (launch.world_size <= 1) return;
  try {
    const std::string method = resolve_init_method(parallel.init, launch, parallel.fs_path, built_with_mpi());
    const bool mpi_here = method == "mpi" && mpi_init_if_needed();
    try {
      run_rendezvous(method, launch, parallel, error.empty() ? "unknown error" : error, "");
    } catch (...) {
    }
    if (mpi_here) mpi_finalize();
  } catch (...) {
  }
}

}  // namespace llmc
