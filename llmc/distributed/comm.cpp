// llmc/distributed/comm.cpp: the NCCL process group: communicator creation with deadlines, the communication stream,
// collectives, host-side agreement points and the fatal-error path (interface in llmc/distributed/comm.h).

#include "llmc/distributed/comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include <nccl.h>

#include "llmc/distributed/rendezvous.h"

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// The process group

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::U8: return ncclUint8;
    case DType::I64: return ncclInt64;
  }
  return ncclFloat32;
}

size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::U8: return 1;
    case DType::I64: return 8;
  }
  return 4;
}

constexpr int kEventRing = 128;

// Ends the process `seconds` from now unless it has exited: nothing may keep a rank alive forever after a fatal error.
// It prints the error that started the shutdown (when known), since main() never got to print it.
void arm_exit_backstop(double seconds, const std::string& reason) {
  static std::atomic<bool> armed{false};
  if (armed.exchange(true)) return;
  const std::string prefix = error_prefix();
  std::thread([seconds, prefix, reason]() {
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<long long>(seconds * 1000)));
    if (!reason.empty()) std::fprintf(stderr, "%serror: %s\n", prefix.c_str(), reason.c_str());
    std::fprintf(stderr, "%serror: still running %g s after a fatal error (a collective or CUDA call did not return): "
                 "exiting\n", prefix.c_str(), seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
}

}  // namespace

struct Comm::Impl {
  ncclComm_t nccl = nullptr;
  std::vector<cudaEvent_t> events;
  int next_event = 0;
  void* dev_scratch = nullptr;
  void* host_scratch = nullptr;  // pinned
  size_t scratch_bytes = 0;
};

Comm::Comm(const LaunchInfo& launch, const ParallelConfig& parallel)
    : launch_(launch), timeout_s_(parallel.timeout_s), impl_(std::make_unique<Impl>()) {
  if (launch_.world_size <= 1) return;
  method_ = resolve_init_method(parallel.init, launch_, parallel.fs_path, built_with_mpi());
  // NVLink SHARP (NVLS) stays off unless the user asks for it explicitly (see the launchers and README).
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  if (method_ == "mpi") mpi_initialised_here_ = mpi_init_if_needed();
  // This rank's startup status: a GPU of its own, and (rank 0) the NCCL unique id.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::string status = capture_error([&]() {
    device_ = choose_device(launch_, cuda_device_count(), std::getenv("CUDA_VISIBLE_DEVICES"));
    CUDA_CHECK(cudaSetDevice(device_));
    if (launch_.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  });
  std::string payload;
  try {
    payload = run_rendezvous(method_, launch_, parallel, status,
                             std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } catch (...) {
    if (mpi_initialised_here_) mpi_finalize();
    mpi_initialised_here_ = false;
    if (!status.empty()) throw Error(status);  // this rank's own problem, in its own words
    throw;
  }
  if (payload.size() != sizeof(id))
    throw_error("rendezvous: the NCCL id from rank 0 has %zu bytes, expected %zu (different NCCL versions?)",
                payload.size(), sizeof(id));
  std::memcpy(&id, payload.data(), sizeof(id));

  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  impl_->events.resize(kEventRing);
  for (cudaEvent_t& e : impl_->events) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  // NCCL, non-blocking so that a peer that never arrives becomes a timeout instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t rc = ncclCommInitRankConfig(&impl_->nccl, launch_.world_size, id, launch_.rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    const std::string last = ncclGetLastError(impl_->nccl);
    if (impl_->nccl) ncclCommAbort(impl_->nccl);
    impl_->nccl = nullptr;
    throw_error("NCCL communicator setup failed on rank %d: %s%s%s", launch_.rank, ncclGetErrorString(rc),
                last.empty() ? "" : ": ", last.c_str());
  }
  const Deadline deadline(timeout_s_);
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(impl_->nccl, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress || deadline.passed()) {
      const std::string last = ncclGetLastError(impl_->nccl);
      const std::string msg =
          state != ncclInProgress
              ? strformat("NCCL communicator setup failed on rank %d: %s%s%s", launch_.rank, ncclGetErrorString(state),
                          last.empty() ? "" : ": ", last.c_str())
              : strformat("NCCL communicator setup did not finish within parallel.timeout_s = %g s on rank %d: a peer "
                          "did not join or cannot be reached (look for other ranks' error lines; NCCL_DEBUG=INFO "
                          "shows the transport)", timeout_s_, launch_.rank);
      arm_exit_backstop(std::max(10.0, std::min(60.0, timeout_s_)), msg);
      ncclCommAbort(impl_->nccl);
      impl_->nccl = nullptr;
      throw Error(msg);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (method_ == "fs" && launch_.rank == 0) fs_rendezvous_cleanup(parallel.fs_path, launch_.job_id);
  ensure_scratch(4096);
}

