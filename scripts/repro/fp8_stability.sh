#!/usr/bin/env bash
# scripts/repro/fp8_stability.sh: the FP8 stability grid (issue 18, in the spirit of "To FP8 and Back Again",
# arXiv 2405.18710): seeds x learning rates x recipes for a small GPT-2 and a small Llama, every run identical but
# for its cell's recipe, learning rate and seed (train.seed: the initialisation; the data and its order are the same
# for every run). scripts/repro/fp8_stability_report.py then writes per cell the final loss, the loss spikes, the
# skipped steps and divergence as a Markdown table and a heat map.
#
#   usage: bash scripts/repro/fp8_stability.sh [--dry] [--models "gpt2-mini llama-mini"]
#            [--recipes "bf16 fp8_tensorwise fp8_delayed fp8_blockwise"] [--seeds "1 2 3"]
#            [--lrs "1.2e-3 2.4e-3 4.8e-3 9.6e-3 1.92e-2 3.84e-2"] [--steps 500] [--batch 32] [--out runs/fp8_stability]
#            [--data data/pysrc] [--corpus DIR] [--build build] [--force] [--tflops 150] [--overhead-s 20]
#            [--gpus LIST] [--per-gpu N]
#   --dry        print the grid, the estimate and every command, run nothing (no data or binary needed)
#   --gpus       run the cells at the same time, one per GPU of LIST (e.g. 0,1,2,3), through
#                scripts/repro/gpu_queue.py (OUT/jobs.txt, OUT/queue/); the cells that fail for a reason other than
#                divergence are listed after all have run; --per-gpu N (default 1) lets N cells share one GPU (the
#                grid's models are too small to fill an H100 or H200 alone)
#   models       gpt2-mini (the preset: 6 layers, n_embd 384, 30M parameters) and llama-mini (llama-125m's
#                architecture, RMSNorm, SwiGLU, RoPE, GQA 6/2 heads, at gpt2-mini's size: 29M parameters)
#   each run     --steps of --batch x 512 tokens, warm-up 10% of the steps, cosine to 10% of the lr, grad clip 1.0,
#                validation every steps/5 on 20 batches, the divergence guard at 5 consecutive skipped steps
#   data         data/pysrc, tokenised on first use from --corpus (default: this Python's site-packages, *.py) by
#                dev/data/prepare.py --python-sources
#   output       OUT/<model>/<recipe>/lr<lr>_seed<seed>/{metrics.jsonl,train.log,command.txt,run.json,exit_code};
#                OUT/stability.md and OUT/stability.png. A cell whose exit_code exists is not run again (a grid can be
#                run in parts: several calls with --models / --recipes, or again after an interruption); --force
#                runs every cell again.
#   estimate     printed before any run: the FLOPs of train_gpt --dry-run for every cell / --tflops (effective
#                TFLOPS of a small model on one H100, an assumption) + --overhead-s per run (start-up, validation).
# A run that the divergence guard stops is a result (recorded, the grid goes on); any other failure stops the grid.
# TRAIN_GPT in the environment names the binary (default: <build>/train_gpt).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS="gpt2-mini llama-mini"
RECIPES="bf16 fp8_tensorwise fp8_delayed fp8_blockwise"
SEEDS="1 2 3"
LRS="1.2e-3 2.4e-3 4.8e-3 9.6e-3 1.92e-2 3.84e-2"
STEPS=500; BATCH=32; SEQ=512; OUT=runs/fp8_stability; DATA=data/pysrc; CORPUS=""; BUILD=build
DRY=0; FORCE=0; TFLOPS=150; OVERHEAD_S=20; MAX_SKIPPED=5; GPUS=""; PER_GPU=1
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) DRY=1; shift ;;
    --models) MODELS=$2; shift 2 ;;
    --recipes) RECIPES=$2; shift 2 ;;
    --seeds) SEEDS=$2; shift 2 ;;
    --lrs) LRS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --corpus) CORPUS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --tflops) TFLOPS=$2; shift 2 ;;
    --overhead-s) OVERHEAD_S=$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --per-gpu) PER_GPU=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "fp8_stability: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
TRAIN_GPT=${TRAIN_GPT:-$BUILD/train_gpt}
KNOWN_RECIPES="bf16 fp8_tensorwise fp8_delayed fp8_blockwise"

fail() { echo "fp8_stability: $*" >&2; exit 2; }
for r in $RECIPES; do
  case " $KNOWN_RECIPES " in *" $r "*) ;; *) fail "unknown recipe '$r' (choose from: $KNOWN_RECIPES)" ;; esac
