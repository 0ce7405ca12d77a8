"""scripts/repro/runlog.py: reading train_gpt's JSONL metrics for the FP8 reports, and the arithmetic they share.

Owns: a log's run name, reading every record of a metrics file (null losses kept: a skipped step's loss is null;
<name>.jsonl.gz is read when <name>.jsonl is not there), the final validation loss, the mean train loss of the last
steps, the loss relative to a baseline in percent, and the loss-spike count of the stability grid. Used by
fp8_parity_report.py (scripts/fp8_loss_parity.sh), fp8_stability_report.py (scripts/repro/fp8_stability.sh),
seed_report.py and numerics_report.py.

Records (llmc/run/metrics.h): {"type":"train","step":S,"loss":L|null,...,"tokens":T}, {"type":"eval","step":S,
"val_loss":V|null}, {"type":"skip","step":S,"loss":...,"consecutive":K} (the divergence guard skipped step S).
"""
import gzip
import json
import math
import os

# A loss spike (fp8_stability_report.py): a train step whose loss exceeds the median of the finite losses of the
# SPIKE_WINDOW steps before it by more than SPIKE_THRESHOLD nats. Consecutive such steps are one spike. Steps with
# fewer than SPIKE_WINDOW finite losses before them are never spikes (the early fast fall is no baseline).
SPIKE_WINDOW = 50
SPIKE_THRESHOLD = 0.5  # nats

# The tail train loss (tail_train_loss): the mean train loss of the last TAIL_STEPS steps. On one pass over the data
# every batch is unseen when its loss is taken, so this is a held-out loss over TAIL_STEPS batches (9.8M tokens in the
# 100.7M-token parity runs), a larger sample than the validation split (under 1M tokens of the Python sources).
TAIL_STEPS = 300


def run_name(path):
    """A log's run name: its file name without .jsonl or .jsonl.gz (runs/x/fp8_blockwise_seed43.jsonl.gz ->
    fp8_blockwise_seed43)."""
    name = os.path.basename(path)
    for ext in (".jsonl.gz", ".jsonl"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def run_device(path):
    """The GPU model a run trained on, from the first lines of the train_gpt output saved beside its JSONL log
    (<run>.log, as scripts/fp8_loss_parity.sh writes it: "device: NVIDIA H100 80GB HBM3 (sm_90, ...)"), or None when
    there is no such file or line. The same run on two GPU models can differ by as much as two seeds do (other GEMM
    kernels, other rounding), so the reports mark comparisons across models."""
    log = os.path.join(os.path.dirname(path), run_name(path) + ".log")
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            for _, line in zip(range(50), f):
                if line.startswith("device: "):
                    return line[len("device: "):].split(" (")[0].strip() or None
    except OSError:
        return None
    return None


def several_gpu_models(models):
    """Whether the known GPU models among `models` (run_device's answers, None for unknown) are more than one."""
    return len({m for m in models if m}) > 1


def read_records(path):
    """Every JSON object of a JSONL file, in order. A line that is not JSON is a ValueError naming the file and line,
    except a partial last line (a run killed while writing), which is dropped."""
    records = []
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            if n == len(lines):  # no newline after it: cut off mid-write
                break
            raise ValueError(f"{path}:{n}: not a JSON line: {line[:80]}") from None
    return records


def finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def train_losses(records):
    """[(step, loss or None)] of the train records in order; None where the loss was not finite (null in JSONL)."""
    return [(r["step"], float(r["loss"]) if finite(r.get("loss")) else None)
            for r in records if r.get("type") == "train"]


def final_val_loss(records):
    """The val_loss of the last eval record, None when there is none, it is null, or train records come after its
    step (a run that stopped before its end: train_gpt validates after the last step, so a finished run's last eval
    is at or after its last train step, and an earlier eval is not the run's final loss)."""
    evals = [r for r in records if r.get("type") == "eval"]
    if not evals or not finite(evals[-1].get("val_loss")):
        return None
    steps = [r["step"] for r in records if r.get("type") == "train" and isinstance(r.get("step"), int)]
    if steps and isinstance(evals[-1].get("step"), int) and evals[-1]["step"] < max(steps):
        return None
    return float(evals[-1]["val_loss"])


def tail_train_loss(records, steps=TAIL_STEPS):
    """The mean of the finite train losses of the last `steps` train records; None when there is none."""
    losses = [loss for _, loss in train_losses(records)[-steps:] if loss is not None]
    return sum(losses) / len(losses) if losses else None


def skipped_steps(records):
    """Number of steps the divergence guard skipped (non-finite loss or gradient norm)."""
    return sum(1 for r in records if r.get("type") == "skip")


def trained_tokens(records):
    """Tokens over all train records (each holds its step's tokens)."""
    return int(sum(r.get("tokens") or 0 for r in records if r.get("type") == "train"))


def relative_pct(value, base):
    """(value - base) / base in percent; None when either is missing or base is 0."""
    if value is None or base is None or base == 0:
        return None
    return (value - base) / base * 100.0


def median(values):
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def spike_steps(losses, window=SPIKE_WINDOW, threshold=SPIKE_THRESHOLD):
    """The first step of every loss spike (see SPIKE_WINDOW) in losses = [(step, loss or None)]."""
    history, starts, in_spike = [], [], False
    for step, loss in losses:
        if loss is None:
            continue  # a skipped step: counted as skipped, never as a spike, and not part of the baseline
        spiking = len(history) >= window and loss > median(history[-window:]) + threshold
        if spiking and not in_spike:
            starts.append(step)
        in_spike = spiking
        history.append(loss)
    return starts
