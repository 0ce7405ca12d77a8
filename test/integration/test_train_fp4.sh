#!/usr/bin/env bash
# Integration (GPU): the FP4 recipes end to end on the tiny GPT-2 and the bundled KJV corpus.
#   1. nvfp4 (both blocks in FP4) trains: the loss falls, the log says what FP4 on this GPU is (FP4 numerics, BF16
#      products), and the numerics telemetry covers the FP4 tensors;
#   2. nvfp4 is deterministic with stochastic rounding on: two identical runs give bit-identical losses, and a run
#      stopped after step 6 and resumed from its checkpoint continues bit-identically (the random streams are keyed
#      by the seed, the step and the micro-step, so nothing about them is checkpointed);
#   3. the NVFP4 paper's ablations as config keys (no stochastic rounding, no Hadamard transform, 1x16 weights) and
#      MXFP4 for every role (keys; the products on FP8 tensor cores through the exact E4M3 remap, whose inexact-block
#      count reaches the telemetry) train with finite, falling losses;
#   4. mxfp4 (Quartet: QuEST forward, backward re-quantised under fresh random Hadamard signs every micro-step) trains,
#      logs what it is, reports the telemetry of its rotated tensors and the inexact-block count, repeats bit for bit
#      and resumes bit for bit (the signs, like stochastic rounding, are keyed by the seed, step and micro-step); its
#      SR backward, its no-mask / no-rotation ablations and the forward rotation with random signs train too.
# Skipped (exit 77) without a GPU, or when the GPU has no FP8 tensor cores (the MXFP4 products need Hopper; nvfp4
# alone runs from sm_80).
set -euo pipefail
TRAIN_GPT=${1:?usage: test_train_fp4.sh path/to/train_gpt}
source test/integration/training_common.sh
require_gpu 90 "the MXFP4 case needs compute capability 9.0"
prepare_kjv
short_run configs/gpt2_tiny_bf16.json
COMMON+=(--set log.numerics_every=6 --set precision.recipe=nvfp4 --set 'precision.bf16_layers=[]')
fail=0

# check <jsonl> <name> <min fall in nats>: 12 finite training losses that fall, validation that falls, and the FP4
# telemetry of the first block's attention input projection at steps 6 and 12.
check() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
name, fall = sys.argv[2], float(sys.argv[3])
train = [r["loss"] for r in recs if r["type"] == "train"]
val = [r["val_loss"] for r in recs if r["type"] == "eval"]
num = [r for r in recs if r["type"] == "numerics"]
assert len(train) == 12 and all(math.isfinite(x) for x in train), f"{name}: 12 finite train losses expected: {train}"
assert train[-1] < train[0] - fall, f"{name}: training loss did not fall by {fall} nat: {train}"
assert val[-1] < val[0], f"{name}: validation loss did not fall: {val}"
steps = sorted({r["step"] for r in num})
assert steps == [6, 12], f"{name}: numerics telemetry expected at steps 6 and 12, got {steps}"
names = {r["tensor"] for r in num if r["step"] == 6}
for role in ("x", "w", "dy"):
    assert f"transformer.h.0.attn.c_attn.{role}" in names, f"{name}: no telemetry for c_attn.{role}: {sorted(names)[:6]}"
for r in num:
    assert r["snr_db"] is None or r["snr_db"] > 5, f"{name}: implausible SNR {r}"
    assert 0 <= r["saturated_frac"] <= 1 and 0 <= r["underflow_frac"] <= 1, r
    assert 0 <= r["clipped_frac"] <= r["saturated_frac"], f"clipped values end at +-max: {r}"
inexact = [r["inexact_blocks"] for r in num if "inexact_blocks" in r]
if name == "mxfp4" or name.startswith("quartet"):
    assert inexact and all(isinstance(v, int) and v >= 0 for v in inexact), f"mxfp4: no inexact-block counts: {num[:2]}"
else:
    assert not inexact, f"{name}: inexact-block counts outside MXFP4: {inexact[:3]}"
print(f"{name}: train {train[0]:.3f} -> {train[-1]:.3f}, val {val[0]:.3f} -> {val[-1]:.3f}, {len(num)} numerics "
      f"records" + (f", {sum(inexact)} inexact MXFP4 blocks" if inexact else ""))
PY
}

echo "== nvfp4"
"$TRAIN_GPT" "${COMMON[@]}" --set "checkpoint.dir=$TMP/nvfp4" > "$TMP/nvfp4.log" 2>&1 ||
  { cat "$TMP/nvfp4.log"; echo "FAIL: nvfp4 run"; exit 1; }
grep -E "precision:|memory:|step +12/|val loss|numerics" "$TMP/nvfp4.log" | head -10
grep -q "precision: nvfp4 (.*FP4 numerics, products on BF16 tensor cores" "$TMP/nvfp4.log" ||
  { echo "FAIL: the log does not say what FP4 is on this GPU"; fail=1; }
check "$TMP/nvfp4/metrics.jsonl" nvfp4 0.5 || fail=1

echo "== nvfp4: determinism and bit-identical resume with stochastic rounding"
N=(--set log.numerics_every=0)
"$TRAIN_GPT" "${COMMON[@]}" "${N[@]}" --set "checkpoint.dir=$TMP/resume" --stop-at-step 6 > "$TMP/r1.log" 2>&1 ||
  { cat "$TMP/r1.log"; exit 1; }
"$TRAIN_GPT" "${COMMON[@]}" "${N[@]}" --set "checkpoint.dir=$TMP/resume" > "$TMP/r2.log" 2>&1 || { cat "$TMP/r2.log"; exit 1; }
grep -q "resumed from .*step_00000006 at step 6" "$TMP/r2.log" || { echo "FAIL: did not resume"; cat "$TMP/r2.log"; fail=1; }
"$TRAIN_GPT" "${COMMON[@]}" "${N[@]}" --set "log.jsonl=$TMP/again.jsonl" > "$TMP/again.log" 2>&1 ||
  { cat "$TMP/again.log"; exit 1; }
