#!/usr/bin/env bash
# Integration (GPU): the FP8 recipes end to end on the tiny GPT-2 and the bundled KJV corpus.
#   1. every FP8 recipe trains (the loss falls), writes numerics telemetry to the JSONL log (every role of a linear,
#      also on a step right after an evaluation, whose forward built the weight codes), and plans smaller activation
#      buffers than BF16 (no BF16 copies of the linear inputs it saves as FP8);
#   2. fp8_delayed: two identical runs give bit-identical losses, and a run stopped after step 6 and resumed from its
#      checkpoint (amax histories and scales included) continues bit-identically;
#   3. precision.tensorwise_products: fp8_blockwise with all three products per-tensor gives fp8_tensorwise's losses
#      bit for bit, and with blocks in fprop only neither plain recipe's;
#   4. the divergence guard: a learning rate that blows the model up gives skipped steps, each logged with the first
#      non-finite gradient, and a clear stop after train.max_skipped_steps consecutive ones.
# Skipped (exit 77) without a GPU, or when the GPU has no FP8 tensor cores.
set -euo pipefail
TRAIN_GPT=${1:?usage: test_train_fp8.sh path/to/train_gpt}
source test/integration/training_common.sh
require_gpu 89 "FP8 needs compute capability 8.9 or newer"
prepare_kjv
short_run configs/gpt2_tiny_bf16.json
COMMON+=(--set log.numerics_every=6)
fail=0

# the model's planned activation buffers (BF16 copies of linear inputs are not kept when the linears save FP8 ones;
# the FP8 copies themselves are reported on the same line and measured by the benchmark's peak memory)
activation_mib() { sed -n 's/^memory: .* activations \([0-9.]*\) MiB.*/\1/p' "$1" | head -1; }

"$TRAIN_GPT" "${COMMON[@]}" --set log.numerics_every=0 --set "checkpoint.dir=$TMP/bf16" > "$TMP/bf16.log" 2>&1 ||
  { cat "$TMP/bf16.log"; exit 1; }
bf16_act=$(activation_mib "$TMP/bf16.log")

for recipe in fp8_tensorwise fp8_delayed fp8_blockwise; do
  echo "== $recipe"
  # Evaluations after steps 5 and 10: the numerics of step 6 follow one.
  "$TRAIN_GPT" "${COMMON[@]}" --set precision.recipe=$recipe --set eval.every=5 --set "checkpoint.dir=$TMP/$recipe" \
    > "$TMP/$recipe.log" 2>&1 ||
    { cat "$TMP/$recipe.log"; echo "FAIL: $recipe run"; fail=1; continue; }
  grep -E "precision:|activations|step +12/|val loss|numerics" "$TMP/$recipe.log" | head -12
  python3 - "$TMP/$recipe/metrics.jsonl" "$recipe" <<'PY' || fail=1
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r["loss"] for r in recs if r["type"] == "train"]
val = [r["val_loss"] for r in recs if r["type"] == "eval"]
num = [r for r in recs if r["type"] == "numerics"]
assert len(train) == 12 and all(math.isfinite(x) for x in train), "12 finite train losses expected"
assert train[-1] < train[0] - 1.0, f"{sys.argv[2]}: training loss did not fall by 1 nat: {train}"
assert val[-1] < val[0] - 1.0, f"{sys.argv[2]}: validation loss did not fall: {val}"
steps = sorted({r["step"] for r in num})
assert steps == [6, 12], f"numerics telemetry expected at steps 6 and 12, got {steps}"
for step in steps:
    names = {r["tensor"] for r in num if r["step"] == step}
    for role in ("x", "w", "dy"):
        assert f"transformer.h.0.attn.c_attn.{role}" in names, \
            f"no telemetry for c_attn.{role} at step {step}: {sorted(names)[:6]}"
for r in num:
    assert r["snr_db"] is None or r["snr_db"] > 10, f"implausible SNR {r}"
    assert 0 <= r["saturated_frac"] <= 1 and 0 <= r["underflow_frac"] <= 1, r
    assert 0 <= r["clipped_frac"] <= r["saturated_frac"], f"clipped values end at +-max: {r}"
print(f"{sys.argv[2]}: train {train[0]:.3f} -> {train[-1]:.3f}, val {val[0]:.3f} -> {val[-1]:.3f}, "
      f"{len(num)} numerics records")
PY
  act=$(activation_mib "$TMP/$recipe.log")
  python3 -c "import sys; a, b = float('$act'), float('$bf16_act'); print(f'activations: $recipe {a} MiB, bf16 {b} MiB');
sys.exit(0 if a < b else 1)" || { echo "FAIL: $recipe plans no smaller activation buffers than bf16"; fail=1; }
done

echo "== fp8_delayed: determinism and bit-identical resume"
D=(--set precision.recipe=fp8_delayed --set log.numerics_every=0)
"$TRAIN_GPT" "${COMMON[@]}" "${D[@]}" --set "checkpoint.dir=$TMP/resume" --stop-at-step 6 > "$TMP/r1.log" 2>&1 ||
  { cat "$TMP/r1.log"; exit 1; }
