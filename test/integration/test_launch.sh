#!/usr/bin/env bash
# test/integration/test_launch: multi-process launches of train_gpt that must fail fast and clearly, with every GPU
# hidden (so it runs the same on any machine): the launchers (scripts/run_local.sh, scripts/run_mpi.sh when mpirun
# exists) and the rendezvous (TCP and shared directory) carry each rank's startup error to every rank; a rank whose
# config does not load still tells the others (they stop at once instead of waiting for parallel.timeout_s); a peer
# that never starts is a timeout naming it; inconsistent launcher variables are refused. Every check is timed: nothing
# may wait for the 60 s timeout set here. Usage: test_launch.sh path/to/train_gpt (run from the repository root).
set -u
BIN=$(realpath "$1")
export LLM8_TRAIN_GPT=$BIN
export CUDA_VISIBLE_DEVICES=""
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "PASS: $*"; }
unset WORLD_SIZE RANK LOCAL_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMI_SIZE PMI_RANK SLURM_NTASKS SLURM_PROCID
CFG=(--config configs/gpt2_tiny_bf16.json --set parallel.timeout_s=60)

# expect LOG NEEDLE: the log contains NEEDLE
expect() { grep -qF -- "$2" "$1" || fail "$3: '$2' not in $(basename "$1"): $(tr '\n' '|' <"$1" | head -c 600)"; }

# 1. Two ranks without GPUs: both stop at once, each naming itself.
start=$SECONDS
LLM8_LOG_DIR=$WORK/no_gpu LLM8_KILL_GRACE_S=60 timeout 120 scripts/run_local.sh 2 "${CFG[1]}" "${CFG[@]:2}" 2>"$WORK/launcher.err"
rc=$?
[ $rc -eq 1 ] || fail "no GPU: run_local.sh exit $rc, expected 1"
[ $((SECONDS - start)) -lt 20 ] || fail "no GPU: took $((SECONDS - start)) s"
for r in 0 1; do expect "$WORK/no_gpu/rank$r.log" "[rank $r] error: no CUDA GPU is visible to rank $r" "no GPU"; done
expect "$WORK/launcher.err" "run_local.sh: failed (exit codes: rank 0: 1; rank 1: 1)" "no GPU"
[ $failures -eq 0 ] && pass "run_local.sh: two ranks without a GPU stop at once, each naming itself"

# 2. Rank 1's config does not load: it still reaches the rendezvous, so rank 0 stops at once too (by itself: the
#    launcher's grace is longer than the test allows).
before=$failures
cat >"$WORK/bad_rank1.sh" <<EOF
#!/usr/bin/env bash
extra=()
[ "\$RANK" = 1 ] && extra=(--set train.lr=fast)
exec "$BIN" ${CFG[*]} "\${extra[@]}"
EOF
chmod +x "$WORK/bad_rank1.sh"
start=$SECONDS
LLM8_LOG_DIR=$WORK/bad_cfg LLM8_KILL_GRACE_S=60 timeout 120 scripts/run_local.sh 2 -- "$WORK/bad_rank1.sh" 2>/dev/null
rc=$?
[ $rc -eq 1 ] || fail "bad config: exit $rc"
[ $((SECONDS - start)) -lt 20 ] || fail "bad config: took $((SECONDS - start)) s (rank 0 waited for a timeout?)"
expect "$WORK/bad_cfg/rank1.log" "[rank 1] error: --set 'train.lr=fast': train.lr: expected a number" "bad config"
expect "$WORK/bad_cfg/rank0.log" "[rank 0] error:" "bad config"
[ $failures -eq $before ] && pass "a rank whose config does not load stops every rank at once"

# 3. The shared-directory rendezvous in the real binary.
before=$failures
start=$SECONDS
LLM8_JOB_ID=launch-test-$$ LLM8_LOG_DIR=$WORK/fs LLM8_KILL_GRACE_S=60 timeout 120 scripts/run_local.sh 2 \
  "${CFG[1]}" "${CFG[@]:2}" --set parallel.init=fs --set "parallel.fs_path=$WORK/rdv" 2>/dev/null
rc=$?
[ $rc -eq 1 ] || fail "fs init: exit $rc"
[ $((SECONDS - start)) -lt 20 ] || fail "fs init: took $((SECONDS - start)) s"
for r in 0 1; do expect "$WORK/fs/rank$r.log" "[rank $r] error: no CUDA GPU is visible" "fs init"; done
[ $failures -eq $before ] && pass "parallel.init=fs: the ranks meet through the shared directory"

# 4. A peer that never starts: rank 0 gives up after parallel.timeout_s (here 2 s).
before=$failures
start=$SECONDS
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((30000 + $$ % 20000)) \
  timeout 60 "$BIN" "${CFG[@]}" --set parallel.timeout_s=2 >"$WORK/alone.out" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "alone: exit $rc"
[ $((SECONDS - start)) -lt 20 ] || fail "alone: took $((SECONDS - start)) s"
expect "$WORK/alone.out" "[rank 1] error: no CUDA GPU is visible to rank 1" "alone"
[ $failures -eq $before ] && pass "a rank whose peers never come stops after parallel.timeout_s"

# 5. Launcher variables that cannot describe a job.
before=$failures
WORLD_SIZE=2 "$BIN" "${CFG[@]}" >/dev/null 2>"$WORK/e5" ; expect "$WORK/e5" "WORLD_SIZE=2 is set but RANK is not" "vars"
RANK=2 WORLD_SIZE=2 LOCAL_RANK=0 "$BIN" "${CFG[@]}" >/dev/null 2>"$WORK/e6"; expect "$WORK/e6" "rank out of range: RANK=2" "vars"
OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0 WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 \
  "$BIN" "${CFG[@]}" >/dev/null 2>"$WORK/e7"; expect "$WORK/e7" "disagree on the world size" "vars"
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 "$BIN" "${CFG[@]}" --set parallel.init=none >/dev/null 2>"$WORK/e8"
expect "$WORK/e8" "[rank 0] error: parallel.init = none, but the launcher started 2 processes" "vars"
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 "$BIN" "${CFG[@]}" >/dev/null 2>"$WORK/e9"
expect "$WORK/e9" "no way to exchange the NCCL id: set MASTER_ADDR and MASTER_PORT" "vars"
# the dry run checks the data: one valid shard
python3 -c 'import struct, sys; open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, 4096, *[0] * 253)
                                                               + bytes(8192))' "$WORK/shard.bin"
WORLD_SIZE=2 "$BIN" "${CFG[@]}" --set "data.train=$WORK/shard.bin" --set "data.val=$WORK/shard.bin" --dry-run \
  >/dev/null 2>&1 || fail "vars: --dry-run with WORLD_SIZE alone must work"
[ $failures -eq $before ] && pass "inconsistent launcher variables are refused with a message naming them"

# 6. mpirun, when installed: the same fast failure through Open MPI.
if command -v mpirun >/dev/null; then
  before=$failures
  start=$SECONDS
  timeout 120 scripts/run_mpi.sh 2 "${CFG[1]}" "${CFG[@]:2}" >"$WORK/mpi.out" 2>&1
  rc=$?
  [ $rc -ne 0 ] || fail "mpirun: exit 0"
  [ $((SECONDS - start)) -lt 30 ] || fail "mpirun: took $((SECONDS - start)) s"
  expect "$WORK/mpi.out" "error: no CUDA GPU is visible to rank" "mpirun"
  [ $failures -eq $before ] && pass "scripts/run_mpi.sh: the ranks stop at once"
else
  echo "SKIP: mpirun not installed (the mpirun launch is not checked)"
fi

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all launch checks passed"
