#!/usr/bin/env bash
# test/integration/test_interop: train_gpt's --export-hf / --export-llmc / --export-dtype and train.init_from with
# Hugging Face directories and llm.c model files, end to end through the binary. On the CPU (no GPU needed): a freshly
# initialised model exported, imported through train.init_from and exported again gives identical bytes (HF and
# llm.c, float32 and bfloat16, HF -> llm.c -> HF); odd vocabulary and head size 128; Llama (GQA, untied and tied,
# Hugging Face only); bad inputs exit 1 with a message naming the file / key and write nothing. With a GPU: a short
# training writes a checkpoint, --export-hf exports it (the checkpoint wins over the seed), and training starts from
# the exported HF directory and llm.c file.
# Usage: test_interop.sh path/to/train_gpt (run from the repository root).
set -u
BIN=$(realpath "$1")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
unset WORLD_SIZE OMPI_COMM_WORLD_SIZE PMI_SIZE SLURM_NTASKS

# run NAME ARGS...: exit 0 expected; stdout in $WORK/out.
run() {
  local name=$1; shift
  "$BIN" "$@" >"$WORK/out" 2>"$WORK/err" || fail "$name: exit $? ($(cat "$WORK/err"))"
}
# expect_error NAME CODE "NEEDLE" ARGS...: exit CODE, NEEDLE on stderr, nothing new under $WORK/x.
expect_error() {
  local name=$1 code=$2 needle=$3; shift 3
  local before after rc
  before=$(find "$WORK/x" | sort)
  "$BIN" "$@" >"$WORK/out" 2>"$WORK/err"; rc=$?
  after=$(find "$WORK/x" | sort)
  [ $rc -eq "$code" ] || fail "$name: exit $rc, expected $code (stderr: $(cat "$WORK/err"))"
  grep -qF -- "$needle" "$WORK/err" || fail "$name: '$needle' not in stderr: $(cat "$WORK/err")"
  [ "$before" == "$after" ] || fail "$name: files were written: $(diff <(echo "$before") <(echo "$after"))"
}
same() {  # same NAME A B: identical bytes
  cmp -s "$2" "$3" || fail "$1: $2 and $3 differ"
}
header() {  # header FILE: the first 8 int32 of an llm.c file
  python3 -c 'import struct,sys; print(*struct.unpack("<8i", open(sys.argv[1],"rb").read(32)))' "$1"
}

T=(--config configs/gpt2_tiny_bf16.json)
mkdir -p "$WORK/x"

# --help documents the flags.
help=$("$BIN" --help) || fail "--help exit code"
for flag in --export-hf --export-llmc --export-dtype; do
  grep -qF -- "$flag" <<<"$help" || fail "--help does not list $flag"
done

# 1. A fresh model (train.seed) exported in both formats, float32; no GPU used.
CUDA_VISIBLE_DEVICES="" run "export fresh" "${T[@]}" --export-hf "$WORK/hf" --export-llmc "$WORK/m.bin"
grep -qF "export: weights from fresh initialisation (train.seed = 42)" "$WORK/out" || fail "export fresh: source line"
grep -qF "export: wrote $WORK/hf/model.safetensors" "$WORK/out" || fail "export fresh: model.safetensors line"
grep -qF "export: wrote $WORK/m.bin" "$WORK/out" || fail "export fresh: m.bin line"
[ -f "$WORK/hf/config.json" ] && [ -f "$WORK/hf/model.safetensors" ] || fail "export fresh: files missing"
[ "$(header "$WORK/m.bin")" == "20240326 3 256 50257 2 2 128 50304" ] || fail "llm.c header: $(header "$WORK/m.bin")"
python3 - "$WORK/hf/config.json" <<'PY' || fail "config.json content"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["GPT2LMHeadModel"] and c["model_type"] == "gpt2", c
assert (c["vocab_size"], c["n_positions"], c["n_embd"], c["n_layer"], c["n_head"]) == (50257, 256, 128, 2, 2), c
assert c["torch_dtype"] == "float32" and c["tie_word_embeddings"] is True and c["activation_function"] == "gelu_new"
PY
# Another seed gives other weights.
run "export seed 7" "${T[@]}" --set train.seed=7 --export-hf "$WORK/hf_seed7"
cmp -s "$WORK/hf/model.safetensors" "$WORK/hf_seed7/model.safetensors" && fail "train.seed does not change the export"

# 2. Round trips through train.init_from.
run "init_from hf" "${T[@]}" --set "train.init_from=$WORK/hf" --export-hf "$WORK/hf2" --export-llmc "$WORK/m2.bin"
grep -qF "export: weights from train.init_from: Hugging Face directory $WORK/hf (gpt2)" "$WORK/out" ||
  fail "init_from hf: source line: $(cat "$WORK/out")"