Comm::~Comm() {
  if (launch_.world_size <= 1) return;
  const bool unwinding = std::uncaught_exceptions() > 0;
  if (impl_->nccl) {
    if (unwinding || aborted_) {
      abort();
    } else {
      // Orderly: finish pending work, then free. A finalize that cannot finish (a peer vanished) becomes an abort.
      ncclResult_t rc = ncclCommFinalize(impl_->nccl);
      const Deadline deadline(timeout_s_);
      while (rc == ncclInProgress || rc == ncclSuccess) {
        ncclResult_t state = ncclInProgress;
        ncclCommGetAsyncError(impl_->nccl, &state);
        if (state != ncclInProgress) break;
        if (deadline.passed()) {
          abort();
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (impl_->nccl) ncclCommDestroy(impl_->nccl);
      impl_->nccl = nullptr;
    }
  }
  if (!aborted_) {
    for (cudaEvent_t e : impl_->events) cudaEventDestroy(e);
    if (impl_->dev_scratch) cudaFree(impl_->dev_scratch);
    if (impl_->host_scratch) cudaFreeHost(impl_->host_scratch);
    if (stream_) cudaStreamDestroy(stream_);
  }
  if (mpi_initialised_here_ && !unwinding && !aborted_) mpi_finalize();
}

void Comm::abort(const std::string& reason) {
  if (launch_.world_size <= 1 || aborted_) return;
  aborted_ = true;
  arm_exit_backstop(std::max(10.0, std::min(60.0, timeout_s_)), reason);
  if (impl_->nccl) ncclCommAbort(impl_->nccl);
  impl_->nccl = nullptr;
}

Comm::AbortGuard::AbortGuard(Comm& comm) : comm_(comm), exceptions_(std::uncaught_exceptions()) {}
Comm::AbortGuard::~AbortGuard() {
  if (std::uncaught_exceptions() > exceptions_) comm_.abort();
}

void Comm::nccl_wait(int result, const char* what) {
  const ncclResult_t r = static_cast<ncclResult_t>(result);
  if (r == ncclSuccess) return;
  if (r == ncclInProgress) {
    const Deadline deadline(timeout_s_);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      ncclCommGetAsyncError(impl_->nccl, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) return nccl_wait(state, what);
      if (deadline.passed()) {
        const std::string msg = strformat("NCCL could not queue the %s within parallel.timeout_s = %g s (rank %d)",
                                          what, timeout_s_, launch_.rank);
        abort(msg);
        throw Error(msg);
      }
      std::this_thread::yield();
    }
  }
  const std::string last = impl_->nccl ? ncclGetLastError(impl_->nccl) : "";
  const std::string msg = strformat("NCCL error during the %s on rank %d: %s%s%s (a peer rank probably failed: look "
                                    "for its error line)", what, launch_.rank, ncclGetErrorString(r),
                                    last.empty() ? "" : ": ", last.c_str());
  abort(msg);
  throw Error(msg);
}

cudaEvent_t Comm::next_event() {
  cudaEvent_t e = impl_->events[impl_->next_event];
  impl_->next_event = (impl_->next_event + 1) % kEventRing;
  return e;
}

void Comm::comm_waits_for(cudaStream_t compute) {
  if (!distributed()) return;
  cudaEvent_t e = next_event();
  CUDA_CHECK(cudaEventRecord(e, compute));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, e, 0));
}

void Comm::waits_for_comm(cudaStream_t compute) {
  if (!distributed()) return;
  cudaEvent_t e = next_event();
  CUDA_CHECK(cudaEventRecord(e, stream_));
  CUDA_CHECK(cudaStreamWaitEvent(compute, e, 0));
}

