#!/usr/bin/env python3
"""scripts/repro/numerics_report.py: the quantisation telemetry of one or more runs as Markdown tables, per kind of
tensor, so that recipes can be compared operand by operand and layer by layer (issue 18: which operands, which layers).

    usage: python3 scripts/repro/numerics_report.py LOG [LOG ...] [--step N | --over-steps FIELD] [--top K]
                                                    [--label NAME ...] [--md FILE]

Reads the "numerics" records that train_gpt writes every log.numerics_every steps (llmc/precision/quantize.h:
{"type":"numerics","step":S,"tensor":NAME,"amax","scale","snr_db","underflow_frac","saturated_frac","clipped_frac"};
logs written before clipped_frac existed lack it) from each
LOG (.jsonl or .jsonl.gz). NAME is a parameter name and the operand: "transformer.h.3.mlp.c_fc.x" is the input of
block 3's c_fc, ".w" its weight, ".dy" its output gradient. A tensor kind is the name without its block number
("transformer.h.*.mlp.c_fc.x"): one row per kind and run, over the blocks, at one step (--step, default the last step
every LOG has telemetry for).

Columns:
  blocks      how many tensors of the kind the run recorded at that step
  amax        the largest amax over the blocks
  underflow   the fraction of nonzero elements quantised to zero: mean over the blocks, and the worst block
  saturated   the fraction of elements at the format's largest magnitude (clipped, or rounded up to it): mean, worst
  clipped     the fraction of elements whose scaled value lies beyond the format's largest finite value (E2M1: at or
              beyond 6, the elements QuEST's trust mask masks under Gaussian scales): mean, worst ("—" where the log
              has no clipped_frac)
  SNR dB      10 log10(sum x^2 / sum (x - dequant(q))^2): mean over the blocks, and the lowest (an exact copy's
              infinite SNR is logged as null and left out; "—" where no block has a finite one)
Then the --top K tensors (default 10) with the largest underflow over all runs.

Where the logs also hold "product_numerics" records at that step (log.numerics_products = true:
{"type":"product_numerics","step":S,"product":NAME,"amax","snr_db","zeroed_frac"}, NAME a linear and its product:
"transformer.h.3.mlp.c_fc.wgrad"), a third table gives each product kind's SNR against the BF16 product of the
unquantised operands: the mean and the lowest over the blocks, and the mean fraction of the reference's nonzero
outputs that came out zero.

--over-steps FIELD replaces those tables with one of FIELD (clipped_frac, saturated_frac, underflow_frac, snr_db or
amax) over the run: per tensor kind and run, its mean over the blocks at every step with telemetry, then per operand
(x, w, dy) its mean over every block tensor of that operand ("all .x"), e.g. how the share of elements QuEST's trust
mask stops moves through training ("—" where a run has no such record at that step).

Exit status 2 when a LOG cannot be read or holds no numerics record, or --step names a step without records.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402

BLOCK_INDEX = re.compile(r"\.(\d+)\.")


def num(record, field):
    """A record's number; NaN where it is missing or null (the trainer writes an infinite SNR, an exact copy, as
    null)."""
    v = record.get(field)
    return float(v) if isinstance(v, (int, float)) else float("nan")


def kind_of(tensor):
    """(kind, block or None): transformer.h.3.mlp.c_fc.x -> (transformer.h.*.mlp.c_fc.x, 3); lm_head.x -> (lm_head.x,
    None)."""
    m = BLOCK_INDEX.search(tensor)
    if not m:
        return tensor, None
    return tensor[: m.start()] + ".*." + tensor[m.end():], int(m.group(1))


def numerics(records, kind="numerics", name="tensor"):
    """{step: [record]} of one run's records of one type ("numerics" with a "tensor", "product_numerics" with a
    "product")."""
    by_step = {}
    for r in records:
        if r.get("type") == kind and name in r and "step" in r:
            by_step.setdefault(int(r["step"]), []).append(r)
    return by_step


def summarise_products(records_at_step):
    """{product kind: row} for one run at one step; row: blocks, SNR mean / min, zeroed mean."""
    kinds = {}
    for r in records_at_step:
        kinds.setdefault(kind_of(r["product"])[0], []).append(r)
    rows = {}
    for kind, items in kinds.items():
        snr = [num(r, "snr_db") for r in items]
        snr = [v for v in snr if runlog.finite(v)]
        zeroed = [num(r, "zeroed_frac") for r in items]
        zeroed = [v for v in zeroed if runlog.finite(v)]
        rows[kind] = {
            "blocks": len(items),
            "snr_mean": sum(snr) / len(snr) if snr else float("nan"),
            "snr_min": min(snr) if snr else float("nan"),
            "zeroed_mean": sum(zeroed) / len(zeroed) if zeroed else float("nan"),
        }
    return rows


def product_order(kind):
    """Block products first in name order, fprop / dgrad / wgrad within a layer."""
    base, _, product = kind.rpartition(".")
    return (".*." not in kind, base, {"fprop": 0, "dgrad": 1, "wgrad": 2}.get(product, 3), product)


def summarise(records_at_step):
    """{kind: row} for one run at one step; row: blocks, amax, underflow mean / max / worst block, saturated mean /
    max, clipped mean / max (NaN where the records have no clipped_frac), SNR mean / min."""
    kinds = {}
    for r in records_at_step:
        kind, block = kind_of(r["tensor"])
        kinds.setdefault(kind, []).append((block, r))
    rows = {}
    for kind, items in kinds.items():
        def values(field):
            return [num(r, field) for _, r in items]
        under = values("underflow_frac")
        worst = max(range(len(items)), key=lambda i: under[i])
        snr = [v for v in values("snr_db") if runlog.finite(v)]
        clipped = [v for v in values("clipped_frac") if runlog.finite(v)]
        rows[kind] = {
            "blocks": len(items),
            "amax": max(values("amax")),
            "under_mean": sum(under) / len(under),
            "under_max": under[worst],
            "under_block": items[worst][0],
            "sat_mean": sum(values("saturated_frac")) / len(items),
            "sat_max": max(values("saturated_frac")),
            "clip_mean": sum(clipped) / len(clipped) if clipped else float("nan"),
            "clip_max": max(clipped) if clipped else float("nan"),
            "snr_mean": sum(snr) / len(snr) if snr else float("nan"),
            "snr_min": min(snr) if snr else float("nan"),
        }
    return rows


def pct(v):
    return f"{100 * v:.3g}%" if v else "0"


def pct_or_dash(v):
    return pct(v) if runlog.finite(v) else "—"


def db(v):
    return f"{v:.1f}" if runlog.finite(v) else "—"


def kind_order(kind):
    """Block tensors first in name order, the operand x / w / dy order within a layer."""
    base, _, operand = kind.rpartition(".")
    return (".*." not in kind, base, {"x": 0, "w": 1, "dy": 2}.get(operand, 3), operand)


def report(runs, step, top, products=None):
    """runs: [(label, {step: [records]})]; products: [(label, {step: [product records]})] or None. The Markdown
    text."""
    summaries = [(label, summarise(by_step[step])) for label, by_step in runs]
    kinds = sorted({k for _, s in summaries for k in s}, key=kind_order)
    lines = [f"Quantisation telemetry at step {step} (per tensor kind: mean over the blocks, and the worst block).", "",
             "| tensor | run | blocks | amax | underflow mean | worst (block) | saturated mean | worst | clipped mean "
             "| worst | SNR dB mean | lowest |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind in kinds:
        for label, s in summaries:
            if kind not in s:
                continue
            r = s[kind]
            block = "" if r["under_block"] is None or not r["under_max"] else f" ({r['under_block']})"
            lines.append(f"| {kind} | {label} | {r['blocks']} | {r['amax']:.4g} | {pct(r['under_mean'])} | "
                         f"{pct(r['under_max'])}{block} | {pct(r['sat_mean'])} | {pct(r['sat_max'])} | "
                         f"{pct_or_dash(r['clip_mean'])} | {pct_or_dash(r['clip_max'])} | "
                         f"{db(r['snr_mean'])} | {db(r['snr_min'])} |")
    tensors = [(num(r, "underflow_frac"), label, r["tensor"], r) for label, by_step in runs for r in by_step[step]]
    tensors = [t for t in tensors if runlog.finite(t[0])]
    tensors.sort(key=lambda t: (-t[0], t[1], t[2]))
    lines += ["", f"The {min(top, len(tensors))} tensors with the most elements quantised to zero:", "",
              "| run | tensor | underflow | amax | SNR dB |", "|---|---|---|---|---|"]
    for under, label, tensor, r in tensors[:top]:
        lines.append(f"| {label} | {tensor} | {pct(under)} | {num(r, 'amax'):.4g} | {db(num(r, 'snr_db'))} |")
    summaries = [(label, summarise_products(by_step[step])) for label, by_step in products or [] if step in by_step]
    if summaries:
        kinds = sorted({k for _, s in summaries for k in s}, key=product_order)
        lines += ["", f"Product error at step {step}: each quantised product against the BF16 product of the "
                  "unquantised operands (per product kind: mean over the blocks, and the lowest).", "",
                  "| product | run | blocks | SNR dB mean | lowest | zeroed mean |", "|---|---|---|---|---|---|"]
        for kind in kinds:
            for label, s in summaries:
                if kind in s:
                    r = s[kind]
                    zeroed = pct(r["zeroed_mean"]) if runlog.finite(r["zeroed_mean"]) else "—"
                    lines.append(f"| {kind} | {label} | {r['blocks']} | {db(r['snr_mean'])} | {db(r['snr_min'])} | "
                                 f"{zeroed} |")
    return "\n".join(lines) + "\n"


OVER_STEPS_FIELDS = ("clipped_frac", "saturated_frac", "underflow_frac", "snr_db", "amax")


def mean_finite(values):
    values = [v for v in values if runlog.finite(v)]
    return sum(values) / len(values) if values else float("nan")


def over_steps(runs, field):
    """runs: [(label, {step: [records]})]. The Markdown table of field's mean over the blocks per tensor kind and run
    at every step any run has telemetry for, then per operand over every block tensor of that operand."""
    steps = sorted(set().union(*(set(by_step) for _, by_step in runs)))
    cell = db if field == "snr_db" else (lambda v: f"{v:.4g}" if runlog.finite(v) else "—") if field == "amax" \
        else pct_or_dash
    groups = {}  # (row name, label) -> {step: [values]}
    for label, by_step in runs:
        for step, records in by_step.items():
            for r in records:
                kind, block = kind_of(r["tensor"])
                v = num(r, field)
                groups.setdefault((kind, label), {}).setdefault(step, []).append(v)
                if block is not None:
                    row = "all ." + kind.rpartition(".")[2]
                    groups.setdefault((row, label), {}).setdefault(step, []).append(v)
    labels = [label for label, _ in runs]
    names = sorted({name for name, _ in groups if not name.startswith("all .")}, key=kind_order)
    names += sorted({name for name, _ in groups if name.startswith("all .")},
                    key=lambda n: {"x": 0, "w": 1, "dy": 2}.get(n[5:], 3))
    lines = [f"{field} over the run (per tensor kind: mean over the blocks; \"all .x\": over every block tensor of "
             "that operand).", "", "| tensor | run | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|---|" + "---|" * len(steps)]
    for name in names:
        for label in labels:
            if (name, label) in groups:
                row = groups[(name, label)]
                lines.append(f"| {name} | {label} | " +
                             " | ".join(cell(mean_finite(row[s])) if s in row else "—" for s in steps) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", help="train_gpt JSONL metrics (.jsonl or .jsonl.gz) with numerics records")
    p.add_argument("--step", type=int, help="the step to report (default: the last step every log has telemetry for)")
    p.add_argument("--top", type=int, default=10, help="how many tensors in the underflow list (default 10)")
    p.add_argument("--label", action="append", help="a name per log, in order (default: the file names)")
    p.add_argument("--md", help="also write the tables to this file")
    p.add_argument("--over-steps", metavar="FIELD", choices=OVER_STEPS_FIELDS,
                   help="instead: FIELD's mean per tensor kind at every step with telemetry (" +
                   ", ".join(OVER_STEPS_FIELDS) + ")")
    args = p.parse_args(argv)
    if args.over_steps and args.step is not None:
        p.error("--over-steps reports every step: leave --step out")
    if args.label and len(args.label) != len(args.logs):
        p.error(f"--label given {len(args.label)} times for {len(args.logs)} logs: give one per log or none")
    runs, products = [], []
    for i, path in enumerate(args.logs):
        try:
            records = runlog.read_records(path)
            by_step = numerics(records)
        except (OSError, ValueError) as e:
            print(f"numerics_report: cannot read {path}: {e}", file=sys.stderr)
            return 2
        if not by_step:
            print(f"numerics_report: {path} holds no numerics record (train with log.numerics_every > 0)",
                  file=sys.stderr)
            return 2
        label = args.label[i] if args.label else runlog.run_name(path)
        runs.append((label, by_step))
        products.append((label, numerics(records, "product_numerics", "product")))
    common = set.intersection(*(set(by_step) for _, by_step in runs))
    if args.over_steps:
        text = over_steps(runs, args.over_steps)
    else:
        if args.step is None:
            if not common:
                print("numerics_report: the logs share no step with telemetry; name one with --step", file=sys.stderr)
                return 2
            step = max(common)
        else:
            step = args.step
            missing = [label for label, by_step in runs if step not in by_step]
            if missing:
                print(f"numerics_report: no telemetry at step {step} in {', '.join(missing)} (steps with telemetry: "
                      f"{', '.join(map(str, sorted(common))) or 'none in common'})", file=sys.stderr)
                return 2
        text = report(runs, step, args.top, products)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
