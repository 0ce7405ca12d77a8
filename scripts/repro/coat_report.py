#!/usr/bin/env python3
"""scripts/repro/coat_report.py: the Markdown report of a COAT reproduction (scripts/repro/coat.sh) beside the paper.

Reads the benchmark's raw records (<out>/bench/raw/*.jsonl, one JSON object per run from dev/bench/bench.py: the row
with model, recipe, micro_batch, tokens_per_s, mem_gib, and max_batch for a B=max run) and the loss logs
(<out>/loss/<recipe>.jsonl and, trained with --seeds, <recipe>_seed<N>.jsonl from scripts/fp8_loss_parity.sh), and
writes <out>/coat.md:
  - peak memory and tokens/s at equal micro-batches, each against bf16's (the median of a recipe's rounds where a
    run was repeated), one group per model and micro-batch: coat.sh's fixed one for every recipe, and coat at
    BF16's largest, against BF16's B=max run (which is a run at that micro-batch);
  - tokens/s and the micro-batch at each recipe's largest micro-batch, against bf16's;
  - the final validation losses and the held-out losses (the mean train loss of the last 300 steps, unseen batches)
    per seed, against bf16 and fp8_tensorwise paired by seed (scripts/repro/seed_report.py's pairing: the mean of the
    per-seed relative differences ± its standard error); the loss goals are judged on the paired mean of the final
    validation loss, and with several seeds the line adds seed_report's two-standard-error verdict (what the seeds
    can decide);
  - the issue's goals, each met, not met or not measured, and COAT's own numbers (shared/reference/fp8_recipes.md §1).
Exit code: 0 when every measured goal is met, 1 when one is not, 2 when there is nothing to report.

  usage: coat_report.py OUT [--base-seed S]   (S: the seed of the logs without _seed<N>, the first one trained)
         coat_report.py OUT --bf16-max-runs MODEL,...   prints bench.py's --runs at BF16's largest micro-batch of
                                                        each model (from OUT's B=max records; exit 1 if one lacks it)
"""
import argparse
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402
import seed_report  # noqa: E402

RECIPES = ("bf16", "fp8_tensorwise", "coat")
PAPER = [
    "Table 7 (Llama-2-7B, 4 x H100, context 2048; BF16 / TE FP8 / COAT): peak 55.1 / 51.1 / 35.6 GB (COAT 0.65x "
    "BF16), 7730 / 9577 / 11257 tokens/s per GPU (1.45x), COAT at twice the micro-batch",
    "Table 2 (activation memory per Llama layer, U = B*S*H*2 bytes): BF16 22.66U, TE 18.33U, COAT 13.33U (0.59x)",
    "Fig. 1c (Llama-2-7B, GB; optimizer / activations / weights / gradients): BF16 12.6 / 40.2 / 6.3 / 6.3, "
    "COAT 3.2 / 26.4 / 6.3 / 6.3",
    "OLMo-1B, 300B tokens: final loss 2.551 (BF16) vs 2.568 (COAT, +0.67%); OLMo-7B 2.366 vs 2.379 (+0.55%)",
]


def bench_rows(out):
    """{(model, micro_batch): {recipe: [row, ...]}} of the successful fixed micro-batch runs, and {(model, None):
    ...} of the B=max runs. BF16's B=max rows also join the fixed group of their micro-batch when another recipe ran
    at it (coat.sh's pass at BF16's largest micro-batch)."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "bench", "raw", "*.jsonl"))):
        for rec in runlog.read_records(path):
            row = rec.get("row")
            if not rec.get("ok") or not row or rec.get("impl", "llm8") != "llm8":
                continue
            key = (row["model"], None if rec.get("max_batch") else row["micro_batch"])
            runs.setdefault(key, {}).setdefault(row["recipe"], []).append(row)
    for (model, b), recipes in list(runs.items()):
        if b is not None:
            continue
        for row in recipes.get("bf16", []):
            group = runs.get((model, row["micro_batch"]))
            if group is not None and "bf16" not in group:
                group["bf16"] = [row]
    return runs


def bf16_max_runs(out, models):
    """bench.py's --runs for each model at BF16's largest micro-batch (its last B=max record), or None."""
    runs = bench_rows(out)
    specs = []
    for model in models:
        rows = runs.get((model, None), {}).get("bf16")
        if not rows:
            return None
        specs.append(f"{model}:{rows[-1]['micro_batch']}:2048")
    return ",".join(specs)


def median_row(rows):
    """The tokens/s and peak memory medians of a recipe's rounds, with their (common) micro-batch."""
    return {"micro_batch": rows[0]["micro_batch"],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
            "mem_gib": statistics.median(r["mem_gib"] for r in rows if r.get("mem_gib") is not None)
            if any(r.get("mem_gib") is not None for r in rows) else None}


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(value, spec, none="n/a"):
    return none if value is None else format(value, spec)


def goal(results, text, value, ok, note=""):
    """Appends a goal line: met / not met with the measured value (and a note after the verdict), or not measured."""
    state = "not measured" if value is None else ("**met**" if ok(value) else "**not met**") + note
    results.append((text, value, state))


