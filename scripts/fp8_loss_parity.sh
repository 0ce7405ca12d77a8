#!/usr/bin/env bash
# scripts/fp8_loss_parity.sh: the FP8 loss-parity experiment. One model trained from the same seed on the same data
# in BF16 and with every FP8 recipe; each FP8 run must end within --tolerance (relative, default 0.25%) of the BF16
# run's validation loss. Any other recipe of the build (nvfp4, mxfp4, coat) can be named with --recipes:
# scripts/repro/nvfp4.sh, quartet.sh and coat.sh run their comparisons (and ablations) through this script. Writes the
# JSONL logs, the loss-curve plot (scripts/plot_runs.py) and a Markdown table
# (scripts/repro/fp8_parity_report.py: final val loss, vs BF16 in %, tokens, steps, ...) to OUT.
#
#   usage: bash scripts/fp8_loss_parity.sh [--model gpt2-124m|llama-350m|llama-125m] [--steps N] [--batch B]
#                                          [--seed S | --seeds "42 43 44"] [--out DIR] [--data DIR] [--corpus DIR]
#                                          [--tolerance PCT] [--dry] [--report] [--recipes "bf16 fp8_tensorwise ..."]
#                                          [--build DIR]
#                                          [--set section.key=value ... --tag NAME] [--gpus LIST | --queue FILE]
#   --model (or MODEL in the environment): gpt2-124m (default; configs/gpt2_124m_bf16.json, batch 32 x 1024, lr 6e-4,
#   out runs/fp8_parity) or llama-350m (configs/llama_350m_bf16.json, batch 16 x 2048, lr 3e-4, out
#   runs/fp8_parity_llama-350m) or llama-125m (configs/llama_125m_bf16.json, batch 16 x 2048, lr 1e-3, out
#   runs/fp8_parity_llama-125m: issue 18's setting, for short diagnosis runs with --steps). All: 3072 steps of
#   32,768 tokens = 100.7M tokens, warm-up 100, cosine to 10%, train.seed --seed (default 42, the config's),
#   validation every steps/4 on 40 batches.
#   --seeds trains every recipe once per seed (the first replaces --seed): the first seed's logs are <recipe>.jsonl as
#   without it, the others' <recipe>_seed<N>.jsonl; the table of the first seed is written as usual, and
#   scripts/repro/seed_report.py adds OUT/seeds.md (per recipe the seeds' final losses, their spread, and the
#   difference to BF16 paired by seed): a gap under about 1% needs it (see dev/bench/results/fp8_blockwise_llama).
#   --set adds overrides to every run (e.g. --set precision.pow2_scales=false) and --tag names that variant: its logs
#   are <recipe>_<tag>.jsonl, so variants can share an output directory with the plain runs.
#   --dry prints the commands and runs nothing (no binary or data needed); --report only writes the plot and the table
#   from the logs already in OUT (after runs made one recipe at a time).
#   data = data/pysrc, tokenised on first use by dev/data/prepare.py --python-sources from --corpus (default: this
#   Python's site-packages, *.py files: a large public text tree present on every machine with Python); with fewer
#   training tokens than a run trains on, the runs repeat data (the same for every recipe) and a warning says so.
#   --gpus 0,1,2,3 trains the recipes at the same time, one per GPU (scripts/repro/gpu_queue.py; each run's output in
#   OUT/<run>.log), then writes the plot and the table. --queue FILE only appends each run's train_gpt command to FILE
#   (after preparing the data), for a caller that collects the runs of several calls and runs them with gpu_queue.py
#   (scripts/repro/nvfp4.sh --gpus does).
#   TRAIN_GPT in the environment names the binary (default: <build>/train_gpt).
#   Exit status: 0 every recipe within the tolerance, 1 one outside it (a result: the table is written), 2 bad
#   arguments, a missing binary or log, 3 a training run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-gpt2-124m}; STEPS=3072; BATCH=""; SEED=42; OUT=""; DATA=data/pysrc; CORPUS=""; BUILD=build
TOLERANCE=0.25; DRY=0; REPORT_ONLY=0; GPUS=""; QUEUE=""; SEEDS=""
RECIPES="bf16 fp8_tensorwise fp8_delayed fp8_blockwise"
EXTRA=(); TAG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --seeds) SEEDS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --corpus) CORPUS=$2; shift 2 ;;
    --recipes) RECIPES=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --tolerance) TOLERANCE=$2; shift 2 ;;
    --dry) DRY=1; shift ;;
    --report) REPORT_ONLY=1; shift ;;
    --set) EXTRA+=(--set "$2"); shift 2 ;;
    --tag) TAG=_$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --queue) QUEUE=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "fp8_loss_parity: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "fp8_loss_parity: $*" >&2; exit 2; }
