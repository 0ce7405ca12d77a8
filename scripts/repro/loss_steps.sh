# scripts/repro/loss_steps.sh: sourced by scripts/repro/nvfp4.sh and quartet.sh, whose runs are
# scripts/fp8_loss_parity.sh calls (a loss comparison, then one call per ablation): their options, and their runs one
# after the other or, with --gpus, all of them at once over the GPUs through one queue (scripts/repro/gpu_queue.py).
#   repro_parse NAME "$@"  sets MODEL, OUT (default runs/NAME, runs/NAME_<model> for a Llama), MODE (--dry,
#                          --report), GPUS, BASE_SEED (--seed, or the first of --seeds: the runs logged without
#                          _seed<N>; default 42) and PARITY (the fp8_loss_parity.sh command with the options it
#                          takes: --steps --batch --seed --seeds --data --corpus --build --checkpoint-every); -h
#                          prints the caller's header
#   repro_step ARGS...     one fp8_loss_parity.sh call; with --gpus its runs are appended to OUT/jobs.txt; a call
#                          whose report finds a recipe outside its tolerance (exit 1) is a result, not a failure
#   repro_run_queue        with --gpus: trains every queued run, one per GPU of GPUS at a time
# The caller's header (its comment lines after the first) is its --help.
repro_parse() {
  REPRO=$1; shift
  MODEL=${MODEL:-gpt2-124m}; OUT=""; MODE=(); GPUS=""; BASE_SEED=42
  local pass=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --model) MODEL=$2; shift 2 ;;
      --out) OUT=$2; shift 2 ;;
      --gpus) GPUS=$2; shift 2 ;;
      --seed) pass+=("$1" "$2"); BASE_SEED=$2; shift 2 ;;
      --seeds) pass+=("$1" "$2"); read -r BASE_SEED _ <<< "$2"; shift 2 ;;
      --steps|--batch|--data|--corpus|--build|--checkpoint-every) pass+=("$1" "$2"); shift 2 ;;
      --dry|--report) MODE+=("$1"); shift ;;
      -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
      *) echo "$REPRO.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
  done
  case "$MODEL" in
    gpt2-124m) OUT=${OUT:-runs/$REPRO} ;;
    llama-350m|llama-125m) OUT=${OUT:-runs/${REPRO}_$MODEL} ;;
    *) echo "$REPRO.sh: unknown model '$MODEL' (choose from: gpt2-124m llama-350m llama-125m)" >&2; exit 2 ;;
  esac
  [ -z "$GPUS" ] || [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]] ||
    { echo "$REPRO.sh: --gpus '$GPUS': give GPU indices separated by commas, e.g. 0,1,2,3" >&2; exit 2; }
  PARITY=(bash scripts/fp8_loss_parity.sh --model "$MODEL" --out "$OUT" "${pass[@]}" "${MODE[@]}")
  if [ -n "$GPUS" ] && ! repro_mode --dry && ! repro_mode --report; then
    mkdir -p "$OUT"
    : > "$OUT/jobs.txt"
    PARITY+=(--queue "$OUT/jobs.txt")
  fi
}

repro_mode() {  # whether --dry / --report was given
  case " ${MODE[*]:-} " in *" $1 "*) return 0 ;; esac
  return 1
}

repro_step() {
  "${PARITY[@]}" "$@"
  local rc=$?
  [ $rc -le 1 ] || { echo "$REPRO.sh: scripts/fp8_loss_parity.sh $* failed (exit $rc)" >&2; exit $rc; }
}

repro_run_queue() {
  [ -n "$GPUS" ] && ! repro_mode --report || return 0
  if repro_mode --dry; then
    echo "then: python3 scripts/repro/gpu_queue.py $OUT/jobs.txt --gpus $GPUS --logdir $OUT/queue"
    return 0
  fi
  python3 scripts/repro/gpu_queue.py "$OUT/jobs.txt" --gpus "$GPUS" --logdir "$OUT/queue" ||
    { echo "$REPRO.sh: a run failed (the runs' logs: $OUT/<run>.log)" >&2; exit 3; }
}
