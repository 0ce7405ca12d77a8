#!/usr/bin/env python3
"""scripts/repro/product_compare.py: the product telemetry of recipes probed on the same operands, as one Markdown
table: per probe point and product (fprop, dgrad, wgrad), for each linear kind the base recipe's mean product SNR and
every other recipe's difference to it in dB (issue 18: is a block-scaled product more accurate than a per-tensor one on
the same weights and batch?).

    usage: python3 scripts/repro/product_compare.py DIR [--base NAME] [--md FILE]

DIR holds the logs scripts/repro/product_probe.sh writes: NAME_POINT.jsonl or .jsonl.gz, one per recipe NAME and
probe point POINT (the step of the BF16 checkpoint the probe started from; 0 = the random initialisation), each with
the "product_numerics" records of one training step ({"type":"product_numerics","step":S,"product":NAME,"snr_db",
"zeroed_frac"}, NAME a linear and its product: "transformer.h.3.mlp.c_fc.wgrad"). Files of another name are ignored.
A product kind is the product name without its block number; its SNR is the mean over the blocks (numerics_report.py's
kinds). --base names the recipe the others are compared with (default: the first name in sort order). The last
column is each recipe's difference averaged over the kinds.

Exit status 2 when DIR holds no such log, a log has no product record, --base names no recipe in DIR, or a recipe
lacks a point the base has.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numerics_report  # noqa: E402
import runlog  # noqa: E402

LOG_NAME = re.compile(r"^(?P<name>.+)_(?P<point>\d+)\.jsonl(\.gz)?$")
PRODUCTS = ("fprop", "dgrad", "wgrad")


def find_logs(directory):
    """{name: {point: path}} of the probe logs in directory."""
    logs = {}
    for f in sorted(os.listdir(directory)):
        m = LOG_NAME.match(f)
        if m:
            logs.setdefault(m.group("name"), {})[int(m.group("point"))] = os.path.join(directory, f)
    return logs


def product_snr(path):
    """{product kind: mean SNR over the blocks} of the log's product records (the first step that has them)."""
    by_step = numerics_report.numerics(runlog.read_records(path), "product_numerics", "product")
    if not by_step:
        raise ValueError(f"{path}: no product_numerics record (was log.numerics_products on?)")
    rows = numerics_report.summarise_products(by_step[min(by_step)])
    return {kind: row["snr_mean"] for kind, row in rows.items()}


def layer_and_product(kind):
    """transformer.h.*.mlp.c_fc.wgrad -> (transformer.h.*.mlp.c_fc, wgrad)."""
    base, _, product = kind.rpartition(".")
    return base, product


def compare(logs, base):
    """(layers, others, rows): the linear kinds, the recipes other than base, and rows = [(point, product,
    {layer: (base SNR, {name: difference})}, {name: mean difference})]."""
    snr = {name: {point: product_snr(path) for point, path in points.items()} for name, points in logs.items()}
    others = [n for n in sorted(snr) if n != base]
    layers = sorted({layer_and_product(k)[0] for pts in snr[base].values() for k in pts})
    rows = []
    for point in sorted(snr[base]):
        for name in others:
            if point not in snr[name]:
                raise ValueError(f"recipe {name} has no log at point {point} (the base {base} has)")
        for product in PRODUCTS:
            cells, diffs = {}, {n: [] for n in others}
            for layer in layers:
                kind = f"{layer}.{product}"
                b = snr[base][point].get(kind)
                if b is None or not runlog.finite(b):
                    continue
                d = {}
                for n in others:
                    v = snr[n][point].get(kind)
                    if v is not None and runlog.finite(v):
                        d[n] = v - b
                        diffs[n].append(v - b)
                cells[layer] = (b, d)
            if cells:
                means = {n: sum(v) / len(v) for n, v in diffs.items() if v}
                rows.append((point, product, cells, means))
    return layers, others, rows


def table(layers, base, others, rows):
    short = [layer.replace("transformer.h.*.", "").replace("model.layers.*.", "") for layer in layers]
    head = "| point | product | " + " | ".join(short) + " | mean " + " / ".join(f"{n} - {base}" for n in others)
    lines = [f"Product SNR in dB of {base}, then each recipe's difference to it "
             f"({', '.join(others)}), per linear kind (mean over the blocks):", "",
             head + " |", "|---|---|" + "---|" * (len(layers) + 1)]
    for point, product, cells, means in rows:
        out = []
        for layer in layers:
            if layer not in cells:
                out.append("—")
                continue
            b, d = cells[layer]
            out.append(f"{b:.1f} " + " ".join(f"{d[n]:+.2f}" if n in d else "—" for n in others))
        mean = " / ".join(f"{means[n]:+.2f}" if n in means else "—" for n in others)
        lines.append(f"| {point} | {product} | " + " | ".join(out) + f" | {mean} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="the probe logs (NAME_POINT.jsonl[.gz])")
    p.add_argument("--base", help="the recipe the others are compared with (default: the first name)")
    p.add_argument("--md", help="also write the table to this file")
    args = p.parse_args(argv)
    try:
        logs = find_logs(args.dir)
    except OSError as e:
        print(f"product_compare: cannot read {args.dir}: {e.strerror}", file=sys.stderr)
        return 2
    if not logs:
        print(f"product_compare: {args.dir} holds no NAME_POINT.jsonl log (hint: scripts/repro/product_probe.sh "
              "writes them)", file=sys.stderr)
        return 2
    base = args.base or sorted(logs)[0]
    if base not in logs:
        print(f"product_compare: --base {base} is not among the recipes in {args.dir}: {', '.join(sorted(logs))}",
              file=sys.stderr)
        return 2
    try:
        layers, others, rows = compare(logs, base)
    except (OSError, ValueError) as e:
        print(f"product_compare: {e}", file=sys.stderr)
        return 2
    text = table(layers, base, others, rows)
    print(text, end="")
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
