#!/usr/bin/env bash
# dev/gpu_suite.sh: the GPU half of the test suite, for a machine with an NVIDIA GPU.
# Configures and builds with every core, then runs the CTest labels that need a GPU (gpu: kernels, attention, GEMMs,
# model parity with the PyTorch reference; integration: trainings, determinism, save/kill/resume), and writes the
# logs and a summary to LOGDIR. Exit status: that of ctest (0 = every GPU test passed).
#   usage: bash dev/gpu_suite.sh [LOGDIR] [BUILD_DIR]      (defaults: runs/gpu_suite, build)
#   CTEST_ARGS: extra ctest arguments, e.g. CTEST_ARGS="-E multi_gpu" on a one-GPU machine, "-R multi_gpu" on two.
#   The tests can share one GPU: "-E multi_gpu -j 3" ran them in 139-147 s on one H200 (about 500 s one at a time).
set -uo pipefail
cd "$(dirname "$0")/.."
LOGDIR=${1:-runs/gpu_suite}
BUILD=${2:-build}
mkdir -p "$LOGDIR"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGDIR/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee "$LOGDIR/commit.txt"

start=$(date +%s)
if ! { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" -j "$(nproc)"; } > "$LOGDIR/build.log" 2>&1; then
  tail -50 "$LOGDIR/build.log"
  echo "gpu_suite: build failed (log: $LOGDIR/build.log)"
  exit 2
fi
echo "gpu_suite: built in $(( $(date +%s) - start )) s"

start=$(date +%s)
# shellcheck disable=SC2086  # CTEST_ARGS is a list of words
(cd "$BUILD" && ctest -L 'gpu|integration' --output-on-failure --timeout 900 ${CTEST_ARGS:-}) > "$LOGDIR/ctest.log" 2>&1
rc=$?
grep -E "tests passed|Test +#|\*\*\*|Failed|Skipped" "$LOGDIR/ctest.log" | tail -40
echo "gpu_suite: ctest exit $rc after $(( $(date +%s) - start )) s (log: $LOGDIR/ctest.log)"
exit $rc
