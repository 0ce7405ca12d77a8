#!/usr/bin/env bash
# test/integration/test_lineage_gpu: the run directory follows the run, end to end on a GPU (tiny GPT-2, KJV):
#   1. a run stopped after step 10 (checkpoints 4 and 8), then resumed from step 4 (a rollback): step_00000008 of the
#      abandoned line is moved into <run>/abandoned/<time>/, the metrics written after step 4 move to
#      metrics.jsonl.after-step-4, and the rollback line reproduces them bit for bit; its log holds steps 1..12 once
#      and its checkpoints record one run id and their parents;
#   2. checkpoint.resume=none in that directory stops before training, naming checkpoint.overwrite, and changes
#      nothing; with checkpoint.overwrite=true the checkpoints are moved aside and the old log is kept as .1.
# Skipped (exit 77) without a GPU. Usage: test_lineage_gpu.sh path/to/train_gpt (run from the repository root).
set -u
TRAIN_GPT=${1:?usage: test_lineage_gpu.sh path/to/train_gpt}
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIPPED: no NVIDIA GPU (this test trains on one)"
  exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
python3 dev/data/prepare.py --kjv --out "$TMP/data" --quiet || exit 1
RUN=$TMP/run
C=(--config configs/gpt2_tiny_bf16.json --set "data.train=$TMP/data/kjv_train_*.bin"
   --set "data.val=$TMP/data/kjv_val_*.bin" --set train.steps=12 --set eval.every=0 --set sample.tokens=0
   --set checkpoint.every=4 --set checkpoint.keep=0 --set "checkpoint.dir=$RUN")
run() {  # run NAME EXPECTED_RC ARGS...
  local name=$1 expected=$2; shift 2
  "$TRAIN_GPT" "${C[@]}" "$@" >"$TMP/$name.log" 2>&1
  local rc=$?
  [ $rc -eq "$expected" ] || { echo "FAIL: $name: exit $rc, expected $expected"; cat "$TMP/$name.log"; fail=1; }
}

echo "== 1. rollback"
run first 0 --stop-at-step 10
run rollback 0 --set "checkpoint.resume=$RUN/step_00000004"
grep -q "checkpoint: rollback: resuming from step 4" "$TMP/rollback.log" ||
  { echo "FAIL: no rollback message"; fail=1; }
# steps 5..10 and the memory record written at the end of the first run
grep -q "metrics: 7 record(s) of $RUN/metrics.jsonl written after the checkpoint of step 4" "$TMP/rollback.log" ||
  { echo "FAIL: no metrics side-file message"; cat "$TMP/rollback.log"; fail=1; }
python3 - "$RUN" <<'PY' || fail=1
import glob, json, sys
run = sys.argv[1]
def train(path):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(path)) if r["type"] == "train"]
log, side = train(run + "/metrics.jsonl"), train(run + "/metrics.jsonl.after-step-4")
assert [s for s, _ in log] == list(range(1, 13)), f"log steps {[s for s, _ in log]}"
assert [s for s, _ in side] == list(range(5, 11)), f"side-file steps {[s for s, _ in side]}"
assert dict(side) == {s: l for s, l in log if 5 <= s <= 10}, "the rollback line does not reproduce the abandoned one"
aside = glob.glob(run + "/abandoned/*/step_00000008")
assert len(aside) == 1, aside
state = lambda d: json.load(open(d + "/trainer_state.json"))
ids = {state(d)["run_id"] for d in [run + "/step_00000004", run + "/step_00000008", run + "/step_00000012", aside[0]]}
assert len(ids) == 1, f"run ids {ids}"
assert state(run + "/step_00000008")["parent"] == run + "/step_00000004", state(run + "/step_00000008")["parent"]
assert state(run + "/step_00000012")["parent"] == run + "/step_00000008"
assert state(aside[0])["parent"] == run + "/step_00000004"
print("PASS: the rollback moved the abandoned line aside and its log records; the rollback line reproduced them")
PY

echo "== 2. a new run where checkpoints are"
before=$(cd "$RUN" && find . | sort)
run none 1 --set checkpoint.resume=none
grep -q "error: .*checkpoint.dir $RUN already holds 3 checkpoint(s).*checkpoint.overwrite=true" "$TMP/none.log" ||
  { echo "FAIL: resume none: message"; cat "$TMP/none.log"; fail=1; }
[ "$before" == "$(cd "$RUN" && find . | sort)" ] || { echo "FAIL: resume none changed $RUN"; fail=1; }
run overwrite 0 --set checkpoint.resume=none --set checkpoint.overwrite=true --stop-at-step 4
[ "$(ls -d "$RUN"/abandoned/*/ | wc -l)" -eq 2 ] && [ -f "$RUN/metrics.jsonl.1" ] &&
  [ "$(ls -d "$RUN"/step_* | wc -l)" -eq 1 ] || { echo "FAIL: overwrite"; find "$RUN" | sort; fail=1; }
[ $fail -eq 0 ] && echo "PASS: resume none stops; checkpoint.overwrite moves the checkpoints aside and keeps the log"
exit $fail