losses "$TMP/nvfp4/metrics.jsonl" > "$TMP/a.losses"
losses "$TMP/resume/metrics.jsonl" > "$TMP/b.losses"
losses "$TMP/again.jsonl" > "$TMP/c.losses"
diff "$TMP/a.losses" "$TMP/c.losses" || { echo "FAIL: two identical nvfp4 runs differ"; fail=1; }
diff "$TMP/a.losses" "$TMP/b.losses" || { echo "FAIL: the resumed nvfp4 run differs from the uninterrupted one"; fail=1; }

echo "== ablations and MXFP4"
declare -A VARIANT=(
  [no_sr]="--set precision.dy_rounding=nearest"
  [no_rht]="--set precision.wgrad_hadamard=0"
  [w_1x16]="--set precision.w_granularity=1x16"
  [mxfp4]="--set precision.x_granularity=1x32 --set precision.w_granularity=1x32 --set precision.dy_granularity=1x32
           --set precision.wgrad_hadamard=32"
)
for name in no_sr no_rht w_1x16 mxfp4; do
  # shellcheck disable=SC2086
  "$TRAIN_GPT" "${COMMON[@]}" ${VARIANT[$name]} --set "checkpoint.dir=$TMP/$name" > "$TMP/$name.log" 2>&1 ||
    { cat "$TMP/$name.log"; echo "FAIL: $name run"; fail=1; continue; }
  grep -E "precision:" "$TMP/$name.log"
  check "$TMP/$name/metrics.jsonl" "$name" 0.5 || fail=1
done
grep -q "products on FP8 tensor cores (exact E4M3 remap)" "$TMP/mxfp4.log" ||
  { echo "FAIL: the MXFP4 log does not name its products"; fail=1; }

echo "== mxfp4 (Quartet): trains, repeats and resumes bit for bit"
Q=(--set precision.recipe=mxfp4)
"$TRAIN_GPT" "${COMMON[@]}" "${Q[@]}" --set "checkpoint.dir=$TMP/quartet" > "$TMP/quartet.log" 2>&1 ||
  { cat "$TMP/quartet.log"; echo "FAIL: mxfp4 run"; exit 1; }
grep -E "precision:" "$TMP/quartet.log"
grep -q "precision: mxfp4 (.*backward re-quantises the saved codes under fresh random Hadamard-32 signs" \
  "$TMP/quartet.log" || { echo "FAIL: the mxfp4 log does not say what its backward is"; fail=1; }
grep -q "products on FP8 tensor cores (exact E4M3 remap)" "$TMP/quartet.log" ||
  { echo "FAIL: the mxfp4 log does not name its products"; fail=1; }
check "$TMP/quartet/metrics.jsonl" quartet 0.5 || fail=1
"$TRAIN_GPT" "${COMMON[@]}" "${Q[@]}" "${N[@]}" --set "checkpoint.dir=$TMP/qresume" --stop-at-step 6 \
  > "$TMP/q1.log" 2>&1 || { cat "$TMP/q1.log"; exit 1; }
"$TRAIN_GPT" "${COMMON[@]}" "${Q[@]}" "${N[@]}" --set "checkpoint.dir=$TMP/qresume" > "$TMP/q2.log" 2>&1 ||
  { cat "$TMP/q2.log"; exit 1; }
grep -q "resumed from .*step_00000006 at step 6" "$TMP/q2.log" || { echo "FAIL: mxfp4 did not resume"; fail=1; }
"$TRAIN_GPT" "${COMMON[@]}" "${Q[@]}" "${N[@]}" --set "log.jsonl=$TMP/qagain.jsonl" > "$TMP/qagain.log" 2>&1 ||
  { cat "$TMP/qagain.log"; exit 1; }
losses "$TMP/quartet/metrics.jsonl" > "$TMP/qa.losses"
losses "$TMP/qresume/metrics.jsonl" > "$TMP/qb.losses"
losses "$TMP/qagain.jsonl" > "$TMP/qc.losses"
diff "$TMP/qa.losses" "$TMP/qc.losses" || { echo "FAIL: two identical mxfp4 runs differ"; fail=1; }
diff "$TMP/qa.losses" "$TMP/qb.losses" || { echo "FAIL: the resumed mxfp4 run differs from the uninterrupted one"; fail=1; }
declare -A QVARIANT=(
  [quartet_sr]="--set precision.dy_rounding=stochastic"
  [quartet_no_mask]="--set precision.trust_mask=false"
  [quartet_no_rotation]="--set precision.forward_hadamard=0 --set precision.backward_hadamard=0"
  [quartet_signed]="--set precision.forward_signs=random"
)
for name in quartet_sr quartet_no_mask quartet_no_rotation quartet_signed; do
  # shellcheck disable=SC2086
  "$TRAIN_GPT" "${COMMON[@]}" "${Q[@]}" ${QVARIANT[$name]} --set "checkpoint.dir=$TMP/$name" > "$TMP/$name.log" 2>&1 ||
    { cat "$TMP/$name.log"; echo "FAIL: $name run"; fail=1; continue; }
  check "$TMP/$name/metrics.jsonl" "$name" 0.5 || fail=1
done

[ $fail -eq 0 ] && echo "PASS: nvfp4 trains, logs FP4 numerics, repeats and resumes bit for bit with stochastic rounding; its ablations and MXFP4 train; mxfp4 (Quartet) trains, repeats and resumes bit for bit, and its ablations train"
exit $fail
