#!/usr/bin/env bash
# test/integration/test_cli: the train_gpt command line end to end: --help lists every flag and says how to train on
# several GPUs, --list-keys, --dry-run sizes, --print-config round trip, exports that refuse to overwrite (--force),
# and every kind of bad input exits non-zero with a message naming the problem, prints nothing on stdout and writes
# nothing; hostile input (deep nesting, duplicate keys, numbers that do not fit, sizes past their bounds, a FIFO or a
# directory as the config) does so within 10 s and 4 GiB of address space. With a GPU: a bad token in the middle of
# the third shard stops the run before step 1, and data.check_tokens=false lets it train.
# Usage: test_cli.sh path/to/train_gpt (run from the repository root).
set -u
BIN=$(realpath "$1")
ROOT=$(pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_ok NAME "NEEDLE" ARGS...: exit 0 and NEEDLE on stdout.
expect_ok() {
  local name=$1 needle=$2; shift 2
  local out rc
  out=$("$BIN" "$@" 2>"$WORK/stderr"); rc=$?
  [ $rc -eq 0 ] || fail "$name: exit $rc (stderr: $(cat "$WORK/stderr"))"
  grep -qF -- "$needle" <<<"$out" || fail "$name: '$needle' not in stdout"
}

# expect_error NAME CODE "NEEDLE" ARGS...: exit CODE, "error: ...NEEDLE..." on stderr, empty stdout, no files written.
expect_error() {
  local name=$1 code=$2 needle=$3; shift 3
  local before after rc
  before=$(cd "$WORK/run" && find . | sort)
  (cd "$WORK/run" && "$BIN" "$@" >"$WORK/stdout" 2>"$WORK/stderr"); rc=$?
  after=$(cd "$WORK/run" && find . | sort)
  [ $rc -eq "$code" ] || fail "$name: exit $rc, expected $code (stderr: $(cat "$WORK/stderr"))"
  grep -qF -- "error:" "$WORK/stderr" || fail "$name: no 'error:' on stderr: $(cat "$WORK/stderr")"
  grep -qF -- "$needle" "$WORK/stderr" || fail "$name: '$needle' not in stderr: $(cat "$WORK/stderr")"
  [ -s "$WORK/stdout" ] && fail "$name: printed on stdout: $(head -3 "$WORK/stdout")"
  [ "$before" == "$after" ] || fail "$name: files were written"
}

unset WORLD_SIZE OMPI_COMM_WORLD_SIZE PMI_SIZE SLURM_NTASKS

# --help documents every flag.
help=$("$BIN" --help) || fail "--help exit code"
for flag in --help --config --set --dry-run --print-config --list-keys --stop-at-step; do
  grep -qF -- "$flag" <<<"$help" || fail "--help does not list $flag"
done
# ... and says how to train on several GPUs (the build has it), as the README does.
grep -qF "not in this build" <<<"$help" && fail "--help says multi-GPU training is not in this build"
for script in scripts/run_local.sh scripts/run_mpi.sh scripts/slurm_srun.sbatch; do
  grep -qF "$script" <<<"$help" || fail "--help does not name $script"
  [ -f "$script" ] || fail "--help names $script, which is not there"
done

# --list-keys: a header and one line per key, every section present.
keys=$("$BIN" --list-keys) || fail "--list-keys exit code"
for key in model.preset model.padded_vocab_multiple data.train train.global_batch_tokens optimizer.beta1 \
           precision.recipe parallel.zero_stage checkpoint.resume eval.batches sample.top_k log.jsonl; do
  grep -qE "^$key " <<<"$keys" || fail "--list-keys lacks $key"
done
sections='model|data|train|optimizer|precision|parallel|checkpoint|eval|sample|log'
documented=$(grep -cE "^\| \`($sections)\.[a-z_0-9]+\` \|" configs/README.md)
[ "$(wc -l <<<"$keys")" -eq $((documented + 1)) ] ||
  fail "--list-keys: expected the $documented keys of configs/README.md + header, got $(wc -l <<<"$keys") lines"

# Dry runs need no GPU and report the size. They also check the data (globs and shard headers) and checkpoint.dir, so
# they run in a tree with small valid shards for the configs' globs (and the repository's configs and tokenizer).
TREE=$WORK/tree
mkdir -p "$TREE"
ln -s "$ROOT/configs" "$TREE/configs"
ln -s "$ROOT/dev" "$TREE/dev"
python3 - "$TREE" configs/*.json <<'PY' || fail "writing the shards for the dry runs"
import glob, json, os, struct, sys
tree = sys.argv[1]
for config in sys.argv[2:]:
    data = json.load(open(config))["data"]
    for key in ("train", "val"):
        if data.get(key):
            path = os.path.join(tree, data[key].replace("*", "000000"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:  # 4096 uint16 tokens after llm.c's 256-int32 header
                f.write(struct.pack("<256i", 20240520, 1, 4096, *([0] * 253)) + bytes(2 * 4096))
PY
cd "$TREE" || exit 1
expect_ok "dry-run checks" "checked: data.train: 1 shard(s) match 'data/kjv/kjv_train_*.bin', 4,096 tokens" \
  --config configs/gpt2_tiny_bf16.json --dry-run
expect_ok "dry-run checkpoint.dir" "checked: checkpoint.dir runs/gpt2_mini_bf16: can be created" \
  --config configs/gpt2_mini_bf16.json --dry-run
[ -e runs ] && fail "a dry run created runs/"
expect_ok "dry-run 124m" "124,475,904" --config configs/gpt2_124m_bf16.json --dry-run
expect_ok "dry-run 124m accumulation" "32 accumulation steps" --config configs/gpt2_124m_bf16.json --dry-run
expect_ok "dry-run tiny" "gpt2-tiny" --config configs/gpt2_tiny_bf16.json --dry-run
expect_ok "dry-run override" "lr 0.0003" --config configs/gpt2_124m_bf16.json --set train.lr=3e-4 --dry-run
WORLD_SIZE=8 expect_ok "dry-run 8 GPUs" "4 accumulation steps" --config configs/gpt2_124m_bf16.json --dry-run
for cfg in configs/*.json; do expect_ok "dry-run $cfg" "parameters" --config "$cfg" --dry-run; done
expect_ok "dry-run llama-1b" "1,076,168,704" --config configs/llama_1b_bf16.json --dry-run
expect_ok "dry-run llama-1b shape" "8 kv heads, RoPE theta 500000, tied lm_head" --config configs/llama_1b_bf16.json --dry-run
expect_ok "dry-run llama-1b vocab 128256" "1,235,814,400" --config configs/llama_1b_bf16.json \
  --set model.vocab_size=128256 --dry-run
expect_ok "dry-run llama-tiny untied" "untied lm_head" --config configs/llama_tiny_bf16.json --dry-run
# The memory plan: every row, in GiB and bytes, for the recipe and state format; ZeRO-1 shards master and states.
for row in "weights" "master weights" "gradients" "optimizer states" "precision state" "saved activations" \
           "logits and losses" "transient buffers" "cuBLASLt workspace" "total"; do
  expect_ok "dry-run memory row $row" "  $row " --config configs/llama_1b_bf16.json --dry-run
done
expect_ok "dry-run memory llama-1b" "  total               28.61 GiB      30,717,808,640 B  on one GPU" \
  --config configs/llama_1b_bf16.json --dry-run
expect_ok "dry-run memory fp8" "quantised weight caches, scales and amax histories" \
  --config configs/llama_1b_bf16.json --set precision.recipe=fp8_tensorwise --dry-run
expect_ok "dry-run memory state format" "AdamW m and v, optimizer.state_format bf16" \
  --config configs/llama_1b_bf16.json --set optimizer.state_format=bf16 --dry-run
WORLD_SIZE=8 expect_ok "dry-run memory ZeRO-1" "fp32, this rank's ZeRO-1 shard" \
  --config configs/llama_1b_bf16.json --dry-run
expect_ok "dry-run llama-7b" "6,888,361,984" --config configs/llama_1b_bf16.json --set model.preset=llama-7b \
  --set train.micro_batch=1 --dry-run
cd "$ROOT" || exit 1

# A dry run that finds problems prints its report, then exits 1 naming each problem; it writes nothing.
: >"$WORK/cfile"
out=$("$BIN" --config configs/gpt2_tiny_bf16.json --set "data.train=$WORK/none_*.bin" \
      --set "data.val=$WORK/none_val_*.bin" --set "checkpoint.dir=$WORK/cfile/run" --dry-run 2>"$WORK/stderr"); rc=$?
[ $rc -eq 1 ] || fail "dry run with problems: exit $rc, expected 1"
grep -qF "parameters" <<<"$out" || fail "dry run with problems: no report on stdout"
for needle in "error: dry run: the config is valid, but a run would stop at 3 problem(s):" \
              "data.train: no files match '$WORK/none_*.bin'" "data.val: no files match '$WORK/none_val_*.bin'" \
              "checkpoint.dir $WORK/cfile/run: it cannot be created: $WORK/cfile is not a directory"; do
  grep -qF -- "$needle" "$WORK/stderr" || fail "dry run with problems: '$needle' not in: $(cat "$WORK/stderr")"
done
[ -f "$WORK/cfile" ] && [ ! -s "$WORK/cfile" ] || fail "dry run with problems: $WORK/cfile changed"

# --print-config output is a valid config that resolves to itself.
"$BIN" --config configs/gpt2_mini_bf16.json --set train.steps=77 --print-config >"$WORK/resolved.json" ||
  fail "--print-config exit code"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert c['train']['steps']==77 and c['model']['n_layer']==6" \
  "$WORK/resolved.json" || fail "--print-config is not the resolved JSON"
"$BIN" --config "$WORK/resolved.json" --print-config >"$WORK/again.json" || fail "--print-config of its own output"
cmp -s "$WORK/resolved.json" "$WORK/again.json" || fail "--print-config does not round-trip"

# Bad input: each exits non-zero with a message naming the problem.
mkdir -p "$WORK/run"
cp "$ROOT"/configs/*.json "$WORK/run/"
printf '{\n  "train": {"lr": 1e-3,,}\n}\n' >"$WORK/run/malformed.json"
printf '{"data": {"train": "a_*.bin"}, "train": {"lrr": 1e-3}}\n' >"$WORK/run/unknown_key.json"
printf '{"data": {"train": "a_*.bin"}, "train": {"steps": "many"}}\n' >"$WORK/run/wrong_type.json"
T=gpt2_tiny_bf16.json
expect_error "missing file" 1 "cannot open config file 'no_such.json'" --config no_such.json
expect_error "malformed JSON" 1 "malformed.json: invalid JSON: parse error at line 2" --config malformed.json
expect_error "unknown key" 1 "unknown key 'train.lrr' (did you mean 'train.lr'?)" --config unknown_key.json
expect_error "key in the wrong section" 1 "did you mean 'optimizer.beta1'?" --config $T --set train.beta1=0.9
expect_error "wrong type" 1 "train.steps: expected an integer, got string" --config wrong_type.json
expect_error "wrong type in --set" 1 "train.lr: expected a number" --config $T --set train.lr=fast
expect_error "batch not dividing" 1 "must be a multiple of micro_batch * seq_len * world_size = 8 * 128 * 1 = 1024" \
  --config $T --set train.global_batch_tokens=1500
WORLD_SIZE=3 expect_error "batch not dividing the world" 1 "world_size = 16 * 1024 * 3" \
  --config gpt2_124m_bf16.json --dry-run
expect_error "seq too long" 1 "train.seq_len = 512 exceeds model.max_seq_len = 256" --config $T --set train.seq_len=512
expect_error "unknown recipe" 1 "precision.recipe: unknown recipe 'fp8_magic'" --config $T --set precision.recipe=fp8_magic
expect_error "unknown preset" 1 "unknown preset 'gpt2-huge'" --config $T --set model.preset=gpt2-huge
expect_error "unknown arch" 1 "unknown architecture 'bert' (supported: gpt2, llama)" --config $T --set model.arch=bert
expect_error "untied gpt2" 1 "gpt2 always ties" --config $T --set model.tied_embeddings=false
expect_error "llama ffn" 1 "model.ffn_hidden = 100 must be a multiple of 8 for llama" \
  --config llama_tiny_bf16.json --set model.ffn_hidden=100
expect_error "llama kv heads" 1 "model.n_head = 2 is not divisible by model.n_kv_head = 3" \
  --config llama_tiny_bf16.json --set model.n_kv_head=3
expect_error "bad --set without =" 1 "--set 'train.lr': expected section.key=value" --config $T --set train.lr
expect_error "bad --set without section" 1 "must be section.key" --config $T --set lr=3e-4
WORLD_SIZE=two expect_error "bad world size" 1 "WORLD_SIZE='two'" --config $T --dry-run
expect_error "unknown flag" 2 "--bogus" --config $T --bogus
expect_error "no --config" 2 "--config" --dry-run

# Hostile input: the same contract, within 10 s (SIGKILL after) and 4 GiB of address space (a crash, a hang or a
# blow-up gives another exit code). Every case used to crash, hang, allocate gigabytes, say "internal error" or pass.
# (AddressSanitizer reserves terabytes of address space for its shadow memory: a sanitized binary gets the time
# limit only.)
address_limit="ulimit -v 4194304"
ldd "$BIN" 2>/dev/null | grep -q libasan && address_limit=":"
printf '#!/usr/bin/env bash\n%s\nexec timeout -s KILL 10 "%s" "$@"\n' "$address_limit" "$BIN" >"$WORK/bounded"
chmod +x "$WORK/bounded"
python3 - "$WORK/run" <<'PY'
import sys
d = sys.argv[1]
open(d + "/deep.json", "w").write('{"model": {"n_layer": ' + "[" * 200000 + "}}")
open(d + "/dup.json", "w").write('{\n  "data": {"train": "a_*.bin"},\n  "train": {\n    "lr": 1e-3,\n    "lr": 3e-4\n  }\n}\n')
open(d + "/dup_section.json", "w").write('{"train": {"lr": 1e-3},\n"train": {"steps": 5}}\n')
open(d + "/overflow.json", "w").write('{"data": {"train": "a_*.bin"},\n"train": {"lr": 1e309}}\n')
open(d + "/huge.json", "w").write('{"model": {"n_layer": 2147483647, "n_embd": 2147483584}, "data": {"train": "a"}}\n')
PY
mkfifo "$WORK/run/fifo.json"
bounded_error() { BIN="$WORK/bounded" expect_error "$@"; }
bounded_error "deep nesting" 1 "deep.json: JSON nested deeper than 64 levels" --config deep.json --dry-run
bounded_error "duplicate key" 1 "dup.json: duplicate key 'train.lr' (line 5)" --config dup.json
bounded_error "duplicate section" 1 "duplicate key 'train' (line 2)" --config dup_section.json
bounded_error "number overflow" 1 "the number 1e309 of 'train.lr' (line 2) does not fit" --config overflow.json
bounded_error "number overflow in --set" 1 "--set 'train.steps=-1e309': the number -1e309" \
  --config $T --set train.steps=-1e309
bounded_error "nan in --set" 1 "train.lr: expected a number, got string" --config $T --set train.lr=nan
bounded_error "float32 overflow" 1 "model.norm_eps = 1e+39 does not fit the key's 32-bit float" \
  --config $T --set model.norm_eps=1e39 --print-config
bounded_error "sizes from a one-line config" 1 "model.n_embd must be in [1, 65536] (got 2147483584)" \
  --config huge.json --dry-run
bounded_error "layers past the bound" 1 "model.n_layer must be in [1, 1024] (got 2147483647)" \
  --config $T --set model.n_layer=2147483647 --dry-run
bounded_error "global batch near 2^63" 1 "train.global_batch_tokens must be in [0, 1099511627776]" \
  --config $T --set train.global_batch_tokens=4611686018427387904 --dry-run
WORLD_SIZE=262144 bounded_error "tokens per micro-step" 1 \
  "train.micro_batch * train.seq_len * world_size = 65536 * 128 * 262144" --config $T --set train.micro_batch=65536 --dry-run
bounded_error "micro-batch tokens" 1 "65536 * 257 = 16842752 tokens per GPU micro-batch exceeds 16777216" \
  --config $T --set train.micro_batch=65536 --set model.max_seq_len=512 --set train.seq_len=257 --dry-run
bounded_error "derived FFN width" 1 "model.n_embd must be in [1, 65536] (got 600000000)" \
  --config $T --set model.preset= --set model.n_embd=600000000 --dry-run
bounded_error "FIFO as the config" 1 "config file 'fifo.json' is a FIFO (named pipe), not a regular file" \
  --config fifo.json --dry-run
bounded_error "directory as the config" 1 "config file '.' is a directory" --config . --dry-run

# The extreme floats that fit still round-trip through --print-config.
"$BIN" --config configs/gpt2_tiny_bf16.json --set model.norm_eps=1e-45 --set model.rope_theta=3.4e38 --print-config \
  >"$WORK/extreme.json" || fail "--print-config of extreme floats"
"$BIN" --config "$WORK/extreme.json" --print-config >"$WORK/extreme_again.json" || fail "--print-config of its output"
cmp -s "$WORK/extreme.json" "$WORK/extreme_again.json" || fail "--print-config of extreme floats does not round-trip"

# With a GPU: the token check before the first step. Five shards of 20,000 GPT-2 tokens, token 60000 (past the
# vocabulary of 50257) in the middle of the third; two steps of 8 x 128 tokens read only the first shard.
if nvidia-smi -L >/dev/null 2>&1 && [ "${CUDA_VISIBLE_DEVICES-unset}" != "" ]; then
  python3 - "$WORK/shards" <<'PY'
import os, struct, sys
d = sys.argv[1]
os.makedirs(d)
for s in range(5):
    tokens = [(s * 20000 + i) % 50000 for i in range(20000)]
    if s == 2:
        tokens[10000] = 60000
    with open(f"{d}/bad_{s:06d}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
  gpu_run=(--config configs/gpt2_tiny_bf16.json --set "data.train=$WORK/shards/bad_*.bin" --set data.val= --set eval.every=0
           --set sample.tokens=0 --set train.steps=2 --set train.warmup_steps=0 --set data.shuffle=false)
  out=$("$BIN" "${gpu_run[@]}" 2>&1); rc=$?
  [ $rc -eq 1 ] || fail "bad token: exit $rc, expected 1: $out"
  grep -qF "bad_000002.bin': token 60000 at position 10000 is outside the model's vocabulary of 50257" <<<"$out" ||
    fail "bad token: not reported with shard, position, value and vocabulary: $out"
  grep -qE "^step [0-9]+/" <<<"$out" && fail "bad token: training started: $out"
  out=$("$BIN" "${gpu_run[@]}" --set data.check_tokens=false 2>&1); rc=$?
  [ $rc -eq 0 ] || fail "data.check_tokens=false: exit $rc: $out"
  grep -qE "^step 2/2" <<<"$out" || fail "data.check_tokens=false: step 2 not reached: $out"
else
  echo "(no GPU: the token-check runs are skipped)"
fi

# Exports never write into a checkpoint step directory; into a non-empty directory or over a file only with --force.
mkdir -p "$WORK/run/ck/step_00000003" "$WORK/run/full"
echo '{}' >"$WORK/run/ck/step_00000003/trainer_state.json"
echo mine >"$WORK/run/full/notes.txt"
echo mine >"$WORK/run/old.bin"
expect_error "export into a step dir" 1 "--export-hf ck/step_00000003 is a checkpoint step directory" \
  --config $T --export-hf ck/step_00000003 --force
expect_error "export llm.c into a step dir" 1 "would write into the checkpoint step directory ck/step_00000003" \
  --config $T --export-llmc ck/step_00000003/m.bin --force
expect_error "export into a non-empty dir" 1 "--export-hf full is not empty: choose another path, or add --force" \
  --config $T --export-hf full
expect_error "export over a file" 1 "--export-llmc old.bin exists" --config $T --export-llmc old.bin
(cd "$WORK/run" && "$BIN" --config $T --export-hf full --export-llmc old.bin --force \
  >"$WORK/stdout" 2>"$WORK/stderr") || fail "export with --force: $(cat "$WORK/stderr")"
[ -f "$WORK/run/full/config.json" ] && [ -f "$WORK/run/full/notes.txt" ] || fail "export with --force: files"
[ "$(head -c 4 "$WORK/run/old.bin" | od -An -tu4 | tr -d ' ')" = 20240326 ] || fail "export with --force: llm.c magic"
rm -rf "$WORK/run/ck" "$WORK/run/full" "$WORK/run/old.bin"

# Training without a GPU (GPUs hidden): the clear no-GPU message, nothing written.
CUDA_VISIBLE_DEVICES="" expect_error "no GPU" 1 \
  "no CUDA GPU found: training needs an NVIDIA GPU (compute capability 8.0 or newer); use --dry-run" --config gpt2_mini_bf16.json

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all CLI checks passed"
