#!/usr/bin/env python3
"""scripts/repro/fp4_report.py: the Markdown table of an FP4 reproduction (scripts/repro/nvfp4.sh, quartet.sh) beside the
paper.

Reads <out>/<run>.jsonl for every run named by --runs (train_gpt's JSONL logs: the plain recipes bf16,
fp8_tensorwise, nvfp4 and the ablation variants <recipe>_<tag>) and writes <out>/<paper>.md:
  - per run: the final validation loss, its difference to the bf16 run and to the fp8_tensorwise run in percent
    ((run - base) / base), for an ablation (a run named <recipe>_<tag>) its difference to the plain <recipe> run and
    whether it raised the loss, the skipped steps, the tokens, what the paper found for that run, and the mean train
    loss of the last 300 steps against bf16's (runlog.TAIL_STEPS);
  - with logs of more seeds beside them (<run>_seed<N>.jsonl, scripts/fp8_loss_parity.sh --seeds): per run the final
    validation loss of every seed, and paired by seed (scripts/repro/seed_report.py's pairing: the mean of the per-seed
    relative differences ± its standard error) its difference to bf16, an ablation's to its recipe, and the held-out
    loss's to bf16's;
  - the goals given by --goal RUN=PCT (e.g. nvfp4=2: nvfp4 within 2% of BF16), each met or not: on the paired mean
    over the seeds where RUN and bf16 share more than one (with seed_report's two-standard-error verdict beside it:
    what the seeds can decide), else on --base-seed's runs.
and <out>/<paper>.png, the loss curves of every run (scripts/plot_runs.py), when matplotlib is there.
Exit code: 0 when every goal is met, 1 when one is not, 2 when a log is missing or has no validation loss.

  usage: fp4_report.py OUT --paper nvfp4|quartet --runs bf16 fp8_tensorwise nvfp4 nvfp4_no_sr ... [--goal nvfp4=2 ...]
                       [--base-seed S] [--gpu NAME] [--no-plot]
  (S: the seed of the logs without _seed<N>, the first one trained; default 42)
"""
import argparse
import datetime
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402
import seed_report  # noqa: E402
from fp8_parity_report import gpu_name  # noqa: E402

# What each paper reports for the runs of its reproduction (shared/reference/fp4_recipes.md), in its own terms.
PAPERS = {
    "nvfp4": {
        "title": "NVIDIA NVFP4 recipe (arXiv 2509.25149)",
        "products": "BF16 tensor cores (exact expansion)",
        "runs": {
            "nvfp4": "12B, 10T tokens: ~1.5% above FP8 at the end (<1% in the stable phase); 8B, 1T tokens: 1.5% "
                     "relative loss error (MXFP4: 2.5%)",
            "nvfp4_no_sr": "Fig. 4: round-to-nearest gradients raise the loss",
            "nvfp4_no_rht": "Fig. 4: no Hadamard transform on the wgrad inputs raises the loss",
            "nvfp4_w1x16": "Fig. 4: 1x16 instead of 16x16 weight blocks raises the loss",
            "nvfp4_all_fp4": "keeps <15% of the linears in BF16, mostly the last blocks (last 4 only: also stable)",
        },
    },
    "quartet": {
        "title": "Quartet (arXiv 2505.14669)",
        "products": "FP8 tensor cores (exact E4M3 remap)",
        "runs": {
            "mxfp4": "30M Llama on C4: val loss 3.49 / 3.38 / 3.29 / 3.24 / 3.20 at 25 / 50 / 100 / 200 / 400 tokens "
                     "per parameter (effN 0.65, effD 0.95); 7B: tracks FP8 (C4 perplexity 17.77, BF16 16.40)",
            "mxfp4_sr": "v1/v2 used SR in the backward; v4 (RTN, the default here) withdraws SR's advantage",
            "mxfp4_no_mask": "QuEST (W4A4, 30M): its trust estimator 3.272 against plain STE 3.792",
            "mxfp4_no_rotation": "Table 2 compares whole forward quantisers: QuEST (Hadamard, Gaussian scale) "
                                 "effN 0.64, RTN-absmax 0.59; this run drops the rotations only (Gaussian scales "
                                 "and mask kept)",
            "mxfp4_rtn_absmax": "Table 2: RTN-absmax (no rotation, amax scales, no trust mask) forward effN 0.59 "
                                "against QuEST's 0.64",
            "mxfp4_rtn_absmax_masked": "not a Table 2 row: RTN-absmax with QuEST's trust mask kept (an element at "
                                       "or above 6 after scaling gets no gradient); its ablation column is against "
                                       "mxfp4_rtn_absmax, i.e. what the mask costs under amax scales",
        },
    },
}


def base_recipe(run, runs):
    """The plain run an ablation varies: the longest other run name that prefixes it followed by '_'."""
    bases = [r for r in runs if r != run and run.startswith(r + "_")]
    return max(bases, key=len) if bases else None


