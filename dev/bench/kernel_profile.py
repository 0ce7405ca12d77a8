#!/usr/bin/env python3
"""dev/bench/kernel_profile.py: where one training step's GPU time goes, kernel by kernel.

Runs train_gpt for a few optimizer steps under Nsight Compute (ncu, one metric: gpu__time_duration, clocks and caches
left alone), cuts the kernel sequence into steps at the embedding's forward kernel (the first kernel of every
micro-step's forward; with one micro-step per step, one step each), and prints the last complete step's kernels grouped
by name: total ms, share, launches. Nsight Systems does not run on the lent machines; ncu serialises the kernels, so
the sum of durations excludes launch gaps (compare it with the trainer's own step time for those).

  python3 dev/bench/kernel_profile.py --train-gpt build/train_gpt --config configs/llama_1b_bf16.json \
      --set train.micro_batch=4 --set precision.recipe=fp8_tensorwise [--steps 2] [--csv out.csv] [--top 40]

The --set overrides are passed to train_gpt after the benchmark's own (one micro-step per optimizer step, no eval,
sampling or checkpoints; training data --data, by default the bundled KJV shards that dev/bench/bench.py uses,
prepared on first use like there). After the kernels comes the same step by family (GEMMs, attention, quantisation,
norms, activations, optimizer, ...: CATEGORIES below), the table the notes in dev/bench/NOTES.md are made of.
--from-csv FILE prints both tables again from a step saved with --csv, without ncu (to compare profiles later).

--detail REGEX profiles only the launches whose kernel name matches REGEX (ncu's --kernel-name regex:, after
--detail-skip matching launches, --detail-count of them) with the metrics that say what bounds a kernel: duration,
DRAM and SM throughput (% of peak), issue-slot use, achieved occupancy, warp instructions executed, registers, and
the three largest stall reasons (cycles per issued instruction):

  python3 dev/bench/kernel_profile.py --config configs/llama_1b_bf16.json --set precision.recipe=mxfp4 \
      --detail mxfp4_to_e4m3 --detail-count 4
"""
import argparse
import csv
import gzip
import io
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the benchmark's training data: DEFAULT_DATA, ensure_data)

STEP_MARKER = "encoder_forward_kernel"

# Kernel families, first match wins: (family, regular expression on the short name). cuBLASLt's kernels (nvjet_*,
# sm90_xmma_*, cutlass, split-K reductions, its bias-gradient kernels) are the GEMMs; our own GEMM epilogues that
# finish a product (the NVFP4 alpha scaling) count with them.
CATEGORIES = [
    ("GEMMs", r"^(nvjet|sm\d+_xmma|cutlass|cublas|gemm|.*splitKreduce|.*gemv|globalKernel)|^nvfp4_gemm_alpha"),
    ("attention", r"attention_"),
    ("optimizer and gradient norm", r"adamw|global_norm|clip_scale"),
    ("quantisation (casts, scales, amax, FP4 expansion)",
     r"^(fp8_|fp4_|mxfp4_|nvfp4_|quantize_|amax_|combine_quant_stats)|_amax_kernel$"),
    ("LayerNorm / RMSNorm", r"(layernorm|rmsnorm)_"),
    ("GELU / SwiGLU / RoPE / bias", r"^(gelu_|swiglu_|rope_|add_bias|bias_partials|sum_column_partials)"),
    ("classifier and loss", r"classifier|_loss_"),
    ("embeddings", r"^(encoder_|wte_|wpe_)"),
]


def category(name):
    """The family of a kernel (a short name, or ncu's full one): matched on its base name, without namespaces and
    template arguments ('<unnamed>::fp4_run_kernel<16>' -> 'fp4_run_kernel')."""
    base = re.sub(r"<unnamed>::|\(anonymous namespace\)::", "", name.strip())
    base = re.sub(r"^void\s+", "", base).split("<")[0].split("(")[0].split("::")[-1]
    for family, pattern in CATEGORIES:
        if re.search(pattern, base):
            return family
    return "other"


def short_name(name):
    """'void llmc::(anonymous namespace)::foo_kernel<128>(float*, ...)' -> 'foo_kernel<128>'; cuBLAS names kept."""
    name = re.sub(r"\(anonymous namespace\)::", "", name.strip())
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # cut at the argument list (the first '(' outside template brackets)
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    base = re.sub(r"^void\s+", "", name[:cut])
    return re.sub(r"^llmc::", "", base)[:120]


