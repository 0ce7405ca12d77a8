#!/usr/bin/env bash
# dev/bench/compare_builds.sh: the speed of two builds of train_gpt measured in one session on one GPU, alternating
# between them run by run (the first build first on even runs, second on odd ones, so a drift of the GPU's clocks
# does not favour either), each run recorded by dev/bench/bench.py in dev/bench/results/<gpu>.md under its own label.
#   usage: dev/bench/compare_builds.sh LABEL_A BUILD_A LABEL_B BUILD_B [RUN:ACCUM ...]
#     RUN:ACCUM   a bench.py run spec and its gradient-accumulation steps (default: GPT-2 124M B32 x16, 350M B16 x32,
#                 llama-1b B8 x8: the README's rows); every one is run with the recipes of RECIPES (default
#                 "bf16 fp8_tensorwise"), STEPS steps (6) of which WARMUP (2) are not timed.
# Prints one line per run and, last, the ratio B / A of tokens/s per run (from the results rows it appended).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 4 ] || { sed -n '2,9p' "$0"; exit 2; }
LABEL_A=$1 BUILD_A=$2 LABEL_B=$3 BUILD_B=$4
shift 4
RUNS=("$@")
[ ${#RUNS[@]} -gt 0 ] || RUNS=(124m:32:1024:16 350m:16:1024:32 llama-1b:8:2048:8)
read -r -a RECIPES <<<"${RECIPES:-bf16 fp8_tensorwise}"
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
WORK=${WORK:-runs/compare_builds}
mkdir -p "$WORK"

bench() {  # bench LABEL BUILD SPEC ACCUM RECIPE
  LLM8_COMMIT=$1 python3 dev/bench/bench.py --build "$2" --runs "$3" --accum "$4" --recipe "$5" --steps "$STEPS" \
    --warmup "$WARMUP" --peer none --workdir "$WORK/$1" > "$WORK/last.log" 2>&1 ||
    { tail -30 "$WORK/last.log"; echo "compare_builds: $1 $3 $5 failed"; exit 1; }
  awk '/^-+$/ { getline; print; exit }' "$WORK/last.log" | sed "s/^/$1 $3 $5: /"  # the summary's first row
}

i=0
for run in "${RUNS[@]}"; do
  spec=${run%:*} accum=${run##*:}
  for recipe in "${RECIPES[@]}"; do
    if [ $((i % 2)) -eq 0 ]; then
      bench "$LABEL_A" "$BUILD_A" "$spec" "$accum" "$recipe"; bench "$LABEL_B" "$BUILD_B" "$spec" "$accum" "$recipe"
    else
      bench "$LABEL_B" "$BUILD_B" "$spec" "$accum" "$recipe"; bench "$LABEL_A" "$BUILD_A" "$spec" "$accum" "$recipe"
    fi
    i=$((i + 1))
  done
done

# The ratio per run, from the rows just appended (the last row of each label for each model / recipe / batch).
python3 - "$LABEL_A" "$LABEL_B" <<'EOF'
import glob, os, sys
a, b = sys.argv[1], sys.argv[2]
path = max(glob.glob("dev/bench/results/*.md"), key=os.path.getmtime)
rows = {}
for line in open(path):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 12 and cells[11] in (a, b):
        key = (cells[0], cells[1], cells[3], cells[4])
        rows.setdefault(key, {})[cells[11]] = float(cells[6].replace(",", ""))
print("| model | recipe | micro-batch | accum | %s tok/s | %s tok/s | %s / %s |" % (a, b, b, a))
print("|---|---|---|---|---|---|---|")
for key, v in rows.items():
    if a in v and b in v:
        print("| %s | %s | %s | %s | %s | %s | %.4f |" % (*key, f"{v[a]:,.0f}", f"{v[b]:,.0f}", v[b] / v[a]))
EOF
