#!/usr/bin/env bash
# scripts/repro/coat.sh: COAT (arXiv 2410.19313) in our numbers, in one command (issue 14):
#   1. memory and speed on one GPU (dev/bench/bench.py, --accum micro-steps per optimizer step, default 4), Llama at
#      T = 2048 with bf16, fp8_tensorwise and coat (fp8_tensorwise GEMMs + FP8 norm / SwiGLU inputs, SwiGLU computed
#      from its copy and recomputed, no weight cache + fp8_expand moments):
#      a. llama-1b and llama-3b at one micro-batch for every recipe (--batch-1b, --batch-3b: default 8 and 4, what
#         BF16 fits on an 80 GB H100), for the peak-memory ratio;
#      b. the same models at each recipe's largest micro-batch (B=max, found from the memory plan), for tokens/s;
#         then coat again at BF16's largest micro-batch (read from b's records; BF16MAX in --dry), for the
#         peak-memory ratio at the equal micro-batch where activations weigh most;
#      c. llama-7b at B=max with bf16 and coat, on a GPU of more than 120 GiB (an H200; skipped otherwise);
#   2. the loss comparison: bf16, fp8_tensorwise and coat trained from the same seed on the same data (llama-350m or
#      GPT-2 124M, 100.7M tokens of Python sources by default) through scripts/fp8_loss_parity.sh (--tolerance 0.5);
#      --seeds "42 43 44" trains each recipe once per seed and the report pairs them by seed (one seed's run differs
#      from another's by more than 0.5%: dev/bench/results/loss_gpt2_124m_100m/README.md);
#   3. scripts/repro/coat_report.py: OUT/coat.md, the measured tables beside the paper's numbers and the issue's
#      goals, each met or not.
#
#   usage: bash scripts/repro/coat.sh [--model llama-350m|gpt2-124m] [--steps N] [--seed S | --seeds "S ..."]
#                                     [--batch-1b B] [--batch-3b B] [--accum K] [--bench-steps N] [--out DIR]
#                                     [--data DIR] [--corpus DIR] [--build DIR] [--gpus LIST] [--skip-bench]
#                                     [--skip-loss] [--checkpoint-every N] [--dry] [--report]
#   --dry prints every command and runs nothing; --report writes OUT/coat.md from the logs already in OUT; --gpus 0,1,2
#   trains the three loss runs at once, one per GPU (scripts/fp8_loss_parity.sh --gpus).
#   COAT's Table 1 (the error of the FP8 moments on a real run's FP32 moments) is dev/tools/state_error on a
#   checkpoint: dev/bench/results/coat/state_error_llama350m.md says how it was measured.
#   OUT defaults to runs/coat; the bench rows go to OUT/bench (raw JSONL and a Markdown table per GPU), the loss logs
#   to OUT/loss.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODEL=llama-350m; OUT=runs/coat; BUILD=build; B1=8; B3=4; ACCUM=4; BENCH_STEPS=6
LOSS=(); BASE_SEED=42; DRY=0; REPORT=0; SKIP_BENCH=0; SKIP_LOSS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --build) BUILD=$2; LOSS+=("$1" "$2"); shift 2 ;;
    --batch-1b) B1=$2; shift 2 ;;
    --batch-3b) B3=$2; shift 2 ;;
    --accum) ACCUM=$2; shift 2 ;;
    --bench-steps) BENCH_STEPS=$2; shift 2 ;;
    --seed) LOSS+=("$1" "$2"); BASE_SEED=$2; shift 2 ;;
    --seeds) LOSS+=("$1" "$2"); read -r BASE_SEED _ <<< "$2"; shift 2 ;;
    --steps|--data|--corpus|--gpus|--checkpoint-every) LOSS+=("$1" "$2"); shift 2 ;;
    --skip-bench) SKIP_BENCH=1; shift ;;
    --skip-loss) SKIP_LOSS=1; shift ;;
    --dry) DRY=1; shift ;;
    --report) REPORT=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "coat.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$MODEL" in
  llama-350m|gpt2-124m) ;;
  *) echo "coat.sh: unknown model '$MODEL' (choose from: llama-350m gpt2-124m)" >&2; exit 2 ;;
esac
for n in "$B1" "$B3" "$ACCUM" "$BENCH_STEPS"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "coat.sh: '$n' is not a positive integer" >&2; exit 2; }
done
[ "$BENCH_STEPS" -ge 3 ] || { echo "coat.sh: --bench-steps must be at least 3 (one warm-up step is dropped)" >&2; exit 2; }

RECIPES=bf16,fp8_tensorwise,coat
BENCH=(python3 dev/bench/bench.py --build "$BUILD" --peer none --accum "$ACCUM" --steps "$BENCH_STEPS" --warmup 2
       --results "$OUT/bench" --workdir "$OUT/bench/logs")
run() {  # prints the command; runs it unless --dry; a failing step stops the script
  echo "+ $*"
  [ $DRY -eq 1 ] && return 0
  "$@" || { echo "coat.sh: '$*' failed (exit $?)" >&2; exit 1; }
}
if [ $REPORT -eq 0 ]; then
  if [ $SKIP_BENCH -eq 0 ]; then
    run "${BENCH[@]}" --runs "llama-1b:$B1:2048,llama-3b:$B3:2048" --recipe "$RECIPES"
    run "${BENCH[@]}" --runs llama-1b:max:2048,llama-3b:max:2048 --recipe "$RECIPES"
    if [ $DRY -eq 1 ]; then
      run "${BENCH[@]}" --runs "llama-1b:BF16MAX:2048,llama-3b:BF16MAX:2048" --recipe coat
    else
      at_bf16_max=$(python3 scripts/repro/coat_report.py "$OUT" --bf16-max-runs llama-1b,llama-3b) ||
        { echo "coat.sh: no BF16 B=max record to take the micro-batch from" >&2; exit 1; }
      run "${BENCH[@]}" --runs "$at_bf16_max" --recipe coat
    fi
    gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    if [ $DRY -eq 1 ] || [ "${gib:-0}" -gt $((120 * 1024)) ]; then
      run "${BENCH[@]}" --runs llama-7b:max:2048 --recipe bf16,coat
    else
      echo "coat.sh: llama-7b needs a GPU of more than 120 GiB (this one: ${gib:-no} MiB): skipped"
    fi
  fi
  if [ $SKIP_LOSS -eq 0 ]; then
    PARITY=(bash scripts/fp8_loss_parity.sh --model "$MODEL" --out "$OUT/loss" --recipes "bf16 fp8_tensorwise coat"
            --tolerance 0.5 "${LOSS[@]}")
    [ $DRY -eq 1 ] && PARITY+=(--dry)
    echo "+ ${PARITY[*]}"
    "${PARITY[@]}"
    rc=$?  # 1: a recipe outside the tolerance, which is a result, not a failure
    [ $rc -le 1 ] || { echo "coat.sh: scripts/fp8_loss_parity.sh failed (exit $rc)" >&2; exit $rc; }
  fi
fi
[ $DRY -eq 1 ] && exit 0
python3 scripts/repro/coat_report.py "$OUT" --base-seed "$BASE_SEED"
