// llmc/distributed/launch.cpp: the launch detection (launcher variables, the GPU of a process, the init method) and
// the per-process error output of a data-parallel run (llmc/distributed/launch.h).

#include "llmc/distributed/launch.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// Errors and output

namespace {
std::atomic<int> g_error_rank{-1};
}

void set_error_rank(int rank, int world_size) { g_error_rank = world_size > 1 ? rank : -1; }

std::string error_prefix() {
  const int r = g_error_rank.load();
  return r >= 0 ? strformat("[rank %d] ", r) : std::string();
}

std::string capture_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return what.empty() ? std::string("unknown error") : what;
  }
  return "";
}

void quiet_stdout_unless(bool keep) {
  if (keep) return;
  std::fflush(stdout);
  const int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::dup2(fd, STDOUT_FILENO);
  ::close(fd);
}

// ------------------------------------------------------------------------------------------------------------------
// Launch detection

const char* process_env(const char* name) { return std::getenv(name); }

namespace {

// The value of an environment variable, nullptr when unset or empty.
const char* env_value(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return (v && *v) ? v : nullptr;
}

int parse_env_int(const char* name, const char* value, int min_value) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || n < min_value || n > 100000000)
    throw_error("environment variable %s='%s' is not %s (fix or unset it; it is read to place this process in the "
                "job)", name, value, min_value > 0 ? "a positive integer" : "a non-negative integer");
  return static_cast<int>(n);
}

struct LaunchSource {
  const char* name;
  const char* rank_var;
  const char* size_var;
  std::vector<const char*> local_vars;  // first one set wins
  const char* local_size_var;           // nullptr = none
};

