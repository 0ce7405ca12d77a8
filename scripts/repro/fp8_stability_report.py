#!/usr/bin/env python3
"""scripts/repro/fp8_stability_report.py: the table and heat map of the FP8 stability grid (fp8_stability.sh).

Reads every run directory under RUNS (any depth) that holds a run.json ({"model", "recipe", "lr", "seed", "steps",
"max_skipped_steps"}), its metrics.jsonl, train.log and exit_code, and writes <out>.md (the tables) and <out>.png
(the heat map; skipped with a note when matplotlib is missing).

Per run:
  final loss   the validation loss of the last eval record (the run's end); the last finite train loss where the run
               has no validation
  spikes       loss spikes: a train step whose loss exceeds the median of the finite train losses of the 50 steps
               before it by more than 0.5 nats; consecutive such steps are one spike; steps with fewer than 50 finite
               losses before them are not judged (scripts/repro/runlog.py: spike_steps)
  skipped      steps the divergence guard skipped ("skip" records: a non-finite loss or gradient norm)
  diverged     the divergence guard stopped the run (max_skipped_steps consecutive skips: "training diverged" in
               train.log, or the last skip record's consecutive count reaching it), or the run ended with a
               non-finite final loss or a final loss above its initial loss (the step-0 validation loss, else the
               step-1 train loss)
  failed       a non-zero exit code for any other reason (shown, never counted as divergence)
  missing      no exit_code yet (not run, running, or killed)
Per cell (model, learning rate, recipe) over its seeds: the mean final loss of the runs that did not diverge, the
mean of the per-seed differences to BF16 in percent ((fp8 - bf16) / bf16 of the same seed and learning rate, where
both ended), the spikes and skipped steps summed, and diverged runs / runs.

The check of issue 18 (also printed): FP8 diverges in no (model, learning rate, seed) where BF16 does not.
Exit code 0; with --check 1 when that check fails; 2 when RUNS holds no runs or a run cannot be read.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402

RECIPE_ORDER = ["bf16", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise"]
DIVERGED_MESSAGE = "training diverged"


class ReportError(Exception):
    pass


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


def analyse_run(run_dir):
    """The result of one run directory: its cell, final loss, spikes, skipped steps and status."""
    try:
        with open(os.path.join(run_dir, "run.json")) as f:
            meta = json.load(f)
        cell = {k: meta[k] for k in ("model", "recipe", "lr", "seed")}
    except (OSError, ValueError, KeyError) as e:
        raise ReportError(f"{run_dir}/run.json: {e} (hint: fp8_stability.sh writes it before each run)")
    exit_text = read_text(os.path.join(run_dir, "exit_code"))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    try:
        records = runlog.read_records(metrics) if os.path.exists(metrics) else []
    except (OSError, ValueError) as e:
        raise ReportError(str(e))
    losses = runlog.train_losses(records)
    finite_losses = [loss for _, loss in losses if loss is not None]
    evals = [r for r in records if r.get("type") == "eval"]
    initial = next((float(r["val_loss"]) for r in evals if r.get("step") == 0 and runlog.finite(r.get("val_loss"))),
                   finite_losses[0] if finite_losses else None)
    final = runlog.final_val_loss(records) if evals else (finite_losses[-1] if finite_losses else None)
    skips = [r for r in records if r.get("type") == "skip"]
    result = dict(cell, dir=run_dir, final=final, initial=initial, spikes=len(runlog.spike_steps(losses)),
                  skipped=len(skips), status="ok", reason="")
    if exit_text is None:
        result.update(status="missing", reason="no exit_code (not run, running or killed)")
        return result
    exit_code = int(exit_text.strip() or "-1")
    log = read_text(os.path.join(run_dir, "train.log")) or ""
    max_skipped = int(meta.get("max_skipped_steps", 5))
    guard = DIVERGED_MESSAGE in log or (skips and (skips[-1].get("consecutive") or 0) >= max_skipped)
    if guard:
        result.update(status="diverged", reason=f"the divergence guard stopped it ({max_skipped} consecutive skips)")
    elif exit_code != 0:
        result.update(status="failed", reason=f"exit code {exit_code} (see {run_dir}/train.log)")
    elif final is None or not math.isfinite(final):
        result.update(status="diverged", reason="non-finite final loss")
    elif initial is not None and final > initial:
        result.update(status="diverged", reason=f"final loss {final:.4f} above the initial {initial:.4f}")
    return result


def find_runs(root):
    if not os.path.isdir(root):
        raise ReportError(f"'{root}' is not a directory (hint: give the --out of fp8_stability.sh)")
    dirs = sorted(d for d, _, files in os.walk(root) if "run.json" in files)
    if not dirs:
        raise ReportError(f"no run directories (with a run.json) under '{root}'")
    return [analyse_run(d) for d in dirs]


def recipe_key(recipe):
    return (RECIPE_ORDER.index(recipe) if recipe in RECIPE_ORDER else len(RECIPE_ORDER), recipe)


def ended(run):
    """The run's final loss counts (for means and the comparison with BF16): it ended without diverging."""
    return run["status"] == "ok" and run["final"] is not None