static void require_comm(bool ok, const char* what) {
  if (!ok) throw_error("internal error: %s on an aborted or absent NCCL communicator", what);
}

void Comm::all_reduce(void* buf, size_t count, DType type, ReduceOp op) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "all-reduce");
  nccl_wait(ncclAllReduce(buf, buf, count, nccl_type(type), op == ReduceOp::Sum ? ncclSum : ncclMax, impl_->nccl,
                          stream_), "all-reduce");
}

void Comm::reduce_scatter(void* buf, size_t count, DType type) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "reduce-scatter");
  char* base = static_cast<char*>(buf);
  nccl_wait(ncclReduceScatter(base, base + size_t(launch_.rank) * count * dtype_bytes(type), count, nccl_type(type),
                              ncclSum, impl_->nccl, stream_), "reduce-scatter");
}

void Comm::all_gather(void* buf, size_t count, DType type) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "all-gather");
  char* base = static_cast<char*>(buf);
  nccl_wait(ncclAllGather(base + size_t(launch_.rank) * count * dtype_bytes(type), base, count, nccl_type(type),
                          impl_->nccl, stream_), "all-gather");
}

void Comm::all_gather(const void* send, void* recv, size_t count, DType type) {
  if (count == 0) return;
  if (!distributed()) {
    if (send != recv) CUDA_CHECK(cudaMemcpy(recv, send, count * dtype_bytes(type), cudaMemcpyDeviceToDevice));
    return;
  }
  require_comm(impl_->nccl, "all-gather");
  nccl_wait(ncclAllGather(send, recv, count, nccl_type(type), impl_->nccl, stream_), "all-gather");
}

void Comm::group_start() {
  if (distributed()) nccl_wait(ncclGroupStart(), "group start");
}
void Comm::group_end() {
  if (distributed()) nccl_wait(ncclGroupEnd(), "grouped send/receive");
}
void Comm::send(const void* buf, size_t count, DType type, int peer) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "send");
  nccl_wait(ncclSend(buf, count, nccl_type(type), peer, impl_->nccl, stream_), "send");
}
void Comm::recv(void* buf, size_t count, DType type, int peer) {
  if (!distributed() || count == 0) return;
  require_comm(impl_->nccl, "receive");
  nccl_wait(ncclRecv(buf, count, nccl_type(type), peer, impl_->nccl, stream_), "receive");
}

void Comm::all_reduce_max_after(float* amax, int count, cudaStream_t s) {
  if (!distributed() || count <= 0) return;
  comm_waits_for(s);
  all_reduce(amax, static_cast<size_t>(count), DType::F32, ReduceOp::Max);
  waits_for_comm(s);
}

void Comm::wait(cudaStream_t s, const char* what) {
  if (!distributed()) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  if (aborted_) throw_error("%s: the NCCL communicator was aborted after an earlier error", what);
  cudaEvent_t e = next_event();
  CUDA_CHECK(cudaEventRecord(e, s));
  const Deadline deadline(timeout_s_);
  int polls = 0;
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    ncclResult_t state = ncclSuccess;
    if (impl_->nccl) ncclCommGetAsyncError(impl_->nccl, &state);
    if (state != ncclSuccess && state != ncclInProgress) nccl_wait(state, what);
    if (deadline.passed()) {
      const std::string msg = strformat("%s did not complete within parallel.timeout_s = %g s: another rank probably "
                                        "failed or stopped (look for its '[rank N] error' line), or it is far slower "
                                        "than this one", what, timeout_s_);
      abort(msg);
      throw Error(msg);
    }
    // Spin briefly (most waits are short), then sleep in small steps.
    if (++polls > 200) std::this_thread::sleep_for(std::chrono::microseconds(polls > 2000 ? 1000 : 50));
  }
}

void Comm::ensure_scratch(size_t bytes) {
  if (bytes <= impl_->scratch_bytes) return;
  bytes = std::max(bytes, impl_->scratch_bytes * 2);
  if (impl_->dev_scratch) CUDA_CHECK(cudaFree(impl_->dev_scratch));
  if (impl_->host_scratch) CUDA_CHECK(cudaFreeHost(impl_->host_scratch));
  impl_->dev_scratch = impl_->host_scratch = nullptr;
  CUDA_CHECK(cudaMalloc(&impl_->dev_scratch, bytes));
  CUDA_CHECK(cudaMallocHost(&impl_->host_scratch, bytes));
  impl_->scratch_bytes = bytes;
}

