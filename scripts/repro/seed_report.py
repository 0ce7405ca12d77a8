#!/usr/bin/env python3
"""scripts/repro/seed_report.py: the Markdown table of a comparison trained with several seeds: per run the final
validation loss of every seed, their mean and spread, and the difference to BF16 (and to the run's plain recipe)
paired by seed, so that a gap between recipes is read against the spread between seeds of one recipe.

    usage: python3 scripts/repro/seed_report.py OUT [--base-seed 42] [--title TEXT] [--gpu NAME] [--md FILE]
                                                [--against RUN ...] [--goal PCT]

Reads OUT/<name>.jsonl (or .jsonl.gz) as scripts/fp8_loss_parity.sh names them: <recipe>[_<variant>][_seed<N>], where
a log without _seed<N> is the run of --base-seed (the script's default seed, 42). Runs of the same name and different
seeds form one row. Per row: the seeds; the final validation loss of each; their mean and sample standard deviation
(in % of the mean); and against bf16 and against the row's recipe (for a variant such as fp8_blockwise_nopow2: the
plain fp8_blockwise) the mean of the per-seed relative differences (recipe - reference) / reference over the seeds
both have, with its standard error (the differences' sample standard deviation / sqrt(seeds); a mean within two
standard errors of a goal cannot tell whether the goal is met) and their range. A second table gives the same for the
held-out loss: the mean train loss of the last runlog.TAIL_STEPS steps (on one pass over the data those batches are
unseen when their loss is taken: ten times the validation split at 32,768 tokens per step). --against RUN adds a
column pairing every run with RUN the same way (e.g. block-wise against per-tensor). --goal PCT adds a verdict column
for a goal of the form "at most PCT% above BF16" (issue 18's 0.25%), from the paired difference to bf16: "met" when
its mean plus two standard errors is at most PCT, "not met" when its mean minus two standard errors is above PCT,
"undecided" in between (the seeds cannot tell; with the number of seeds that would decide it if the mean and the
spread between seeds stayed as they are), each with its interval mean ± 2 SE, and "one seed" when only one pair
exists. The GPU model of each run comes from the train_gpt output beside its log (<run>.log, "device: ..."); a paired
difference says how many of its pairs ran on two different GPU models, and the GPU of every run follows the tables
when the runs used more than one: the same run on two GPU models can differ by as much as two seeds do. Writes
OUT/seeds.md (or --md) and prints it. Exit status 2 when OUT holds no log with a validation loss.
"""
import argparse
import datetime
import glob
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402
from fp8_parity_report import gpu_name  # noqa: E402

