#!/usr/bin/env bash
# dev/prove_refactor.sh: on a GPU machine, proves that this tree trains bit for bit like an earlier one and that the
# GPU suite still passes, in one go (the lease-friendly order: both builds in parallel, then the bit-identity runs and
# the GPU suite side by side on the same GPU; neither measures time, and every kernel is deterministic, so sharing
# the GPU changes no result).
#   usage: dev/prove_refactor.sh OLD_SRC OUT [JOBS]
#     OLD_SRC  a source tree of the earlier revision (e.g. `git archive <rev> | tar -x -C old`)
#     OUT      logs: build logs, bit_identity.md (the comparison table), gpu_suite/ (dev/gpu_suite.sh's logs), and
#              bits/ (the runs: their checkpoints take a few GB; BITS=DIR puts them elsewhere)
# Exit status: 0 when the builds succeed, every case is bit-identical (losses, validation losses, samples, state files,
# and the old build's step-25 checkpoints resumed by this build) and the GPU suite passes.
set -uo pipefail
cd "$(dirname "$0")/.."
OLD=$(cd "${1:?OLD_SRC}" && pwd)
OUT=${2:?OUT}
JOBS=${3:-$(nproc)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
NEW=$(pwd)

build() {  # build SRC BUILD_DIR JOBS LOG [TARGET]
  { cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release && cmake --build "$2" -j "$3" ${5:+--target "$5"}; } > "$4" 2>&1
}
start=$(date +%s)
half=$(( JOBS / 2 > 0 ? JOBS / 2 : 1 ))
build "$OLD" "$OLD/build" "$half" "$OUT/build_old.log" train_gpt & old_pid=$!  # the old tree: the trainer only
build "$NEW" "$NEW/build" "$half" "$OUT/build_new.log" & new_pid=$!
wait $old_pid; old_rc=$?
wait $new_pid; new_rc=$?
echo "prove_refactor: builds done in $(( $(date +%s) - start )) s (old rc $old_rc, new rc $new_rc)"
if [ $old_rc -ne 0 ] || [ $new_rc -ne 0 ]; then
  tail -30 "$OUT/build_old.log" "$OUT/build_new.log"
  exit 2
fi

# One copy of the bundled corpus for both builds and the suite, prepared before anything runs in parallel.
export DATA="$NEW/data/kjv"
ls "$DATA"/kjv_train_*.bin > /dev/null 2>&1 || python3 dev/data/prepare.py --kjv > "$OUT/prepare.log" 2>&1 ||
  { cat "$OUT/prepare.log"; exit 2; }
BITS=${BITS:-$OUT/bits}
start=$(date +%s)
(
  dev/bit_identity.sh record "$OLD" "$OLD/build" "$BITS/old" &&
  dev/bit_identity.sh record "$NEW" "$NEW/build" "$BITS/new" &&
  dev/bit_identity.sh resume "$NEW" "$NEW/build" "$BITS/old" "$BITS/resumed" &&
  dev/bit_identity.sh compare "$BITS/old" "$BITS/new" "$BITS/resumed"
) > "$OUT/bit_identity.log" 2>&1 & bits_pid=$!
bash dev/gpu_suite.sh "$OUT/gpu_suite" build > "$OUT/gpu_suite.log" 2>&1 & suite_pid=$!
wait $bits_pid; bits_rc=$?
wait $suite_pid; suite_rc=$?
grep -E "^\||bit identity" "$OUT/bit_identity.log" > "$OUT/bit_identity.md"
cat "$OUT/bit_identity.md"
[ $bits_rc -ne 0 ] && tail -20 "$OUT/bit_identity.log"
tail -25 "$OUT/gpu_suite.log"
echo "prove_refactor: bit identity rc $bits_rc, GPU suite rc $suite_rc, $(( $(date +%s) - start )) s"
[ $bits_rc -eq 0 ] && [ $suite_rc -eq 0 ]
