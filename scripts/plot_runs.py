#!/usr/bin/env python3
"""scripts/plot_runs.py: loss curves of one or more train_gpt runs in one PNG, to compare recipes or settings.

Reads the JSONL metrics that train_gpt writes (log.jsonl, or <checkpoint.dir>/metrics.jsonl): "train" records
(step, loss, tokens) and "eval" records (step, val_loss). Each run is drawn in its own colour: the raw train loss
faintly, the train loss smoothed by a bias-corrected exponential moving average as a line, and the validation loss
as points. A resumed run may repeat steps; the later record of a step wins. --relative adds a lower panel with every
other run's loss relative to the first file's, in percent, where the gaps between recipes (often under 1%) are visible:
the train losses smoothed more (--relative-smooth) at the steps both runs logged, and the validation losses at the
steps both evaluated.

Examples:
  python3 scripts/plot_runs.py runs/gpt2_mini_bf16/metrics.jsonl
  python3 scripts/plot_runs.py a.jsonl b.jsonl --label bf16 --label fp8 --out bf16_vs_fp8.png --x tokens
  python3 scripts/plot_runs.py bf16.jsonl fp8.jsonl --relative     (lower panel: fp8 vs bf16 in %)
"""
import argparse
import gzip
import json
import math
import os
import sys


def read_metrics(path):
    """(train, val) of a JSONL metrics file: train = [(step, loss, tokens)], val = [(step, val_loss)], sorted by
    step, the last record of a repeated step kept, records with a null loss dropped. Non-JSON lines are errors that
    name the file and line. A gzip-compressed file (.gz; also read when path is missing and path.gz exists) is read
    the same way."""
    train, val = {}, {}
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{n}: not a JSON line: {line[:80]}") from None
            kind, step = record.get("type"), record.get("step")
            if step is None:
                continue
            if kind == "train" and _finite(record.get("loss")):
                train[step] = (step, float(record["loss"]), record.get("tokens") or 0)
            elif kind == "eval" and _finite(record.get("val_loss")):
                val[step] = (step, float(record["val_loss"]))
    return [train[s] for s in sorted(train)], [val[s] for s in sorted(val)]


