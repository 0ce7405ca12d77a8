#!/usr/bin/env bash
# Integration (GPU): short trainings of llama-tiny (configs/llama_tiny_bf16.json: RMSNorm, RoPE, grouped-query
# attention, SwiGLU, untied lm_head) on the bundled KJV corpus.
#   1. the loss falls (train and validation) and a sample is printed;
#   2. determinism: the same run twice gives bit-identical losses;
#   3. recompute: train.recompute=1 (RMSNorm and SwiGLU outputs recomputed in backward) gives the same losses to the
#      last bit;
#   4. resume: a run stopped after step 6 and resumed from its checkpoint (Llama tensor names in model.safetensors)
#      continues bit-identically to an uninterrupted run;
#   5. the tied variant (model.tied_embeddings=true) trains too;
#   6. the FP8 recipes train it (fp8_tensorwise and fp8_delayed on compute capability 8.9+, fp8_blockwise on 9.0+):
#      the loss falls as in BF16 (the amaxes come from the RMSNorm / SwiGLU / RoPE / attention kernels).
# Skipped (exit 77) without a GPU.
set -euo pipefail
TRAIN_GPT=${1:?usage: test_train_llama_gpu.sh path/to/train_gpt}
source test/integration/training_common.sh
require_gpu
prepare_kjv
short_run configs/llama_tiny_bf16.json

run() {  # run NAME ARGS...: train, print the log on failure
  local name=$1; shift
  "$TRAIN_GPT" "${COMMON[@]}" "$@" > "$TMP/$name.log" 2>&1 || { echo "FAIL: run $name"; cat "$TMP/$name.log"; exit 1; }
}

echo "== uninterrupted run A"
run a --set "checkpoint.dir=$TMP/runA"
cat "$TMP/a.log"
echo "== run B: stop after step 6, then resume"
run b1 --set "checkpoint.dir=$TMP/runB" --stop-at-step 6
run b2 --set "checkpoint.dir=$TMP/runB"
grep -q "resumed from .*step_00000006 at step 6" "$TMP/b2.log" || { echo "FAIL: run B did not resume from step 6"; cat "$TMP/b2.log"; exit 1; }
echo "== run C: same config as A, no checkpoints"
run c --set "log.jsonl=$TMP/c.jsonl"
echo "== run D: recompute 1"
run d --set "log.jsonl=$TMP/d.jsonl" --set train.recompute=1
echo "== run E: tied embeddings"
run e --set "log.jsonl=$TMP/e.jsonl" --set model.tied_embeddings=true
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
FP8_RECIPES=()
[ "${cc:-0}" -ge 89 ] && FP8_RECIPES+=(fp8_tensorwise fp8_delayed)
[ "${cc:-0}" -ge 90 ] && FP8_RECIPES+=(fp8_blockwise)
for recipe in ${FP8_RECIPES[@]+"${FP8_RECIPES[@]}"}; do
  echo "== run $recipe"
  run "$recipe" --set "log.jsonl=$TMP/$recipe.jsonl" --set "precision.recipe=$recipe"
done

losses "$TMP/runA/metrics.jsonl" > "$TMP/a.losses"
losses "$TMP/runB/metrics.jsonl" > "$TMP/b.losses"
losses "$TMP/c.jsonl" > "$TMP/c.losses"
losses "$TMP/d.jsonl" > "$TMP/d.losses"
fail=0
if ! diff "$TMP/a.losses" "$TMP/c.losses"; then echo "FAIL: two identical runs gave different losses"; fail=1; fi
if ! diff "$TMP/a.losses" "$TMP/d.losses"; then echo "FAIL: recompute=1 changed the losses"; fail=1; fi
if ! diff "$TMP/a.losses" "$TMP/b.losses"; then echo "FAIL: the resumed run differs from the uninterrupted one"; fail=1; fi
for recipe in ${FP8_RECIPES[@]+"${FP8_RECIPES[@]}"}; do
  python3 - "$TMP/$recipe.jsonl" "$recipe" <<'PY' || fail=1
import json, sys
train = [json.loads(l)["loss"] for l in open(sys.argv[1]) if json.loads(l)["type"] == "train"]
print(sys.argv[2], "train losses:", [round(x, 3) for x in train])
assert len(train) == 12 and train[-1] < train[0] - 1.0, f"{sys.argv[2]}: the loss did not fall by 1 nat in 12 steps"
PY
done
python3 - "$TMP/runA/metrics.jsonl" "$TMP/e.jsonl" "$TMP/runA/step_00000012/model.safetensors" <<'PY' || fail=1
import json, struct, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r["loss"] for r in recs if r["type"] == "train"]
val = [r["val_loss"] for r in recs if r["type"] == "eval"]
samples = [r for r in recs if r["type"] == "sample"]
print("train losses:", [round(x, 3) for x in train], "val:", [round(x, 3) for x in val])
assert len(train) == 12, "expected 12 train records"
assert train[-1] < train[0] - 1.0, "training loss did not fall by 1 nat in 12 steps"
assert len(val) >= 2 and val[-1] < val[0] - 1.0, "validation loss did not fall"
assert samples and samples[-1]["text"], "no sample text"
tied = [json.loads(l)["loss"] for l in open(sys.argv[2]) if json.loads(l)["type"] == "train"]
print("tied train losses:", [round(x, 3) for x in tied])
assert len(tied) == 12 and tied[-1] < tied[0] - 1.0, "the tied model did not learn"
with open(sys.argv[3], "rb") as f:  # the checkpoint holds the Llama names
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
for name in ("model.embed_tokens.weight", "model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight",
             "model.norm.weight", "lm_head.weight"):
    assert name in header, f"checkpoint lacks {name}"
PY
[ -f "$TMP/runA/step_00000012/DONE" ] || { echo "FAIL: final checkpoint missing"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: llama loss falls, runs are deterministic, recompute and resume are bit-identical"
exit $fail