done
for m in $MODELS; do
  case "$m" in gpt2-mini|llama-mini) ;; *) fail "unknown model '$m' (choose from: gpt2-mini llama-mini)" ;; esac
done
for s in $SEEDS; do [[ "$s" =~ ^[0-9]+$ ]] || fail "--seeds: '$s' is not a non-negative integer"; done
for lr in $LRS; do [[ "$lr" =~ ^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$ ]] || fail "--lrs: '$lr' is not a positive number"; done
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 10 ] || fail "--steps must be an integer >= 10 (got '$STEPS')"
[[ "$BATCH" =~ ^[0-9]+$ ]] && [ "$BATCH" -ge 1 ] || fail "--batch must be a positive integer (got '$BATCH')"
[ -z "$GPUS" ] || [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]] || fail "--gpus '$GPUS': give GPU indices separated by commas, e.g. 0,1,2,3"
[[ "$PER_GPU" =~ ^[0-9]+$ ]] && [ "$PER_GPU" -ge 1 ] || fail "--per-gpu must be a positive integer (got '$PER_GPU')"
[ -n "$MODELS" ] && [ -n "$RECIPES" ] && [ -n "$SEEDS" ] && [ -n "$LRS" ] || fail "an empty grid axis"
[ -z "$CORPUS" ] || [ -d "$CORPUS" ] || fail "--corpus '$CORPUS' is not a directory (give a directory that holds .py files, or leave --corpus out for this Python's site-packages)"

# The model of a grid row: its config and the overrides that make it (into the array MODEL_ARGS).
set_model_args() {
  case "$1" in
    gpt2-mini) MODEL_ARGS=(--config configs/gpt2_mini_bf16.json) ;;
    llama-mini) MODEL_ARGS=(--config configs/llama_125m_bf16.json --set model.n_layer=6 --set model.n_head=6
                            --set model.n_kv_head=2 --set model.n_embd=384 --set model.ffn_hidden=1024
                            --set model.max_seq_len=$SEQ) ;;
  esac
}
# Everything but the model, the cell (recipe, lr, seed) and the log: the same for every run of the grid.
COMMON_ARGS=(--set "data.train=$DATA/pysrc_train_*.bin" --set "data.val=$DATA/pysrc_val_*.bin"
             --set data.check_tokens=false --set train.micro_batch="$BATCH" --set train.seq_len=$SEQ
             --set train.global_batch_tokens=0 --set train.steps="$STEPS" --set train.warmup_steps=$((STEPS / 10))
             --set train.schedule=cosine --set train.final_lr_frac=0.1 --set train.grad_clip=1.0
             --set train.max_skipped_steps=$MAX_SKIPPED --set eval.every=$((STEPS / 5)) --set eval.batches=20
             --set sample.tokens=0 --set checkpoint.dir= --set log.every=50)
cell_dir() { echo "$OUT/$1/$2/lr$3_seed$4"; }

n_models=$(wc -w <<<"$MODELS"); n_recipes=$(wc -w <<<"$RECIPES")
n_seeds=$(wc -w <<<"$SEEDS"); n_lrs=$(wc -w <<<"$LRS")
runs=$((n_models * n_recipes * n_seeds * n_lrs))
echo "fp8_stability: grid of $n_models model(s) x $n_recipes recipe(s) x $n_seeds seed(s) x $n_lrs learning rate(s)" \
     "= $runs runs of $STEPS steps x $((BATCH * SEQ)) tokens"
echo "  models: $MODELS; recipes: $RECIPES; seeds: $SEEDS; learning rates: $LRS"

# The estimate: train_gpt --dry-run's FLOPs of one run of each model (recipe, lr and seed do not change them).
if [ -x "$TRAIN_GPT" ]; then
  total_flops=0
  for m in $MODELS; do
    set_model_args "$m"
    flops=$({ "$TRAIN_GPT" "${MODEL_ARGS[@]}" "${COMMON_ARGS[@]}" --dry-run 2>/dev/null || true; } |
            sed -n 's/^training .*, \([0-9.e+]*\) FLOPs in total$/\1/p')
    [ -n "$flops" ] || fail "$TRAIN_GPT --dry-run printed no FLOPs total for $m"
    total_flops=$(python3 -c "print($total_flops + $flops * $n_recipes * $n_seeds * $n_lrs)")
    echo "  $m: $flops FLOPs per run"
  done
  python3 - "$total_flops" "$TFLOPS" "$OVERHEAD_S" "$runs" <<'PY'
import sys
flops, tflops, overhead, runs = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
compute = flops / (tflops * 1e12)
total = compute + runs * overhead
print(f"estimate: {flops:.3g} FLOPs in total; at {tflops:g} effective TFLOPS {compute / 60:.1f} min of compute "
      f"+ {runs} x {overhead:g} s start-up and validation = {total / 60:.1f} GPU-minutes ({total / 3600:.2f} "
      f"GPU-hours) on one H100")
