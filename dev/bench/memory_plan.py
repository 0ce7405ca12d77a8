#!/usr/bin/env python3
"""dev/bench/memory_plan.py: the device memory that runs of several recipes plan, side by side, by what holds it,
from `train_gpt --dry-run` (no GPU needed: the plan is counted by the allocating code itself; bench.py's B=max and
the README quote how close it comes to the measured peaks). One Markdown table: the total, the precision state
(quantised weight caches, scales, amax histories), the saved activations split into the model's own buffers and the
quantised linear inputs, the transient buffers with the quantised operands among them, and each recipe's saved
activations against a base recipe's. This is the comparison issue 15's memory goal asks for ("saved-activation memory
of both FP4 recipes below fp8_tensorwise's"), which a measured peak cannot separate from the rest of the run.

The plan is printed before the data checks, so the configs' data paths need not exist here.

Examples:
  python3 dev/bench/memory_plan.py --config configs/llama_1b_bf16.json --micro-batch 8 \\
      --recipes bf16,fp8_tensorwise,fp8_blockwise,nvfp4,mxfp4
  python3 dev/bench/memory_plan.py --config configs/llama_350m_bf16.json --micro-batch 16 --recipes fp8_tensorwise,nvfp4 \\
      --set precision.bf16_layers=[] --md plan.md
"""
import argparse
import os
import re
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A row of the plan as llmc/run/memory_plan.cpp's format_memory_plan prints it: two spaces, the name padded, the GiB,
# the exact bytes, then two spaces and the detail (none on some rows).
ROW = re.compile(r"^  (\S.*?)\s+([0-9]+\.[0-9]+) GiB\s+([0-9,]+) B(?:  (.*))?$")
# The saved-activations detail under a quantised recipe: "...: <the model's buffers> X GiB + quantised linear inputs
# Y GiB".
SAVED_SPLIT = re.compile(r": (.+) ([0-9]+\.[0-9]+) GiB \+ quantised linear inputs ([0-9]+\.[0-9]+) GiB$")
QUANTISED_OPERANDS = re.compile(r"quantised operands ([0-9]+\.[0-9]+) GiB$")
GIB = 1024 ** 3


def parse_memory_plan(text):
    """The rows of a --dry-run memory plan, in order, as {name: (bytes, detail)}; the 'total' row included. {} when
    the text has no plan (a refused config)."""
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = (int(m.group(3).replace(",", "")), m.group(4) or "")
    return rows if "total" in rows else {}


def saved_split(rows):
    """(model's saved buffers, quantised linear inputs) of the 'saved activations' row in GiB: the detail's two
    figures where the recipe quantises linear inputs, else (the whole row, 0.0)."""
    saved_bytes, detail = rows["saved activations"]
    m = SAVED_SPLIT.search(detail)
    if m:
        return float(m.group(2)), float(m.group(3))
    return saved_bytes / GIB, 0.0


def quantised_operands(rows):
    """The quantised operands among the transient buffers (GiB), 0.0 for a recipe without them."""
    m = QUANTISED_OPERANDS.search(rows["transient buffers"][1])
    return float(m.group(1)) if m else 0.0


def dry_run(train_gpt, config, micro_batch, recipe, sets):
    """train_gpt --dry-run for one recipe; its plan rows. Exits with the trainer's own message when it plans nothing."""
    cmd = [train_gpt, "--config", config, "--set", f"train.micro_batch={micro_batch}", "--set",
           "train.global_batch_tokens=0", "--set", f"precision.recipe={recipe}"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd + ["--dry-run"], cwd=REPO_ROOT, capture_output=True, text=True)
    rows = parse_memory_plan(out.stdout)
    if not rows:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-6:])
        sys.exit(f"memory_plan: recipe '{recipe}': train_gpt --dry-run printed no memory plan (exit "
                 f"{out.returncode}):\n{tail}")
    return rows


def table(plans, base, title):
    """The Markdown report: one row per recipe (plans: [(recipe, rows)] in order), saved activations against base's."""
    by_recipe = dict(plans)
    base_saved = by_recipe[base]["saved activations"][0] if base in by_recipe else None
    lines = [title, "",
             "GiB on one GPU, from each recipe's `train_gpt --dry-run` memory plan (counted by the allocating code, "
             "not measured). Saved activations = the model's own saved buffers + the quantised linear inputs; "
             f"the last column is the saved activations against {base}'s.", "",
             "| recipe | total | precision state | saved activations | of which the model's buffers | of which "
             "quantised linear inputs | transient (quantised operands) | saved vs " + base + " |",
             "|---|---|---|---|---|---|---|---|"]
    for recipe, rows in plans:
        saved = rows["saved activations"][0]
        model_part, quantised = saved_split(rows)
        ratio = "—" if base_saved is None or recipe == base else f"{saved / base_saved:.3f}x"
        lines.append(f"| {recipe} | {rows['total'][0] / GIB:.2f} | {rows['precision state'][0] / GIB:.2f} | "
                     f"{saved / GIB:.2f} | {model_part:.2f} | {quantised:.2f} | "
                     f"{rows['transient buffers'][0] / GIB:.2f} ({quantised_operands(rows):.2f}) | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a run config, e.g. configs/llama_1b_bf16.json")
    ap.add_argument("--micro-batch", type=int, required=True, help="sequences per micro-step (train.micro_batch)")
    ap.add_argument("--recipes", default="bf16,fp8_tensorwise,fp8_blockwise,nvfp4,mxfp4",
                    help="comma-separated precision.recipe values, in table order")
    ap.add_argument("--base", default="fp8_tensorwise", help="the recipe the saved activations are compared with")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every recipe (repeatable)")
    ap.add_argument("--title", default=None, help="the line above the table")
    ap.add_argument("--md", default=None, help="also write the Markdown to this file")
    ap.add_argument("--train-gpt", default=os.environ.get("LLM8_TRAIN_GPT", os.path.join(REPO_ROOT, "build",
                                                                                       "train_gpt")),
                    help="the trainer binary (default $LLM8_TRAIN_GPT or build/train_gpt)")
    args = ap.parse_args(argv)
    if args.micro_batch < 1:
        ap.error("--micro-batch must be >= 1")
    recipes = [r for r in args.recipes.split(",") if r]
    if not recipes:
        ap.error("--recipes names no recipe")
    if not os.path.isfile(args.train_gpt):
        ap.error(f"--train-gpt {args.train_gpt}: no such file (build it: cmake --build build --target train_gpt)")
    plans = [(r, dry_run(args.train_gpt, args.config, args.micro_batch, r, args.set)) for r in recipes]
    title = args.title or (f"Memory plan of {args.config} at micro-batch {args.micro_batch}"
                           + (f" ({', '.join(args.set)})" if args.set else ""))
    report = table(plans, args.base, title)
    print(report, end="")
    if args.md:
        with open(args.md, "w") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