case "$MODEL" in
  gpt2-124m) CONFIG=configs/gpt2_124m_bf16.json; SEQ=1024; LR=6e-4; TITLE="GPT-2 124M"
             BATCH=${BATCH:-32}; OUT=${OUT:-runs/fp8_parity} ;;
  llama-350m) CONFIG=configs/llama_350m_bf16.json; SEQ=2048; LR=3e-4; TITLE="Llama 350M"
              BATCH=${BATCH:-16}; OUT=${OUT:-runs/fp8_parity_llama-350m} ;;
  llama-125m) CONFIG=configs/llama_125m_bf16.json; SEQ=2048; LR=1e-3; TITLE="Llama 125M"
              BATCH=${BATCH:-16}; OUT=${OUT:-runs/fp8_parity_llama-125m} ;;
  *) fail "unknown model '$MODEL' (choose from: gpt2-124m llama-350m llama-125m)" ;;
esac
KNOWN_RECIPES="bf16 fp8_tensorwise fp8_delayed fp8_blockwise nvfp4 mxfp4 coat"
for r in $RECIPES; do
  case " $KNOWN_RECIPES " in *" $r "*) ;; *) fail "unknown recipe '$r' (choose from: $KNOWN_RECIPES)" ;; esac
done
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 4 ] || fail "--steps must be an integer >= 4 (got '$STEPS')"
[[ "$BATCH" =~ ^[0-9]+$ ]] && [ "$BATCH" -ge 1 ] || fail "--batch must be a positive integer (got '$BATCH')"
[[ "$SEED" =~ ^[0-9]+$ ]] || fail "--seed must be a non-negative integer (got '$SEED')"
for s in $SEEDS; do [[ "$s" =~ ^[0-9]+$ ]] || fail "--seeds: '$s' is not a non-negative integer"; done
[ "$(tr ' ' '\n' <<<"$SEEDS" | grep -v '^$' | sort | uniq -d)" = "" ] || fail "--seeds '$SEEDS' names a seed twice"
[ -z "$SEEDS" ] || SEED=${SEEDS%% *}
SEEDS=${SEEDS:-$SEED}
[ -z "$GPUS" ] || [ -z "$QUEUE" ] || fail "--gpus runs the queue itself and --queue leaves it to the caller: give one"
[ -z "$GPUS" ] || [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]] || fail "--gpus '$GPUS': give GPU indices separated by commas, e.g. 0,1,2,3"
[ -z "$CORPUS" ] || [ -d "$CORPUS" ] || fail "--corpus '$CORPUS' is not a directory (give a directory that holds .py files, or leave --corpus out for this Python's site-packages)"
TOKENS=$((STEPS * BATCH * SEQ))
TRAIN_GPT=${TRAIN_GPT:-$BUILD/train_gpt}
echo "fp8_loss_parity: $TITLE, recipes $RECIPES: $STEPS steps x $((BATCH * SEQ)) tokens = $TOKENS tokens per run," \
     "train.seed $SEED, out $OUT"

# 1. Data.
if [ "$DRY" -eq 0 ] && [ "$REPORT_ONLY" -eq 0 ]; then
  [ -x "$TRAIN_GPT" ] || fail "$TRAIN_GPT not found: build first (cmake --build build --target train_gpt)"
  mkdir -p "$OUT"
  if ! ls "$DATA"/pysrc_train_*.bin >/dev/null 2>&1; then
    echo "fp8_loss_parity: tokenising the Python sources${CORPUS:+ under $CORPUS} into $DATA"
    # shellcheck disable=SC2086
    python3 dev/data/prepare.py --python-sources --out "$DATA" --workers "$(nproc)" $CORPUS
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
  if [ "$train_tokens" -lt "$TOKENS" ]; then
    echo "fp8_loss_parity: warning: a run trains on $TOKENS tokens, more than the $train_tokens in $DATA: the runs" \
         "repeat data (the same for every recipe); give a larger --corpus for a single pass" >&2
  fi
