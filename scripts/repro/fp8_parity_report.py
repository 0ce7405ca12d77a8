#!/usr/bin/env python3
"""scripts/repro/fp8_parity_report.py: the Markdown table of scripts/fp8_loss_parity.sh (one run per recipe).

Reads <out>/<recipe><tag>.jsonl for every recipe and writes <out>/summary<tag>.md: per recipe the final validation
loss, its difference to the BF16 run in percent ((recipe - bf16) / bf16), whether that is within --tolerance, the
final train loss, the median step time (steps 6 on), the skipped steps, the tokens trained, the steps, and the mean
train loss of the last 300 steps with its difference to BF16's (runlog.TAIL_STEPS: a held-out loss on a larger
sample than the validation split when the run makes one pass over its data). A variant
(--tag) compares with its own bf16 run when there is one, else with the plain bf16.jsonl. When the runs trained on
more than one GPU model (runlog.run_device: the train_gpt output beside each log) a last column names each run's:
the step times then compare GPUs as well, and the losses the GPUs' rounding as well as the recipes. Exit code 1 when
an FP8 recipe is outside the tolerance, 2 when a log is missing or has no validation loss.

  usage: fp8_parity_report.py OUT --title TEXT [--tag _NAME] [--tolerance PCT] [--gpu NAME] RECIPE...
"""
import argparse
import datetime
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        out = []
    return out[0] if out else "GPU unknown"


def run_path(out, recipe, tag):
    path = os.path.join(out, f"{recipe}{tag}.jsonl")
    if recipe == "bf16" and tag and not os.path.exists(path):
        path = os.path.join(out, "bf16.jsonl")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the directory of the runs' JSONL logs")
    ap.add_argument("recipes", nargs="+")
    ap.add_argument("--title", default="", help="the line above the table (model, steps, tokens)")
    ap.add_argument("--gpu", help="the GPU the runs ran on, for a table written on another machine (default: this "
                    "machine's, from nvidia-smi)")
    ap.add_argument("--tag", default="", help="variant suffix of the log names, with its leading '_'")
    ap.add_argument("--tolerance", type=float, default=0.25, help="allowed |final val loss vs bf16| in %% "
                    "(default 0.25)")
    args = ap.parse_args(argv)

    def load(recipe):
        path = run_path(args.out, recipe, args.tag)
        try:
            recs = runlog.read_records(path)
        except (OSError, ValueError) as e:
            raise SystemExit(f"fp8_parity_report.py: cannot read the {recipe} run: {e}")
        if runlog.final_val_loss(recs) is None:
            raise SystemExit(f"fp8_parity_report.py: {path} has no finite validation loss (did the run finish?)")
        return recs

    try:
        base_recs = load("bf16")
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    base = runlog.final_val_loss(base_recs)
    devices = {recipe: runlog.run_device(run_path(args.out, recipe, args.tag)) for recipe in args.recipes}
    mixed_gpus = runlog.several_gpu_models(devices.values())
    rows, ok = [], True
    for recipe in args.recipes:
        try:
            recs = base_recs if recipe == "bf16" else load(recipe)
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 2
        final_val = runlog.final_val_loss(recs)
        train = [r for r in recs if r.get("type") == "train"]
        times = sorted(r["ms"] for r in train[5:] if runlog.finite(r.get("ms")))
        ms = runlog.median(times) if times else float("nan")
        losses = [loss for _, loss in runlog.train_losses(recs) if loss is not None]
        rel = runlog.relative_pct(final_val, base)
        tail = runlog.tail_train_loss(recs)
        tail_rel = runlog.relative_pct(tail, runlog.tail_train_loss(base_recs))
        within = recipe == "bf16" or abs(rel) <= args.tolerance
        ok &= within
        rows.append(f"| {recipe}{args.tag} | {final_val:.4f} | {rel:+.2f}% | {'yes' if within else 'NO'} | "
                    f"{losses[-1] if losses else float('nan'):.4f} | {ms:.1f} | {runlog.skipped_steps(recs)} | "
                    f"{runlog.trained_tokens(recs):,} | {train[-1]['step'] if train else 0} | "
                    f"{tail if tail is not None else float('nan'):.4f} | "
                    f"{'n/a' if tail_rel is None else format(tail_rel, '+.2f') + '%'} |"
                    + (f" {devices[recipe] or 'unknown'} |" if mixed_gpus else ""))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    table = [f"{args.title}; {args.gpu or gpu_name()}; {date}.", "",
             f"| recipe | final val loss | vs bf16 | within {args.tolerance:g}% | final train loss | median step ms | "
             f"skipped steps | tokens | steps | train loss, last {runlog.TAIL_STEPS} steps | vs bf16 |"
             + (" GPU |" if mixed_gpus else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if mixed_gpus else "")] + rows
    with open(os.path.join(args.out, f"summary{args.tag}.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