void Comm::barrier(const char* what) {
  if (!distributed()) return;
  sum(0.0, what);
}

double Comm::sum(double value, const char* what) {
  if (!distributed()) return value;
  ensure_scratch(sizeof(double));
  double* host = static_cast<double*>(impl_->host_scratch);
  *host = value;
  CUDA_CHECK(cudaMemcpyAsync(impl_->dev_scratch, host, sizeof(double), cudaMemcpyHostToDevice, stream_));
  all_reduce(impl_->dev_scratch, 1, DType::F64, ReduceOp::Sum);
  CUDA_CHECK(cudaMemcpyAsync(host, impl_->dev_scratch, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  wait(stream_, what);
  return *host;
}

double Comm::average(double value, const char* what) {
  if (!distributed()) return value;
  return sum(value, what) / launch_.world_size;
}

std::vector<std::string> Comm::all_gather_text(const std::string& text, const char* what) {
  if (!distributed()) return {text};
  const size_t n = static_cast<size_t>(launch_.world_size);
  // 1. lengths
  ensure_scratch(n * sizeof(int64_t));
  int64_t* lens = static_cast<int64_t*>(impl_->host_scratch);
  lens[launch_.rank] = static_cast<int64_t>(text.size());
  int64_t* dev_lens = static_cast<int64_t*>(impl_->dev_scratch);
  CUDA_CHECK(cudaMemcpyAsync(dev_lens + launch_.rank, lens + launch_.rank, sizeof(int64_t), cudaMemcpyHostToDevice,
                             stream_));
  all_gather(dev_lens, 1, DType::I64);
  CUDA_CHECK(cudaMemcpyAsync(lens, dev_lens, n * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_));
  wait(stream_, what);
  std::vector<int64_t> lengths(lens, lens + n);
  const size_t slot = static_cast<size_t>(std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end())));
  // 2. the texts, one slot per rank
  ensure_scratch(n * slot);
  char* host = static_cast<char*>(impl_->host_scratch);
  char* dev = static_cast<char*>(impl_->dev_scratch);
  std::memset(host + size_t(launch_.rank) * slot, 0, slot);
  std::memcpy(host + size_t(launch_.rank) * slot, text.data(), text.size());
  CUDA_CHECK(cudaMemcpyAsync(dev + size_t(launch_.rank) * slot, host + size_t(launch_.rank) * slot, slot,
                             cudaMemcpyHostToDevice, stream_));
  all_gather(dev, slot, DType::U8);
  CUDA_CHECK(cudaMemcpyAsync(host, dev, n * slot, cudaMemcpyDeviceToHost, stream_));
  wait(stream_, what);
  std::vector<std::string> out(n);
  for (size_t r = 0; r < n; r++) out[r].assign(host + r * slot, static_cast<size_t>(lengths[r]));
  return out;
}

std::string Comm::broadcast_text(const std::string& text, const char* what) {
  if (!distributed()) return text;
  return all_gather_text(launch_.rank == 0 ? text : std::string(), what)[0];
}

void Comm::check_all_ok(const std::string& my_error, const char* stage) {
  if (!distributed()) {
    if (!my_error.empty()) throw Error(my_error);
    return;
  }
  // One 8-byte all-reduce in the common case (nobody failed); the messages are gathered only when someone did.
  if (sum(my_error.empty() ? 0.0 : 1.0, stage) == 0.0) return;
  const std::vector<std::string> errors = all_gather_text(my_error, stage);
  std::string failures;
  for (size_t r = 0; r < errors.size(); r++)
    if (!errors[r].empty())
      failures += (failures.empty() ? "" : "; ") + strformat("rank %zu failed while %s: %s", r, stage,
                                                             errors[r].c_str());
  if (failures.empty()) return;
  if (!my_error.empty()) throw Error(my_error);
  throw GroupError(failures);
}

}  // namespace llmc
