#!/usr/bin/env bash
# Integration (GPU): the coat recipe (COAT: FP8 GEMMs, the norm / GELU / SwiGLU inputs saved as E4M3 1x16 groups, FP8
# AdamW moments with dynamic range expansion) end to end on the tiny GPT-2 and the tiny Llama, KJV corpus:
#   1. it trains (the loss falls), logs the recipe and the fp8_expand moments, and plans smaller activation buffers
#      than fp8_tensorwise;
#   2. the FP8 copies change only backward: the first step's loss (a forward from the same initial weights) equals
#      fp8_tensorwise's bit for bit, and a later one differs from coat's own run with precision.nonlinear_fp8 = false
#      (so backward read the copies);
#   3. two identical runs give bit-identical losses, and a run stopped after step 6 and resumed from its checkpoint
#      (FP8 moments with their scales, exponents and centres) continues bit-identically;
#   4. with precision.recompute_mlp_act (GELU / SwiGLU computed from their input's FP8 copy and recomputed in
#      backward): it trains, its first loss moves from coat's by the copy's rounding only, it plans less memory, and
#      it repeats and resumes bit for bit.
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
  run fp8 --set precision.recipe=fp8_tensorwise || { fail=1; continue; }
  run coat --set precision.recipe=coat || { fail=1; continue; }
  run bf16_copies --set precision.recipe=coat --set precision.nonlinear_fp8=false || { fail=1; continue; }
  grep -E "precision:|optimizer:|activations" "$TMP/$name.coat.log" | head -4
  grep -q "^optimizer: AdamW, moments stored as fp8_expand" "$TMP/$name.coat.log" ||
    { echo "FAIL: $name: coat did not store the moments as fp8_expand"; fail=1; }
  grep -q "inputs saved as e4m3 1x16 groups" "$TMP/$name.coat.log" ||
    { echo "FAIL: $name: the recipe line does not name the FP8 non-linear inputs"; fail=1; }
  python3 - "$TMP/$name.coat/metrics.jsonl" "$name" <<'PY' || fail=1
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r["loss"] for r in recs if r["type"] == "train"]
val = [r["val_loss"] for r in recs if r["type"] == "eval"]
assert len(train) == 12 and all(math.isfinite(x) for x in train), "12 finite train losses expected"
assert train[-1] < train[0] - 1.0, f"{sys.argv[2]} coat: training loss did not fall by 1 nat: {train}"
assert val[-1] < val[0] - 0.5, f"{sys.argv[2]} coat: validation loss did not fall: {val}"
print(f"{sys.argv[2]} coat: train {train[0]:.3f} -> {train[-1]:.3f}, val {val[0]:.3f} -> {val[-1]:.3f}")
PY
  act_fp8=$(activation_mib "$TMP/$name.fp8.log")
  act_coat=$(activation_mib "$TMP/$name.coat.log")
  python3 -c "import sys; a, b = float('$act_coat'), float('$act_fp8'); print(f'activations: coat {a} MiB, fp8_tensorwise {b} MiB');
sys.exit(0 if a < b else 1)" || { echo "FAIL: $name: coat plans no smaller activation buffers than fp8_tensorwise"; fail=1; }
  first_fp8=$(loss_at "$TMP/$name.fp8/metrics.jsonl" 1)
  first_coat=$(loss_at "$TMP/$name.coat/metrics.jsonl" 1)
  [ -n "$first_coat" ] && [ "$first_coat" = "$first_fp8" ] ||
    { echo "FAIL: $name: coat's first loss $first_coat is not fp8_tensorwise's $first_fp8 (the forward changed)"; fail=1; }
  if [ "$(loss_at "$TMP/$name.coat/metrics.jsonl" 3)" = "$(loss_at "$TMP/$name.bf16_copies/metrics.jsonl" 3)" ]; then
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

  echo "== $name coat with precision.recompute_mlp_act: trains, plans less, repeats and resumes bit for bit"
  FLOW=(--set precision.recipe=coat --set precision.recompute_mlp_act=true)
  run flow "${FLOW[@]}" || { fail=1; continue; }
  run flow_again "${FLOW[@]}" || { fail=1; continue; }
  "$TRAIN_GPT" "${COMMON[@]}" "${FLOW[@]}" --set "checkpoint.dir=$TMP/$name.flow_resume" --stop-at-step 6 \
    > "$TMP/$name.f1.log" 2>&1 || { cat "$TMP/$name.f1.log"; fail=1; continue; }
  "$TRAIN_GPT" "${COMMON[@]}" "${FLOW[@]}" --set "checkpoint.dir=$TMP/$name.flow_resume" \
    > "$TMP/$name.f2.log" 2>&1 || { cat "$TMP/$name.f2.log"; fail=1; continue; }
  grep -q "computed from them and recomputed in backward" "$TMP/$name.flow.log" ||
    { echo "FAIL: $name: the recipe line does not name the recomputed activation"; fail=1; }
  python3 - "$TMP/$name.flow/metrics.jsonl" "$TMP/$name.coat/metrics.jsonl" "$name" <<'PY' || fail=1
import json, math, sys
def load(p):
    return [json.loads(l) for l in open(p)]
flow, coat, name = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
train = [r["loss"] for r in flow if r["type"] == "train"]
assert len(train) == 12 and all(math.isfinite(x) for x in train), "12 finite train losses expected"
assert train[-1] < train[0] - 1.0, f"{name} recompute_mlp_act: training loss did not fall by 1 nat: {train}"
coat_train = [r["loss"] for r in coat if r["type"] == "train"]
# The forward computes the activation from its FP8 copy: even the first loss moves, by the copy's rounding only.
assert train[0] != coat_train[0], f"{name}: the first loss is coat's: the forward did not read the copy"
assert abs(train[0] - coat_train[0]) < 0.01 * abs(coat_train[0]), (train[0], coat_train[0])
est = lambda recs: [r["estimate_bytes"] for r in recs if r["type"] == "memory"][0]
assert est(flow) < est(coat), f"{name}: planned {est(flow)} B, not less than coat's {est(coat)} B"
print(f"{name} recompute_mlp_act: train {train[0]:.4f} -> {train[-1]:.4f} (coat {coat_train[0]:.4f} -> "
      f"{coat_train[-1]:.4f}); plan {est(flow)} B vs coat {est(coat)} B")
PY
  losses "$TMP/$name.flow/metrics.jsonl" > "$TMP/a.losses"
  losses "$TMP/$name.flow_again/metrics.jsonl" > "$TMP/b.losses"
  losses "$TMP/$name.flow_resume/metrics.jsonl" > "$TMP/c.losses"
  diff "$TMP/a.losses" "$TMP/b.losses" || { echo "FAIL: $name: two identical recompute_mlp_act runs differ"; fail=1; }
  diff "$TMP/a.losses" "$TMP/c.losses" ||
    { echo "FAIL: $name: the resumed recompute_mlp_act run differs from the uninterrupted one"; fail=1; }
done

[ $fail -eq 0 ] && echo "PASS: coat trains GPT-2 and Llama with FP8 moments and smaller activation buffers, leaves the forward bit-identical, and repeats and resumes bit for bit (also with recompute_mlp_act)"
exit $fail