def seeds_table(runs, vals, tails):
    """The Markdown table of every seed's run: {run: {seed: loss}} of the final validation and held-out losses."""
    seeds = sorted({s for per_seed in vals.values() for s in per_seed})
    lines = [f"Every seed ({', '.join(map(str, seeds))}; differences paired by seed: mean ± standard error, range):", "",
             "| run | final val loss per seed | vs bf16 | ablation vs its recipe | held-out vs bf16 |",
             "|---|---|---|---|---|"]
    for run in runs:
        if run not in vals:
            continue
        per_seed = " / ".join(f"{vals[run][s]:.4f}" if s in vals[run] else "—" for s in seeds)
        base = base_recipe(run, runs)

        def vs(table, ref):
            return seed_report.fmt_paired(seed_report.paired(table[run], table[ref])) \
                if ref is not None and ref != run and run in table and ref in table else "—"
        lines.append(f"| {run} | {per_seed} | {vs(vals, 'bf16')} | {vs(vals, base)} | {vs(tails, 'bf16')} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the directory of the runs' JSONL logs")
    ap.add_argument("--paper", required=True, choices=sorted(PAPERS))
    ap.add_argument("--runs", nargs="+", required=True, help="run names: <out>/<run>.jsonl")
    ap.add_argument("--goal", action="append", default=[], metavar="RUN=PCT",
                    help="RUN's final validation loss within PCT percent of bf16's (repeatable)")
    ap.add_argument("--gpu", help="the GPU the runs ran on, for a table written on another machine (default: this "
                    "machine's, from nvidia-smi)")
    ap.add_argument("--base-seed", type=int, default=42,
                    help="the seed of the logs without _seed<N> (the first seed trained; default 42)")
    ap.add_argument("--no-plot", action="store_true", help="write the table only")
    args = ap.parse_args(argv)
    paper = PAPERS[args.paper]
    goals = {}
    for g in args.goal:
        run, _, pct = g.partition("=")
        try:
            goals[run] = float(pct)
        except ValueError:
            ap.error(f"--goal {g}: expected RUN=PCT")
        if run not in args.runs:
            ap.error(f"--goal {g}: {run} is not among --runs")

    records, final = {}, {}
    for run in args.runs:
        path = os.path.join(args.out, run + ".jsonl")
        try:
            records[run] = runlog.read_records(path)
        except (OSError, ValueError) as e:
            print(f"fp4_report.py: cannot read the {run} run: {e}", file=sys.stderr)
            return 2
        final[run] = runlog.final_val_loss(records[run])
        if final[run] is None:
            print(f"fp4_report.py: {path} has no finite validation loss (did the run finish?)", file=sys.stderr)
            return 2

    def rel(run, base):
        return f"{runlog.relative_pct(final[run], final[base]):+.2f}%" if base in final else "—"

    rows = []
    for run in args.runs:
        base = base_recipe(run, args.runs)
        if base is not None:
            delta = runlog.relative_pct(final[run], final[base])
            ablation = f"{delta:+.2f}% ({'raises' if delta > 0 else 'does not raise'} the loss)"
        else:
            ablation = "—"
        tail = runlog.tail_train_loss(records[run])
        tail_rel = runlog.relative_pct(tail, runlog.tail_train_loss(records["bf16"])) if "bf16" in records else None
        rows.append(f"| {run} | {final[run]:.4f} | {rel(run, 'bf16')} | {rel(run, 'fp8_tensorwise')} | {ablation} | "
                    f"{runlog.skipped_steps(records[run])} | {runlog.trained_tokens(records[run]):,} | "
                    f"{paper['runs'].get(run, '—')} | {tail if tail is not None else float('nan'):.4f} "
                    f"({'—' if tail_rel is None else format(tail_rel, '+.2f') + '%'}) |")
    seed_vals, seed_tails = seed_report.collect(args.out, args.base_seed)
    seed_vals = {r: seed_vals[r] for r in args.runs if r in seed_vals}
    seed_tails = {r: seed_tails[r] for r in args.runs if r in seed_tails}
    several = any(len(per_seed) > 1 for per_seed in seed_vals.values())
    ok = True
    goal_lines = []
    for run, pct in goals.items():
        if "bf16" not in final:
            print("fp4_report.py: a goal needs the bf16 run among --runs", file=sys.stderr)
            return 2
        p = seed_report.paired(seed_vals.get(run, {}), seed_vals.get("bf16", {}))
        if p is not None and p[4] > 1:
            d = p[0]
            measured = f"{d:+.2f}% ± {p[1]:.2f} over {p[4]} seeds, paired"
        else:
            d = runlog.relative_pct(final[run], final["bf16"])
            measured = f"{d:+.2f}%"
        met = abs(d) <= pct
        ok &= met
        line = f"- {run} within {pct:g}% of BF16: {measured}, {'met' if met else 'NOT met'}"
        if p is not None and p[4] > 1:  # what the seeds can decide: seed_report's two-standard-error verdict
            verdict = seed_report.goal_verdict(p, pct, two_sided=True)
            line += f" on the mean; at two standard errors {verdict}"
        goal_lines.append(line)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    first = f" (the first table: seed {args.base_seed})" if several else ""
    table = [f"{paper['title']} in our numbers; {args.gpu or gpu_name()}; {date}. Same seed{first} and data for every run; the FP4 "
             f"products run exactly on {paper['products']} (Hopper has no FP4 ones): FP4 numerics, not FP4 speed.",
             "",
             "| run | final val loss | vs bf16 | vs fp8_tensorwise | ablation vs its recipe | skipped steps | tokens | "
             f"paper | train loss, last {runlog.TAIL_STEPS} steps (vs bf16) |",
             "|---|---|---|---|---|---|---|---|---|"] + rows
    if several:
        table += ["", seeds_table(args.runs, seed_vals, seed_tails)]
    if goal_lines:
        table += [""] + goal_lines
    with open(os.path.join(args.out, f"{args.paper}.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table))
    if not args.no_plot:
        here = os.path.dirname(os.path.abspath(__file__))
        cmd = [sys.executable, os.path.join(here, "..", "plot_runs.py")]
        cmd += [os.path.join(args.out, r + ".jsonl") for r in args.runs]
        for r in args.runs:
            cmd += ["--label", r]
        cmd += ["--out", os.path.join(args.out, f"{args.paper}.png"), "--x", "tokens", "--title", paper["title"]]
        if subprocess.run(cmd).returncode != 0:
            print("fp4_report.py: no plot (scripts/plot_runs.py failed: is matplotlib installed?)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
