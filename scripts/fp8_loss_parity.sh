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
#                                          [--variant "NAME section.key=value ..." ...] [--force]
#                                          [--checkpoint-every N]
#   --model (or MODEL in the environment): gpt2-124m (default; configs/gpt2_124m_bf16.json, batch 32 x 1024, lr 6e-4,
#   out runs/fp8_parity) or llama-350m (configs/llama_350m_bf16.json, batch 16 x 2048, lr 3e-4, out
#   runs/fp8_parity_llama-350m) or llama-125m (configs/llama_125m_bf16.json, batch 16 x 2048, lr 1e-3, out
#   runs/fp8_parity_llama-125m: issue 18's setting, for short diagnosis runs with --steps). All: 3072 steps of
#   32,768 tokens = 100.7M tokens, warm-up 100, cosine to 10%, train.seed --seed (default 42, the config's),
#   validation every steps/4 on 40 batches.
#   --seeds trains every recipe once per seed (the first replaces --seed): the first seed's logs are <recipe>.jsonl as
#   without it, the others' <recipe>_seed<N>.jsonl; the table of the first seed is written as usual, and
#   scripts/repro/seed_report.py adds OUT/seeds.md (per recipe the seeds' final losses, their spread, and the
#   difference to BF16 paired by seed, judged against --tolerance at two standard errors: met, not met, or undecided
#   with the seeds that would decide it): a gap under about 1% needs it (see dev/bench/results/fp8_blockwise_llama).
#   Because a call's first seed has no suffix, `--seed 43` and then `--seed 44` into one --out would share names: a
#   run whose console log (OUT/<run>.log) was initialised with another train.seed is refused before anything trains
#   (exit 2; give each seed its own --out, name the seeds in one --seeds, or --force to train the name again).
#   --set adds overrides to every run (e.g. --set precision.pow2_scales=false) and --tag names that variant: its logs
#   are <recipe>_<tag>.jsonl, so variants can share an output directory with the plain runs.
#   --variant "NAME key=value ..." (repeatable) adds, beside the plain runs, one run of every recipe and seed with those
#   overrides, named <recipe>[_<tag>]_NAME[_seed<N>]: an ablation in one command, e.g.
#     --recipes fp8_blockwise --seeds "42 43" --variant "nopow2 precision.pow2_scales=false" \
#     --variant "ends precision.bf16_layers=[0,-1]"
#   Each variant gets its table (summary_NAME.md: against bf16_NAME, or the plain bf16 run where bf16 is not among
#   the recipes) and a row in seeds.md with the difference to the plain run of its recipe, paired by seed. The exit
#   status judges the plain runs only.
#   A run whose log already holds its final validation (an eval record at the last step) is kept and not trained
#   again, so an interrupted comparison resumes where it stopped and a finished log is never overwritten; --force
#   trains every run again.
#   --checkpoint-every N (default 0: none) checkpoints each run every N steps into OUT/checkpoints/<run> (only the
#   newest is kept, the final one once the run ends: about 1.5 GB per GPT-2 124M run), so that a run cut short (a
#   job's time limit, a lost machine) continues from its newest checkpoint when the same command runs again, with the
#   same bits as an uninterrupted run; its console log OUT/<run>.log is then appended to, and the trainer moves the
#   JSONL records written after that checkpoint aside (OUT/<run>.jsonl.after-step-S). With --force such a run starts
#   over: its checkpoints are moved to OUT/checkpoints/<run>/abandoned/ by the trainer, not deleted.
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
#   Without a bf16 run in OUT (the recipes do not include bf16: e.g. another seed of one recipe) the runs are trained
#   and no table is written: exit 0 after a line saying so (--report alone: exit 2).
#   Exit status: 0 every recipe within the tolerance, 1 one outside it (a result: the table is written), 2 bad
#   arguments, a missing binary or log, 3 a training run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-gpt2-124m}; STEPS=3072; BATCH=""; SEED=42; OUT=""; DATA=data/pysrc; CORPUS=""; BUILD=build
TOLERANCE=0.25; DRY=0; REPORT_ONLY=0; GPUS=""; QUEUE=""; SEEDS=""; FORCE=0; CKPT_EVERY=0
VARIANT_NAMES=(""); VARIANT_SETS=("")
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
    --variant) read -r vname vsets <<<"$2"
               VARIANT_NAMES+=("${vname:-}"); VARIANT_SETS+=("${vsets:-}"); shift 2 ;;
    --force) FORCE=1; shift ;;
    --checkpoint-every) CKPT_EVERY=$2; shift 2 ;;
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
[[ "$CKPT_EVERY" =~ ^[0-9]+$ ]] ||
  fail "--checkpoint-every must be a non-negative number of steps (got '$CKPT_EVERY'; 0 = no checkpoints)"
