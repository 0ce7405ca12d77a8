#!/usr/bin/env bash
# Integration (GPU): short trainings of the tiny GPT-2 on the bundled KJV corpus.
#   1. the loss falls (train and validation) and a sample is printed;
#   2. determinism: the same run twice gives bit-identical losses;
#   3. resume: a run stopped after step 6 and resumed from its checkpoint continues bit-identically to an
#      uninterrupted run (losses of every later step equal to the last bit, as written in the JSONL log).
# Skipped (exit 77) without a GPU.
set -euo pipefail
TRAIN_GPT=${1:?usage: test_train_gpu.sh path/to/train_gpt}
source test/integration/training_common.sh
require_gpu
prepare_kjv
short_run configs/gpt2_tiny_bf16.json

echo "== uninterrupted run A"
"$TRAIN_GPT" "${COMMON[@]}" --set "checkpoint.dir=$TMP/runA" > "$TMP/a.log" 2>&1 || { cat "$TMP/a.log"; exit 1; }
cat "$TMP/a.log"
echo "== run B: stop after step 6, then resume"
"$TRAIN_GPT" "${COMMON[@]}" --set "checkpoint.dir=$TMP/runB" --stop-at-step 6 > "$TMP/b1.log" 2>&1 || { cat "$TMP/b1.log"; exit 1; }
"$TRAIN_GPT" "${COMMON[@]}" --set "checkpoint.dir=$TMP/runB" > "$TMP/b2.log" 2>&1 || { cat "$TMP/b2.log"; exit 1; }
grep -q "resumed from .*step_00000006 at step 6" "$TMP/b2.log" || { echo "FAIL: run B did not resume from step 6"; cat "$TMP/b2.log"; exit 1; }
echo "== run C: same config as A, no checkpoints"
"$TRAIN_GPT" "${COMMON[@]}" --set "log.jsonl=$TMP/c.jsonl" > "$TMP/c.log" 2>&1 || { cat "$TMP/c.log"; exit 1; }

losses "$TMP/runA/metrics.jsonl" > "$TMP/a.losses"
losses "$TMP/runB/metrics.jsonl" > "$TMP/b.losses"
losses "$TMP/c.jsonl" > "$TMP/c.losses"
fail=0
if ! diff "$TMP/a.losses" "$TMP/c.losses"; then echo "FAIL: two identical runs gave different losses"; fail=1; fi
if ! diff "$TMP/a.losses" "$TMP/b.losses"; then echo "FAIL: the resumed run differs from the uninterrupted one"; fail=1; fi
python3 - "$TMP/runA/metrics.jsonl" <<'PY' || fail=1
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r["loss"] for r in recs if r["type"] == "train"]
val = [r["val_loss"] for r in recs if r["type"] == "eval"]
samples = [r for r in recs if r["type"] == "sample"]
print("train losses:", [round(x, 3) for x in train], "val:", [round(x, 3) for x in val])
assert len(train) == 12, "expected 12 train records"
assert train[-1] < train[0] - 1.0, "training loss did not fall by 1 nat in 12 steps"
assert len(val) >= 2 and val[-1] < val[0] - 1.0, "validation loss did not fall"
assert samples and samples[-1]["text"], "no sample text"
PY
[ -f "$TMP/runA/step_00000012/DONE" ] || { echo "FAIL: final checkpoint missing"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: loss falls, runs are deterministic, resume is bit-identical"
exit $fail
