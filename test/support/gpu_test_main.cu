// Shared main for the GPU test executables: without a usable GPU it prints why and exits 77, which CTest reports as
// skipped (never as passed). With a GPU it runs GoogleTest as usual.
#include <cstdio>

#include <gtest/gtest.h>

#include "llmc/core/common.h"

int main(int argc, char** argv) {
  if (llmc::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA GPU on this machine (GPU tests need one; run them on a GPU machine)\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