[[ "$SEED" =~ ^[0-9]+$ ]] || fail "--seed must be a non-negative integer (got '$SEED')"
for s in $SEEDS; do [[ "$s" =~ ^[0-9]+$ ]] || fail "--seeds: '$s' is not a non-negative integer"; done
[ "$(tr ' ' '\n' <<<"$SEEDS" | grep -v '^$' | sort | uniq -d)" = "" ] || fail "--seeds '$SEEDS' names a seed twice"
for i in "${!VARIANT_NAMES[@]}"; do
  [ "$i" -gt 0 ] || continue
  v=${VARIANT_NAMES[$i]}
  [[ "$v" =~ ^[A-Za-z0-9][A-Za-z0-9-]*(_[A-Za-z0-9-]+)*$ ]] && ! [[ "$v" =~ (^|_)seed[0-9]+$ ]] ||
    fail "--variant '$v ${VARIANT_SETS[$i]}': the name (first word) must be letters, digits, '-' and '_' and not end" \
         "in seed<N>, e.g. --variant \"nopow2 precision.pow2_scales=false\""
  [ -n "${VARIANT_SETS[$i]}" ] || fail "--variant '$v': give its overrides after the name, e.g." \
                                       "--variant \"$v precision.pow2_scales=false\""
  for kv in ${VARIANT_SETS[$i]}; do
    [[ "$kv" =~ ^[a-z_0-9]+\.[a-z_0-9]+=.+$ ]] || fail "--variant '$v': '$kv' is not section.key=value"
  done
  for j in $(seq 1 $((i - 1))); do
    [ "${VARIANT_NAMES[$j]}" != "$v" ] || fail "--variant '$v' is given twice"
  done
done
[ -z "$SEEDS" ] || SEED=${SEEDS%% *}
SEEDS=${SEEDS:-$SEED}
[ -z "$GPUS" ] || [ -z "$QUEUE" ] || fail "--gpus runs the queue itself and --queue leaves it to the caller: give one"
[ -z "$GPUS" ] || [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]] || fail "--gpus '$GPUS': give GPU indices separated by commas, e.g. 0,1,2,3"
[ -z "$CORPUS" ] || [ -d "$CORPUS" ] || fail "--corpus '$CORPUS' is not a directory (give a directory that holds .py files, or leave --corpus out for this Python's site-packages)"
TOKENS=$((STEPS * BATCH * SEQ))
TRAIN_GPT=${TRAIN_GPT:-$BUILD/train_gpt}
echo "fp8_loss_parity: $TITLE, recipes $RECIPES: $STEPS steps x $((BATCH * SEQ)) tokens = $TOKENS tokens per run," \
     "train.seed $SEED, out $OUT"
