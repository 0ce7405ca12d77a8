#!/usr/bin/env bash
# dev/bench/peer_run.sh: llm8 beside its peers llm.c and PyTorch in one command on a GPU machine: GPT-2 124M
# (B=32 x 16) and 350M (B=16 x 32) in BF16, 524,288-token optimizer steps, ours and the peers alternating over two
# rounds (dev/bench/bench.py --peer torch,llmc --rounds 2), recorded in dev/bench/results/<gpu>.md with ours/peer.
#   usage: dev/bench/peer_run.sh [LLMC_TARBALL]        (default .peers/llm.c-cuda13.tar.gz)
# Prepares what is missing first: build/train_gpt (cmake, Release: minutes), .peers/llm.c extracted from LLMC_TARBALL
# (.peers/ is git-ignored; bench.py builds train_gpt2cu there, about 80 s on 16 cores) and the KJV shards (bench.py).
# Environment: STEPS (6) and WARMUP (2) per run, ROUNDS (2), PEERS (torch,llmc), BUILD (build), WORK (runs/peer_run),
# OUT (where set, as on the lent GPU machines: the results file, raw records and logs are copied there after each
# model). Prints the summary tables of both models last.
set -euo pipefail
cd "$(dirname "$0")/../.."
TARBALL=${1:-.peers/llm.c-cuda13.tar.gz}
PEER_DIR=.peers
LLMC_DIR=$PEER_DIR/llm.c
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-2}
PEERS=${PEERS:-torch,llmc}
BUILD=${BUILD:-build}
WORK=${WORK:-runs/peer_run}
start=$SECONDS
mkdir -p "$WORK"

if [ ! -f "$LLMC_DIR/Makefile" ]; then
  [ -f "$TARBALL" ] || { echo "peer_run: neither $LLMC_DIR/Makefile nor the tarball $TARBALL is here: copy" \
    "../shared/peers/llm.c-cuda13.tar.gz into $PEER_DIR/ (git-ignored) or give its path"; exit 1; }
  mkdir -p "$PEER_DIR"
  tar -xzf "$TARBALL" -C "$PEER_DIR"
  [ -f "$LLMC_DIR/Makefile" ] || { echo "peer_run: $TARBALL did not extract to $LLMC_DIR/Makefile"; exit 1; }
fi
if [ ! -x "$BUILD/train_gpt" ]; then
  echo "peer_run: building $BUILD/train_gpt (log $WORK/build.log) ..."
  { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" -j --target train_gpt; } \
    > "$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log"; echo "peer_run: building train_gpt failed"; exit 1; }
fi

keep() {  # copies the results and logs to $OUT, where it is set
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT/results"
  cp -r dev/bench/results/*.md dev/bench/results/raw "$OUT/results/" 2>/dev/null || true
  cp -r "$WORK" "$OUT/" 2>/dev/null || true
}

status=0
bench() {  # bench NAME SPEC ACCUM
  python3 dev/bench/bench.py --build "$BUILD" --runs "$2" --accum "$3" --recipe bf16 --steps "$STEPS" --warmup "$WARMUP" \
    --peer "$PEERS" --rounds "$ROUNDS" --llmc-dir "$LLMC_DIR" --timeout 300 --workdir "$WORK/$1" \
    2>&1 | tee "$WORK/$1.log" || status=1
  keep
}
bench gpt2_124m 124m:32:1024 16
bench gpt2_350m 350m:16:1024 32

echo
echo "== llm8 and its peers, $ROUNDS rounds of $STEPS steps ($WARMUP warm-up), $((SECONDS - start)) s in all"
for name in gpt2_124m gpt2_350m; do
  sed -n '/^run  .*ours\/peer$/,/^results:/p' "$WORK/$name.log" | grep -v '^results:' || true
done
exit $status