PY
else
  echo "estimate: unavailable ($TRAIN_GPT is not built; the estimate comes from its --dry-run FLOPs)"
fi

if [ "$DRY" -eq 0 ]; then
  [ -x "$TRAIN_GPT" ] || fail "$TRAIN_GPT not found: build first (cmake --build build --target train_gpt)"
  if ! ls "$DATA"/pysrc_train_*.bin >/dev/null 2>&1; then
    echo "fp8_stability: tokenising the Python sources${CORPUS:+ under $CORPUS} into $DATA"
    # shellcheck disable=SC2086
    python3 dev/data/prepare.py --python-sources --out "$DATA" --workers "$(nproc)" $CORPUS
  fi
fi

# The runs: every cell of the grid, models outermost, so that a part of the grid is a whole model's table. With
# --gpus each cell's command goes to the queue file (the cell's exit code written by the job itself).
QUEUED=()
if [ -n "$GPUS" ] && [ "$DRY" -eq 0 ]; then
  mkdir -p "$OUT"
  : > "$OUT/jobs.txt"
fi
for m in $MODELS; do
  set_model_args "$m"
  for lr in $LRS; do
    for seed in $SEEDS; do
      for recipe in $RECIPES; do
        dir=$(cell_dir "$m" "$recipe" "$lr" "$seed")
        cmd=("$TRAIN_GPT" "${MODEL_ARGS[@]}" "${COMMON_ARGS[@]}" --set precision.recipe="$recipe" --set train.lr="$lr"
             --set train.seed="$seed" --set log.jsonl="$dir/metrics.jsonl")
        if [ "$DRY" -eq 1 ]; then
          printf '%q ' "${cmd[@]}"; echo
          continue
        fi
        if [ -f "$dir/exit_code" ] && [ "$FORCE" -eq 0 ]; then
          echo "== $m $recipe lr $lr seed $seed: done before (exit code $(cat "$dir/exit_code")), not run again"
          continue
        fi
        rm -rf "$dir"; mkdir -p "$dir"
        printf '%q ' "${cmd[@]}" >"$dir/command.txt"; echo >>"$dir/command.txt"
        printf '{"model": "%s", "recipe": "%s", "lr": %s, "seed": %s, "steps": %s, "tokens_per_step": %s, "max_skipped_steps": %s}\n' \
          "$m" "$recipe" "$lr" "$seed" "$STEPS" "$((BATCH * SEQ))" "$MAX_SKIPPED" >"$dir/run.json"
        if [ -n "$GPUS" ]; then
          printf '%s> %q 2>&1; echo $? > %q\n' "$(printf '%q ' "${cmd[@]}")" "$dir/train.log" "$dir/exit_code" \
            >> "$OUT/jobs.txt"
          QUEUED+=("$dir")
          continue
        fi
        echo "== $m $recipe lr $lr seed $seed"
        set +e
        "${cmd[@]}" >"$dir/train.log" 2>&1
        rc=$?
        set -e
        echo "$rc" >"$dir/exit_code"
        grep -E "^(step .*val loss|error)" "$dir/train.log" | tail -n 2 || true
        if [ "$rc" -ne 0 ] && ! grep -q "training diverged" "$dir/train.log"; then
          echo "fp8_stability: the run failed for a reason other than divergence (log: $dir/train.log)" >&2
          exit 1
        fi
      done
    done
  done
done
if [ "$DRY" -eq 1 ]; then
  [ -z "$GPUS" ] || echo "then: python3 scripts/repro/gpu_queue.py $OUT/jobs.txt --gpus $GPUS --per-gpu $PER_GPU --logdir $OUT/queue"
  exit 0
fi
if [ ${#QUEUED[@]} -gt 0 ]; then
  python3 scripts/repro/gpu_queue.py "$OUT/jobs.txt" --gpus "$GPUS" --per-gpu "$PER_GPU" --logdir "$OUT/queue"
  failed=()
  for dir in "${QUEUED[@]}"; do
    rc=$(cat "$dir/exit_code" 2>/dev/null || echo none)
    if [ "$rc" != 0 ] && ! grep -q "training diverged" "$dir/train.log" 2>/dev/null; then failed+=("$dir"); fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "fp8_stability: ${#failed[@]} run(s) failed for a reason other than divergence (their train.log):" >&2
    printf '  %s\n' "${failed[@]}" >&2
    exit 1
  fi
fi

python3 scripts/repro/fp8_stability_report.py "$OUT" --out "$OUT/stability"