[ "$CKPT_EVERY" -eq 0 ] ||
  echo "fp8_loss_parity: checkpoints every $CKPT_EVERY steps in $OUT/checkpoints/<run>; a run cut short continues" \
       "from its newest one when this command runs again"

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
# finished LOG: the log holds an eval record at the last step (the run ended); the logs may be .jsonl or .jsonl.gz.
finished() {
  python3 - "$1" "$STEPS" <<'PY'
import sys
sys.path.insert(0, "scripts/repro")
import runlog
try:
    evals = [r for r in runlog.read_records(sys.argv[1]) if r.get("type") == "eval"]
except (OSError, ValueError):  # no log yet, or a broken one: train the run (it rewrites the log)
    sys.exit(1)
sys.exit(0 if evals and evals[-1].get("step") == int(sys.argv[2]) and runlog.finite(evals[-1].get("val_loss")) else 1)
PY
}
# run_name RECIPE VARIANT SEED: a run's log name (the first seed of the call has no _seed<N> suffix).
run_name() {
  local name=$1$TAG${2:+_$2}
  [ "$3" = "$SEED" ] || name=${name}_seed$3
  echo "$name"
}
# logged_seed LOG: the train.seed a run's console log says it was initialised with (train_gpt's "train.seed = N"
# line), or nothing (no log yet, or one from before the trainer printed it).
logged_seed() { { grep -m1 -o 'train\.seed = [0-9]*' "$1" 2>/dev/null || true; } | grep -o '[0-9]*$' || true; }
# A run of another seed under this call's name (the first seed of a call has no _seed suffix, so `--seed 43` then
# `--seed 44` into one --out name both runs alike) would be kept as finished or resumed from the other seed's
# checkpoint: refused before anything trains.
if [ "$REPORT_ONLY" -eq 0 ] && [ "$FORCE" -eq 0 ]; then
  for recipe in $RECIPES; do
    for vname in "${VARIANT_NAMES[@]}"; do
      for seed in $SEEDS; do
        run=$(run_name "$recipe" "$vname" "$seed")
        prev=$(logged_seed "$OUT/$run.log")
        [ -z "$prev" ] || [ "$prev" = "$seed" ] ||
          fail "$OUT/$run.log is the log of a train.seed $prev run, and this call would keep or resume it as seed" \
               "$seed's (the first seed of a call has no _seed<N> suffix): give seed $seed its own --out, name both" \
               "seeds in one call (--seeds \"$prev $seed\"), or --force to train $run again as seed $seed"
      done
    done
  done
fi
for recipe in $RECIPES; do
 for vi in "${!VARIANT_NAMES[@]}"; do
 vname=${VARIANT_NAMES[$vi]}
 vsets=(); for kv in ${VARIANT_SETS[$vi]}; do vsets+=(--set "$kv"); done
 for seed in $SEEDS; do
  [ "$REPORT_ONLY" -eq 0 ] || break 3
  run=$(run_name "$recipe" "$vname" "$seed")
  if [ "$FORCE" -eq 0 ] && finished "$OUT/$run.jsonl"; then
    echo "fp8_loss_parity: $run finished already ($OUT/$run.jsonl): kept (--force trains it again)"
    continue
  fi
  ckpt_dir=""; [ "$CKPT_EVERY" -eq 0 ] || ckpt_dir=$OUT/checkpoints/$run
  cmd=("$TRAIN_GPT" --config "$CONFIG" --set precision.recipe="$recipe"
       --set "data.train=$DATA/pysrc_train_*.bin" --set "data.val=$DATA/pysrc_val_*.bin"
       --set train.micro_batch="$BATCH" --set train.seq_len=$SEQ --set train.global_batch_tokens=0
       --set train.steps="$STEPS" --set train.warmup_steps=100 --set train.lr=$LR --set train.final_lr_frac=0.1
       --set train.seed="$seed" --set eval.every=$((STEPS / 4)) --set eval.batches=40 --set sample.every=0
       --set sample.tokens=64 --set checkpoint.dir="$ckpt_dir" --set log.every=100
       --set log.numerics_every=$((STEPS / 4))
       --set log.jsonl="$OUT/$run.jsonl")
  # With checkpoints an unfinished run resumes (the trainer's resume=auto: from the newest complete checkpoint, if
  # any) and its console log is appended to; --force starts it over (older checkpoints moved aside by the trainer).
  redirect=">"
  if [ "$CKPT_EVERY" -gt 0 ]; then
    cmd+=(--set checkpoint.every="$CKPT_EVERY" --set checkpoint.keep=1)
    if [ "$FORCE" -eq 1 ]; then
      cmd+=(--set checkpoint.resume=none --set checkpoint.overwrite=true)
    else
      cmd+=(--set checkpoint.resume=auto)
      redirect=">>"
    fi
  fi
  cmd+=("${EXTRA[@]}" "${vsets[@]}")
  if [ "$DRY" -eq 1 ]; then
    printf '%q ' "${cmd[@]}"; echo
    continue
  fi
  if [ -n "$QUEUE" ]; then
    { printf '%q ' "${cmd[@]}"; printf '%s %q 2>&1\n' "$redirect" "$OUT/$run.log"; } >> "$QUEUE"
    continue
  fi
  echo "== $run"
  tee_args=("$OUT/$run.log")
  if [ "$redirect" = ">>" ] && [ -s "$OUT/$run.log" ]; then
    tee_args=(-a "$OUT/$run.log")
    echo "== fp8_loss_parity: $run again, $(date -u '+%Y-%m-%d %H:%M UTC'): it continues from its newest checkpoint" \
         "in $OUT/checkpoints/$run, if one is complete" | tee -a "$OUT/$run.log"
  fi
  # The trainer's status (pipefail: the grep's is always 0), whether or not any line of its output matched.
  status=0
  "${cmd[@]}" 2>&1 | tee "${tee_args[@]}" |
    { grep -E "^(device|precision|memory|step .*(/|val)|resum|error)" || true; } || status=$?
  [ "$status" -eq 0 ] || { echo "fp8_loss_parity: the $run run failed (log: $OUT/$run.log)" >&2; exit 3; }
 done
 done
