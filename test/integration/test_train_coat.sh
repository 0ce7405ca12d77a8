#!/usr/bin/env bash
# Integration (GPU): the coat recipe (COAT: FP8 GEMMs, the norm / GELU / SwiGLU inputs saved as E4M3 1x16 groups,
# GELU / SwiGLU computed from their input's copy and recomputed in backward, the weights' FP8 codes made in every
# forward and backward, FP8 AdamW moments with dynamic range expansion) end to end on the tiny GPT-2 and the tiny
# Llama, KJV corpus:
#   1. the preset trains (the loss falls), logs the recipe and the fp8_expand moments, and plans less memory than the
#      FP8 copies alone (precision.recompute_mlp_act = false, the weight cache on), which plan smaller activation
#      buffers than fp8_tensorwise;
#   2. the FP8 copies alone change only backward: their first step's loss (a forward from the same initial weights)
#      equals fp8_tensorwise's bit for bit, and a later one differs from a run with precision.nonlinear_fp8 = false
#      (so backward read the copies); the preset's first loss moves from theirs by the copy's rounding only (its
#      forward computes the activation from the copy);
#   3. two identical runs of the preset give bit-identical losses, and a run stopped after step 6 and resumed from its
#      checkpoint (FP8 moments with their scales, exponents and centres) continues bit-identically;
#   4. with the weight cache on (precision.cache_weights = true: each weight's codes made once per step and kept) the
#      losses are the preset's bit for bit, and the plan is larger.
# Skipped (exit 77) without a GPU, or when the GPU has no FP8 tensor cores.
set -euo pipefail
TRAIN_GPT=${1:?usage: test_train_coat.sh path/to/train_gpt}
source test/integration/training_common.sh
require_gpu 89 "coat's GEMMs are FP8: they need compute capability 8.9 or newer"
prepare_kjv
fail=0

activation_mib() { sed -n 's/^memory: .* activations \([0-9.]*\) MiB.*/\1/p' "$1" | head -1; }
loss_at() { losses "$1" | awk -v s="$2" '$1 == s { print $2 }'; }

for config in configs/gpt2_tiny_bf16.json configs/llama_tiny_bf16.json; do
  name=$(basename "$config" _bf16.json)
  echo "== $name"
  short_run "$config"
  # Four blocks: with two, the two residual-stream working buffers outweigh what the copies save.
  COMMON+=(--set model.n_layer=4)
  run() {  # run LABEL [overrides...]
    local label=$1
    shift
    "$TRAIN_GPT" "${COMMON[@]}" --set "checkpoint.dir=$TMP/$name.$label" "$@" > "$TMP/$name.$label.log" 2>&1 ||
      { cat "$TMP/$name.$label.log"; echo "FAIL: $name $label run"; return 1; }
  }
  COPIES=(--set precision.recipe=coat --set precision.recompute_mlp_act=false --set precision.cache_weights=true
          --set precision.cache_weight_transpose=true)
  run fp8 --set precision.recipe=fp8_tensorwise || { fail=1; continue; }
  run coat --set precision.recipe=coat || { fail=1; continue; }
  run copies "${COPIES[@]}" || { fail=1; continue; }
  run no_copies "${COPIES[@]}" --set precision.nonlinear_fp8=false || { fail=1; continue; }
  grep -E "precision:|optimizer:|activations" "$TMP/$name.coat.log" | head -4
  grep -q "^optimizer: AdamW, moments stored as fp8_expand" "$TMP/$name.coat.log" ||
    { echo "FAIL: $name: coat did not store the moments as fp8_expand"; fail=1; }
  grep -q "inputs saved as e4m3 1x16 groups, GELU / SwiGLU computed from them and recomputed in backward" \
    "$TMP/$name.coat.log" || { echo "FAIL: $name: the recipe line does not name the FP8 copies and the recomputation"; fail=1; }
  grep -q "weight codes made in every forward and backward (no weight cache)" "$TMP/$name.coat.log" ||
    { echo "FAIL: $name: the recipe line does not say the weights are quantised in every pass"; fail=1; }
  python3 - "$TMP/$name.coat/metrics.jsonl" "$TMP/$name.copies/metrics.jsonl" "$name" <<'PY' || fail=1
import json, math, sys
def load(p):
    return [json.loads(l) for l in open(p)]