same "hf -> hf" "$WORK/hf/model.safetensors" "$WORK/hf2/model.safetensors"
same "hf -> hf config" "$WORK/hf/config.json" "$WORK/hf2/config.json"
same "hf -> llm.c" "$WORK/m.bin" "$WORK/m2.bin"
run "init_from llm.c" "${T[@]}" --set "train.init_from=$WORK/m.bin" --export-hf "$WORK/hf3" --export-llmc "$WORK/m3.bin"
grep -qF "train.init_from: llm.c model file $WORK/m.bin" "$WORK/out" || fail "init_from llm.c: source line"
same "llm.c -> hf" "$WORK/hf/model.safetensors" "$WORK/hf3/model.safetensors"
same "llm.c -> llm.c" "$WORK/m.bin" "$WORK/m3.bin"

# 3. bfloat16: lossy once, then stable; llm.c version 5.
run "export bf16" "${T[@]}" --export-dtype bfloat16 --export-hf "$WORK/hfb" --export-llmc "$WORK/mb.bin"
[ "$(header "$WORK/mb.bin" | cut -d' ' -f1-2)" == "20240326 5" ] || fail "bf16 llm.c header: $(header "$WORK/mb.bin")"
grep -qF '"torch_dtype": "bfloat16"' "$WORK/hfb/config.json" || fail "bf16 config.json torch_dtype"
run "bf16 again" "${T[@]}" --set "train.init_from=$WORK/hfb" --export-dtype bfloat16 --export-hf "$WORK/hfb2" \
  --export-llmc "$WORK/mb2.bin"
same "bf16 hf stable" "$WORK/hfb/model.safetensors" "$WORK/hfb2/model.safetensors"
same "bf16 llm.c stable" "$WORK/mb.bin" "$WORK/mb2.bin"
run "bf16 -> f32" "${T[@]}" --set "train.init_from=$WORK/mb.bin" --export-hf "$WORK/hfbf"
run "bf16 -> f32 -> f32" "${T[@]}" --set "train.init_from=$WORK/hfbf" --export-hf "$WORK/hfbf2"
same "bf16-valued f32 stable" "$WORK/hfbf/model.safetensors" "$WORK/hfbf2/model.safetensors"

# 4. Odd vocabulary (1000, padded to 1024) and head size 128.
ODD=("${T[@]}" --set model.vocab_size=1000 --set model.n_head=1)
run "odd export" "${ODD[@]}" --export-hf "$WORK/hfo" --export-llmc "$WORK/mo.bin"
[ "$(header "$WORK/mo.bin")" == "20240326 3 256 1000 2 1 128 1024" ] ||
  fail "odd llm.c header: $(header "$WORK/mo.bin")"
run "odd init_from" "${ODD[@]}" --set "train.init_from=$WORK/mo.bin" --export-hf "$WORK/hfo2"
same "odd llm.c -> hf" "$WORK/hfo/model.safetensors" "$WORK/hfo2/model.safetensors"
python3 - "$WORK/hfo/model.safetensors" <<'PY' || fail "odd vocabulary: HF shapes"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
assert h["transformer.wte.weight"]["shape"] == [1000, 128], h["transformer.wte.weight"]
assert h["transformer.h.0.attn.c_attn.weight"]["shape"] == [128, 384]      # Conv1D (in, out)
assert h["transformer.h.1.mlp.c_proj.weight"]["shape"] == [512, 128]
assert "lm_head.weight" not in h and h["__metadata__"]["format"] == "pt"
PY

# 5. Llama (llama-tiny: grouped-query attention, untied lm_head): Hugging Face only.
L=(--config configs/llama_tiny_bf16.json)
run "llama export" "${L[@]}" --export-hf "$WORK/hfl"
grep -qF '"LlamaForCausalLM"' "$WORK/hfl/config.json" || fail "llama config.json architectures"
grep -qF '"num_key_value_heads": 1' "$WORK/hfl/config.json" || fail "llama config.json num_key_value_heads"
grep -qF '"tie_word_embeddings": false' "$WORK/hfl/config.json" || fail "llama config.json tie_word_embeddings"
run "llama init_from" "${L[@]}" --set "train.init_from=$WORK/hfl" --export-hf "$WORK/hfl2"
grep -qF "Hugging Face directory $WORK/hfl (llama)" "$WORK/out" || fail "llama init_from: source line"
same "llama hf -> hf" "$WORK/hfl/model.safetensors" "$WORK/hfl2/model.safetensors"
same "llama hf -> hf config" "$WORK/hfl/config.json" "$WORK/hfl2/config.json"
run "llama bf16" "${L[@]}" --set model.tied_embeddings=true --export-dtype bfloat16 --export-hf "$WORK/hflb"
run "llama bf16 again" "${L[@]}" --set model.tied_embeddings=true --set "train.init_from=$WORK/hflb" \
  --export-dtype bfloat16 --export-hf "$WORK/hflb2"