def parse_ncu_csv(text):
    """ncu --csv --print-units base output -> [(kernel name, duration ns)] in launch order."""
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit("kernel_profile: no ncu CSV in the output (did ncu run? see the log above)")
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    kernels = {}
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1.0, "nsecond": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(unit, 1.0)
        kernels[int(r["ID"])] = (r["Kernel Name"], value * scale)
    return [kernels[i] for i in sorted(kernels)]


def last_step(kernels):
    starts = [i for i, (name, _) in enumerate(kernels) if STEP_MARKER in name]
    if len(starts) < 2:
        raise SystemExit(f"kernel_profile: found {len(starts)} '{STEP_MARKER}' launches; need 2 steps or more")
    return kernels[starts[-2]:starts[-1]] if len(starts) > 2 else kernels[starts[-1]:]


def tables(step, top):
    """The two tables of one step [(name, ns)]: kernels grouped by short name (the top ones, the rest summed), then
    families."""
    total = sum(ns for _, ns in step)
    groups, families = {}, {}
    for name, ns in step:
        short = short_name(name)
        for table, key in ((groups, short), (families, category(short))):
            g = table.setdefault(key, [0.0, 0])
            g[0] += ns
            g[1] += 1
    lines = [f"one step: {len(step)} kernels, {total / 1e6:.2f} ms of kernel time (no launch gaps)", "",
             f"{'ms':>8} {'share':>6} {'launches':>8}  kernel"]
    ordered = sorted(groups.items(), key=lambda kv: -kv[1][0])
    for name, (ns, n) in ordered[:top]:
        lines.append(f"{ns / 1e6:8.3f} {100 * ns / total:5.1f}% {n:8d}  {name}")
    rest = ordered[top:]
    if rest:
        ns = sum(v[0] for _, v in rest)
        lines.append(f"{ns / 1e6:8.3f} {100 * ns / total:5.1f}% {sum(v[1] for _, v in rest):8d}  "
                     f"({len(rest)} other kernels)")
    lines += ["", f"{'ms':>8} {'share':>6} {'launches':>8}  family"]
    for family, (ns, n) in sorted(families.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{ns / 1e6:8.3f} {100 * ns / total:5.1f}% {n:8d}  {family}")
    return "\n".join(lines)


# --detail: (metric, column header, multiplier), then the stall reasons (ncu's names; cycles per issued instruction).
DETAIL_METRICS = [
    ("gpu__time_duration.sum", "us", 1e-3),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM%", 1.0),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM%", 1.0),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue%", 1.0),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "occup%", 1.0),
    ("smsp__inst_executed.sum", "Minst", 1e-6),
    ("launch__registers_per_thread", "regs", 1.0),
]
STALL_REASONS = ["long_scoreboard", "short_scoreboard", "barrier", "membar", "math_pipe_throttle", "mio_throttle",
                 "lg_throttle", "tex_throttle", "wait", "not_selected", "no_instruction", "dispatch_stall", "drain",
                 "branch_resolving", "sleeping", "imc_miss", "misc"]


def stall_metric(reason):
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


def detail_metric_names():
    return [m for m, _, _ in DETAIL_METRICS] + [stall_metric(r) for r in STALL_REASONS]


