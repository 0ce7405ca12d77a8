#!/usr/bin/env python3
"""scripts/repro/window_report.py: compares runs along the training, not only at their end: per window of steps the
mean train loss of every run and its difference to a base run in percent, and every validation loss the runs share.
Only the steps every run reached are used, so runs that stopped early (a machine given back mid-run) are compared
over what they have: the table says up to which step.

    usage: python3 scripts/repro/window_report.py OUT RUN... [--base bf16] [--window 768] [--last 300]
                                                  [--norms] [--title TEXT] [--md FILE]

Reads OUT/<run>.jsonl (or .jsonl.gz). Windows: steps 1..W, W+1..2W, ... up to the last step all runs reached (a
shorter last window is kept), then the last --last steps of that range as one more row. With one pass over the data
each train batch is unseen when its loss is taken, so a window's mean train loss is a held-out loss on
(window x tokens per step) tokens (runlog.TAIL_STEPS explains the same measure at the end of a run). A window's mean
uses the finite losses only (a skipped step has none); its row gives the number of such steps left out. --norms adds
a table of the median gradient norm (the train records' "norm", before clipping) per window and its difference to the
base run: a recipe that drops gradient (a mask) or adds to it shows there. Prints the Markdown (and writes it to --md
when given); when the runs trained on more than one GPU model (runlog.run_device: the train_gpt output beside each
log) a last line names each run's. Exit status 2 when a log is missing, has no train records, or the base run is not
among the runs.
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402


# One run's log: train {step: loss or None}, evals {step: val_loss}, norms {step: gradient norm} (the train records
# with a finite "norm").
RunLog = collections.namedtuple("RunLog", "train evals norms")


def load(out, run):
    """The RunLog of OUT/<run>.jsonl[.gz]."""
    records = runlog.read_records(os.path.join(out, f"{run}.jsonl"))
    train = dict(runlog.train_losses(records))
    evals = {r["step"]: float(r["val_loss"]) for r in records
             if r.get("type") == "eval" and runlog.finite(r.get("val_loss"))}
    norms = {r["step"]: float(r["norm"]) for r in records
             if r.get("type") == "train" and runlog.finite(r.get("norm"))}
    return RunLog(train, evals, norms)


def windows(last_step, width, last):
    """[(first, last)] step ranges: consecutive windows of `width` from step 1 to last_step, then the final `last`."""
    ranges = [(lo, min(lo + width - 1, last_step)) for lo in range(1, last_step + 1, width)]
    if last > 0:
        ranges.append((max(1, last_step - last + 1), last_step))
    return ranges


def window_mean(train, lo, hi):
    """(mean of the finite losses of steps lo..hi, steps without a finite loss)."""
    losses = [train.get(s) for s in range(lo, hi + 1)]
    finite = [x for x in losses if x is not None]
    return (sum(finite) / len(finite) if finite else None), len(losses) - len(finite)


def window_median(values, lo, hi):
    """The median of values {step: value} over steps lo..hi, or None when none of them has one."""
    present = [values[s] for s in range(lo, hi + 1) if s in values]
    return runlog.median(present) if present else None


def fmt_pct(value):
    return "—" if value is None else f"{value:+.2f}%"


def fmt_cell(value, base_value, is_base):
    """A table cell: the value, and for a run other than the base its difference to the base's value in brackets."""
    if value is None:
        return "—"
    return f"{value:.4f}" + ("" if is_base else f" ({fmt_pct(runlog.relative_pct(value, base_value))})")


def table_head(first, runs):
    """The header and separator lines of a table with a first column and one column per run."""
    return [f"| {first} | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]


def report(out, runs, base, width, last, title="", norms=False):
    data = {run: load(out, run) for run in runs}
    for run, log in data.items():
        if not log.train:
            raise ValueError(f"{run}: the log holds no train records")
    last_step = min(max(log.train) for log in data.values())
    lines = [title, ""] if title else []
    reached = ", ".join(f"{run} {max(log.train)}" for run, log in data.items())
    lines += [f"Steps every run reached: 1-{last_step} (last step per run: {reached}). Mean train loss per window of "
              f"steps; in brackets the difference to {base} ((run - {base}) / {base}).", ""]
    lines += table_head("steps", runs)
    for lo, hi in windows(last_step, width, last):
        means = {run: window_mean(data[run].train, lo, hi) for run in runs}
        cells = []
        for run in runs:
            mean, missing = means[run]
            cell = fmt_cell(mean, means[base][0], run == base)
            if missing:
                cell += f", {missing} skipped"
            cells.append(cell)
        lines.append(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
    if norms:
        lines += ["", f"Median gradient norm per window (before clipping); in brackets the difference to {base}.", ""]
        lines += table_head("steps", runs)
        for lo, hi in windows(last_step, width, last):
            medians = {run: window_median(data[run].norms, lo, hi) for run in runs}
            cells = [fmt_cell(medians[run], medians[base], run == base) for run in runs]
            lines.append(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
    shared = sorted(set.intersection(*(set(log.evals) for log in data.values())))
    if shared:
        lines += ["", f"Validation loss at the steps every run evaluated; in brackets the difference to {base}.", ""]
        lines += table_head("step", runs)
        for step in shared:
            vals = {run: data[run].evals[step] for run in runs}
            cells = [fmt_cell(vals[run], vals[base], run == base) for run in runs]
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    devices = {run: runlog.run_device(os.path.join(out, f"{run}.jsonl")) for run in runs}
    if runlog.several_gpu_models(devices.values()):
        lines += ["", "GPU model per run (runs on different models differ by the GPU's rounding as well as the "
                  "recipe): " + ", ".join(f"{run} {devices[run] or 'unknown'}" for run in runs) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the directory of the runs' JSONL logs")
    ap.add_argument("runs", nargs="+", help="run names (log file names without .jsonl[.gz])")
    ap.add_argument("--base", default="bf16", help="the run the others are compared with (default bf16)")
    ap.add_argument("--window", type=int, default=768, help="steps per window (default 768)")
    ap.add_argument("--last", type=int, default=runlog.TAIL_STEPS,
                    help=f"one more row for the last N shared steps (default {runlog.TAIL_STEPS}; 0: none)")
    ap.add_argument("--norms", action="store_true", help="add the median gradient norm per window")
    ap.add_argument("--title", default="", help="the line above the tables")
    ap.add_argument("--md", help="also write the Markdown to this file")
    args = ap.parse_args(argv)
    if args.window < 1 or args.last < 0:
        ap.error("--window must be >= 1 and --last >= 0")
    if args.base not in args.runs:
        print(f"window_report: the base run '{args.base}' is not among the runs {args.runs}: name it too",
              file=sys.stderr)
        return 2
    try:
        text = report(args.out, args.runs, args.base, args.window, args.last, args.title, args.norms)
    except (OSError, ValueError) as e:
        print(f"window_report: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    if args.md:
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
