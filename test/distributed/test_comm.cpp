// test/distributed/test_comm: the CPU half of llmc/distributed/comm: reading the launcher's variables (mpirun, srun, torchrun) and every
// inconsistency it must refuse, the GPU choice per local rank, the init-method choice, the lenient bootstrap config,
// and the startup rendezvous over TCP and over a shared directory between threads and between forked processes:
// payload delivery, a rank's startup error reaching every rank, disagreeing world sizes, duplicate ranks, strangers on
// the port, and peers that never arrive (timeouts with messages naming who is missing). The rendezvous under attack
// (impostors, forgers, replays, malformed messages, floods, stale files) is test_rendezvous.cpp.
#include <gtest/gtest.h>

#include "test/support/temp_dir.h"
#include "test/distributed/rendezvous_test_util.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llmc/distributed/comm.h"
#include "llmc/distributed/rendezvous.h"
#include "llmc/run/config.h"
#include "llmc/core/common.h"
#include "test/support/error_of.h"

namespace fs = std::filesystem;
using llmc_test::error_of;
using llmc::LaunchInfo;
using llmc_test::free_port;
using llmc_test::kPayload;
using llmc_test::run_ranks;
using llmc_test::specs_for;

namespace {

// detect_launch over a fixed environment.
LaunchInfo detect(const std::map<std::string, std::string>& vars) {
  return llmc::detect_launch([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

#define EXPECT_ERROR_HAS(stmt, needle)                                          \
  do {                                                                          \
    const std::string msg_ = error_of([&]() { stmt; });                         \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "message: " << msg_;     \
  } while (0)


}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// detect_launch

TEST(DetectLaunch, NoLauncherIsOneProcess) {
  LaunchInfo l = detect({});
  EXPECT_EQ(l.world_size, 1);
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.launcher, "none");
  EXPECT_EQ(detect({{"WORLD_SIZE", "1"}}).world_size, 1);  // WORLD_SIZE=1 alone is a single process
  EXPECT_EQ(detect({{"WORLD_SIZE", ""}, {"RANK", ""}}).world_size, 1);  // empty = unset
}

TEST(DetectLaunch, Torchrun) {
  LaunchInfo l = detect({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(l.launcher, "torchrun");
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_world_size, 2);
  EXPECT_EQ(l.master_addr, "node0");
  EXPECT_EQ(l.master_port, 29500);
}

TEST(DetectLaunch, OpenMpiAndSlurm) {
  LaunchInfo m = detect({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(m.launcher, "mpi");
  EXPECT_EQ(m.rank, 1);
  EXPECT_EQ(m.local_rank, 1);
  LaunchInfo s = detect({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                         {"SLURM_JOB_ID", "777"}, {"SLURM_STEP_ID", "2"}});
  EXPECT_EQ(s.launcher, "slurm");
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.world_size, 8);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.job_id, "777.2");
  EXPECT_EQ(detect({{"LLM8_JOB_ID", "mine"}, {"SLURM_JOB_ID", "777"}}).job_id, "mine");
}

TEST(DetectLaunch, SlurmAllocationMaySubdivide) {
  // mpirun -np 2 or torchrun inside a 4-task allocation: Slurm's variables describe the allocation, not this launch.
  LaunchInfo m = detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}});
  EXPECT_EQ(m.launcher, "mpi");
  EXPECT_EQ(m.world_size, 2);
  LaunchInfo t = detect({{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"},
                         {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(t.launcher, "torchrun");
  EXPECT_EQ(t.world_size, 8);
  // srun started the process and WORLD_SIZE (without RANK) agrees with it: fine.
  LaunchInfo s = detect({{"WORLD_SIZE", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(s.launcher, "slurm");
  EXPECT_EQ(s.rank, 1);
}

TEST(DetectLaunch, Disagreements) {
  EXPECT_ERROR_HAS(detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"WORLD_SIZE", "2"}}),
                   "disagree on the world size: OMPI_COMM_WORLD_SIZE=4 but WORLD_SIZE=2");
  EXPECT_ERROR_HAS(detect({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}}),
                   "disagree on the rank: OMPI_COMM_WORLD_RANK=1 but RANK=0");
  EXPECT_ERROR_HAS(detect({{"WORLD_SIZE", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"},
                           {"SLURM_LOCALID", "1"}}),
                   "disagree on the world size: SLURM_NTASKS=4 but WORLD_SIZE=2");
}

TEST(DetectLaunch, IncompleteOrInvalid) {
  EXPECT_ERROR_HAS(detect({{"WORLD_SIZE", "2"}}), "WORLD_SIZE=2 is set but RANK is not");
  EXPECT_ERROR_HAS(detect({{"RANK", "1"}}), "RANK=1 is set but WORLD_SIZE is not");
  EXPECT_ERROR_HAS(detect({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}),
                   "rank out of range: RANK=2 but WORLD_SIZE=2");
  EXPECT_ERROR_HAS(detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}}), "LOCAL_RANK is not set");
  EXPECT_ERROR_HAS(detect({{"RANK", "one"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}),
                   "RANK='one' is not a non-negative integer");
  EXPECT_ERROR_HAS(detect({{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"LOCAL_RANK", "0"}}),
                   "WORLD_SIZE='0' is not a positive integer");
  EXPECT_ERROR_HAS(detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
                   "local rank out of range: LOCAL_RANK=2 but LOCAL_WORLD_SIZE=2");
  EXPECT_ERROR_HAS(detect({{"MASTER_PORT", "70000"}}), "MASTER_PORT='70000' is not a TCP port");
}

TEST(DetectLaunch, RendezvousSecret) {
  const std::string secret(64, 'a');
  EXPECT_EQ(detect({{"LLM8_RDV_SECRET", secret}}).rendezvous_secret, secret);
  EXPECT_EQ(detect({}).rendezvous_secret, "");
  // Too short to be a secret: the error names the variable and its length, never the value.
  const std::string msg = error_of([] { detect({{"LLM8_RDV_SECRET", "hunter2hunter2"}}); });
  EXPECT_NE(msg.find("LLM8_RDV_SECRET is set but has only 14 characters"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/dev/urandom"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("hunter2"), std::string::npos) << msg;
}

// ------------------------------------------------------------------------------------------------------------------
// choose_device, resolve_init_method, bootstrap_parallel_config

TEST(ChooseDevice, LocalRankPicksTheGpu) {
  LaunchInfo l;
  l.rank = 3;
  l.world_size = 4;
  l.local_rank = 1;
  l.hostname = "gpu7";
  EXPECT_EQ(llmc::choose_device(l, 2, nullptr), 1);
  EXPECT_EQ(llmc::choose_device(l, 1, "3"), 0);  // the launcher bound one GPU to this process
  EXPECT_ERROR_HAS(llmc::choose_device(l, 1, nullptr), "rank 3 has local rank 1, but host gpu7 shows only 1 GPU(s)");
  EXPECT_ERROR_HAS(llmc::choose_device(l, 1, "0,1"), "(CUDA_VISIBLE_DEVICES=0,1)");
  EXPECT_ERROR_HAS(llmc::choose_device(l, 0, ""), "no CUDA GPU is visible to rank 3 on host gpu7");
}

TEST(InitMethod, Resolution) {
  LaunchInfo one;
  for (const char* init : {"auto", "mpi", "tcp", "fs", "none"})
    EXPECT_EQ(llmc::resolve_init_method(init, one, "", false), "none");  // one process needs no exchange
  LaunchInfo two;
  two.world_size = 2;
  two.rank = 1;
  two.launcher = "torchrun";
  EXPECT_ERROR_HAS(llmc::resolve_init_method("none", two, "", true), "parallel.init = none, but the launcher started 2");
  EXPECT_ERROR_HAS(llmc::resolve_init_method("auto", two, "", true), "no way to exchange the NCCL id");
  EXPECT_ERROR_HAS(llmc::resolve_init_method("tcp", two, "", true), "needs MASTER_ADDR and MASTER_PORT");
  EXPECT_ERROR_HAS(llmc::resolve_init_method("fs", two, "/shared", true), "needs a job id");
  EXPECT_ERROR_HAS(llmc::resolve_init_method("mpi", two, "", false), "this build has no MPI");
  EXPECT_ERROR_HAS(llmc::resolve_init_method("mpi", two, "", true), "not started by mpirun");
  EXPECT_ERROR_HAS(llmc::resolve_init_method("magic", two, "", true), "unknown method 'magic'");
  two.job_id = "42";
  EXPECT_EQ(llmc::resolve_init_method("auto", two, "/shared", true), "fs");
  two.master_addr = "127.0.0.1";
  two.master_port = 29500;
  EXPECT_EQ(llmc::resolve_init_method("auto", two, "/shared", true), "tcp");  // tcp before fs
  EXPECT_EQ(llmc::resolve_init_method("fs", two, "/shared", true), "fs");
  two.launcher = "mpi";
  EXPECT_EQ(llmc::resolve_init_method("auto", two, "", true), "mpi");
  EXPECT_EQ(llmc::resolve_init_method("auto", two, "", false), "tcp");  // no MPI in the build: the variables do
  two.master_port = 0;
  EXPECT_ERROR_HAS(llmc::resolve_init_method("auto", two, "", false), "this build has no MPI, so mpirun alone");
}

TEST(BootstrapConfig, LenientRead) {
  const std::string path = (fs::temp_directory_path() / ("llm8_boot_" + std::to_string(::getpid()) + ".json")).string();
  {
    std::ofstream f(path);
    f << R"({"train": {"lr": "fast"}, "parallel": {"init": "fs", "fs_path": "/shared/x", "timeout_s": 30}})";
  }
  llmc::ParallelConfig p = llmc::bootstrap_parallel_config(path, {"parallel.timeout_s=12", "train.lr=oops"});
  EXPECT_EQ(p.init, "fs");
  EXPECT_EQ(p.fs_path, "/shared/x");
  EXPECT_EQ(p.timeout_s, 12);
  {
    std::ofstream f(path);
    f << "{ not json";
  }
  p = llmc::bootstrap_parallel_config(path, {"parallel.init=tcp", "parallel.timeout_s=-5"});
  EXPECT_EQ(p.init, "tcp");
  EXPECT_EQ(p.timeout_s, llmc::ParallelConfig().timeout_s);  // invalid value: default kept
  p = llmc::bootstrap_parallel_config("/no/such/config.json", {});
  EXPECT_EQ(p.init, "auto");
  fs::remove(path);
}

TEST(Errors, PrefixAndCapture) {
  llmc::set_error_rank(3, 4);
  EXPECT_EQ(llmc::error_prefix(), "[rank 3] ");
  llmc::set_error_rank(0, 1);
  EXPECT_EQ(llmc::error_prefix(), "");
  EXPECT_EQ(llmc::capture_error([] {}), "");
  EXPECT_EQ(llmc::capture_error([] { llmc::throw_error("bad %d", 7); }), "bad 7");
}

// ------------------------------------------------------------------------------------------------------------------
// TCP rendezvous

namespace {
std::function<std::string(const llmc::RendezvousSpec&, const std::string&)> tcp_with(int port) {
  return [port](const llmc::RendezvousSpec& s, const std::string& status) {
    return llmc::tcp_rendezvous(s, "127.0.0.1", port, status, s.rank == 0 ? kPayload : "");
  };
}
}  // namespace

TEST(TcpRendezvous, DeliversThePayload) {
  auto out = run_ranks(specs_for(4, 20), {"", "", "", ""}, tcp_with(free_port()));
  for (const std::string& o : out) EXPECT_EQ(o, "payload:" + kPayload);
}

TEST(TcpRendezvous, StartupErrorReachesEveryRank) {
  auto out = run_ranks(specs_for(3, 20), {"", "", "data.train: no file matches x_*.bin"}, tcp_with(free_port()));
  for (const std::string& o : out)
    EXPECT_EQ(o, "group:rank 2 failed during startup: data.train: no file matches x_*.bin");
}

TEST(TcpRendezvous, WorldSizesDisagree) {
  std::vector<llmc::RendezvousSpec> specs = {{0, 3, 20}, {1, 4, 20}};
  auto out = run_ranks(specs, {"", ""}, tcp_with(free_port()));
  for (const std::string& o : out)
    EXPECT_NE(o.find("world sizes disagree: rank 0 was started for 3 processes but rank 1"), std::string::npos) << o;
}

TEST(TcpRendezvous, DuplicateRank) {
  auto out = run_ranks(specs_for(3, 20, {0, 1, 1}), {"", "", ""}, tcp_with(free_port()));
  EXPECT_NE(out[0].find("two processes claim rank 1"), std::string::npos) << out[0];
  // Both claims authenticated with the job's secret: still the misconfiguration it is, not a stranger.
  out = run_ranks(specs_for(3, 20, {0, 1, 1}, std::string(64, 's')), {"", "", ""}, tcp_with(free_port()));
  EXPECT_NE(out[0].find("two processes claim rank 1"), std::string::npos) << out[0];
}

TEST(TcpRendezvous, MissingPeerTimesOut) {
  const auto t0 = std::chrono::steady_clock::now();
  auto out = run_ranks(specs_for(3, 1.5, {0, 1}), {"", ""}, tcp_with(free_port()));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(out[0].find("error:rank(s) 2 did not join the rendezvous"), std::string::npos) << out[0];
  EXPECT_NE(out[1].find("rank(s) 2 did not join"), std::string::npos) << out[1];  // rank 0's verdict reaches rank 1
  EXPECT_LT(s, 10.0);
}

TEST(TcpRendezvous, NoRankZero) {
  const int port = free_port();
  auto out = run_ranks(specs_for(2, 1.0, {1}), {""}, tcp_with(port));
  EXPECT_NE(out[0].find("could not reach rank 0 at MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port)),
            std::string::npos) << out[0];
}

TEST(TcpRendezvous, IgnoresStrangersAndLateStarters) {
  const int port = free_port();
  std::vector<std::string> out(2);
  std::thread root([&]() {
    try {
      out[0] = llmc::tcp_rendezvous({0, 2, 20}, "127.0.0.1", port, "", kPayload);
    } catch (const llmc::Error& e) {
      out[0] = std::string("error:") + e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // A stranger connects and sends garbage, another connects and closes.
  for (const char* junk : {"GET / HTTP/1.0\r\n\r\n", ""}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (*junk) ASSERT_GT(::send(fd, junk, std::strlen(junk), 0), 0);
    ::close(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 1 starts late
  out[1] = llmc::tcp_rendezvous({1, 2, 20}, "127.0.0.1", port, "", "");
  root.join();
  EXPECT_EQ(out[0], kPayload);
  EXPECT_EQ(out[1], kPayload);
}

TEST(TcpRendezvous, BetweenProcesses) {
  const int port = free_port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1 in another process: exit code 0 only when it got rank 0's payload
    int rc = 3;
    try {
      rc = llmc::tcp_rendezvous({1, 2, 20}, "localhost", port, "", "") == kPayload ? 0 : 2;
    } catch (...) {
      rc = 1;
    }
    ::_exit(rc);
  }
  const std::string got = llmc::tcp_rendezvous({0, 2, 20}, "127.0.0.1", port, "", kPayload);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(got, kPayload);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// ------------------------------------------------------------------------------------------------------------------
// Shared-directory rendezvous

class FsRendezvous : public llmc_test::TempDirTest {
 protected:
  std::function<std::string(const llmc::RendezvousSpec&, const std::string&)> fs_with(const std::string& job) {
    return [this, job](const llmc::RendezvousSpec& s, const std::string& status) {
      return llmc::fs_rendezvous(s, dir_, job, status, s.rank == 0 ? kPayload : "");
    };
  }
};

TEST_F(FsRendezvous, DeliversThePayloadAndCleansUp) {
  auto out = run_ranks(specs_for(3, 20), {"", "", ""}, fs_with("job1"));
  for (const std::string& o : out) EXPECT_EQ(o, "payload:" + kPayload);
  llmc::fs_rendezvous_cleanup(dir_, "job1");
  EXPECT_TRUE(fs::is_empty(dir_)) << "hello / reply files left behind";
}

TEST_F(FsRendezvous, StaleReplyOfAnEarlierJobIsIgnored) {
  fs::create_directories(dir_);
  {  // an earlier job with the same id left an answer with other nonces
    std::ofstream f(dir_ + "/llm8-job2.reply");
    f << R"({"ok": true, "payload": "6f6c64", "nonces": {"1": "0000000000000000"}})";
  }
  auto out = run_ranks(specs_for(2, 20, {1, 0}), {"", ""}, fs_with("job2"));  // rank 1 starts first
  for (const std::string& o : out) EXPECT_EQ(o, "payload:" + kPayload);
}

TEST_F(FsRendezvous, StartupErrorAndDisagreements) {
  auto out = run_ranks(specs_for(2, 20), {"bad config", ""}, fs_with("job3"));
  for (const std::string& o : out) EXPECT_EQ(o, "group:rank 0 failed during startup: bad config");
  std::vector<llmc::RendezvousSpec> specs = {{0, 2, 20}, {1, 3, 20}};
  out = run_ranks(specs, {"", ""}, fs_with("job4"));
  for (const std::string& o : out) EXPECT_NE(o.find("world sizes disagree"), std::string::npos) << o;
}

TEST_F(FsRendezvous, MissingPeerTimesOut) {
  auto out = run_ranks(specs_for(3, 1.0, {0, 2}), {"", ""}, fs_with("job5"));
  EXPECT_NE(out[0].find("rank(s) 1 did not join the rendezvous in " + dir_), std::string::npos) << out[0];
  EXPECT_NE(out[1].find("rank(s) 1 did not join"), std::string::npos) << out[1];
  out = run_ranks(specs_for(2, 0.5, {1}), {""}, fs_with("job6"));
  EXPECT_NE(out[0].find("rank 0 did not answer through " + dir_), std::string::npos) << out[0];
}
