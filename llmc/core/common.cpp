// llmc/core/common.cpp: implementation of the error paths and device queries declared in common.h.
#include "llmc/core/common.h"

#include <cstdarg>
#include <vector>

#include <cublas_api.h>
#include <nccl.h>

namespace llmc {

static std::string vformat(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  std::vector<char> buf(n > 0 ? n + 1 : 1);
  std::vsnprintf(buf.data(), buf.size(), fmt, ap);
  return std::string(buf.data());
}

std::string strformat(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  return s;
}

void throw_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  throw Error(s);
}

void cuda_fail(cudaError_t err, const char* expr, const char* file, int line) {
  std::string hint;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    hint = " (hint: this needs an NVIDIA GPU with a working driver)";
  else if (err == cudaErrorMemoryAllocation)
    hint = " (hint: lower train.micro_batch or enable train.recompute)";
  else if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorUnsupportedPtxVersion)
    hint = " (hint: rebuild with -DCMAKE_CUDA_ARCHITECTURES set for this GPU)";
  throw Error(strformat("CUDA error %s: %s at %s:%d in %s%s", cudaGetErrorName(err), cudaGetErrorString(err), file,
                        line, expr, hint.c_str()));
}

void cublas_fail(int status, const char* expr, const char* file, int line) {
  throw Error(strformat("cuBLAS error %s (%d) at %s:%d in %s", cublasGetStatusString(static_cast<cublasStatus_t>(status)),
                        status, file, line, expr));
}

void nccl_fail(int result, const char* expr, const char* file, int line) {
  throw Error(strformat("NCCL error %s (%d) at %s:%d in %s", ncclGetErrorString(static_cast<ncclResult_t>(result)),
                        result, file, line, expr));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string cuda_device_name(int device) {
  if (cuda_device_count() <= device) return "";
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

}  // namespace llmc
