// test/distributed/rendezvous_test_util.h: helpers of the rendezvous tests (test_comm.cpp, test_rendezvous.cpp): a
// free loopback port, and ranks run as threads of this process with their outcomes as strings.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "llmc/distributed/rendezvous.h"

namespace llmc_test {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

using RankFn = std::function<std::string(const llmc::RendezvousSpec&, const std::string&)>;

// Runs one rendezvous per spec in its own thread; returns per-rank "payload:<bytes>" or "error:<message>"
// ("group:" for GroupError).
inline std::vector<std::string> run_ranks(const std::vector<llmc::RendezvousSpec>& specs,
                                          const std::vector<std::string>& statuses, const RankFn& f) {
  std::vector<std::string> out(specs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < specs.size(); i++)
    threads.emplace_back([&, i]() {
      try {
        out[i] = "payload:" + f(specs[i], statuses[i]);
      } catch (const llmc::GroupError& e) {
        out[i] = std::string("group:") + e.what();
      } catch (const llmc::Error& e) {
        out[i] = std::string("error:") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

// Specs of the given ranks (all by default) of a world, with a timeout and a secret.
inline std::vector<llmc::RendezvousSpec> specs_for(int world, double timeout, std::vector<int> ranks = {},
                                                   const std::string& secret = "") {
  if (ranks.empty())
    for (int r = 0; r < world; r++) ranks.push_back(r);
  std::vector<llmc::RendezvousSpec> specs;
  for (int r : ranks) {
    llmc::RendezvousSpec s;
    s.rank = r;
    s.world_size = world;
    s.timeout_s = timeout;
    s.secret = secret;
    specs.push_back(s);
  }
  return specs;
}

inline const std::string kPayload = std::string("nccl\0id\xff", 8);

}  // namespace llmc_test