def loss_table(by_recipe, measure):
    """The lines of one loss table: per recipe the loss of every seed, and the difference to bf16 and to
    fp8_tensorwise paired by seed (seed_report.paired: mean ± standard error over the common seeds)."""
    if not by_recipe:
        return []
    seeds = sorted({s for per_seed in by_recipe.values() for s in per_seed})
    lines = [f"## {measure} (same data; seeds {', '.join(map(str, seeds))})", "",
             "| recipe | per seed | vs bf16 | vs fp8_tensorwise |", "| --- | --- | --- | --- |"]
    for recipe in RECIPES:
        if recipe not in by_recipe:
            continue
        per_seed = " / ".join(f"{by_recipe[recipe][s]:.4f}" if s in by_recipe[recipe] else "—" for s in seeds)
        cells = [seed_report.fmt_paired(seed_report.paired(by_recipe[recipe], by_recipe[base]))
                 if base in by_recipe and base != recipe else "—" for base in ("bf16", "fp8_tensorwise")]
        lines.append(f"| {recipe} | {per_seed} | {cells[0]} | {cells[1]} |")
    return lines + [""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the output directory of scripts/repro/coat.sh")
    ap.add_argument("--base-seed", type=int, default=42,
                    help="the seed of the loss logs without _seed<N> (the first seed trained; default 42)")
    ap.add_argument("--bf16-max-runs", metavar="MODELS",
                    help="print bench.py's --runs for these comma-separated models at BF16's largest micro-batch "
                         "(from the B=max records) and exit")
    args = ap.parse_args(argv)
    if args.bf16_max_runs:
        spec = bf16_max_runs(args.out, args.bf16_max_runs.split(","))
        if spec is None:
            print(f"coat_report.py: no successful bf16 B=max record for every one of {args.bf16_max_runs} under "
                  f"{args.out}/bench/raw", file=sys.stderr)
            return 1
        print(spec)
        return 0
    runs = bench_rows(args.out)
    losses, held_out = {}, {}  # {recipe: {seed: loss}}
    if os.path.isdir(os.path.join(args.out, "loss")):
        val_runs, tail_runs = seed_report.collect(os.path.join(args.out, "loss"), args.base_seed)
        losses = {r: val_runs[r] for r in RECIPES if r in val_runs}
        held_out = {r: tail_runs[r] for r in RECIPES if r in tail_runs}
    if not runs and not losses:
        print(f"coat_report.py: no benchmark records under {args.out}/bench/raw and no loss logs under "
              f"{args.out}/loss", file=sys.stderr)
        return 2

    lines = ["# COAT in our numbers", "",
             "Written by `scripts/repro/coat.sh` (`scripts/repro/coat_report.py`). `coat` = fp8_tensorwise GEMMs, the "
             "norm and GELU / SwiGLU inputs saved as E4M3 1x16 groups (GELU / SwiGLU computed from them and recomputed in "
             "backward), the weights' FP8 codes made in every forward and backward (no weight cache), AdamW moments "
             "fp8_expand; peak memory is the "
             "trainer's measured peak (cudaMemGetInfo); tokens/s the median step after the warm-up.", ""]
    goals = []
    for max_batch, title in ((False, "At equal micro-batch"),
                             (True, "At each recipe's largest micro-batch (B=max, from the memory plan)")):
        groups = sorted((k for k in runs if (k[1] is None) == max_batch), key=lambda k: (k[0], k[1] or 0))
        if not groups:
            continue
        lines += [f"## {title}", "", "| model | recipe | micro-batch | peak GiB | vs bf16 | tokens/s | vs bf16 |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for model, b in groups:
            by_recipe = {r: median_row(rows) for r, rows in runs[(model, b)].items()}
            base = by_recipe.get("bf16")
            for recipe in sorted(by_recipe, key=lambda r: (RECIPES.index(r) if r in RECIPES else len(RECIPES), r)):
                m = by_recipe[recipe]
                mem_ratio = ratio(m["mem_gib"], base and base["mem_gib"])
                tok_ratio = ratio(m["tokens_per_s"], base and base["tokens_per_s"])
                lines.append(f"| {model} | {recipe} | {m['micro_batch']} | {fmt(m['mem_gib'], '.1f')} | "
                             f"{fmt(mem_ratio, '.3f')} | {fmt(m['tokens_per_s'], ',.0f')} | {fmt(tok_ratio, '.3f')} |")
                if recipe != "coat" or base is None:
                    continue
                if not max_batch and model in ("llama-1b", "llama-3b"):
                    goal(goals, f"{model}, equal micro-batch ({b}): coat peak memory <= 0.65x bf16's", mem_ratio,
                         lambda v: v <= 0.65)
                if max_batch and model in ("llama-1b", "llama-3b", "llama-7b"):
                    goal(goals, f"{model}, largest micro-batches: coat tokens/s >= 1.4x bf16's", tok_ratio,
                         lambda v: v >= 1.4)
                if max_batch and model == "llama-7b":
                    goal(goals, "llama-7b: coat's largest micro-batch >= 3x bf16's",
                         ratio(m["micro_batch"], base["micro_batch"]), lambda v: v >= 3)
        lines.append("")
    if losses:
        lines += loss_table(losses, "Final validation loss") + loss_table(held_out, "Held-out loss, the last 300 steps")
        for base in ("bf16", "fp8_tensorwise"):
            p = seed_report.paired(losses["coat"], losses[base]) if "coat" in losses and base in losses else None
            several = p is not None and p[4] > 1
            goal(goals, f"coat's final validation loss within 0.5% of {base}'s"
                 + (f" (mean of {p[4]} seeds, paired)" if several else ""),
                 p[0] if p else None, lambda v: abs(v) <= 0.5,
                 f" on the mean; at two standard errors {seed_report.goal_verdict(p, 0.5, two_sided=True)}"
                 if several else "")
    lines += ["## Goals (issue 14)", "", "| goal | measured | |", "| --- | --- | --- |"]
    lines += [f"| {text} | {fmt(value, '.3f')} | {state} |" for text, value, state in goals]
    lines += ["", "## COAT's numbers (arXiv 2410.19313)", ""] + [f"- {p}" for p in PAPER] + [""]
    path = os.path.join(args.out, "coat.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print(f"coat_report.py: wrote {path}")
    return 1 if any(state.startswith("**not met**") for _, _, state in goals) else 0


if __name__ == "__main__":
    sys.exit(main())