def _finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def ema(values, beta):
    """Exponential moving average with bias correction (the first values are not pulled towards 0)."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = beta * avg + (1.0 - beta) * v
        out.append(avg / (1.0 - beta ** i))
    return out


def cumulative_tokens(train):
    """{step: tokens processed up to and including that step} from the per-step "tokens" of the train records."""
    total, out = 0, {}
    for step, _, tokens in train:
        total += tokens
        out[step] = total
    return out


def relative_series(base, other, beta):
    """[(step, percent)] of other's loss relative to base's, 100 * (other - base) / base, at the steps both have:
    base and other are [(step, loss, ...)] sorted by step; each is first smoothed by ema(beta) over its own records
    (beta 0 = raw), so a gap is measured between the two smoothed curves."""
    def smoothed(series):
        steps = [r[0] for r in series]
        losses = [r[1] for r in series]
        return dict(zip(steps, ema(losses, beta) if beta > 0 else losses))
    b, o = smoothed(base), smoothed(other)
    return [(s, 100.0 * (o[s] - b[s]) / b[s]) for s in sorted(set(b) & set(o)) if b[s] != 0]


def default_labels(paths):
    """File names without extension (and without .gz); when they clash (e.g. runs/*/metrics.jsonl), the parent
    directory names."""
    names = [os.path.basename(p) for p in paths]
    names = [n[:-3] if n.endswith(".gz") else n for n in names]
    names = [os.path.splitext(n)[0] for n in names]
    if len(set(names)) < len(names):
        names = [os.path.basename(os.path.dirname(os.path.abspath(p))) or n for p, n in zip(paths, names)]
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSONL metrics files")
    ap.add_argument("--label", action="append", default=[], help="legend label, once per file in order "
                    "(default: the file names)")
    ap.add_argument("--out", default="loss.png", help="output PNG (default loss.png)")
    ap.add_argument("--smooth", type=float, default=0.9, help="EMA factor for the train loss, 0 = none (default 0.9)")
    ap.add_argument("--x", choices=["step", "tokens"], default="step", help="x axis (default step)")
    ap.add_argument("--title", default="", help="plot title")
    ap.add_argument("--ymax", type=float, help="upper limit of the loss axis (the first steps are often far above)")
    ap.add_argument("--log-x", action="store_true", help="logarithmic x axis")
    ap.add_argument("--relative", action="store_true", help="a lower panel: every other run's loss relative to the "
                    "first file's, in percent")
    ap.add_argument("--relative-smooth", type=float, default=0.99, help="EMA factor of the train losses compared in "
                    "the --relative panel (default 0.99: per-step losses vary by several percent)")
    args = ap.parse_args(argv)

    if args.label and len(args.label) != len(args.files):
        ap.error(f"give one --label per file ({len(args.files)} files, {len(args.label)} labels)")
    if not 0.0 <= args.smooth < 1.0:
        ap.error("--smooth must be in [0, 1)")
    if not 0.0 <= args.relative_smooth < 1.0:
        ap.error("--relative-smooth must be in [0, 1)")
    if args.relative and len(args.files) < 2:
        ap.error("--relative compares runs with the first file: give at least two")
    labels = args.label or default_labels(args.files)

    runs = []
    for path, label in zip(args.files, labels):
        try:
            train, val = read_metrics(path)
        except (OSError, ValueError) as e:
            print(f"plot_runs.py: {e}", file=sys.stderr)
            return 1
        if not train and not val:
            print(f"plot_runs.py: {path} has no train or eval records", file=sys.stderr)
            return 1
        runs.append((label, train, val))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_runs.py: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 1

    if args.relative:
        fig, (ax, rel_ax) = plt.subplots(2, 1, figsize=(10, 9), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=(10, 6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, train, val) in enumerate(runs):
        color = colors[i % len(colors)]
        tokens = cumulative_tokens(train)
        xof = (lambda s: s) if args.x == "step" else (lambda s, t=tokens: t.get(s, math.nan))
        summary = [label]
        if train:
            xs = [xof(s) for s, _, _ in train]
            losses = [l for _, l, _ in train]
            if args.smooth > 0:
                ax.plot(xs, losses, color=color, alpha=0.2, linewidth=0.8)
            smooth = ema(losses, args.smooth) if args.smooth > 0 else losses
            ax.plot(xs, smooth, color=color, linewidth=1.6, label=f"{label} train")
            summary.append(f"train {smooth[-1]:.4f} at step {train[-1][0]}")
        if val:
            if args.x == "tokens" and not train:
                print(f"plot_runs.py: {label}: no train records to place val points by tokens", file=sys.stderr)
            else:
                ax.plot([xof(s) for s, _ in val], [v for _, v in val], "o", color=color, markersize=5,
                        label=f"{label} val")
                summary.append(f"val {val[-1][1]:.4f} at step {val[-1][0]}")
        print(": ".join([summary[0], ", ".join(summary[1:])]))

    if args.relative:
        base_label, base_train, base_val = runs[0]
        tokens = cumulative_tokens(base_train)
        xof = (lambda s: s) if args.x == "step" else (lambda s: tokens.get(s, math.nan))
        rel_ax.axhline(0.0, color=colors[0], linewidth=1.0)
        for i, (label, train, val) in enumerate(runs[1:], 1):
            color = colors[i % len(colors)]
            summary = []
            rel = relative_series(base_train, train, args.relative_smooth)
            if rel:
                rel_ax.plot([xof(s) for s, _ in rel], [p for _, p in rel], color=color, linewidth=1.4,
                            label=f"{label} train")
                summary.append(f"train {rel[-1][1]:+.2f}% at step {rel[-1][0]}")
            rel_val = relative_series(base_val, val, 0.0)
            if rel_val:
                rel_ax.plot([xof(s) for s, _ in rel_val], [p for _, p in rel_val], "o", color=color, markersize=5,
                            label=f"{label} val")
                summary.append(f"val {rel_val[-1][1]:+.2f}% at step {rel_val[-1][0]}")
            print(f"{label} vs {base_label}: " + (", ".join(summary) or "no common steps"))
        rel_ax.set_ylabel(f"loss vs {base_label} (%)")
        rel_ax.grid(True, alpha=0.3)
        rel_ax.legend(fontsize=8)
        rel_ax.set_xlabel("step" if args.x == "step" else "tokens")
    else:
        ax.set_xlabel("step" if args.x == "step" else "tokens")
    ax.set_ylabel("loss")
    if args.log_x:
        ax.set_xscale("log")
    if args.ymax is not None:
        ax.set_ylim(top=args.ymax)
    if args.title:
        ax.set_title(args.title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
