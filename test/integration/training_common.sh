#!/usr/bin/env bash
# test/integration/training_common.sh: what the GPU training tests share, sourced by them (not a test itself):
#   require_gpu [MIN_CC REASON]  exit 77 (CTest's skip) without an NVIDIA GPU, or when its compute capability (e.g.
#                                89) is below MIN_CC, printing why
#   prepare_kjv                  TMP: a temporary directory (removed at exit) holding the bundled KJV corpus as shards,
#                                $TMP/data/kjv_{train,val}_*.bin
#   short_run CONFIG             COMMON: the overrides of a 12-step run of CONFIG on those shards (validation and
#                                checkpoints every 6 steps, a log record every step, no samples)
#   losses JSONL                 "step loss" of every train record, at full precision as logged
require_gpu() {
  if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIPPED: no NVIDIA GPU (this test trains on one)"
    exit 77
  fi
  if [ $# -ge 1 ]; then
    local cc
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
    if [ "${cc:-0}" -lt "$1" ]; then
      echo "SKIPPED: $2 (this GPU: compute capability $cc)"
      exit 77
    fi
  fi
}

prepare_kjv() {
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
  python3 dev/data/prepare.py --kjv --out "$TMP/data" --quiet
}

short_run() {
  COMMON=(--config "$1"
          --set "data.train=$TMP/data/kjv_train_*.bin" --set "data.val=$TMP/data/kjv_val_*.bin"
          --set train.steps=12 --set train.warmup_steps=2 --set eval.every=6 --set eval.batches=4
          --set sample.tokens=16 --set sample.every=0 --set checkpoint.every=6 --set log.every=1)
}

losses() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["type"] == "train": print(r["step"], repr(r["loss"]))' "$1"
}