done
if [ "$DRY" -eq 1 ]; then
  [ -z "$GPUS" ] || echo "then: python3 scripts/repro/gpu_queue.py $OUT/jobs$TAG.txt --gpus $GPUS --logdir $OUT/queue$TAG"
  exit 0
fi
if [ -n "$GPUS" ] && [ "$REPORT_ONLY" -eq 0 ]; then
  if [ -s "$QUEUE" ]; then
    python3 scripts/repro/gpu_queue.py "$QUEUE" --gpus "$GPUS" --logdir "$OUT/queue$TAG" ||
      { echo "fp8_loss_parity: a run failed (its log: $OUT/<run>.log)" >&2; exit 3; }
  fi
elif [ -n "$QUEUE" ]; then
  echo "fp8_loss_parity: the runs of $RECIPES are queued in $QUEUE"
  exit 0
fi

# 3. Plot and tables (of the first seed; seeds.md covers every seed).
files=(); labels=()
for recipe in $RECIPES; do
  for vname in "${VARIANT_NAMES[@]}"; do
    files+=("$OUT/$recipe$TAG${vname:+_$vname}.jsonl"); labels+=(--label "$recipe$TAG${vname:+_$vname}")
  done
done
relative=(); [ ${#files[@]} -lt 2 ] || relative=(--relative)
python3 scripts/plot_runs.py "${files[@]}" "${labels[@]}" --out "$OUT/fp8_loss_parity$TAG.png" --x tokens \
  "${relative[@]}" --title "$TITLE, $STEPS steps x $((BATCH * SEQ)) tokens: BF16 vs low-precision recipes" --ymax 6 || true
if [ ! -f "$OUT/bf16$TAG.jsonl" ] && [ ! -f "$OUT/bf16.jsonl" ]; then
  # Runs added to a directory without BF16 (another seed of one recipe, its BF16 trained elsewhere): nothing to judge
  # them against. A training call has done its work (exit 0); --report alone asked for the table (exit 2).
  msg="fp8_loss_parity: no bf16 run in $OUT to compare the runs with, so no table: train one with --recipes bf16 into
the same --out (or copy its bf16.jsonl there) and run again with --report"
  if [ "$REPORT_ONLY" -eq 1 ]; then echo "$msg" >&2; exit 2; fi
  echo "$msg"
  exit 0
fi
if [ "$SEEDS" != "$SEED" ] || [ ${#VARIANT_NAMES[@]} -gt 1 ]; then
  python3 scripts/repro/seed_report.py "$OUT" --base-seed "$SEED" --goal "$TOLERANCE" \
    --title "$TITLE, $STEPS steps x $((BATCH * SEQ)) tokens (seq $SEQ), seeds $SEEDS" || exit 2
fi
for vname in "${VARIANT_NAMES[@]:1}"; do
  python3 scripts/repro/fp8_parity_report.py "$OUT" $RECIPES --tag "${TAG}_$vname" --tolerance "$TOLERANCE" \
    --title "$TITLE, $STEPS steps x $((BATCH * SEQ)) tokens (seq $SEQ) = $TOKENS tokens, variant $vname" && rc=0 ||
    rc=$?
  [ "$rc" -le 1 ] || exit 2  # 1: outside the tolerance, a result; 2: a missing log
done
python3 scripts/repro/fp8_parity_report.py "$OUT" $RECIPES --tag "$TAG" --tolerance "$TOLERANCE" \
  --title "$TITLE, $STEPS steps x $((BATCH * SEQ)) tokens (seq $SEQ) = $TOKENS tokens, same seed ($SEED) and data"