fi

# 2. The runs: identical but for precision.recipe; with --gpus or --queue, their commands go to a queue file.
if [ -n "$GPUS" ] && [ "$DRY" -eq 0 ] && [ "$REPORT_ONLY" -eq 0 ]; then
  QUEUE=$OUT/jobs$TAG.txt
  : > "$QUEUE"
fi
for recipe in $RECIPES; do
 for seed in $SEEDS; do
  [ "$REPORT_ONLY" -eq 0 ] || break 2
  run=$recipe$TAG
  [ "$seed" = "$SEED" ] || run=${run}_seed$seed
  cmd=("$TRAIN_GPT" --config "$CONFIG" --set precision.recipe="$recipe"
       --set "data.train=$DATA/pysrc_train_*.bin" --set "data.val=$DATA/pysrc_val_*.bin"
       --set train.micro_batch="$BATCH" --set train.seq_len=$SEQ --set train.global_batch_tokens=0
       --set train.steps="$STEPS" --set train.warmup_steps=100 --set train.lr=$LR --set train.final_lr_frac=0.1
       --set train.seed="$seed" --set eval.every=$((STEPS / 4)) --set eval.batches=40 --set sample.every=0
       --set sample.tokens=64 --set checkpoint.dir= --set log.every=100 --set log.numerics_every=$((STEPS / 4))
       --set log.jsonl="$OUT/$run.jsonl" "${EXTRA[@]}")
  if [ "$DRY" -eq 1 ]; then
    printf '%q ' "${cmd[@]}"; echo
    continue
  fi
  if [ -n "$QUEUE" ]; then
    { printf '%q ' "${cmd[@]}"; printf '> %q 2>&1\n' "$OUT/$run.log"; } >> "$QUEUE"
    continue
  fi
  echo "== $run"
  "${cmd[@]}" 2>&1 | tee "$OUT/$run.log" | grep -E "^(device|precision|memory|step .*(/|val)|error)" || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fp8_loss_parity: the $run run failed (log: $OUT/$run.log)" >&2; exit 3; }
 done
done
if [ "$DRY" -eq 1 ]; then
  [ -z "$GPUS" ] || echo "then: python3 scripts/repro/gpu_queue.py $OUT/jobs$TAG.txt --gpus $GPUS --logdir $OUT/queue$TAG"
  exit 0
fi
if [ -n "$GPUS" ] && [ "$REPORT_ONLY" -eq 0 ]; then
  python3 scripts/repro/gpu_queue.py "$QUEUE" --gpus "$GPUS" --logdir "$OUT/queue$TAG" ||
    { echo "fp8_loss_parity: a run failed (its log: $OUT/<run>.log)" >&2; exit 3; }
elif [ -n "$QUEUE" ]; then
  echo "fp8_loss_parity: the runs of $RECIPES are queued in $QUEUE"
  exit 0
fi

# 3. Plot and table.
files=(); labels=()
for recipe in $RECIPES; do files+=("$OUT/$recipe$TAG.jsonl"); labels+=(--label "$recipe$TAG"); done
relative=(); [ ${#files[@]} -lt 2 ] || relative=(--relative)
python3 scripts/plot_runs.py "${files[@]}" "${labels[@]}" --out "$OUT/fp8_loss_parity$TAG.png" --x tokens \
  "${relative[@]}" --title "$TITLE, $STEPS steps x $((BATCH * SEQ)) tokens: BF16 vs low-precision recipes" --ymax 6 || true
if [ "$SEEDS" != "$SEED" ]; then
  python3 scripts/repro/seed_report.py "$OUT" --base-seed "$SEED" \
    --title "$TITLE, $STEPS steps x $((BATCH * SEQ)) tokens (seq $SEQ), seeds $SEEDS" || exit 2
fi
python3 scripts/repro/fp8_parity_report.py "$OUT" $RECIPES --tag "$TAG" --tolerance "$TOLERANCE" \
  --title "$TITLE, $STEPS steps x $((BATCH * SEQ)) tokens (seq $SEQ) = $TOKENS tokens, same seed ($SEED) and data"
