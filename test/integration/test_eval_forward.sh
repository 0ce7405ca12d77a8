#!/usr/bin/env bash
# Integration (GPU): the validation loss is the loss of the function that training optimises. For every recipe and
# both model families, an evaluation forward (no gradients) and a training forward of the same batch with the same
# weights give the same loss. The trainer evaluates after step 6 on a validation shard built to hold exactly the
# batch that step 7 trains on (data.shuffle=false: step k reads windows (k-1)B .. kB-1 of the first training shard),
# so val_loss at step 6 and the training loss of step 7 must agree to the rounding of their sums (the one is summed
# on the host, the other on the device). A recipe whose evaluation quantised differently from its training (another
# kernel, scale, rotation, a weight cache one step stale, delayed scaling's history) would be off by far more.
# Skipped (exit 77) without a GPU, or below compute capability 9.0 (the FP8 and MXFP4 products need Hopper).
set -euo pipefail
TRAIN_GPT=${1:?usage: test_eval_forward.sh path/to/train_gpt}
source test/integration/training_common.sh
require_gpu 90 "the FP8 and MXFP4 recipes need compute capability 9.0"
prepare_kjv

B=8
T=128
EVAL_STEP=6
# The validation shard: the tokens of step EVAL_STEP+1's batch (B windows of T+1 tokens at stride T).
python3 - "$TMP/data" "$B" "$T" "$EVAL_STEP" <<'PY'
import glob, os, sys
import numpy as np
data, B, T, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
first = sorted(glob.glob(os.path.join(data, "kjv_train_*.bin")))[0]
header = np.fromfile(first, dtype="<i4", count=256)
assert header[0] == 20240520 and header[1] == 1, f"{first}: not a uint16 shard: {header[:3]}"
tokens = np.fromfile(first, dtype="<u2", offset=256 * 4, count=int(header[2]))
start = k * B * T
assert start + B * T + 1 <= len(tokens), f"{first}: {len(tokens)} tokens, fewer than {k + 1} batches"
out = np.zeros(256, dtype="<i4")
out[:3] = (20240520, 1, B * T + 1)
with open(os.path.join(data, "step_batch_val_000000.bin"), "wb") as f:
    f.write(out.tobytes())
    f.write(tokens[start:start + B * T + 1].astype("<u2").tobytes())
PY

fail=0
for config in configs/gpt2_tiny_bf16.json configs/llama_tiny_bf16.json; do
  model=$(basename "$config" _bf16.json)
  for recipe in bf16 fp8_tensorwise fp8_delayed fp8_blockwise coat nvfp4 mxfp4; do
    run="$TMP/${model}_$recipe"
    if ! "$TRAIN_GPT" --config "$config" \
        --set "data.train=$TMP/data/kjv_train_*.bin" --set "data.val=$TMP/data/step_batch_val_*.bin" \
        --set data.shuffle=false --set train.micro_batch=$B --set train.seq_len=$T --set train.global_batch_tokens=0 \
        --set train.steps=$((EVAL_STEP + 1)) --set train.warmup_steps=2 --set eval.every=$EVAL_STEP \
        --set eval.batches=1 --set sample.every=0 --set sample.tokens=0 --set checkpoint.dir= --set log.every=1 \
        --set precision.recipe=$recipe --set 'precision.bf16_layers=[]' --set "log.jsonl=$run.jsonl" \
        > "$run.log" 2>&1; then
      cat "$run.log"
      echo "FAIL: $model $recipe: the run failed"
      fail=1
      continue
    fi
    python3 - "$run.jsonl" "$model $recipe" "$EVAL_STEP" <<'PY' || fail=1
import json, sys
path, name, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
recs = [json.loads(line) for line in open(path)]
evals = {r["step"]: r["val_loss"] for r in recs if r["type"] == "eval"}
train = {r["step"]: r["loss"] for r in recs if r["type"] == "train"}
if k not in evals or k + 1 not in train:
    sys.exit(f"FAIL: {name}: no validation at step {k} or no training loss at step {k + 1}: {sorted(evals)}, "
             f"{sorted(train)}")
ev, tr = evals[k], train[k + 1]
rel = abs(ev - tr) / abs(tr)
# Each loss is a mean of 1024 per-token losses in FP32; the two sums differ by a few FP32 roundings at most.
ok = rel <= 1e-5
print(f"{'ok  ' if ok else 'FAIL'} {name}: evaluation {ev!r}, training {tr!r}, relative difference {rel:.2e}")
sys.exit(0 if ok else 1)
PY
  done
done
[ "$fail" -eq 0 ] && echo "PASS: every recipe evaluates the function it trains" || exit 1