def summarise(runs):
    """{model: {(lr, recipe): cell summary}} and the list of (model, lr, seed, recipe) where FP8 diverged but BF16
    did not."""
    by_seed = {(r["model"], r["lr"], r["seed"], r["recipe"]): r for r in runs}
    cells = {}
    for r in runs:
        cells.setdefault(r["model"], {}).setdefault((r["lr"], r["recipe"]), []).append(r)
    summary, violations = {}, []
    for model, model_cells in cells.items():
        for (lr, recipe), seeds in model_cells.items():
            finals = [r["final"] for r in seeds if ended(r)]
            rels = []
            for r in seeds:
                base = by_seed.get((model, lr, r["seed"], "bf16"))
                if recipe != "bf16" and base is not None and ended(base) and ended(r):
                    rels.append(runlog.relative_pct(r["final"], base["final"]))
                if (recipe != "bf16" and r["status"] == "diverged" and base is not None
                        and base["status"] == "ok"):
                    violations.append((model, lr, r["seed"], recipe))
            summary.setdefault(model, {})[(lr, recipe)] = {
                "runs": len(seeds),
                "diverged": sum(1 for r in seeds if r["status"] == "diverged"),
                "failed": sum(1 for r in seeds if r["status"] == "failed"),
                "missing": sum(1 for r in seeds if r["status"] == "missing"),
                "final": sum(finals) / len(finals) if finals else None,
                "rel": sum(rels) / len(rels) if rels else None,
                "spikes": sum(r["spikes"] for r in seeds),
                "skipped": sum(r["skipped"] for r in seeds),
            }
    return summary, sorted(violations, key=lambda v: (v[0], v[1], v[2], recipe_key(v[3])))


def fmt(value, spec, empty="—"):
    return empty if value is None else format(value, spec)


def markdown(runs, summary, violations):
    lines = ["# FP8 stability grid", "",
             "Final loss: the last validation loss (mean over the seeds that did not diverge). vs bf16: the mean over "
             "seeds of (recipe - bf16) / bf16 at the same seed and learning rate. Spikes: train steps whose loss "
             f"exceeds the median of the previous {runlog.SPIKE_WINDOW} steps' losses by more than "
             f"{runlog.SPIKE_THRESHOLD:g} nats (consecutive steps count once), summed over seeds. Skipped: steps the "
             "divergence guard skipped, summed. Diverged: the guard stopped the run, or its final loss is not finite "
             "or above its initial loss.", ""]
    for model in sorted(summary):
        lines += [f"## {model}", "",
                  "| lr | recipe | final loss | vs bf16 | spikes | skipped | diverged | runs |",
                  "|---|---|---|---|---|---|---|---|"]
        for (lr, recipe) in sorted(summary[model], key=lambda k: (k[0], recipe_key(k[1]))):
            c = summary[model][(lr, recipe)]
            extra = "".join(f", {c[k]} {k}" for k in ("failed", "missing") if c[k])
            lines.append(f"| {lr:g} | {recipe} | {fmt(c['final'], '.4f')} | "
                         f"{'—' if recipe == 'bf16' else fmt(c['rel'], '+.2f') + ('%' if c['rel'] is not None else '')}"
                         f" | {c['spikes']} | {c['skipped']} | {c['diverged']}/{c['runs']} | {c['runs']}{extra} |")
        lines.append("")
    lines += ["## Every run", "", "| model | lr | seed | recipe | final loss | spikes | skipped | status |",
              "|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["model"], r["lr"], r["seed"], recipe_key(r["recipe"]))):
        status = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        lines.append(f"| {r['model']} | {r['lr']:g} | {r['seed']} | {r['recipe']} | {fmt(r['final'], '.4f')} | "
                     f"{r['spikes']} | {r['skipped']} | {status} |")
    lines += ["", check_line(violations), ""]
    return "\n".join(lines)


def check_line(violations):
    if not violations:
        return "Check: FP8 diverges in no (model, lr, seed) where BF16 does not."
    cells = "; ".join(f"{m} lr {lr:g} seed {s} {recipe}" for m, lr, s, recipe in violations)
    return f"Check FAILED: FP8 diverges where BF16 does not: {cells}."


def heat_map(summary, path):
    """One panel per model: recipes x learning rates coloured by the mean final loss; each cell annotated with its
    loss, spikes (S), skipped steps (K) and diverged runs (D); cells where every run diverged are grey."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return "heat map skipped: matplotlib is not installed (pip install matplotlib)"
    models = sorted(summary)
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        lrs = sorted({lr for lr, _ in summary[model]})
        recipes = sorted({recipe for _, recipe in summary[model]}, key=recipe_key)
        grid = np.full((len(recipes), len(lrs)), np.nan)
        for (lr, recipe), c in summary[model].items():
            if c["final"] is not None:
                grid[recipes.index(recipe), lrs.index(lr)] = c["final"]
        cmap = plt.get_cmap("viridis_r").copy()
        cmap.set_bad("lightgrey")
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto")
        fig.colorbar(image, ax=ax, label="final loss")
        for (lr, recipe), c in summary[model].items():
            text = (f"{fmt(c['final'], '.3f', 'diverged')}\nS{c['spikes']} K{c['skipped']} "
                    f"D{c['diverged']}/{c['runs']}")
            ax.text(lrs.index(lr), recipes.index(recipe), text, ha="center", va="center", fontsize=7,
                    color="red" if c["diverged"] else "black")
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
        ax.set_yticks(range(len(recipes)), recipes)
        ax.set_xlabel("peak learning rate")
        ax.set_title(model)
    fig.suptitle("FP8 stability: final loss; S spikes, K skipped steps, D diverged runs (summed over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", help="the grid's output directory (fp8_stability.sh --out)")
    ap.add_argument("--out", help="output prefix: <out>.md and <out>.png (default: RUNS/stability)")
    ap.add_argument("--check", action="store_true", help="exit 1 when FP8 diverges where BF16 does not")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(args.runs, "stability")
    try:
        runs = find_runs(args.runs)
    except ReportError as e:
        print(f"fp8_stability_report.py: error: {e}", file=sys.stderr)
        return 2
    summary, violations = summarise(runs)
    text = markdown(runs, summary, violations)
    with open(out + ".md", "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {out}.md")
    print(heat_map(summary, out + ".png"))
    return 1 if args.check and violations else 0


if __name__ == "__main__":
    sys.exit(main())
