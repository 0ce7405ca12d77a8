#!/usr/bin/env bash
# dev/bit_identity.sh: proves that two builds of llm8 train bit for bit alike (a refactor must not change a single
# bit), on a GPU machine. For gpt2-mini and llama-tiny under every precision recipe it runs 50 optimizer steps (two
# micro-steps each, so gradient accumulation is covered) on the bundled KJV text and records, per run: every step's
# training loss (JSON doubles, 17 significant digits), the validation losses, the sample text, and the SHA-256 of the
# final checkpoint's state files (FP32 master weights, optimizer state, precision state). Checkpoints are written at
# steps 25 and 50, so the other build can resume the first one and must reproduce steps 26..50 exactly.
#
#   dev/bit_identity.sh record  SRC BUILD OUT         run every case with SRC's configs and BUILD/train_gpt into OUT
#   dev/bit_identity.sh resume  SRC BUILD FROM OUT    resume every case of FROM (a record dir) at step 25 with BUILD
#   dev/bit_identity.sh compare A B [RESUMED]         compare two record dirs (and a resume dir against A); exit 1
#                                                     on any difference, with a table of what matched
# DATA (default: SRC/data/kjv, prepared with dev/data/prepare.py --kjv when missing) holds the shards.
# MODELS and RECIPES (space-separated) narrow the cases; SETS adds --set overrides to every run (space-separated
# key=value words), e.g. SETS="optimizer.state_format=fp8_expand" to record, resume and compare a build with itself.
set -euo pipefail

read -r -a MODELS <<<"${MODELS:-gpt2_mini llama_tiny}"
read -r -a RECIPES <<<"${RECIPES:-bf16 fp8_tensorwise fp8_delayed fp8_blockwise}"
read -r -a SETS <<<"${SETS:-}"
STEPS=50

die() { echo "bit_identity: $*" >&2; exit 2; }

# The overrides of one case: 50 steps, 2 micro-steps per step, checkpoints at 25 and 50 (all kept), validation at
# 25 and 50, a 24-token sample at the end.
case_args() {  # case_args MODEL RECIPE CKPT_DIR JSONL
  local model=$1 recipe=$2 ckpt=$3 jsonl=$4 tokens
  case $model in
    gpt2_mini) tokens=16384 ;;   # micro-batch 16 x 512
    llama_tiny) tokens=2048 ;;   # micro-batch 8 x 128
    *) die "unknown model $model" ;;
  esac
  echo --set "precision.recipe=$recipe" --set "train.steps=$STEPS" --set "train.global_batch_tokens=$tokens" \
       --set "checkpoint.dir=$ckpt" --set checkpoint.every=25 --set checkpoint.keep=0 \
       --set eval.every=25 --set eval.batches=4 --set sample.every=0 --set sample.tokens=24 --set log.every=10 \
       --set "log.jsonl=$jsonl" --set "data.train=$DATA/kjv_train_*.bin" --set "data.val=$DATA/kjv_val_*.bin"
  local s
  for s in ${SETS[@]+"${SETS[@]}"}; do echo --set "$s"; done
}

# summary.json of a run directory: losses, validation losses, samples, state-file hashes of the final checkpoint.
summarise() {  # summarise RUN_DIR
  python3 - "$1" <<'EOF'
import hashlib, json, os, sys
run = sys.argv[1]
recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
out = {"train": {}, "val": {}, "sample": {}, "files": {}}
for r in recs:
    t, s = r.get("type"), str(r.get("step"))
    if t == "train": out["train"][s] = repr(r["loss"])
    elif t == "eval": out["val"][s] = repr(r["val_loss"]) if "val_loss" in r else repr(r.get("loss"))
    elif t == "sample": out["sample"][s] = r.get("text", "")
final = os.path.join(run, "ckpt", "step_%08d" % 50)
if os.path.isdir(final):
    for name in sorted(os.listdir(final)):
        if name.endswith(".safetensors"):
            out["files"][name] = hashlib.sha256(open(os.path.join(final, name), "rb").read()).hexdigest()
json.dump(out, open(os.path.join(run, "summary.json"), "w"), indent=1, sort_keys=True)
print("%s: %d steps, %d validations, %d state files" % (run, len(out["train"]), len(out["val"]), len(out["files"])))
EOF
}