const std::vector<LaunchSource>& launch_sources() {
  static const std::vector<LaunchSource> sources = {
      {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", {"OMPI_COMM_WORLD_LOCAL_RANK"},
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", {"MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"},
       "MPI_LOCALNRANKS"},
      {"torchrun", "RANK", "WORLD_SIZE", {"LOCAL_RANK"}, "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", {"SLURM_LOCALID"}, nullptr},
  };
  return sources;
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace

std::string rendezvous_secret_hint() {
  return strformat("scripts/run_local.sh, scripts/run_mpi.sh and the Slurm scripts generate one per launch; by hand: "
                   "export %s=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n') once, then start every rank from that "
                   "environment", kRendezvousSecretVar);
}

LaunchInfo detect_launch(const EnvLookup& env) {
  LaunchInfo info;
  info.hostname = host_name();
  const auto& sources = launch_sources();
  const LaunchSource* chosen = nullptr;
  for (const LaunchSource& s : sources) {
    const char* r = env_value(env, s.rank_var);
    const char* n = env_value(env, s.size_var);
    if (r && n) {
      chosen = &s;
      break;
    }
  }
  // A world size above 1 without its rank cannot be placed; RANK without WORLD_SIZE is a half-set torchrun launch.
  if (!chosen) {
    for (const LaunchSource& s : sources) {
      const char* r = env_value(env, s.rank_var);
      const char* n = env_value(env, s.size_var);
      if (n && !r && parse_env_int(s.size_var, n, 1) > 1)
        throw_error("%s=%s is set but %s is not, so this process cannot tell its rank: start the processes with a "
                    "launcher that sets both (scripts/run_local.sh, torchrun, mpirun, srun), or unset %s for a "
                    "single-GPU run", s.size_var, n, s.rank_var, s.size_var);
      if (r && !n && std::string(s.name) == "torchrun")
        throw_error("RANK=%s is set but WORLD_SIZE is not: set both (and LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or "
                    "neither for a single-GPU run", r);
    }
  }
  if (chosen) {
    info.launcher = chosen->name;
    info.world_size = parse_env_int(chosen->size_var, env_value(env, chosen->size_var), 1);
    info.rank = parse_env_int(chosen->rank_var, env_value(env, chosen->rank_var), 0);
    if (info.rank >= info.world_size)
      throw_error("rank out of range: %s=%d but %s=%d (ranks are 0 .. %d)", chosen->rank_var, info.rank,
                  chosen->size_var, info.world_size, info.world_size - 1);
    // Every other launcher's variables that are set must describe the same job (Slurm's describe the allocation).
    for (const LaunchSource& s : sources) {
      if (&s == chosen || std::string(s.name) == "slurm") continue;
      const char* n = env_value(env, s.size_var);
      if (n && parse_env_int(s.size_var, n, 1) != info.world_size)
        throw_error("the launcher variables disagree on the world size: %s=%d but %s=%s (a variable left over in the "
                    "environment? unset the one that does not belong to this launch)",
                    chosen->size_var, info.world_size, s.size_var, n);
      const char* r = env_value(env, s.rank_var);
      if (n && r && parse_env_int(s.rank_var, r, 0) != info.rank)
        throw_error("the launcher variables disagree on the rank: %s=%d but %s=%s (a variable left over in the "
                    "environment? unset the one that does not belong to this launch)",
                    chosen->rank_var, info.rank, s.rank_var, r);
    }
    const char* local_var = nullptr;
    for (const char* v : chosen->local_vars)
      if (env_value(env, v)) {
        local_var = v;
        break;
      }
    if (local_var) {
      info.local_rank = parse_env_int(local_var, env_value(env, local_var), 0);
    } else if (info.world_size > 1) {
      throw_error("%s is not set, so this process cannot tell which GPU of its node to use (rank %d of %d): the "
                  "launcher must set it%s", chosen->local_vars[0], info.rank, info.world_size,
                  std::string(chosen->name) == "torchrun" ? " (scripts/run_local.sh and torchrun do)" : "");
    }
    if (chosen->local_size_var && env_value(env, chosen->local_size_var))
      info.local_world_size = parse_env_int(chosen->local_size_var, env_value(env, chosen->local_size_var), 1);
    if (info.local_world_size > 0 && info.local_rank >= info.local_world_size)
      throw_error("local rank out of range: %s=%d but %s=%d", local_var ? local_var : "local rank", info.local_rank,
                  chosen->local_size_var, info.local_world_size);
  }
  if (const char* a = env_value(env, "MASTER_ADDR")) info.master_addr = a;
  if (const char* p = env_value(env, "MASTER_PORT")) {
    info.master_port = parse_env_int("MASTER_PORT", p, 1);
    if (info.master_port > 65535) throw_error("environment variable MASTER_PORT='%s' is not a TCP port (1-65535)", p);
  }
  if (const char* secret = env_value(env, kRendezvousSecretVar)) {
    info.rendezvous_secret = secret;
    if (info.rendezvous_secret.size() < kRendezvousSecretMinChars)
      throw_error("%s is set but has only %zu characters: it must be a random value of at least %zu characters, the "
                  "same on every rank of the job; %s", kRendezvousSecretVar, info.rendezvous_secret.size(),
                  kRendezvousSecretMinChars, rendezvous_secret_hint().c_str());
  }
  if (const char* j = env_value(env, "LLM8_JOB_ID")) {
    info.job_id = j;
  } else if (const char* sj = env_value(env, "SLURM_JOB_ID")) {
    info.job_id = sj;
    if (const char* step = env_value(env, "SLURM_STEP_ID")) info.job_id += std::string(".") + step;
  }
  return info;
}

int choose_device(const LaunchInfo& launch, int visible_gpus, const char* cuda_visible_devices) {
  const std::string cvd = cuda_visible_devices ? cuda_visible_devices : "";
  const std::string cvd_note = cuda_visible_devices ? " (CUDA_VISIBLE_DEVICES=" + cvd + ")" : "";
  if (visible_gpus <= 0)
    throw_error("no CUDA GPU is visible to rank %d on host %s%s: training needs one NVIDIA GPU per process",
                launch.rank, launch.hostname.c_str(), cvd_note.c_str());
  if (launch.local_rank < visible_gpus) return launch.local_rank;
  // The launcher bound one GPU to each process (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES=<one id> per rank).
  if (visible_gpus == 1 && !cvd.empty() && cvd.find(',') == std::string::npos) return 0;
  throw_error("rank %d has local rank %d, but host %s shows only %d GPU(s)%s: start at most one process per GPU "
              "(e.g. scripts/run_local.sh N with N <= %d)",
              launch.rank, launch.local_rank, launch.hostname.c_str(), visible_gpus, cvd_note.c_str(), visible_gpus);
}

bool built_with_mpi() {
#ifdef LLM8_USE_MPI
  return true;
#else
  return false;
#endif
}

std::string resolve_init_method(const std::string& init, const LaunchInfo& launch, const std::string& fs_path,
                                bool have_mpi) {
  if (init != "auto" && init != "mpi" && init != "tcp" && init != "fs" && init != "none")
    throw_error("parallel.init: unknown method '%s' (auto, mpi, tcp, fs or none)", init.c_str());
  if (launch.world_size == 1) return "none";
  const bool by_mpi = launch.launcher == "mpi" || launch.launcher == "pmi";
  const bool tcp_ready = !launch.master_addr.empty() && launch.master_port > 0;
  const std::string job_hint =
      "set LLM8_JOB_ID to a value shared by the ranks of this job and no other (Slurm's SLURM_JOB_ID is used when "
      "set)";
  if (init == "none")
    throw_error("parallel.init = none, but the launcher started %d processes (this is rank %d, via %s): set "
                "parallel.init to auto, or start a single process", launch.world_size, launch.rank,
                launch.launcher.c_str());
  if (init == "mpi") {
    if (!have_mpi)
      throw_error("parallel.init = mpi, but this build has no MPI: configure with -DLLM8_MPI=ON and an MPI installation "
                  "(apt-get install libopenmpi-dev), or use parallel.init = tcp with MASTER_ADDR and MASTER_PORT");
    if (!by_mpi)
      throw_error("parallel.init = mpi, but this process was not started by mpirun (no OMPI_COMM_WORLD_* or PMI_* "
                  "variables; launcher: %s)", launch.launcher.c_str());
    return "mpi";
  }
  if (init == "tcp") {
    if (!tcp_ready)
      throw_error("parallel.init = tcp needs MASTER_ADDR and MASTER_PORT (rank 0's address and a free port, the same "
                  "on every rank); MASTER_ADDR=%s MASTER_PORT=%s",
                  launch.master_addr.empty() ? "(unset)" : launch.master_addr.c_str(),
                  launch.master_port ? std::to_string(launch.master_port).c_str() : "(unset)");
    return "tcp";
  }
  if (init == "fs") {
    if (fs_path.empty())
      throw_error("parallel.init = fs needs parallel.fs_path: a directory every rank can read and write");
    if (launch.job_id.empty()) throw_error("parallel.init = fs needs a job id: %s", job_hint.c_str());
    return "fs";
  }
  // auto
  if (by_mpi && have_mpi) return "mpi";
  if (tcp_ready) return "tcp";
  if (!fs_path.empty() && !launch.job_id.empty()) return "fs";
  throw_error("%d processes were started (launcher: %s) but there is no way to exchange the NCCL id: set MASTER_ADDR "
              "and MASTER_PORT (tcp), or parallel.fs_path with a job id (fs: %s)%s",
              launch.world_size, launch.launcher.c_str(), job_hint.c_str(),
              by_mpi && !have_mpi ? "; this build has no MPI, so mpirun alone is not enough (scripts/run_mpi.sh sets "
                                    "MASTER_ADDR/MASTER_PORT)"
                                  : "");
}


}  // namespace llmc