same "llama bf16 stable" "$WORK/hflb/model.safetensors" "$WORK/hflb2/model.safetensors"
expect_error "llama to llm.c" 1 "llm.c model files hold GPT-2 models only" "${L[@]}" --export-llmc "$WORK/x/l.bin"
expect_error "llama into a gpt2 config" 1 'model.arch = "llama" but the config says "gpt2"' \
  "${T[@]}" --set "train.init_from=$WORK/hfl" --export-hf "$WORK/x/out"
expect_error "untied into tied" 1 "model.tied_embeddings = false but the config says true" \
  "${L[@]}" --set model.tied_embeddings=true --set "train.init_from=$WORK/hfl" --export-hf "$WORK/x/out"

# 6. Bad inputs: exit 1 (or 2 for usage), a message naming the problem, nothing written.
expect_error "model mismatch hf" 1 "model.n_layer = 2 but the config says 3" \
  "${T[@]}" --set model.n_layer=3 --set "train.init_from=$WORK/hf" --export-hf "$WORK/x/out"
expect_error "model mismatch llm.c" 1 "$WORK/m.bin: the imported model has model.vocab_size = 50257" \
  "${T[@]}" --set model.vocab_size=1000 --set "train.init_from=$WORK/m.bin" --export-llmc "$WORK/x/out.bin"
head -c 5000 "$WORK/m.bin" >"$WORK/trunc.bin"
expect_error "truncated llm.c" 1 "$WORK/trunc.bin is 5000 bytes" \
  "${T[@]}" --set "train.init_from=$WORK/trunc.bin" --export-hf "$WORK/x/out"
expect_error "missing init_from" 1 "$WORK/nothing does not exist" \
  "${T[@]}" --set "train.init_from=$WORK/nothing" --export-hf "$WORK/x/out"
mkdir -p "$WORK/mistral" && cp "$WORK/hf/model.safetensors" "$WORK/mistral/"
echo '{"model_type": "mistral", "architectures": ["MistralForCausalLM"]}' >"$WORK/mistral/config.json"
expect_error "unknown architecture" 1 "$WORK/mistral/config.json: unknown architecture (model_type 'mistral'" \
  "${T[@]}" --set "train.init_from=$WORK/mistral" --export-hf "$WORK/x/out"
expect_error "llm.c needs ffn 4C" 1 "model.ffn_hidden is 256; use --export-hf" \
  "${T[@]}" --set model.ffn_hidden=256 --export-llmc "$WORK/x/out.bin"
expect_error "bad dtype" 2 "--export-dtype" "${T[@]}" --export-dtype fp8 --export-hf "$WORK/x/out"
expect_error "export with dry run" 2 "excludes" "${T[@]}" --dry-run --export-hf "$WORK/x/out"

# 7. With a GPU: export a trained checkpoint, then train from the exported files.
if nvidia-smi -L >/dev/null 2>&1; then
  python3 dev/data/prepare.py --kjv --out "$WORK/data" --quiet || fail "prepare.py"
  G=("${T[@]}" --set "data.train=$WORK/data/kjv_train_*.bin" --set "data.val=$WORK/data/kjv_val_*.bin"
     --set train.steps=2 --set train.warmup_steps=1 --set eval.every=0 --set sample.tokens=0)
  run "train 2 steps" "${G[@]}" --set "checkpoint.dir=$WORK/run"
  run "export checkpoint" "${G[@]}" --set "checkpoint.dir=$WORK/run" --export-hf "$WORK/hf_ck" \
    --export-llmc "$WORK/ck.bin"
  grep -qF "export: weights from checkpoint $WORK/run/step_00000002 (step 2)" "$WORK/out" ||
    fail "export checkpoint: source line: $(cat "$WORK/out")"
  cmp -s "$WORK/hf/model.safetensors" "$WORK/hf_ck/model.safetensors" && fail "the checkpoint export is the seed's"
  run "train from hf" "${G[@]}" --set "train.init_from=$WORK/hf_ck"
  grep -qF "init: weights from Hugging Face directory $WORK/hf_ck (gpt2)" "$WORK/out" || fail "train from hf: init"
  run "train from llm.c" "${G[@]}" --set "train.init_from=$WORK/ck.bin"
  grep -qF "init: weights from llm.c model file $WORK/ck.bin" "$WORK/out" || fail "train from llm.c: init"
else
  echo "note: no GPU; the checkpoint export and training from imported weights were not run"
fi

if [ $failures -ne 0 ]; then
  echo "$failures interop check(s) failed"
  exit 1
fi
echo "all interop checks passed"