"$TRAIN_GPT" "${COMMON[@]}" "${D[@]}" --set "checkpoint.dir=$TMP/resume" > "$TMP/r2.log" 2>&1 || { cat "$TMP/r2.log"; exit 1; }
grep -q "resumed from .*step_00000006 at step 6" "$TMP/r2.log" || { echo "FAIL: did not resume"; cat "$TMP/r2.log"; fail=1; }
[ -f "$TMP/resume/step_00000006/precision_state.safetensors" ] || { echo "FAIL: no precision state in checkpoint"; fail=1; }
"$TRAIN_GPT" "${COMMON[@]}" "${D[@]}" --set "log.jsonl=$TMP/again.jsonl" > "$TMP/again.log" 2>&1 || { cat "$TMP/again.log"; exit 1; }
losses "$TMP/fp8_delayed/metrics.jsonl" > "$TMP/a.losses"
losses "$TMP/resume/metrics.jsonl" > "$TMP/b.losses"
losses "$TMP/again.jsonl" > "$TMP/c.losses"
diff "$TMP/a.losses" "$TMP/c.losses" || { echo "FAIL: two identical fp8_delayed runs differ"; fail=1; }
diff "$TMP/a.losses" "$TMP/b.losses" || { echo "FAIL: the resumed fp8_delayed run differs from the uninterrupted one"; fail=1; }

echo "== precision.tensorwise_products: fp8_blockwise with every product per-tensor trains as fp8_tensorwise"
T=(--set log.numerics_every=0)
"$TRAIN_GPT" "${COMMON[@]}" "${T[@]}" --set precision.recipe=fp8_tensorwise --set "log.jsonl=$TMP/tw.jsonl" \
  > "$TMP/tw.log" 2>&1 || { cat "$TMP/tw.log"; exit 1; }
for products in fprop,dgrad,wgrad dgrad,wgrad; do
  "$TRAIN_GPT" "${COMMON[@]}" "${T[@]}" --set precision.recipe=fp8_blockwise --set "precision.tensorwise_products=$products" \
    --set "log.jsonl=$TMP/mixed_$products.jsonl" > "$TMP/mixed_$products.log" 2>&1 ||
    { cat "$TMP/mixed_$products.log"; echo "FAIL: tensorwise_products=$products run"; fail=1; continue; }
  grep -q "per-tensor scales in $products" "$TMP/mixed_$products.log" ||
    { echo "FAIL: the log does not describe tensorwise_products=$products"; fail=1; }
  losses "$TMP/mixed_$products.jsonl" > "$TMP/mixed_$products.losses"
done
losses "$TMP/tw.jsonl" > "$TMP/tw.losses"
losses "$TMP/fp8_blockwise/metrics.jsonl" > "$TMP/bw.losses"
diff -q "$TMP/tw.losses" "$TMP/mixed_fprop,dgrad,wgrad.losses" > /dev/null ||
  { echo "FAIL: fp8_blockwise with tensorwise_products=fprop,dgrad,wgrad differs from fp8_tensorwise"; fail=1; }
if diff -q "$TMP/tw.losses" "$TMP/mixed_dgrad,wgrad.losses" > /dev/null ||
   diff -q "$TMP/bw.losses" "$TMP/mixed_dgrad,wgrad.losses" > /dev/null; then
  echo "FAIL: blocks in fprop only gave the losses of one of the plain recipes"; fail=1
fi
tail -1 "$TMP/mixed_dgrad,wgrad.losses"

echo "== divergence guard"
set +e
"$TRAIN_GPT" "${COMMON[@]}" --set precision.recipe=fp8_tensorwise --set train.lr=1e30 --set train.warmup_steps=0 \
  --set train.max_skipped_steps=3 --set log.numerics_every=0 --set "log.jsonl=$TMP/guard.jsonl" > "$TMP/guard.log" 2>&1
rc=$?
set -e
if [ $rc -eq 0 ] || ! grep -q "training diverged: 3 consecutive steps" "$TMP/guard.log" ||
   ! grep -q "skipped: loss" "$TMP/guard.log"; then
  echo "FAIL: the divergence guard did not stop the run as documented (exit $rc)"; cat "$TMP/guard.log"; fail=1
else
  grep -E "skipped|error" "$TMP/guard.log" | head -5
  python3 -c "
import json, sys
skips = [json.loads(l) for l in open('$TMP/guard.jsonl') if json.loads(l)['type'] == 'skip']
assert len(skips) == 3 and all(s['first_nonfinite_gradient'] for s in skips), skips" || fail=1
fi

[ $fail -eq 0 ] && echo "PASS: FP8 recipes train, log numerics, save activation memory; fp8_delayed is deterministic and resumes bit-identically; per-tensor products of fp8_blockwise are fp8_tensorwise's; the divergence guard stops cleanly"
exit $fail