coat, copies, name = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
train = [r["loss"] for r in coat if r["type"] == "train"]
val = [r["val_loss"] for r in coat if r["type"] == "eval"]
assert len(train) == 12 and all(math.isfinite(x) for x in train), "12 finite train losses expected"
assert train[-1] < train[0] - 1.0, f"{name} coat: training loss did not fall by 1 nat: {train}"
assert val[-1] < val[0] - 0.5, f"{name} coat: validation loss did not fall: {val}"
copies_train = [r["loss"] for r in copies if r["type"] == "train"]
# The preset's forward computes the activation from its FP8 copy: even the first loss moves, by the copy's rounding.
assert train[0] != copies_train[0], f"{name}: the first loss is the copies-only run's: the forward did not read the copy"
assert abs(train[0] - copies_train[0]) < 0.01 * abs(copies_train[0]), (train[0], copies_train[0])
est = lambda recs: [r["estimate_bytes"] for r in recs if r["type"] == "memory"][0]
assert est(coat) < est(copies), f"{name}: coat planned {est(coat)} B, not less than the copies alone {est(copies)} B"
print(f"{name} coat: train {train[0]:.4f} -> {train[-1]:.4f}, val {val[0]:.3f} -> {val[-1]:.3f}; "
      f"plan {est(coat)} B vs the copies alone {est(copies)} B")
PY
  act_fp8=$(activation_mib "$TMP/$name.fp8.log")
  act_copies=$(activation_mib "$TMP/$name.copies.log")
  python3 -c "import sys; a, b = float('$act_copies'), float('$act_fp8'); print(f'activations: FP8 copies {a} MiB, fp8_tensorwise {b} MiB');
sys.exit(0 if a < b else 1)" || { echo "FAIL: $name: the FP8 copies plan no smaller activation buffers than fp8_tensorwise"; fail=1; }
  first_fp8=$(loss_at "$TMP/$name.fp8/metrics.jsonl" 1)
  first_copies=$(loss_at "$TMP/$name.copies/metrics.jsonl" 1)
  [ -n "$first_copies" ] && [ "$first_copies" = "$first_fp8" ] ||
    { echo "FAIL: $name: the copies' first loss $first_copies is not fp8_tensorwise's $first_fp8 (the forward changed)"; fail=1; }
  if [ "$(loss_at "$TMP/$name.copies/metrics.jsonl" 3)" = "$(loss_at "$TMP/$name.no_copies/metrics.jsonl" 3)" ]; then
    echo "FAIL: $name: step 3 is the same with and without the FP8 copies: backward did not read them"; fail=1
  fi

  echo "== $name coat: determinism and bit-identical resume"
  run again --set precision.recipe=coat || { fail=1; continue; }
  "$TRAIN_GPT" "${COMMON[@]}" --set precision.recipe=coat --set "checkpoint.dir=$TMP/$name.resume" --stop-at-step 6 \
    > "$TMP/$name.r1.log" 2>&1 || { cat "$TMP/$name.r1.log"; fail=1; continue; }
  "$TRAIN_GPT" "${COMMON[@]}" --set precision.recipe=coat --set "checkpoint.dir=$TMP/$name.resume" \
    > "$TMP/$name.r2.log" 2>&1 || { cat "$TMP/$name.r2.log"; fail=1; continue; }
  grep -q "resumed from .*step_00000006 at step 6" "$TMP/$name.r2.log" ||
    { echo "FAIL: $name: did not resume"; cat "$TMP/$name.r2.log"; fail=1; }
  losses "$TMP/$name.coat/metrics.jsonl" > "$TMP/a.losses"
  losses "$TMP/$name.again/metrics.jsonl" > "$TMP/b.losses"
  losses "$TMP/$name.resume/metrics.jsonl" > "$TMP/c.losses"
  diff "$TMP/a.losses" "$TMP/b.losses" || { echo "FAIL: $name: two identical coat runs differ"; fail=1; }
  diff "$TMP/a.losses" "$TMP/c.losses" || { echo "FAIL: $name: the resumed coat run differs from the uninterrupted one"; fail=1; }

  echo "== $name coat with the weight cache (precision.cache_weights = true): the same losses, more memory"
  run cached --set precision.recipe=coat --set precision.cache_weights=true || { fail=1; continue; }
  losses "$TMP/$name.cached/metrics.jsonl" > "$TMP/d.losses"
  diff "$TMP/a.losses" "$TMP/d.losses" || { echo "FAIL: $name: coat with a weight cache differs from coat without"; fail=1; }
  grep -q "transposed weight codes made in every backward" "$TMP/$name.cached.log" ||
    { echo "FAIL: $name: the recipe line does not say the weight transposes are made in backward"; fail=1; }
  python3 - "$TMP/$name.cached/metrics.jsonl" "$TMP/$name.coat/metrics.jsonl" "$name" <<'PY' || fail=1
import json, sys
est = lambda p: [json.loads(l)["estimate_bytes"] for l in open(p) if json.loads(l)["type"] == "memory"][0]
cached, coat = est(sys.argv[1]), est(sys.argv[2])
assert coat < cached, f"{sys.argv[3]}: coat planned {coat} B, not less than with a weight cache {cached} B"
print(f"{sys.argv[3]}: plan with a weight cache {cached} B, coat {coat} B")
PY
done

[ $fail -eq 0 ] && echo "PASS: coat trains GPT-2 and Llama with FP8 moments, FP8 activation copies that leave the forward bit-identical alone, and less memory with the recomputed activation and without a weight cache; it repeats and resumes bit for bit"
exit $fail
