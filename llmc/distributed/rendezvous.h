// llmc/distributed/rendezvous.h: the startup rendezvous of a data-parallel run. Every rank reports its startup status
// (ok, or the error that stops it) and rank 0 hands out a payload (the NCCL unique id), over MPI, over TCP to rank 0
// (MASTER_ADDR:MASTER_PORT) or through a shared directory (parallel.fs_path). CPU only; tested with several
// processes and threads on one machine.
//
// Authentication (tcp and fs). The key is LLM8_RDV_SECRET: a random value the launch scripts generate per launch and
// export to every rank; it never travels and never appears in a log or an error. Every message carries an HMAC-SHA256
// (llmc/distributed/hmac_sha256.h) over its fields in a fixed encoding (the tag "llm8-rendezvous/2", the message kind,
// then each field as <length>:<bytes>,) together with the values that make it fresh: rank 0's challenge (tcp, new for
// every connection) or session (fs, new for every rendezvous) and the rank's nonce (new for every process). TCP
// requires the secret unless MASTER_ADDR is a loopback address (one host); without it rank 0 says in its log that
// the rendezvous is unauthenticated and listens on loopback only, and the MACs are computed under the empty key (they
// still reject garbage, not a local impostor). Received messages are checked field by field (JSON object of this
// protocol, types, lengths, hex) before anything uses them; a message that fails a check or its MAC is logged (where
// it came from and why) and ignored: only an authenticated message can stop the job.
//
// TCP. Messages are a 4-byte little-endian length and a JSON object with "magic": "llm8-rendezvous", "version": 2 and
// "kind":
//   rank 0 listens on the addresses MASTER_ADDR resolves to on its host (never the wildcard address) and greets every
//     connection with {"kind": "challenge", "challenge": <32 hex>, "auth": <whether it has a secret>}.
//   rank k > 0 connects (retrying until parallel.timeout_s) and sends {"kind": "hello", "rank": k, "world_size": N,
//     "status": "" | "<its startup error>", "nonce": <32 hex>, "mac": HMAC(hello, challenge, nonce, rank, world_size,
//     status)}. A rank whose secret setting differs from rank 0's "auth" stops at once, naming LLM8_RDV_SECRET.
//   rank 0 registers an authenticated hello and acknowledges it: {"kind": "accepted", "rank": k, "mac": HMAC(accepted,
//     challenge, nonce, rank)}. When every rank is registered, or authenticated ranks disagree (world sizes, a rank out
//     of range, two processes with one rank), every authenticated rank gets {"kind": "verdict", "ok": true,
//     "payload": <hex>} or {"kind": "verdict", "ok": false, "error": "...", "startup_failure": <bool>}, with "mac":
//     HMAC(verdict, challenge, nonce, rank, ok, payload or error, startup_failure).
//   A hello that fails its checks is answered {"kind": "rejected", "error": "<why>"} (no MAC: the rank that gets it
//     stops with that reason) and its connection closed. A replayed hello fails: the challenge is new.
//   Rank 0's bounds: at most kRendezvousMaxStrangers connections without an authenticated hello at a time (beyond that
//     the oldest one older than kRendezvousStrangerGraceS is dropped, else new connections wait in the listen queue),
//     each closed when it sends no complete hello within stranger_timeout_s; hellos of at most kRendezvousMaxHello
//     bytes; poll with timeouts, never a busy loop.
//   Rank k reconnects (same nonce) when its connection breaks before "accepted": rank 0 takes the newer connection of
//     the same nonce. An authenticated claim of a registered rank with another nonce is the duplicate-rank error.
// fs. Files in <fs_path>, prefix llm8-<job> (<job> is LLM8_JOB_ID, else SLURM_JOB_ID[.SLURM_STEP_ID]: the ranks of
//   one job share it and no two jobs may), each written to a temporary name (mode 0600) and renamed:
//   rank 0 first publishes <prefix>.session = {"kind": "session", "session": <32 hex>, "auth", "mac": HMAC(session,
//     job, session)}.
//   rank k writes <prefix>.hello.<k> = {"kind": "hello", "rank", "world_size", "status", "session", "nonce", "mac":
//     HMAC(fs-hello, job, session, nonce, rank, world_size, status)}, and writes it again when the session changes.
//   rank 0 takes only hellos of its session (others, e.g. of an earlier job with the same id, are logged and ignored)
//     and answers in <prefix>.reply = {"kind": "reply", "session", "ok", "payload" | "error", "startup_failure",
//     "ranks": {"<k>": {"nonce", "mac": HMAC(fs-reply, job, session, k, nonce, ok, payload or error,
//     startup_failure)}}}; rank k takes the reply of its session that names its nonce with a MAC that verifies.
// MPI (parallel.init = mpi): an allgather of the statuses and a broadcast of the payload; the MPI launcher decides who
//   belongs to the job, so there is no secret.
#pragma once