run_case() {  # run_case SRC BUILD RUN_DIR MODEL RECIPE [extra args...]
  local src=$1 build=$2 dir=$3 model=$4 recipe=$5
  shift 5
  mkdir -p "$dir"
  # shellcheck disable=SC2046  # case_args prints a list of words
  (cd "$src" && "$build/train_gpt" --config "configs/${model}_bf16.json" $(case_args "$model" "$recipe" "$dir/ckpt" \
      "$dir/metrics.jsonl") "$@") > "$dir/log.txt" 2>&1 || { tail -20 "$dir/log.txt"; die "$model $recipe failed (log: $dir/log.txt)"; }
  summarise "$dir"
}

prepare_data() {  # prepare_data SRC
  DATA=${DATA:-$(cd "$1" && pwd)/data/kjv}
  if ! ls "$DATA"/kjv_train_*.bin >/dev/null 2>&1; then
    (cd "$1" && python3 dev/data/prepare.py --kjv --out "$DATA") > /dev/null
  fi
}

cmd=${1:-}
case $cmd in
  record)
    [ $# -eq 4 ] || die "usage: record SRC BUILD OUT"
    src=$(cd "$2" && pwd); build=$(cd "$3" && pwd); out=$4
    mkdir -p "$out"; out=$(cd "$out" && pwd)
    prepare_data "$src"
    for m in "${MODELS[@]}"; do for r in "${RECIPES[@]}"; do
      run_case "$src" "$build" "$out/${m}_${r}" "$m" "$r"
    done; done ;;
  resume)
    [ $# -eq 5 ] || die "usage: resume SRC BUILD FROM OUT"
    src=$(cd "$2" && pwd); build=$(cd "$3" && pwd); from=$(cd "$4" && pwd); out=$5
    mkdir -p "$out"; out=$(cd "$out" && pwd)
    prepare_data "$src"
    for m in "${MODELS[@]}"; do for r in "${RECIPES[@]}"; do
      dir="$out/${m}_${r}"
      rm -rf "$dir"; mkdir -p "$dir/ckpt"
      cp -r "$from/${m}_${r}/ckpt/step_00000025" "$dir/ckpt/"   # the other build's checkpoint, resumed with auto
      run_case "$src" "$build" "$dir" "$m" "$r"
    done; done ;;
  compare)
    [ $# -ge 3 ] || die "usage: compare A B [RESUMED]"
    python3 - "$2" "$3" "${4:-}" "${MODELS[*]}" "${RECIPES[*]}" <<'EOF'
import json, os, sys
a, b, resumed, models, recipes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5].split()
load = lambda d, c: json.load(open(os.path.join(d, c, "summary.json")))
ok = True
print("| run | steps | train losses | val losses | samples | state files | resumed 26-50 |")
print("|---|---|---|---|---|---|---|")
for m in models:
    for r in recipes:
        c = "%s_%s" % (m, r)
        A, B = load(a, c), load(b, c)
        cells = [str(len(A["train"])),
                 "equal" if A["train"] == B["train"] and len(A["train"]) == 50 else "DIFFER",
                 "equal" if A["val"] == B["val"] else "DIFFER",
                 "equal" if A["sample"] == B["sample"] else "DIFFER",
                 "equal" if A["files"] == B["files"] and A["files"] else "DIFFER"]
        if resumed:
            R = load(resumed, c)
            tail = {k: v for k, v in A["train"].items() if int(k) > 25}
            same = R["train"] == tail and R["files"] == A["files"] and R["sample"] == A["sample"]
            cells.append("equal" if same else "DIFFER")
        else:
            cells.append("-")
        ok &= "DIFFER" not in cells
        print("| %s | %s |" % (c, " | ".join(cells)))
print("bit identity: %s" % ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
EOF
    ;;
  *) die "usage: $0 record|resume|compare ... (see the header of this file)" ;;
esac