RECIPES = ("bf16", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise", "coat", "nvfp4", "mxfp4")
SEED_SUFFIX = re.compile(r"^(?P<name>.+)_seed(?P<seed>\d+)$")


def split_name(stem, base_seed):
    """(run name, seed) of a log's file name without extension: bf16_seed43 -> (bf16, 43), bf16 -> (bf16, base)."""
    m = SEED_SUFFIX.match(stem)
    return (m.group("name"), int(m.group("seed"))) if m else (stem, base_seed)


def recipe_of(name):
    """The recipe a run name starts with (the longest known one), or None: fp8_blockwise_nopow2 -> fp8_blockwise."""
    known = [r for r in RECIPES if name == r or name.startswith(r + "_")]
    return max(known, key=len) if known else None


def collect(out, base_seed, devices=None):
    """({run name: {seed: final val loss}}, {run name: {seed: held-out loss}}) over OUT/*.jsonl[.gz]; logs without a
    validation loss are left out of both. `devices`, a dict, receives {run name: {seed: GPU model}} for the runs whose
    GPU model is known (runlog.run_device)."""
    runs, held_out = {}, {}
    paths = sorted(set(glob.glob(os.path.join(out, "*.jsonl")) + glob.glob(os.path.join(out, "*.jsonl.gz"))))
    for path in paths:
        name, seed = split_name(runlog.run_name(path), base_seed)
        if seed in runs.get(name, {}):
            continue  # x.jsonl and x.jsonl.gz: the same run
        records = runlog.read_records(path)
        val = runlog.final_val_loss(records)
        if val is not None:
            runs.setdefault(name, {})[seed] = val
            device = runlog.run_device(path)
            if devices is not None and device:
                devices.setdefault(name, {})[seed] = device
            tail = runlog.tail_train_loss(records)
            if tail is not None:
                held_out.setdefault(name, {})[seed] = tail
    return runs, held_out


def mean_sd(values):
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return m, sd


def paired(run, reference, run_gpus=None, reference_gpus=None):
    """(mean, standard error or None, min, max, n, mixed) of the per-seed relative differences of run against
    reference in %, over common seeds; mixed: how many of those pairs ran on two different GPU models (both known,
    from {seed: GPU model}); None when they share no seed."""
    run_gpus, reference_gpus = run_gpus or {}, reference_gpus or {}
    pairs = [(s, runlog.relative_pct(run[s], reference[s])) for s in sorted(set(run) & set(reference))]
    pairs = [(s, d) for s, d in pairs if d is not None]
    if not pairs:
        return None
    diffs = [d for _, d in pairs]
    mixed = sum(1 for s, _ in pairs
                if run_gpus.get(s) and reference_gpus.get(s) and run_gpus[s] != reference_gpus[s])
    mean, sd = mean_sd(diffs)
    se = sd / math.sqrt(len(diffs)) if sd is not None else None
    return mean, se, min(diffs), max(diffs), len(diffs), mixed


def fmt_paired(p):
    if p is None:
        return "—"
    mean, se, lo, hi, n, mixed = p
    text = f"{mean:+.2f}%" if n == 1 else f"{mean:+.2f}% ± {se:.2f} ({lo:+.2f}..{hi:+.2f}, {n} seeds)"
    if mixed:
        text += " across GPU models" if mixed == n else f" ({mixed} of {n} across GPU models)"
    return text


MAX_SEEDS = 1000  # beyond this a seed count is no plan


def goal_verdict(p, goal, two_sided=False):
    """The verdict on "at most goal % above the reference" (two_sided: "within goal % of it, either way") of a paired
    difference (paired()'s tuple, or None): met when mean ± 2 SE lies wholly inside, not met when wholly outside,
    otherwise undecided with the seeds that would decide it at the measured spread; one seed; or — when there is no
    pair."""
    if p is None:
        return "—"
    mean, se, _, _, n, _ = p
    if n < 2:
        return "one seed"
    lo, hi = mean - 2 * se, mean + 2 * se
    def edge(x):  # two decimals, three where two would print the goal itself (a verdict decided by less than 0.005)
        text = f"{x:+.2f}"
        return f"{x:+.3f}" if abs(abs(float(text)) - goal) < 1e-9 else text
    interval = f"{edge(lo)}..{edge(hi)}"  # every verdict shows it: a "not met" by 0.01 reads unlike one by 1
    floor = -goal if two_sided else -math.inf
    if floor <= lo and hi <= goal:
        return f"met ({interval})"
    if lo > goal or hi < floor:
        return f"not met ({interval})"
    distance = min(abs(goal - mean), abs(mean - floor))  # to the nearer edge of the goal
    # the seeds that would decide it if the mean and the spread between seeds stayed: 2 sd / sqrt(n) < distance; a
    # mean at the goal (within the table's 0.01 points, or needing more than MAX_SEEDS) is not decided by seeds
    if distance < 0.005 or (2 * se * math.sqrt(n) / distance) ** 2 >= MAX_SEEDS:
        return f"undecided ({interval}; the mean is at the goal: more seeds alone do not decide it)"
    needed = math.floor((2 * se * math.sqrt(n) / distance) ** 2) + 1
    return f"undecided ({interval}; ~{needed} seeds)"


def order_key(name):
    recipe = recipe_of(name)
    return (RECIPES.index(recipe) if recipe else len(RECIPES), name != recipe, name)


def table(runs, measure="final val loss", against=(), devices=None, goal=None):
    """The Markdown table of {run: {seed: loss}}; `against`: more runs to pair every run with (one column each);
    `devices`: {run: {seed: GPU model}} (pairs across GPU models are counted in the paired cells); `goal`: a percentage
    above BF16, judged per run in a last column (goal_verdict)."""
    devices = devices or {}

    def pair(name, reference):
        return fmt_paired(paired(runs[name], runs[reference], devices.get(name), devices.get(reference)))

    extra = "".join(f" vs {a}, paired by seed |" for a in against)
    if goal is not None:
        extra += f" at most {goal:g}% above bf16 (mean ± 2 SE) |"
    lines = [f"| run | seeds | {measure} per seed | mean | sd (% of mean) | vs bf16, paired by seed | "
             f"vs its recipe, paired by seed |{extra}",
             "|---|---|---|---|---|---|---|" + "---|" * (len(against) + (goal is not None))]
    bf16 = runs.get("bf16", {})
    for name in sorted(runs, key=order_key):
        vals = runs[name]
        seeds = sorted(vals)
        m, sd = mean_sd([vals[s] for s in seeds])
        recipe = recipe_of(name)
        vs_bf16 = pair(name, "bf16") if name != "bf16" and bf16 else "—"
        vs_recipe = pair(name, recipe) if recipe and recipe != name and recipe in runs else "—"
        sd_text = f"{sd:.4f} ({100 * sd / m:.2f}%)" if sd is not None else "—"
        vs_more = "".join(f" {pair(name, a) if a != name and a in runs else '—'} |" for a in against)
        if goal is not None:
            verdict = goal_verdict(paired(vals, bf16), goal) if name != "bf16" and bf16 else "—"
            vs_more += f" {verdict} |"
        lines.append(f"| {name} | {' '.join(map(str, seeds))} | {' '.join(f'{vals[s]:.4f}' for s in seeds)} | "
                     f"{m:.4f} | {sd_text} | {vs_bf16} | {vs_recipe} |{vs_more}")
    return "\n".join(lines)


def logged_gpus(devices):
    """The GPU models the runs' logs name, in the words of the title ("A", "A and B"); "" when no log names one."""
    models = sorted({gpu for per_seed in devices.values() for gpu in per_seed.values() if gpu})
    if not models:
        return ""
    text = " and ".join(models)
    return text + " (the GPU of each run is listed below the tables)" if len(models) > 1 else text


def gpu_list(runs, devices):
    """The GPU model of every run and seed, one line per run, when the runs used more than one model; "" otherwise."""
    if not runlog.several_gpu_models(gpu for per_seed in devices.values() for gpu in per_seed.values()):
        return ""
    lines = ["GPU model per run and seed (pairs across models differ by the GPU's rounding as well as the recipe):", ""]
    for name in sorted(runs, key=order_key):
        per_seed = devices.get(name, {})
        seeds = ", ".join(f"{seed} {per_seed.get(seed, 'unknown')}" for seed in sorted(runs[name]))
        lines.append(f"- {name}: {seeds}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the directory of the runs' JSONL logs")
    p.add_argument("--base-seed", type=int, default=42, help="the seed of the logs without _seed<N> (default 42)")
    p.add_argument("--title", default="", help="the line above the table (model, steps, tokens)")
    p.add_argument("--gpu", help="the GPU the runs ran on (default: the models the logs name, else this machine's, "
                                 "from nvidia-smi)")
    p.add_argument("--md", help="where to write the table (default OUT/seeds.md)")
    p.add_argument("--against", action="append", default=[], metavar="RUN",
                   help="also pair every run with this one (a column per --against), e.g. --against fp8_tensorwise")
    p.add_argument("--goal", type=float, metavar="PCT",
                   help="judge every run against 'at most PCT%% above bf16' (a verdict column), e.g. --goal 0.25")
    args = p.parse_args(argv)
    if args.goal is not None and not args.goal >= 0:
        p.error(f"--goal must be a non-negative percentage (got {args.goal})")
    try:
        devices = {}
        runs, held_out = collect(args.out, args.base_seed, devices)
    except (OSError, ValueError) as e:
        print(f"seed_report: {e}", file=sys.stderr)
        return 2
    if not runs:
        print(f"seed_report: {args.out} holds no JSONL log with a validation loss", file=sys.stderr)
        return 2
    unknown = [a for a in args.against if a not in runs]
    if unknown:
        print(f"seed_report: --against {', '.join(unknown)}: no such run in {args.out} (runs: "
              f"{', '.join(sorted(runs, key=order_key))})", file=sys.stderr)
        return 2
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = ", ".join(x for x in (args.title, args.gpu or logged_gpus(devices) or gpu_name(), when) if x)
    text = (f"{head}.\n\nFinal validation loss per seed (train.seed: the initialisation; the data order is the same "
            f"for every run). Paired differences: the mean over the seeds both runs have of (run - reference) / "
            f"reference ± its standard error, with their range.\n\n"
            f"{table(runs, against=args.against, devices=devices, goal=args.goal)}\n\nHeld-out loss per seed: the "
            f"mean train loss of the last {runlog.TAIL_STEPS} steps (unseen batches on one pass over the data).\n\n"
            f"{table(held_out, 'held-out loss', args.against, devices, args.goal)}\n")
    gpus = gpu_list(runs, devices)
    if gpus:
        text += "\n" + gpus
    md = args.md or os.path.join(args.out, "seeds.md")
    with open(md, "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    print(f"wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