#include <functional>
#include <string>

#include "llmc/distributed/launch.h"

namespace llmc {

// TCP rank 0's bounds on connections without an authenticated hello (the protocol above).
constexpr int kRendezvousMaxStrangers = 64;
constexpr double kRendezvousStrangerGraceS = 0.5;
constexpr size_t kRendezvousMaxHello = 16 << 10;

// Where the rendezvous notes what it ignored (strangers, malformed or stale messages) and that it runs
// unauthenticated: one line per call, without a trailing newline.
using RendezvousLog = std::function<void(const std::string& line)>;

struct RendezvousSpec {
  int rank = 0;
  int world_size = 1;
  double timeout_s = 300;
  std::string secret;               // the key of the MACs (LLM8_RDV_SECRET); "" = unauthenticated (loopback only)
  double stranger_timeout_s = 10;   // tcp: how long a connection may take to send a complete hello
  RendezvousLog log;                // nullptr: "[rank R] rendezvous: <line>" on stderr
};

// Every rank brings `status` ("" = ok, else its error message); rank 0 brings `root_payload` (bytes). Returns the
// payload on every rank. Throws GroupError when any rank reported an error ("rank 1 failed during startup: ..."),
// llmc::Error for a disagreement among authenticated ranks (world sizes, rank out of range, two processes with the
// same rank), a missing secret (tcp with a MASTER_ADDR that is not a loopback address), a secret setting that differs
// from rank 0's, or when a peer does not arrive within timeout_s (naming the missing ranks, or rank 0's address, and
// what was ignored on the way).
std::string tcp_rendezvous(const RendezvousSpec& spec, const std::string& master_addr, int master_port,
                           const std::string& status, const std::string& root_payload);
std::string fs_rendezvous(const RendezvousSpec& spec, const std::string& dir, const std::string& job_id,
                          const std::string& status, const std::string& root_payload);
// Removes rank 0's session and reply files once every rank is past the rendezvous (called after NCCL is up).
void fs_rendezvous_cleanup(const std::string& dir, const std::string& job_id);

// Whether every address `host` resolves to here is a loopback address (127.0.0.0/8, ::1): the ranks of a TCP job
// with such a MASTER_ADDR run on one host. false when it does not resolve.
bool is_loopback_address(const std::string& host);

// A rank that cannot run (its config did not load) still joins the rendezvous with its error so that every rank
// stops at once with a message naming it. Returns normally (the caller rethrows its own error). Best effort: any
// problem here (no peer, bad parallel settings) is swallowed, the launcher or the peers' timeout end the job.
void report_startup_failure(const LaunchInfo& launch, const ParallelConfig& parallel, const std::string& error);

// The rendezvous of `method` ("tcp", "fs", "mpi") for this launch and parallel section (the secret is the launch's
// rendezvous_secret); for mpi, MPI must be initialised (mpi_init_if_needed).
std::string run_rendezvous(const std::string& method, const LaunchInfo& launch, const ParallelConfig& parallel,
                           const std::string& status, const std::string& root_payload);
// MPI_Init when this build has MPI and nobody initialised it yet: true when this call did (the caller finalises);
// false without MPI.
bool mpi_init_if_needed();
void mpi_finalize();

}  // namespace llmc