def parse_ncu_metrics(text):
    """ncu --csv --print-units base output with several metrics -> [(kernel name, {metric: value})] in launch order
    (values as floats, '1,234' read as 1234; metrics ncu reports as n/a are left out)."""
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit("kernel_profile: no ncu CSV in the output (did ncu run? see the log above)")
    launches = {}
    for r in csv.DictReader(io.StringIO(text[start:])):
        entry = launches.setdefault(int(r["ID"]), (r["Kernel Name"], {}))
        try:
            entry[1][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            pass
    return [launches[i] for i in sorted(launches)]


def detail_table(launches):
    """One row per profiled launch: the DETAIL_METRICS columns, then the three largest stall reasons."""
    header = f"{'launch':>6}  " + " ".join(f"{h:>8}" for _, h, _ in DETAIL_METRICS) + "  kernel; top stalls"
    lines = [header]
    for i, (name, m) in enumerate(launches):
        cells = " ".join(f"{m[k] * mul:8.1f}" if k in m else f"{'-':>8}" for k, _, mul in DETAIL_METRICS)
        stalls = sorted(((m[stall_metric(r)], r) for r in STALL_REASONS if stall_metric(r) in m), reverse=True)[:3]
        top = ", ".join(f"{r} {v:.2f}" for v, r in stalls)
        lines.append(f"{i:6d}  {cells}  {short_name(name)}; {top}")
    return "\n".join(lines)


def read_step_csv(path):
    """A step written by --csv (or that file gzipped, as the recorded ones are) -> [(kernel name, ns)] in launch
    order."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"launch", "kernel", "ns"} <= set(rows[0]):
        raise SystemExit(f"kernel_profile: {path} is not a --csv step (columns launch, kernel, ns)")
    return [(r["kernel"], float(r["ns"])) for r in sorted(rows, key=lambda r: int(r["launch"]))]


def ncu_command(args, overrides):
    """The ncu command line: every kernel's duration, or (--detail) the detail metrics of the matching launches."""
    metrics = ",".join(detail_metric_names()) if args.detail else "gpu__time_duration.sum"
    cmd = [args.ncu, "--csv", "--print-units", "base", "--metrics", metrics, "--cache-control", "none",
           "--clock-control", "none"]
    if args.detail:
        cmd += ["--kernel-name", f"regex:{args.detail}", "--launch-skip", str(args.detail_skip), "--launch-count",
                str(args.detail_count)]
    cmd += [args.train_gpt, "--config", args.config]
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def run_overrides(args):
    """train_gpt's overrides of a profiled run: a few steps of one micro-step each on --data, nothing else; the
    user's --set last, so that it wins."""
    return ["train.global_batch_tokens=0", f"train.steps={args.steps}", "train.warmup_steps=1", "eval.every=0",
            "sample.every=0", "sample.tokens=0", 'checkpoint.dir=""', 'data.val=""', "log.every=1",
            f"data.train={args.data}"] + args.set


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-gpt", default="build/train_gpt")
    ap.add_argument("--config", help="the run's config (required unless --from-csv)")
    ap.add_argument("--from-csv", help="print the tables of a step saved with --csv instead of running ncu")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--data", default=bench.DEFAULT_DATA,
                    help=f"training shards (default {bench.DEFAULT_DATA}, prepared when missing)")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps to run (the last complete one is shown)")
    ap.add_argument("--top", type=int, default=40, help="kernel names to list (the rest are summed)")
    ap.add_argument("--csv", help="also write the step's kernels (launch order, name, ns) here")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--detail", metavar="REGEX", help="profile only the launches of kernels matching REGEX, with the "
                    "metrics that say what bounds them (see above)")
    ap.add_argument("--detail-skip", type=int, default=0, help="matching launches to skip first (default 0)")
    ap.add_argument("--detail-count", type=int, default=4, help="matching launches to profile (default 4)")
    args = ap.parse_args()
    if args.from_csv:
        print(tables(read_step_csv(args.from_csv), args.top))
        return
    if not args.config:
        ap.error("--config is required (or --from-csv FILE)")
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first step carries one-time work)")
    if args.detail is not None and (args.detail_count < 1 or args.detail_skip < 0):
        ap.error("--detail-count must be at least 1 and --detail-skip at least 0")

    args.python = sys.executable
    user_data = any(o.startswith("data.train=") for o in args.set)  # --set data.train=... wins over --data
    if not user_data and not bench.ensure_data(args, dry=False):
        raise SystemExit(f"kernel_profile: no training shards for --data {args.data}")
    cmd = ncu_command(args, run_overrides(args))
    print("kernel_profile:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"kernel_profile: ncu exited {proc.returncode}")
    if args.detail:
        launches = parse_ncu_metrics(proc.stdout)
        if not launches:
            raise SystemExit(f"kernel_profile: no launch matched --detail {args.detail!r}")
        print()
        print(detail_table(launches))
        return
    kernels = parse_ncu_csv(proc.stdout)
    step = last_step(kernels)
    print()
    print(tables(step, args.top))
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["launch", "kernel", "ns"])
            for i, (name, ns) in enumerate(step):
                w.writerow([i, name, f"{ns:.0f}"])


if __name__ == "__main__":
    main()
