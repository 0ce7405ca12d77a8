#!/usr/bin/env bash
# scripts/fp8_loss_parity.sh: the FP8 loss-parity experiment. GPT-2 124M trained from the same seed on the same data
# in BF16 and with every FP8 recipe; each FP8 run must end within 1% (relative) of the BF16 run's validation loss.
# Writes the JSONL logs, the loss-curve plot (scripts/plot_runs.py) and a Markdown table to OUT.
#
#   usage: bash scripts/fp8_loss_parity.sh [--steps N] [--batch B] [--out DIR] [--data DIR] [--corpus DIR]
#                                          [--recipes "bf16 fp8_tensorwise ..."] [--build DIR]
#                                          [--set section.key=value ... --tag NAME]
#   --set adds overrides to every run (e.g. --set precision.pow2_scales=false) and --tag names that variant: its logs
#   are <recipe>_<tag>.jsonl, so variants can share an output directory with the plain runs.
#   defaults: 1000 steps of 32 x 1024 = 32,768 tokens; data = data/pysrc, tokenised on first use from --corpus
#   (default: this Python's site-packages, *.py files: a large public text tree present on every machine with Python)
#   which must give at least 100M training tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=1000; BATCH=32; OUT=runs/fp8_parity; DATA=data/pysrc; CORPUS=""; BUILD=build
RECIPES="bf16 fp8_tensorwise fp8_delayed fp8_blockwise"
EXTRA=(); TAG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --corpus) CORPUS=$2; shift 2 ;;
    --recipes) RECIPES=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --set) EXTRA+=(--set "$2"); shift 2 ;;
    --tag) TAG=_$2; shift 2 ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) echo "fp8_loss_parity: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
TRAIN_GPT=$BUILD/train_gpt
[ -x "$TRAIN_GPT" ] || { echo "fp8_loss_parity: $TRAIN_GPT not found: build first (make)" >&2; exit 2; }
mkdir -p "$OUT"

# 1. Data: >= 100M training tokens.
if ! ls "$DATA"/pysrc_train_*.bin >/dev/null 2>&1; then
  [ -n "$CORPUS" ] || CORPUS=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "fp8_loss_parity: tokenising *.py under $CORPUS into $DATA"
  python3 dev/data/prepare.py --name pysrc --out "$DATA" --ext .py --split-docs file --val-fraction 0.005 \
    --encoding-errors replace --workers "$(nproc)" "$CORPUS"
fi
train_tokens=$(python3 - "$DATA" <<'PY'
import glob, sys
import numpy as np
total = 0
for f in glob.glob(sys.argv[1] + "/pysrc_train_*.bin"):
    total += int(np.fromfile(f, dtype=np.int32, count=3)[2])
print(total)
PY
)
echo "fp8_loss_parity: $train_tokens training tokens in $DATA"
if [ "$train_tokens" -lt 100000000 ]; then
  echo "fp8_loss_parity: fewer than 100M training tokens: give a larger --corpus" >&2
  exit 2
fi

# 2. The runs: identical but for precision.recipe.
for recipe in $RECIPES; do
  run=$recipe$TAG
  echo "== $run"
  "$TRAIN_GPT" --config configs/gpt2_124m_bf16.json --set precision.recipe="$recipe" \
    --set "data.train=$DATA/pysrc_train_*.bin" --set "data.val=$DATA/pysrc_val_*.bin" \
    --set train.micro_batch="$BATCH" --set train.seq_len=1024 --set train.global_batch_tokens=0 \
    --set train.steps="$STEPS" --set train.warmup_steps=100 --set train.lr=6e-4 --set train.final_lr_frac=0.1 \
    --set eval.every=$((STEPS / 4)) --set eval.batches=40 --set sample.every=0 --set sample.tokens=64 \
    --set checkpoint.dir= --set log.every=100 --set log.numerics_every=$((STEPS / 4)) \
    --set log.jsonl="$OUT/$run.jsonl" "${EXTRA[@]}" 2>&1 | tee "$OUT/$run.log" |
    grep -E "^(device|precision|memory|step .*(/|val)|error)" || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fp8_loss_parity: the $run run failed (log: $OUT/$run.log)" >&2; exit 1; }
done

# 3. Plot and table.
files=(); labels=()
for recipe in $RECIPES; do files+=("$OUT/$recipe$TAG.jsonl"); labels+=(--label "$recipe$TAG"); done
python3 scripts/plot_runs.py "${files[@]}" "${labels[@]}" --out "$OUT/fp8_loss_parity$TAG.png" \
  --title "GPT-2 124M, $STEPS steps x $((BATCH * 1024)) tokens: BF16 vs FP8 recipes" --ymax 6 || true
python3 - "$OUT" "$STEPS" "$BATCH" "$TAG" $RECIPES <<'PY'
import datetime, json, os, subprocess, sys
out, steps, batch, tag, recipes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
def records(r):
    # a variant's runs compare with its own bf16 run when there is one, else with the plain bf16 run
    path = f"{out}/{r}{tag}.jsonl"
    if r == "bf16" and tag and not os.path.exists(path):
        path = f"{out}/bf16.jsonl"
    return [json.loads(l) for l in open(path)]
rows, ok = [], True
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                     text=True).stdout.strip().splitlines()[0]
base = None
if "bf16" not in recipes and os.path.exists(f"{out}/bf16.jsonl"):  # a variant of FP8 runs only: the plain bf16 run
    base = [x for x in records("bf16") if x["type"] == "eval"][-1]["val_loss"]
for r in recipes:
    recs = records(r)
    val = [x for x in recs if x["type"] == "eval"]
    train = [x for x in recs if x["type"] == "train"]
    final_val = val[-1]["val_loss"]
    ms = sorted(x["ms"] for x in train[5:])[len(train[5:]) // 2] if len(train) > 5 else float("nan")
    skips = sum(1 for x in recs if x["type"] == "skip")
    if r == "bf16":
        base = final_val
    rel = (final_val - base) / base if base else float("nan")
    within = r == "bf16" or abs(rel) <= 0.01
    ok &= within
    rows.append(f"| {r}{tag} | {final_val:.4f} | {rel * 100:+.2f}% | {'yes' if within else 'NO'} | "
                f"{train[-1]['loss']:.4f} | {ms:.1f} | {skips} |")
date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
table = [f"GPT-2 124M, {steps} steps x {batch * 1024:,} tokens (seq 1024), same seed and data; {gpu}; {date}.",
         "", "| recipe | final val loss | vs bf16 | within 1% | final train loss | median step ms | skipped steps |",
         "|---|---|---|---|---|---|---|"] + rows
open(f"{out}/summary{tag}.md", "w").write("\n".join(table) + "\n")
print("\n".join(table))
sys.exit(0 if ok else 1)
PY
