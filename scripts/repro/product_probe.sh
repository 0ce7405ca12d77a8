#!/usr/bin/env bash
# scripts/repro/product_probe.sh: quantised products of several recipes measured on the same operands (issue 18).
# Trains a model in BF16 with scripts/fp8_loss_parity.sh's settings (3072 steps of 32,768 tokens of Python sources,
# seed 42, the model's lr, warm-up 100, cosine to 10%, validation every --every steps on 40 batches) and keeps a
# checkpoint every --every steps; then, from the random initialisation and from each checkpoint, runs one training
# step of each probe recipe with log.numerics_products on and precision.fp8_activations off (wgrad needs the BF16
# input): the same weights and the same batch for every recipe, so the products' SNRs against the BF16 products of the
# unquantised operands differ only by the recipe. Writes OUT/<probe>_<step>.jsonl and the table of
# scripts/repro/product_compare.py (OUT/products.md).
#
#   usage: bash scripts/repro/product_probe.sh [--model M] [--out DIR] [--data DIR] [--build DIR] [--every N]
#                                              [--steps N] [--probe "NAME section.key=value ..." ...] [--base NAME]
#                                              [--dry]
#   --model    gpt2-124m (default: batch 32 x 1024, lr 6e-4), llama-350m (16 x 2048, lr 3e-4) or llama-125m
#              (16 x 2048, lr 1e-3): fp8_loss_parity.sh's models and settings
#   --out      default runs/product_probe_<model> (the BF16 run's checkpoints in OUT/ck, its log OUT/bf16_run.jsonl)
#   --data     default data/pysrc, tokenised on first use by dev/data/prepare.py --python-sources
#   --every    checkpoint interval of the BF16 run (default 768: probes at 0, 768, 1536, 2304, 3072)
#   --probe    a probe recipe: its name and overrides (repeatable; default: tw = fp8_tensorwise, bwfp32 =
#              fp8_blockwise with FP32 block scales (the preset), bwpow2 = fp8_blockwise with power-of-two block
#              scales (DeepSeek-V3's)); --base names the one the table compares with (default tw)
#   --dry      prints the commands and runs nothing
#   A BF16 run whose final checkpoint exists is not trained again. TRAIN_GPT in the environment names the binary.
#   Exit status: 0 done, 2 bad arguments or a missing binary, 3 a run failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=gpt2-124m; OUT=""; DATA=data/pysrc; BUILD=build; EVERY=768; STEPS=3072; DRY=0; BASE=tw
PROBE_NAMES=(); PROBE_SETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --every) EVERY=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --probe) read -r name sets <<< "$2"; PROBE_NAMES+=("$name"); PROBE_SETS+=("${sets:-}"); shift 2 ;;
    --dry) DRY=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "product_probe: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$MODEL" in
  gpt2-124m) CONFIG=configs/gpt2_124m_bf16.json; BATCH=32; SEQ=1024; LR=6e-4 ;;
  llama-350m) CONFIG=configs/llama_350m_bf16.json; BATCH=16; SEQ=2048; LR=3e-4 ;;
  llama-125m) CONFIG=configs/llama_125m_bf16.json; BATCH=16; SEQ=2048; LR=1e-3 ;;
  *) echo "product_probe: unknown model '$MODEL' (choose from: gpt2-124m llama-350m llama-125m)" >&2; exit 2 ;;
esac
OUT=${OUT:-runs/product_probe_$MODEL}
if [ ${#PROBE_NAMES[@]} -eq 0 ]; then
  PROBE_NAMES=(tw bwfp32 bwpow2)
  PROBE_SETS=("precision.recipe=fp8_tensorwise" "precision.recipe=fp8_blockwise precision.pow2_scales=false"
              "precision.recipe=fp8_blockwise precision.pow2_scales=true")
fi
for v in "$EVERY" "$STEPS"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "product_probe: --every and --steps take positive integers, got '$v'" >&2; exit 2; }
done
TRAIN_GPT=${TRAIN_GPT:-$BUILD/train_gpt}
if [ "$DRY" -eq 0 ]; then
  [ -x "$TRAIN_GPT" ] || { echo "product_probe: no binary at $TRAIN_GPT (hint: cmake --build $BUILD, or --build DIR)" >&2; exit 2; }
  if ! ls "$DATA"/pysrc_train_*.bin > /dev/null 2>&1; then
    echo "product_probe: tokenising the Python sources into $DATA"
    python3 dev/data/prepare.py --python-sources --out "$DATA" --workers "$(nproc)"
  fi
  mkdir -p "$OUT"
fi
COMMON=(--config "$CONFIG" --set "data.train=$DATA/pysrc_train_*.bin" --set train.micro_batch=$BATCH
        --set train.seq_len=$SEQ --set train.global_batch_tokens=0 --set train.seed=42 --set sample.every=0
        --set sample.tokens=0 --set log.every=100 --set train.lr=$LR)
run() {  # run LOG ARGS...: one train_gpt call (printed with --dry)
  local log=$1; shift
  if [ "$DRY" -eq 1 ]; then printf '%q ' "$TRAIN_GPT" "$@"; echo; return 0; fi
  "$TRAIN_GPT" "$@" > "$log" 2>&1 || { echo "product_probe: run failed (log: $log)" >&2; tail -5 "$log" >&2; exit 3; }
}
ck() { printf '%s/ck/step_%08d' "$OUT" "$1"; }

# 1. The BF16 run with its checkpoints.
if [ "$DRY" -eq 1 ] || [ ! -d "$(ck "$STEPS")" ]; then
  echo "product_probe: BF16 run, $STEPS steps, a checkpoint every $EVERY"
  run "$OUT/bf16_run.log" "${COMMON[@]}" --set "data.val=$DATA/pysrc_val_*.bin" --set train.steps="$STEPS" \
    --set train.warmup_steps=100 --set train.final_lr_frac=0.1 --set eval.every="$EVERY" --set eval.batches=40 \
    --set checkpoint.dir="$OUT/ck" --set checkpoint.every="$EVERY" --set checkpoint.keep=0 \
    --set checkpoint.resume=auto --set log.jsonl="$OUT/bf16_run.jsonl"
fi

# 2. One step of every probe recipe from the initialisation and from each checkpoint.
for ((s = 0; s <= STEPS; s += EVERY)); do
  init=""; [ "$s" -gt 0 ] && init=$(ck "$s")
  for i in "${!PROBE_NAMES[@]}"; do
    sets=(); for kv in ${PROBE_SETS[$i]}; do sets+=(--set "$kv"); done
    name=${PROBE_NAMES[$i]}_$s
    [ "$DRY" -eq 1 ] || echo "product_probe: $name"
    run "$OUT/$name.log" "${COMMON[@]}" --set data.val= --set eval.every=0 --set train.steps=1 \
      --set train.warmup_steps=0 --set checkpoint.dir= --set train.init_from="$init" --set log.numerics_every=1 \
      --set log.numerics_products=true --set precision.fp8_activations=false --set log.jsonl="$OUT/$name.jsonl" \
      "${sets[@]}"
  done
done
[ "$DRY" -eq 1 ] && exit 0
python3 scripts/repro/product_compare.py "$OUT" --base "$BASE" --md "$OUT/products.md"
