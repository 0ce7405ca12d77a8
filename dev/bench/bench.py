#!/usr/bin/env python3
"""dev/bench/bench.py: the llm8 benchmark driver. Runs train_gpt configs for a fixed number of steps, measures
tokens/s, MFU (against the BF16 and FP8 peaks of the GPU it finds), peak device memory and loss, runs peers beside
each single-GPU run on the same GPU (--peer torch: GPT-2 dev/reference/gpt2.py --time, Llama dev/reference/llama.py
--time, i.e. transformers' LlamaForCausalLM with sdpa; both torch.compile, BF16 autocast, fused AdamW; --peer llmc:
karpathy/llm.c's train_gpt2cu from --llmc-dir, GPT-2 only, on the same shards and tokens per step), alternating ours
and the peers over --rounds, appends one Markdown row per run to dev/bench/results/<gpu>.md (peer rows with
ours/peer) and prints a side-by-side table.

How a run is measured (details in dev/bench/README.md):
  - train_gpt runs `--steps` optimizer steps of `--accum` micro-steps each (default 1: train.global_batch_tokens=0;
    K > 1: train.global_batch_tokens = K * B * T * GPUs, gradient accumulation as in a real run, where the optimizer
    step is amortised over the global batch), no validation, sampling or checkpoints, and writes its JSONL metrics; the
    first `--warmup` steps are dropped and tokens/s = tokens per step / median step time of the rest. The peer runs
    the same accumulation.
  - llm.c runs -d = our tokens per step with its published micro-batch (124M: 64, 350M: 32) where it divides them,
    from a random init (-e dN), no recomputation; tokens/s = -d / median of its per-step 'X ms' after the warm-up.
  - FLOPs per token come from `train_gpt --dry-run` (6N + 6LCT); MFU = FLOPs/token * tokens/s / (peak * GPUs).
  - peak memory = the largest mem_gib of the JSONL records; loss = the last train loss.
  - a run spec with micro_batch `max` (llama-1b:max:2048) runs each recipe at its largest micro-batch that fits: the
    largest B whose `--dry-run` memory plan (within 0.1% of the measured peak) is at most the GPU's memory less
    --headroom-gib, found by doubling and bisection over dry runs (no peers: they need one fixed batch).
  - --gpus N[,M...] runs every spec on that many GPUs through scripts/run_local.sh (weak scaling: micro_batch per GPU
    stays, tokens per step grow with N); multi-GPU rows carry the GPU count, and the communication hidden behind
    backward is measured from the trainer's "comm" records (CUDA events on the communication stream, see README).

Examples:
  python3 dev/bench/bench.py                              # the gpt2 suite (124M and 350M), peer included
  python3 dev/bench/bench.py --suite llama                # llama-350m and llama-1b at T=2048, HF peer included
  python3 dev/bench/bench.py --suite quick --peer none
  python3 dev/bench/bench.py --runs 124m:32:1024,350m:16:1024:2 --recipe bf16 --steps 40 --dry
  python3 dev/bench/bench.py --runs 124m:32:1024 --gpus 1,2 --peer none     # scaling from 1 to 2 GPUs
  python3 dev/bench/bench.py --runs llama-1b:4:2048 --recipe bf16,fp8_tensorwise --accum 16 --steps 4 --warmup 1
  python3 dev/bench/bench.py --runs 124m:32:1024 --accum 16 --steps 6 --warmup 2 --peer torch,llmc \
      --llmc-dir .peers/llm.c                             # llm.c and PyTorch beside ours, two rounds
  python3 dev/bench/bench.py --runs llama-1b:max:2048 --recipe bf16,coat --accum 4 --peer none  # largest batches
"""
import argparse
import dataclasses
import datetime
import glob
import json
import math
import os
import re
import shlex
import shutil
import socket
import statistics
import struct
import subprocess
import sys
from dataclasses import dataclass, field

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Dense peak TFLOP/s per GPU (BF16, FP8) from NVIDIA's datasheets; the same table as llmc/run/metrics.cpp. Matched as
# lower-case substrings of the nvidia-smi name, most specific first. None = the GPU has no such peak (A100: no FP8).
GPU_PEAKS = [
    ("gh200", (989.0, 1979.0)),
    ("h200", (989.0, 1979.0)),
    ("h100 pcie", (756.0, 1513.0)),
    ("h100 nvl", (835.0, 1671.0)),
    ("h100", (989.0, 1979.0)),  # H100 SXM5 (nvidia-smi: "NVIDIA H100 80GB HBM3")
    ("h800", (989.0, 1979.0)),
    ("a100", (312.0, None)),
    ("gb200", (2500.0, 5000.0)),
    ("b200", (2250.0, 4500.0)),
]

# GPT-2 model presets (n_layer, n_head, n_embd, max_seq_len), as in llmc/model/gpt2/gpt2_family.cpp. Used only when
# the trainer's --dry-run output cannot be parsed (FLOPs fallback, peer model sizes).
GPT2_PRESETS = {
    "gpt2-tiny": (2, 2, 128, 256),
    "gpt2-mini": (6, 6, 384, 512),
    "gpt2-124m": (12, 12, 768, 1024),
    "gpt2-350m": (24, 16, 1024, 1024),
    "gpt2-774m": (36, 20, 1280, 1024),
    "gpt2-1558m": (48, 25, 1600, 1024),
}
GPT2_VOCAB = 50257

# Llama presets (n_layer, n_head, n_kv_head, n_embd, ffn_hidden, max_seq_len, rope_theta, tied), as in
# llmc/model/llama/llama_family.cpp; the same fallback role as GPT2_PRESETS.
LLAMA_PRESETS = {
    "llama-tiny": (2, 2, 1, 128, 512, 256, 10000.0, False),
    "llama-125m": (12, 12, 4, 768, 2048, 2048, 500000.0, True),
    "llama-350m": (24, 16, 4, 1024, 2816, 2048, 500000.0, True),
    "llama-1b": (16, 32, 8, 2048, 8192, 2048, 500000.0, True),
    "llama-3b": (28, 24, 8, 3072, 8192, 2048, 500000.0, True),
}

# Named suites: run specs "model:micro_batch:seq_len[:gpus]".
SUITES = {
    "gpt2": ["124m:32:1024", "124m:64:1024", "350m:16:1024", "350m:32:1024"],
    "llama": ["llama-350m:8:2048", "llama-1b:4:2048", "llama-1b:8:2048"],
    "quick": ["mini:16:512"],
}

PEER_RECIPE = "pytorch-compile-bf16"            # dev/reference/gpt2.py --time
LLAMA_PEER_RECIPE = "hf-llama-compile-bf16"     # dev/reference/llama.py --time (transformers' LlamaForCausalLM)
RESULT_COLUMNS = ["model", "recipe", "GPUs", "micro-batch", "accum", "sequence", "tokens/s", "MFU (BF16 peak)",
                  "MFU (FP8 peak)", "peak memory GiB", "loss", "commit", "date", "ours/peer"]


# ----------------------------------------------------------------------------------------------------------------
# run specs and commands

MAX_BATCH = 0  # RunSpec.micro_batch of a "max" spec: each recipe's largest micro-batch that fits (largest_micro_batch)


@dataclass
class RunSpec:
    model: str        # short name ("124m", "mini") or a path to a config .json
    micro_batch: int  # B, or MAX_BATCH
    seq_len: int      # T
    gpus: int = 1

    def label(self):
        b = "max" if self.micro_batch == MAX_BATCH else self.micro_batch
        return f"{os.path.basename(self.model)} B={b} T={self.seq_len} x{self.gpus}"


def parse_run_spec(text):
    """'124m:32:1024' or '124m:32:1024:2' (model:micro_batch:seq_len[:gpus]) -> RunSpec; micro_batch 'max' is each
    recipe's largest micro-batch that fits on the GPU (MAX_BATCH)."""
    parts = text.strip().split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise ValueError(f"run spec '{text}': expected model:micro_batch:seq_len[:gpus], e.g. 124m:32:1024")
    try:
        numbers = [MAX_BATCH if i == 0 and p == "max" else int(p) for i, p in enumerate(parts[1:])]
    except ValueError:
        raise ValueError(f"run spec '{text}': micro_batch ('max' or an integer), seq_len and gpus must be integers") \
            from None
    if min(n for i, n in enumerate(numbers) if not (i == 0 and parts[1] == "max")) < 1:
        raise ValueError(f"run spec '{text}': micro_batch, seq_len and gpus must be >= 1")
    return RunSpec(parts[0], *numbers)


def dry_run_total_bytes(text):
    """The device bytes train_gpt --dry-run plans for one GPU (its 'total ... B  on one GPU' row), or None."""
    m = re.search(r"^\s*total\s+[0-9.]+ GiB\s+([0-9,]+) B", text, re.M)
    return int(m.group(1).replace(",", "")) if m else None


def largest_micro_batch(planned_bytes, budget_bytes, limit=4096):
    """The largest B in [1, limit] whose planned_bytes(B) (the memory plan, None when the config is refused) is at most
    budget_bytes, or None when B = 1 does not fit. The plan grows with B, so doubling then bisection finds it with
    O(log B) dry runs."""
    def fits(b):
        need = planned_bytes(b)
        return need is not None and need <= budget_bytes
    if not fits(1):
        return None
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)  # lo fits, hi does not (or is past the limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def gpu_memory_bytes():
    """Total memory of GPU 0 from nvidia-smi, or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60)
        return int(out.stdout.split()[0]) * 1024 * 1024 if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def parse_run_list(runs, suite):
    specs = []
    if suite:
        for name in suite.split(","):
            if name not in SUITES:
                raise ValueError(f"unknown suite '{name}' (known: {', '.join(sorted(SUITES))})")
            specs += [parse_run_spec(s) for s in SUITES[name]]
    if runs:
        specs += [parse_run_spec(s) for s in runs.split(",") if s.strip()]
    return specs


def config_stem(model):
    """'124m' -> 'gpt2_124m'; 'llama-1b' or 'llama_1b' -> 'llama_1b' (a model named with its architecture)."""
    stem = model.replace("-", "_")
    return stem if stem.startswith(("gpt2_", "llama_")) else f"gpt2_{stem}"


def config_for(model, recipe, configs_dir):
    """The config file of a run and whether precision.recipe must be overridden. A model that names a .json file is
    used as is; otherwise configs/<stem>_<recipe>.json if it exists, else configs/<stem>_bf16.json, with
    <stem> = gpt2_<model> (124m) or the model itself when it names its architecture (llama-1b -> llama_1b)."""
    if model.endswith(".json"):
        return model, True
    stem = config_stem(model)
    specific = os.path.join(configs_dir, f"{stem}_{recipe}.json")
    if os.path.exists(specific):
        return specific, False
    return os.path.join(configs_dir, f"{stem}_bf16.json"), True


def bench_overrides(spec, recipe, steps, warmup, jsonl_path, train_glob, accum=1):
    """--set overrides that turn a training config into a benchmark: fixed batch and steps, `accum` micro-steps per
    optimizer step (1: train.global_batch_tokens=0), the learning-rate warm-up as long as the timing warm-up (it must
    not exceed the steps), no validation/sampling/checkpoints, JSONL metrics every step."""
    global_tokens = accum * spec.micro_batch * spec.seq_len * spec.gpus if accum > 1 else 0
    return [
        f"train.micro_batch={spec.micro_batch}",
        f"train.seq_len={spec.seq_len}",
        f"train.global_batch_tokens={global_tokens}",
        f"train.steps={steps}",
        f"train.warmup_steps={warmup}",
        f"precision.recipe={recipe}",
        f"data.train={train_glob}",
        'data.val=""',
        "eval.every=0",
        "sample.every=0",
        "sample.tokens=0",
        'checkpoint.dir=""',
        "log.every=1",
        f"log.jsonl={jsonl_path}",
    ]


def recipe_label(recipe, extra_sets):
    """The results' recipe column: the recipe, plus the extra --set overrides that change the run (e.g.
    'fp8_blockwise (precision.cache_weight_transpose=false)')."""
    return f"{recipe} ({', '.join(extra_sets)})" if extra_sets else recipe


def trainer_command(train_gpt, config, overrides, dry_run=False):
    cmd = [train_gpt, "--config", config]
    for o in overrides:
        cmd += ["--set", o]
    if dry_run:
        cmd.append("--dry-run")
    return cmd


def peer_command(python, dims, spec, warmup, steps, accum=1):
    """The PyTorch peer in timing mode with the model sizes given explicitly (works for any preset):
    dev/reference/gpt2.py for gpt2, dev/reference/llama.py (transformers' LlamaForCausalLM) for llama."""
    common = ["--B", str(spec.micro_batch), "--T", str(spec.seq_len),
              "--warmup", str(warmup), "--iters", str(max(1, steps - warmup))]
    if accum > 1:
        common += ["--accum", str(accum)]
    sizes = ["--n_layer", str(dims["n_layer"]), "--n_head", str(dims["n_head"]), "--n_embd", str(dims["n_embd"]),
             "--max_seq_len", str(max(dims["max_seq_len"], spec.seq_len)), "--vocab_size", str(dims["vocab_size"])]
    if dims["arch"] == "llama":
        return [python, os.path.join("dev", "reference", "llama.py"), "--time"] + sizes + [
            "--n_kv_head", str(dims["n_kv_head"]), "--ffn_hidden", str(dims["ffn_hidden"]),
            "--rope_theta", repr(float(dims["rope_theta"])), "--tied" if dims["tied_embeddings"] else "--untied",
        ] + common
    return [python, os.path.join("dev", "reference", "gpt2.py"), "--time"] + sizes + common


# ----------------------------------------------------------------------------------------------------------------
# the llm.c peer: karpathy/llm.c's train_gpt2cu, built from an extracted copy of llm.c-cuda13.tar.gz (--llmc-dir)

LLMC_RECIPE = "llm.c-bf16"
LLMC_BINARY = "train_gpt2cu"
LLMC_MAKE = ["make", LLMC_BINARY, "USE_CUDNN=1", "NO_MULTI_GPU=1"]  # cuDNN attention, one GPU (no MPI/NCCL)
# llm.c's `-e dN` models (train_gpt2.cu, gpt2_build_from_descriptor): depth -> (channels, heads), all with GPT-2's
# vocabulary and 1024 positions.
LLMC_MODELS = {6: (384, 6), 12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}
LLMC_MAX_SEQ_LEN = 1024
# llm.c's published micro-batches by depth (its README: GPT-2 124M at B=64, 350M at B=32, T=1024).
LLMC_MICRO_BATCH = {12: 64, 24: 32}
# The only shard header llm.c's data loader accepts (its llmc/dataloader.h): magic, version (uint16 tokens). It is
# the header of dev/data/prepare.py's default shards; --uint32 shards (20240801, 7) are not readable by llm.c.
LLMC_SHARD_MAGIC, LLMC_SHARD_VERSION = 20240520, 1
LLMC_EXTRACT_HINT = ("extract the peer into an ignored folder of the checkout: mkdir -p .peers && "
                     "tar -xzf ../shared/peers/llm.c-cuda13.tar.gz -C .peers, then --llmc-dir .peers/llm.c")


class PeerUnsupported(ValueError):
    """The peer cannot train this run spec (llm.c and a Llama model); the peer is skipped for the spec."""


@dataclass
class LlmcPlan:
    model: str            # llm.c's -e model descriptor, e.g. "d12"
    micro_batch: int      # -b
    seq_len: int          # -t
    tokens_per_step: int  # -d: tokens per optimizer step, ours

    @property
    def accum(self):
        return self.tokens_per_step // (self.micro_batch * self.seq_len)


def llmc_plan(dims, spec, accum):
    """How llm.c runs beside a spec: its -e dN model of the same sizes, our sequence length and our tokens per
    optimizer step (-d = accum x B x T); the micro-batch is llm.c's published one for that model (124M: 64, 350M: 32)
    when it divides the step's tokens (llm.c then accumulates -d / (B x T) micro-steps), else ours. Raises
    PeerUnsupported for what llm.c cannot train."""
    if dims is None:
        raise PeerUnsupported("the model sizes are unknown (the dry run failed and the preset is not known)")
    if dims["arch"] != "gpt2":
        raise PeerUnsupported(f"llm.c trains GPT-2 only and this is a {dims['arch']} model")
    if spec.gpus != 1:
        raise PeerUnsupported(f"llm.c is built with NO_MULTI_GPU=1 and this run uses {spec.gpus} GPUs")
    layers, width, heads = dims["n_layer"], dims["n_embd"], dims["n_head"]
    if (LLMC_MODELS.get(layers) != (width, heads) or (dims.get("ffn_hidden") or 4 * width) != 4 * width
            or dims["vocab_size"] != GPT2_VOCAB):
        known = ", ".join(f"d{d} = {c} wide, {h} heads" for d, (c, h) in sorted(LLMC_MODELS.items()))
        raise PeerUnsupported(f"llm.c has no model with n_layer={layers} n_embd={width} n_head={heads} "
                              f"vocab_size={dims['vocab_size']} (its -e dN models: {known}; FFN 4C, vocabulary "
                              f"{GPT2_VOCAB})")
    if spec.seq_len > LLMC_MAX_SEQ_LEN:
        raise PeerUnsupported(f"llm.c's models have {LLMC_MAX_SEQ_LEN} positions, this run T={spec.seq_len}")
    tokens = accum * spec.micro_batch * spec.seq_len
    micro_batch = LLMC_MICRO_BATCH.get(layers, spec.micro_batch)
    if tokens % (micro_batch * spec.seq_len) != 0:
        micro_batch = spec.micro_batch
    return LlmcPlan(f"d{layers}", micro_batch, spec.seq_len, tokens)


def llmc_skip_reason(dims, spec, accum):
    """Why llm.c cannot run beside a spec, known before anything runs (from the preset's sizes), else None; a spec
    whose sizes are not known yet (a config path) is decided when its dry run has given them."""
    if dims is None:
        return None
    try:
        llmc_plan(dims, spec, accum)
    except PeerUnsupported as e:
        return str(e)
    return None


def llmc_command(binary, plan, steps, data_glob, out_dir):
    """train_gpt2cu for `steps` optimizer steps of the plan from a random init on our training shards."""
    return [binary,
            "-i", data_glob,
            "-j", data_glob,               # its validation loader needs shards of B*T+1 tokens (KJV's val shard: 59,631)
            "-e", plan.model,              # dN: initialise from scratch
            "-b", str(plan.micro_batch), "-t", str(plan.seq_len), "-d", str(plan.tokens_per_step),
            "-x", str(steps),
            "-v", str(steps + 1),          # validation only before step 1 and after the last (-v 0 divides by zero)
            "-m", "1",                     # one validation batch: that untimed part stays short
            "-s", "0", "-n", "0",          # no sampling, no checkpoints
            "-r", "0",                     # no recomputation (llm.c's fastest setting when the memory is there)
            "-o", out_dir]


_LLMC_STEP = re.compile(r"^step\s+(\d+)/(\d+)\s*\|\s*loss\s+(\S+).*\|\s*([\d.]+)\s*ms\s*\|\s*([\d.]+)%\s*bf16 MFU"
                        r"\s*\|\s*([\d.]+)\s*tok/s")
_LLMC_BATCH = re.compile(r"batch_size B=(\d+) \* seq_len T=(\d+) \* num_processes=(\d+) and total_batch_size=(\d+)")
_LLMC_MEMORY = re.compile(r"device memory usage:\s*(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")


def parse_llmc_output(text, warmup):
    """Summary of train_gpt2cu's console output, measured as ours: the first `warmup` step lines are dropped and
    tokens/s = tokens per step (its total_batch_size line) / median step time (the 'X ms' of its step lines: CUDA
    events around the step). Its printed tok/s is a bias-corrected moving average over the steps so far, so it is kept
    only as 'printed_tok_s' (the last one). Returns dict(timed_steps, step_ms, step_ms_mean, tokens_per_step,
    tokens_per_s, micro_batch, grad_accum, mem_gib (its 'device memory usage' after allocating its state, None if
    absent), loss (last), llmc_mfu (median of its own MFU), printed_tok_s, last_step, managed_memory (it fell back to
    cudaMallocManaged)). Raises ValueError when the batch line or the timed steps are missing."""
    steps, batch, mem_mib = [], None, None
    for line in text.splitlines():
        line = line.strip()
        m = _LLMC_STEP.match(line)
        if m:
            steps.append(dict(step=int(m.group(1)), total=int(m.group(2)), loss=float(m.group(3)),
                              ms=float(m.group(4)), mfu=float(m.group(5)), tok_s=float(m.group(6))))
            continue
        m = _LLMC_BATCH.search(line)
        if m:
            batch = [int(g) for g in m.groups()]
            continue
        m = _LLMC_MEMORY.search(line)
        if m:
            mem_mib = int(m.group(1))
    if batch is None:
        raise ValueError("no 'batch_size B=.. * seq_len T=.. * num_processes=.. and total_batch_size=..' line")
    micro_batch, seq_len, processes, tokens_per_step = batch
    timed = steps[warmup:]
    if not timed:
        raise ValueError(f"no timed steps: {len(steps)} step lines, warm-up {warmup} (run more --steps than --warmup)")
    step_ms = statistics.median(s["ms"] for s in timed)
    return {
        "timed_steps": len(timed),
        "step_ms": step_ms,
        "step_ms_mean": statistics.fmean(s["ms"] for s in timed),
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / (step_ms / 1000.0) if step_ms > 0 else float("nan"),
        "micro_batch": micro_batch,
        "grad_accum": tokens_per_step // (micro_batch * seq_len * processes),
        "mem_gib": mem_mib / 1024.0 if mem_mib is not None else None,
        "loss": steps[-1]["loss"],
        "llmc_mfu": statistics.median(s["mfu"] for s in timed),
        "printed_tok_s": steps[-1]["tok_s"],
        "last_step": steps[-1]["step"],
        "managed_memory": "Fell back to cudaMallocManaged" in text,
    }


def check_llmc_shards(data_glob, min_tokens):
    """None when every shard of data_glob is one llm.c reads (header magic 20240520, version 1: uint16 tokens, the
    format dev/data/prepare.py writes by default) and holds at least min_tokens (llm.c asserts B*T+1 per shard);
    otherwise what is wrong and the fix."""
    paths = sorted(glob.glob(data_glob))
    if not paths:
        return f"no shards match {data_glob}"
    for path in paths:
        with open(path, "rb") as f:
            head = f.read(12)
        if len(head) < 12:
            return f"{path}: {len(head)} bytes, shorter than a shard header"
        magic, version, count = struct.unpack("<3i", head)
        if (magic, version) != (LLMC_SHARD_MAGIC, LLMC_SHARD_VERSION):
            return (f"{path}: shard header magic {magic} version {version}, but llm.c reads only magic "
                    f"{LLMC_SHARD_MAGIC} version {LLMC_SHARD_VERSION} (uint16 tokens): prepare the shards without "
                    f"--uint32, or leave llmc out of --peer")
        if count < min_tokens:
            return (f"{path}: {count:,} tokens, but llm.c needs B*T+1 = {min_tokens:,} in every shard: use larger "
                    f"shards (dev/data/prepare.py --shard-tokens) or a smaller micro-batch")
    return None


def ensure_llmc_binary(llmc_dir, timeout, jobs=None):
    """Path of llm.c's train_gpt2cu in llmc_dir, built there first when missing (LLMC_MAKE, its log kept beside it
    as train_gpt2cu.build.log). Returns (path, None) or (None, what failed, naming the log)."""
    if not os.path.isfile(os.path.join(llmc_dir, "Makefile")):
        return None, f"--llmc-dir {llmc_dir}: no Makefile there; {LLMC_EXTRACT_HINT}"
    binary = os.path.join(llmc_dir, LLMC_BINARY)
    if os.access(binary, os.X_OK):
        return binary, None
    cmd = LLMC_MAKE + [f"-j{jobs or os.cpu_count() or 1}"]
    log_path = binary + ".build.log"
    print(f"building llm.c: {shlex.join(cmd)} in {llmc_dir} (log {log_path}) ...", flush=True)
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, cwd=llmc_dir, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
        except OSError as e:
            log.write(f"{cmd[0]}: {e}\n")
            rc = 127
    with open(log_path, errors="replace") as log:
        text = log.read()
    if rc != 0 or not os.access(binary, os.X_OK):
        status = f"timed out after {timeout} s" if rc is None else f"exit {rc}"
        return None, (f"building llm.c failed ({status}: '{shlex.join(cmd)}' in {llmc_dir}); see {log_path}: "
                      f"{first_compiler_error(text)}")
    return binary, None


def first_compiler_error(text):
    """The first error a build log reports (the compiler's, not make's summary after it), else last_error_line."""
    for line in text.splitlines():
        if re.search(r"\berror\b|fatal", line, re.IGNORECASE) and not line.startswith("make"):
            return line.strip()[:300]
    return last_error_line(text)

# ----------------------------------------------------------------------------------------------------------------
# parsing: the trainer's --dry-run report, its JSONL metrics, the peer's JSON line

_NUMBER = r"(\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([kKMGTP](?![a-zA-Z]))?"
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_FLOPS_PHRASE = re.compile(r"flops\s*(?:/|per|_per_)\s*_?(?:token|tok)\b", re.IGNORECASE)


def parse_flops_per_token(text):
    """FLOPs per token from a line such as 'FLOPs/token  7.985e+08 (6N + 6LCT at T = 1024)' or
    'FLOPs per token: 798,523,392'. Returns the largest number on the matching line (after the phrase; a unit
    suffix k/M/G/T is applied), which skips small numbers like 'T = 1024'; None if no line matches."""
    for line in text.splitlines():
        m = _FLOPS_PHRASE.search(line)
        if not m:
            continue
        values = [float(num.replace(",", "")) * _SCALE[unit]
                  for num, unit in re.findall(_NUMBER, line[m.end():])]
        values = [v for v in values if math.isfinite(v)]
        if values:
            return max(values)
    return None


def parse_resolved_model(text):
    """The model section of the --dry-run 'resolved config' dump ('  model: n_layer=12 n_head=12 ...') as a dict,
    or {} when absent. Values are JSON (strings quoted)."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("model:"):
            continue
        out = {}
        for key, value in re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", stripped[len("model:"):]):
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = value
        if "n_layer" in out:
            return out
    return {}


def parse_metrics(text, warmup):
    """Summary of a trainer JSONL metrics file: drops the first `warmup` train records and takes the median step
    time of the rest. Returns dict(timed_steps, step_ms (median), step_ms_mean, tokens_per_step, tokens_per_s,
    mem_gib (largest, None if never reported), loss (last train loss), val_loss (last, None if none), last_step).
    Raises ValueError when there are no train records after the warm-up."""
    train, evals, comm = [], [], []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise ValueError(f"metrics line {n} is not JSON: {line[:80]}") from None
        if record.get("type") == "train":
            train.append(record)
        elif record.get("type") == "eval":
            evals.append(record)
        elif record.get("type") == "comm":
            comm.append(record)
    timed = [r for r in train[warmup:] if r.get("ms") is not None and r.get("tokens") is not None]
    if not timed:
        raise ValueError(f"no timed steps: {len(train)} train records, warm-up {warmup} "
                         f"(run more --steps than --warmup)")
    step_ms = statistics.median(r["ms"] for r in timed)
    tokens = statistics.median(r["tokens"] for r in timed)
    mems = [r["mem_gib"] for r in train if r.get("mem_gib") is not None]
    losses = [r["loss"] for r in train if r.get("loss") is not None]
    vals = [r["val_loss"] for r in evals if r.get("val_loss") is not None]
    return {
        "timed_steps": len(timed),
        "step_ms": step_ms,
        "step_ms_mean": statistics.fmean(r["ms"] for r in timed),
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / (step_ms / 1000.0) if step_ms > 0 else float("nan"),
        "mem_gib": max(mems) if mems else None,
        "loss": losses[-1] if losses else None,
        "val_loss": vals[-1] if vals else None,
        "last_step": train[-1].get("step") if train else None,
        "comm": comm_summary(comm, {r.get("step") for r in timed}),
    }


def comm_summary(records, steps):
    """Medians over the timed steps of the trainer's "comm" records (multi-GPU runs): reduce_ms = time NCCL spent on
    the gradient reductions (CUDA events around each on the communication stream), exposed_reduce_ms = end of backward
    to end of the last reduction (what the step waited for), optimizer_ms = norm + AdamW + weight all-gather after the
    reductions; hidden_pct = share of the reduction time overlapped with backward. None for single-GPU runs."""
    timed = [r for r in records if r.get("step") in steps]
    if not timed:
        return None
    reduce_ms = statistics.median(r["reduce_ms"] for r in timed)
    exposed = statistics.median(r["exposed_reduce_ms"] for r in timed)
    return {
        "steps": len(timed),
        "reduce_ms": reduce_ms,
        "exposed_reduce_ms": exposed,
        "optimizer_ms": statistics.median(r["optimizer_ms"] for r in timed),
        "hidden_pct": 100.0 * max(0.0, reduce_ms - exposed) / reduce_ms if reduce_ms > 0 else None,
    }


def parse_peer_output(text):
    """The last JSON object line with "tokens_per_s" printed by dev/reference/gpt2.py --time, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "tokens_per_s" in record:
                return record
    return None


def last_error_line(text):
    """The line that best explains a failure: the last one mentioning an error, else the last non-empty one."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for pattern in (r"error|out of memory|\boom\b", r"exception|fatal|abort|killed|terminate|traceback"):
        for line in reversed(lines):
            if re.search(pattern, line, re.IGNORECASE):
                return line[:300]
    return lines[-1][:300] if lines else "(no output)"


# ----------------------------------------------------------------------------------------------------------------
# FLOPs, peaks, MFU

def gpt2_flops_per_token(n_layer, n_embd, seq_len, vocab=GPT2_VOCAB, ffn_hidden=None):
    """6N + 6LCT, the convention of llmc flops_per_token: N = non-embedding parameters + the lm_head matmul on the
    real vocabulary (= all parameters except wpe, wte counted once as the tied lm_head)."""
    C, L, F = n_embd, n_layer, ffn_hidden or 4 * n_embd
    per_layer = (2 * C) + (3 * C * C + 3 * C) + (C * C + C) + (2 * C) + (F * C + F) + (C * F + C)
    n = vocab * C + L * per_layer + 2 * C
    return 6.0 * n + 6.0 * L * C * seq_len


def llama_flops_per_token(n_layer, n_head, n_kv_head, n_embd, ffn_hidden, seq_len, vocab=GPT2_VOCAB):
    """6N + 6LCT for llama, the convention of llmc flops_per_token: N = non-embedding parameters (RMSNorm weights,
    q/k/v/o with the grouped-query k/v sizes, gate/up/down) + the lm_head matmul on the real vocabulary."""
    C, L, F, HS = n_embd, n_layer, ffn_hidden, n_embd // n_head
    per_layer = 2 * C + n_head * HS * C + 2 * n_kv_head * HS * C + C * n_head * HS + 3 * F * C
    n = vocab * C + L * per_layer + C
    return 6.0 * n + 6.0 * L * C * seq_len


def model_flops_per_token(dims, seq_len):
    """The 6N + 6LCT formula of the architecture in dims (see model_dims)."""
    if dims["arch"] == "llama":
        return llama_flops_per_token(dims["n_layer"], dims["n_head"], dims["n_kv_head"], dims["n_embd"],
                                     dims["ffn_hidden"], seq_len, dims["vocab_size"])
    return gpt2_flops_per_token(dims["n_layer"], dims["n_embd"], seq_len, dims["vocab_size"], dims.get("ffn_hidden"))


def gpu_peaks(name):
    """(bf16, fp8) dense peak TFLOP/s for an nvidia-smi GPU name, or None when unknown."""
    lower = name.lower()
    for part, peaks in GPU_PEAKS:
        if part in lower:
            return peaks
    return None


def mfu_percent(flops_per_token, tokens_per_s, peak_tflops, gpus):
    if not flops_per_token or not tokens_per_s or not peak_tflops or gpus < 1:
        return None
    if not all(math.isfinite(v) for v in (flops_per_token, tokens_per_s, peak_tflops)):
        return None
    return 100.0 * flops_per_token * tokens_per_s / (peak_tflops * 1e12 * gpus)


def slug(name):
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return s or "unknown-gpu"


def detect_gpus():
    """(name of GPU 0, number of GPUs) from nvidia-smi, or (None, 0) when there is none."""
    if not shutil.which("nvidia-smi"):
        return None, 0
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None, 0
    names = [l.strip() for l in out.stdout.splitlines() if l.strip()]
    if out.returncode != 0 or not names:
        return None, 0
    return names[0], len(names)


def git_commit():
    """Short HEAD, with '+dirty' when tracked files other than dev/bench/results differ from it. LLM8_COMMIT overrides
    it, for machines that receive a copy of the working tree without its .git (the commit must then be clean)."""
    if os.environ.get("LLM8_COMMIT"):
        return os.environ["LLM8_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)dev/bench/results"], cwd=REPO_ROOT, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


# ----------------------------------------------------------------------------------------------------------------
# results

def fmt(value, spec, none="n/a"):
    return none if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


RESULTS_HEADER = """# llm8 benchmarks on {gpu}

One row per benchmark run, appended by `dev/bench/bench.py` (see dev/bench/README.md).

- **model, recipe**: the model preset and precision recipe. The peers run beside ours on the same GPU in the same
  session: `{peer}` is the PyTorch reference (`dev/reference/gpt2.py --time`: torch.compile, BF16 autocast, fused
  AdamW); for Llama models `{llama_peer}` (`dev/reference/llama.py --time`: transformers' LlamaForCausalLM with
  sdpa attention, torch.compile, BF16 autocast, fused AdamW); `{llmc_peer}` is karpathy/llm.c's `train_gpt2cu`
  (GPT-2 only; cuDNN attention, no recomputation, from a random init on the same shards; `--peer llmc`).
- **GPUs, micro-batch, accum, sequence**: data-parallel GPUs, sequences per GPU per micro-step, micro-steps per
  optimizer step (gradient accumulation; 1 = an optimizer step after every micro-step), tokens per sequence. llm.c
  runs the same tokens per optimizer step as ours with its own published micro-batch (124M: 64, 350M: 32) where it
  divides them.
- **tokens/s**: over all GPUs. llm8 runs `accum` micro-steps per optimizer step with no validation, sampling or
  checkpoints; the first warm-up steps are dropped and tokens/s = tokens per step / median step time of the rest
  (train_gpt's per-step `ms`). llm.c is measured the same way from the `X ms` of its step lines. The PyTorch peer
  runs the same accumulation, drops the same number of warm-up steps (torch.compile happens there) and reports the
  mean step time of the rest (synchronised wall clock around the loop).
- **MFU**: FLOPs/token x tokens/s / (peak x GPUs), FLOPs/token = 6N + 6LCT (N = non-embedding parameters + the
  lm_head on the real vocabulary; L layers, C width, T sequence), against the dense peaks of this GPU:
  {peaks}. The peers' rows use the same formula.
- **peak memory GiB**: per GPU; llm8's largest `mem_gib`, the PyTorch peer's torch.cuda.max_memory_allocated,
  llm.c's `device memory usage` line (used device memory after it allocated its state, the CUDA context included).
- **loss**: the last training loss (llm8 and llm.c on the bundled KJV text; the PyTorch peer on random tokens, so not
  comparable).
- **commit, date**: `git rev-parse --short HEAD` (`+dirty` = uncommitted changes outside the results; the environment variable `LLM8_COMMIT` overrides it where the tree has no .git) and UTC time.
- **ours/peer** (peer rows): our tokens/s in the same round of the same run spec / this row's, one ratio per recipe
  of ours. With `--rounds N` ours and the peers alternate (ours first in rounds 1, 3, ..., last in rounds 2, 4, ...);
  rows written before this column existed leave it empty.

| {columns} |
|{rule}|
"""


def result_row(r):
    return "| " + " | ".join([
        r["model"], r["recipe"], str(r["gpus"]), str(r["micro_batch"]), str(r.get("accum", 1)), str(r["seq_len"]),
        fmt(r["tokens_per_s"], ",.0f"), fmt(r["mfu_bf16"], ".1f") + "%" * (r["mfu_bf16"] is not None),
        fmt(r["mfu_fp8"], ".1f") + "%" * (r["mfu_fp8"] is not None),
        fmt(r["mem_gib"], ".1f"), fmt(r["loss"], ".4f"), r["commit"], r["date"], ratio_text(r.get("ours_per_peer")),
    ]) + " |"


def ratio_text(ratios, digits=3):
    """The ours/peer cell: '1.063 (bf16), 1.271 (fp8_tensorwise)' from [(our recipe, ours / peer)]; '' for our own
    rows (None), 'n/a' for a peer row without a successful run of ours in its round ([])."""
    if ratios is None:
        return ""
    return ", ".join(f"{ratio:.{digits}f} ({recipe})" for recipe, ratio in ratios) or "n/a"


def results_header(gpu_name):
    """The header of a results file: what its columns mean and the column line with its rule."""
    peaks = gpu_peaks(gpu_name)
    peak_text = ("BF16 {:g}, FP8 {} TFLOP/s".format(peaks[0], fmt(peaks[1], "g"))
                 if peaks else "unknown to bench.py, so MFU is n/a")
    return RESULTS_HEADER.format(gpu=gpu_name, peer=PEER_RECIPE, llama_peer=LLAMA_PEER_RECIPE, llmc_peer=LLMC_RECIPE,
                                 peaks=peak_text, columns=" | ".join(RESULT_COLUMNS),
                                 rule="|".join("---" for _ in RESULT_COLUMNS))


def with_current_header(text, gpu_name):
    """A results file's text with its header (everything up to the table's rule line) replaced by the current one
    when its column line differs (a column was added since the file was created); the rows stay as they are."""
    lines = text.splitlines(keepends=True)
    column_line = "| " + " | ".join(RESULT_COLUMNS) + " |"
    for i, line in enumerate(lines[:-1]):
        if line.startswith("| model |") and lines[i + 1].startswith("|---"):
            if line.rstrip("\n") == column_line:
                return text
            return results_header(gpu_name) + "".join(lines[i + 2:])
    raise ValueError("no '| model | ...' column line followed by its rule")


def append_results(path, gpu_name, rows):
    """Appends rows to a results file, creating it with its header, or bringing an older file's header up to date."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
        try:
            current = with_current_header(text, gpu_name)
        except ValueError as e:
            raise ValueError(f"{path}: not a bench.py results table ({e}); move it away to start a new one") from None
        if current != text:
            with open(path, "w") as f:
                f.write(current)
    else:
        with open(path, "w") as f:
            f.write(results_header(gpu_name))
    with open(path, "a") as f:
        for r in rows:
            f.write(result_row(r) + "\n")


# ----------------------------------------------------------------------------------------------------------------
# running

@dataclass
class Outcome:
    ok: bool
    row: dict = field(default_factory=dict)  # result row fields when ok
    error: str = ""                          # last error line when not ok
    raw: dict = field(default_factory=dict)


def run_logged(cmd, log_path, timeout, env=None):
    """Runs cmd with stdout+stderr to log_path; returns (exit code or None on timeout, log text)."""
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                                env=env).returncode
        except subprocess.TimeoutExpired:
            rc = None
    with open(log_path, errors="replace") as log:
        return rc, log.read()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_trainer(cmd, gpus, log_prefix, timeout):
    """One process, or `gpus` processes through scripts/run_local.sh (torchrun-style variables, a free MASTER_PORT,
    NCCL_NVLS_ENABLE=0, one failing rank stops the others); per-rank logs <log_prefix>.rank<R>.log. Returns (exit
    code or None on timeout, rank 0's log, or the failing rank's log when one failed)."""
    if gpus == 1:
        return run_logged(cmd, log_prefix + ".log", timeout)
    logdir = log_prefix + ".ranks"
    os.makedirs(logdir, exist_ok=True)
    env = dict(os.environ, LLM8_LOG_DIR=logdir, NCCL_NVLS_ENABLE="0")
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(var, None)
    launcher = [os.path.join(REPO_ROOT, "scripts", "run_local.sh"), str(gpus), "--"] + cmd
    rc, launcher_text = run_logged(launcher, log_prefix + ".launcher.log", timeout, env=env)
    texts = []
    for rank in range(gpus):
        try:
            with open(os.path.join(logdir, f"rank{rank}.log"), errors="replace") as f:
                texts.append(f.read())
        except OSError:
            texts.append("")
    if rc == 0:
        return 0, texts[0]
    failed = [t for t in texts if re.search(r"error", t, re.IGNORECASE)]
    return rc, (failed[0] if failed else texts[0]) + "\n" + launcher_text


def failure_text(rc, text, timeout):
    if rc is None:
        return f"timed out after {timeout} s; " + last_error_line(text)
    return f"exit {rc}: " + last_error_line(text)


def resolve_max_batch(args, spec, recipe, workdir):
    """A MAX_BATCH spec with the recipe's largest micro-batch whose --dry-run memory plan (within 0.1% of the
    measured peak on llama-1b) fits the GPU's memory less --headroom-gib; (spec, None) or (None, error)."""
    total = gpu_memory_bytes()
    if total is None:
        return None, "B=max: nvidia-smi gives no GPU memory size"
    budget = total - int(args.headroom_gib * 1024 ** 3)
    config, set_recipe = config_for(spec.model, recipe, args.configs)
    log_path = os.path.join(workdir, f"{os.path.basename(spec.model).removesuffix('.json')}_max_{recipe}.search.log")

    def planned(b):
        trial = dataclasses.replace(spec, micro_batch=b)
        overrides = bench_overrides(trial, recipe, args.steps, args.warmup, os.devnull, args.data, args.accum) + \
            args.set
        if not set_recipe:
            overrides = [o for o in overrides if not o.startswith("precision.recipe=")]
        out = subprocess.run(trainer_command(args.train_gpt, config, overrides, dry_run=True), cwd=REPO_ROOT,
                             capture_output=True, text=True)
        need = dry_run_total_bytes(out.stdout)  # the plan is printed before any data check; a refused config has none
        with open(log_path, "a") as log:
            log.write(f"B={b}: {need if need is not None else 'refused: ' + last_error_line(out.stdout + out.stderr)}"
                      f" (budget {budget})\n")
        return need

    b = largest_micro_batch(planned, budget)
    if b is None:
        return None, f"B=max: not even B=1 fits in {budget / 1024 ** 3:.1f} GiB (search log {log_path})"
    print(f"  B=max for {recipe}: {b} (planned within {budget / 1024 ** 3:.1f} GiB)", flush=True)
    return dataclasses.replace(spec, micro_batch=b), None


def run_ours(args, spec, recipe, gpu_name, workdir, commit, date, round_index=0):
    max_batch = spec.micro_batch == MAX_BATCH
    if max_batch:
        spec, error = resolve_max_batch(args, spec, recipe, workdir)
        if error:
            return Outcome(False, error=error, raw={"impl": "llm8", "recipe": recipe, "max_batch": True}), None
    model = os.path.basename(spec.model).removesuffix(".json")
    name = f"{model}_b{spec.micro_batch}_t{spec.seq_len}_g{spec.gpus}_{recipe}_r{round_index}"
    jsonl = os.path.join(workdir, name + ".jsonl")
    config, set_recipe = config_for(spec.model, recipe, args.configs)
    overrides = bench_overrides(spec, recipe, args.steps, args.warmup, jsonl, args.data, args.accum) + args.set
    if not set_recipe:
        overrides = [o for o in overrides if not o.startswith("precision.recipe=")]
    env = dict(os.environ, WORLD_SIZE=str(spec.gpus))
    raw = {"impl": "llm8", "spec": spec.__dict__, "round": round_index, "recipe": recipe, "config": config,
           "overrides": overrides, "max_batch": max_batch}

    # the dry run validates the config (no GPU) and gives FLOPs/token and the resolved model sizes
    with open(os.path.join(workdir, name + ".dryrun.log"), "w") as log:
        dry = subprocess.run(trainer_command(args.train_gpt, config, overrides, dry_run=True), cwd=REPO_ROOT,
                             stdout=log, stderr=subprocess.STDOUT, env=env)
    dry_text = open(log.name, errors="replace").read()
    if dry.returncode != 0:
        return Outcome(False, error="dry run " + failure_text(dry.returncode, dry_text, 0), raw=raw), None
    resolved = parse_resolved_model(dry_text)
    preset_name = resolved.get("preset") or read_preset(config, spec.model)
    dims = model_dims(resolved, preset_name)
    flops = parse_flops_per_token(dry_text)
    raw["flops_source"] = "train_gpt --dry-run"
    if flops is None and dims:
        flops = model_flops_per_token(dims, spec.seq_len)
        raw["flops_source"] = "bench.py 6N+6LCT fallback"
    raw["flops_per_token"] = flops
    if dims:
        # cross-check against bench.py's own 6N + 6LCT (the dry run prints 4 significant digits)
        formula = model_flops_per_token(dims, spec.seq_len)
        raw["flops_per_token_formula"] = formula
        if flops and abs(flops / formula - 1) > 0.01:
            print(f"  warning: FLOPs/token {flops:.4g} from --dry-run differs from 6N+6LCT = {formula:.4g}",
                  flush=True)

    if os.path.exists(jsonl):
        os.remove(jsonl)
    rc, text = launch_trainer(trainer_command(args.train_gpt, config, overrides), spec.gpus,
                              os.path.join(workdir, name), args.timeout)
    if rc != 0:
        return Outcome(False, error=failure_text(rc, text, args.timeout), raw=raw), dims
    try:
        with open(jsonl) as f:
            metrics = parse_metrics(f.read(), args.warmup)
    except (OSError, ValueError) as e:
        return Outcome(False, error=f"metrics {jsonl}: {e}", raw=raw), dims
    raw["metrics"] = metrics
    peaks = gpu_peaks(gpu_name) or (None, None)
    row = {
        "model": preset_name or spec.model, "recipe": recipe_label(recipe, args.set), "gpus": spec.gpus, "micro_batch": spec.micro_batch,
        "accum": args.accum,
        "seq_len": spec.seq_len, "tokens_per_s": metrics["tokens_per_s"],
        "mfu_bf16": mfu_percent(flops, metrics["tokens_per_s"], peaks[0], spec.gpus),
        "mfu_fp8": mfu_percent(flops, metrics["tokens_per_s"], peaks[1], spec.gpus),
        "mem_gib": metrics["mem_gib"], "loss": metrics["loss"], "commit": commit, "date": date,
    }
    return Outcome(True, row=row, raw=raw), dims


def run_torch(args, spec, dims, model_name, gpu_name, workdir, commit, date, round_index=0):
    """The PyTorch peer (peer_command) beside a single-GPU run."""
    cmd = peer_command(args.python, dims, spec, args.warmup, args.steps, args.accum)
    name = f"peer_{model_name}_b{spec.micro_batch}_t{spec.seq_len}_r{round_index}"
    llama = dims["arch"] == "llama"
    raw = {"impl": "pytorch-hf-llama" if llama else "pytorch", "spec": spec.__dict__, "round": round_index,
           "command": cmd}
    rc, text = run_logged(cmd, os.path.join(workdir, name + ".log"), args.timeout)
    if rc == 77:
        return Outcome(False, error="skipped: PyTorch is not installed", raw=raw)
    if rc != 0:
        return Outcome(False, error=failure_text(rc, text, args.timeout), raw=raw)
    out = parse_peer_output(text)
    if out is None:
        return Outcome(False, error="no JSON line with tokens_per_s in the output: " + last_error_line(text), raw=raw)
    raw["output"] = out
    flops = model_flops_per_token(dims, spec.seq_len)
    peaks = gpu_peaks(gpu_name) or (None, None)
    tok_s = out["tokens_per_s"]
    row = {
        "model": model_name, "recipe": LLAMA_PEER_RECIPE if llama else PEER_RECIPE, "gpus": 1,
        "micro_batch": spec.micro_batch, "accum": args.accum,
        "seq_len": spec.seq_len, "tokens_per_s": tok_s, "mfu_bf16": mfu_percent(flops, tok_s, peaks[0], 1),
        "mfu_fp8": mfu_percent(flops, tok_s, peaks[1], 1), "mem_gib": out.get("peak_mem_gib"),
        "loss": out.get("loss"), "commit": commit, "date": date,
    }
    return Outcome(True, row=row, raw=raw)


def run_llmc(args, spec, plan, dims, model_name, binary, gpu_name, workdir, commit, date, round_index):
    """llm.c's train_gpt2cu for --steps optimizer steps of the plan (llmc_plan) on our training shards."""
    name = f"llmc_{model_name}_b{plan.micro_batch}_t{plan.seq_len}_r{round_index}"
    cmd = llmc_command(binary, plan, args.steps, args.data, os.path.join(workdir, name))
    raw = {"impl": "llm.c", "spec": spec.__dict__, "round": round_index, "plan": plan.__dict__, "command": cmd}
    shard_error = check_llmc_shards(args.data, plan.micro_batch * plan.seq_len + 1)
    if shard_error:
        return Outcome(False, error=shard_error, raw=raw)
    rc, text = run_logged(cmd, os.path.join(workdir, name + ".log"), args.timeout)
    if rc != 0:
        return Outcome(False, error=failure_text(rc, text, args.timeout), raw=raw)
    try:
        out = parse_llmc_output(text, args.warmup)
    except ValueError as e:
        return Outcome(False, error=f"llm.c output: {e}: " + last_error_line(text), raw=raw)
    raw["output"] = out
    if out["tokens_per_step"] != plan.tokens_per_step:
        return Outcome(False, error=f"llm.c ran {out['tokens_per_step']} tokens per step, not the "
                                    f"{plan.tokens_per_step} asked for", raw=raw)
    if out["managed_memory"]:
        print("  warning: llm.c fell back to cudaMallocManaged (not enough device memory): it runs slower", flush=True)
    flops = model_flops_per_token(dims, spec.seq_len)
    peaks = gpu_peaks(gpu_name) or (None, None)
    tok_s = out["tokens_per_s"]
    row = {
        "model": model_name, "recipe": LLMC_RECIPE, "gpus": 1, "micro_batch": plan.micro_batch, "accum": plan.accum,
        "seq_len": plan.seq_len, "tokens_per_s": tok_s, "mfu_bf16": mfu_percent(flops, tok_s, peaks[0], 1),
        "mfu_fp8": mfu_percent(flops, tok_s, peaks[1], 1), "mem_gib": out["mem_gib"], "loss": out["loss"],
        "commit": commit, "date": date,
    }
    return Outcome(True, row=row, raw=raw)

def read_preset(config, model=""):
    """model.preset of a config file; when the file cannot be read, the preset the model names if it is known
    ('124m' -> 'gpt2-124m', 'llama_1b' -> 'llama-1b')."""
    try:
        with open(os.path.join(REPO_ROOT, config)) as f:
            return json.load(f).get("model", {}).get("preset", "")
    except (OSError, ValueError, AttributeError):
        name = config_stem(model).replace("_", "-")
        return name if name in GPT2_PRESETS or name in LLAMA_PRESETS else ""


def model_dims(resolved, preset_name):
    """The model sizes as a dict (arch, n_layer, n_head, n_embd, max_seq_len, vocab_size; llama also n_kv_head,
    ffn_hidden, rope_theta, tied_embeddings) from the resolved config, else the preset tables; None if unknown."""
    keys = ("n_layer", "n_head", "n_embd", "max_seq_len")
    arch = resolved.get("arch") or ("llama" if preset_name in LLAMA_PRESETS else "gpt2")
    if all(k in resolved for k in keys):
        dims = {k: int(resolved[k]) for k in keys}
        dims.update(arch=arch, vocab_size=int(resolved.get("vocab_size", GPT2_VOCAB)))
        if "ffn_hidden" in resolved:
            dims["ffn_hidden"] = int(resolved["ffn_hidden"])
        if arch == "llama":
            if not all(k in resolved for k in ("n_kv_head", "ffn_hidden", "rope_theta", "tied_embeddings")):
                return None
            dims.update(n_kv_head=int(resolved["n_kv_head"]), rope_theta=float(resolved["rope_theta"]),
                        tied_embeddings=bool(resolved["tied_embeddings"]))
        return dims
    if preset_name in GPT2_PRESETS:
        n_layer, n_head, n_embd, max_seq_len = GPT2_PRESETS[preset_name]
        return dict(arch="gpt2", n_layer=n_layer, n_head=n_head, n_embd=n_embd, max_seq_len=max_seq_len,
                    vocab_size=GPT2_VOCAB)
    if preset_name in LLAMA_PRESETS:
        n_layer, n_head, n_kv, n_embd, ffn, max_seq_len, theta, tied = LLAMA_PRESETS[preset_name]
        return dict(arch="llama", n_layer=n_layer, n_head=n_head, n_kv_head=n_kv, n_embd=n_embd, ffn_hidden=ffn,
                    max_seq_len=max_seq_len, vocab_size=GPT2_VOCAB, rope_theta=theta, tied_embeddings=tied)
    return None


DEFAULT_DATA = "data/kjv/kjv_train_*.bin"


def ensure_data(args, dry):
    """Prepares the bundled KJV corpus when its training shards are missing; another --data glob must exist."""
    if glob.glob(os.path.join(REPO_ROOT, args.data)):
        return True
    if args.data != DEFAULT_DATA:
        print(f"bench.py: no shards match --data {args.data}", file=sys.stderr)
        return dry
    cmd = [args.python, os.path.join("dev", "data", "prepare.py"), "--kjv"]
    if dry:
        print("# no shards match", args.data, "- would prepare them with:")
        print(shlex.join(cmd))
        return True
    if not os.path.exists(os.path.join(REPO_ROOT, "dev", "data", "prepare.py")):
        print(f"bench.py: no shards match {args.data} and dev/data/prepare.py is missing", file=sys.stderr)
        return False
    print("preparing data:", shlex.join(cmd), flush=True)
    if subprocess.run(cmd, cwd=REPO_ROOT).returncode != 0 or not glob.glob(os.path.join(REPO_ROOT, args.data)):
        print(f"bench.py: '{shlex.join(cmd)}' did not produce {args.data}", file=sys.stderr)
        return False
    return True


PEER_NAMES = ("torch", "llmc")  # --peer names: the PyTorch reference, llm.c's train_gpt2cu


def parse_peers(text):
    """--peer: 'none' or a comma list of PEER_NAMES (run in that order within a round) -> list of names."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["none"]:
        return []
    if not names or any(n not in PEER_NAMES for n in names):
        raise ValueError(f"--peer {text}: expected none or a comma list of {', '.join(PEER_NAMES)}, e.g. torch,llmc")
    return list(dict.fromkeys(names))


def run_order(rounds, peers):
    """The runs of one spec, round by round: ["ours", *peers] in even rounds and the reverse in odd ones, so a drift
    of the GPU's clocks or temperature over the session favours neither side ("ours" = each --recipe in turn)."""
    sequence = ["ours"] + list(peers)
    return [sequence if r % 2 == 0 else sequence[::-1] for r in range(rounds)]


def peer_recipe(peer, dims):
    """The recipe column of a peer's rows."""
    if peer == "llmc":
        return LLMC_RECIPE
    return LLAMA_PEER_RECIPE if dims and dims["arch"] == "llama" else PEER_RECIPE


@dataclass
class SpecResults:
    """Every run of one spec: one Outcome per round for each of our recipes and each peer, and the peers skipped."""
    spec: RunSpec
    ours: dict = field(default_factory=dict)     # recipe -> [Outcome]
    peers: dict = field(default_factory=dict)    # peer name -> [Outcome]
    labels: dict = field(default_factory=dict)   # peer name -> its recipe column
    skipped: dict = field(default_factory=dict)  # peer name -> why it does not run beside this spec


def print_dry(args, specs, recipes, gpu_name, peers):
    print(f"# GPU: {gpu_name or 'none found'}; results would go to "
          f"{os.path.join(args.results, slug(gpu_name or 'unknown-gpu') + '.md')}")
    ensure_data(args, dry=True)
    llmc_binary = os.path.join(args.llmc_dir, LLMC_BINARY) if "llmc" in peers else None
    if llmc_binary and not os.access(llmc_binary, os.X_OK):
        print(f"# llm.c: would build {llmc_binary} with: (cd {shlex.quote(args.llmc_dir)} && "
              f"{shlex.join(LLMC_MAKE)} -j{os.cpu_count() or 1})")
    for spec in specs:
        for recipe in recipes:
            config, set_recipe = config_for(spec.model, recipe, args.configs)
            shown = dataclasses.replace(spec, micro_batch=1) if spec.micro_batch == MAX_BATCH else spec
            overrides = bench_overrides(shown, recipe, args.steps, args.warmup, f"{args.workdir}/<run>.jsonl", args.data,
                                        args.accum) + args.set
            if not set_recipe:
                overrides = [o for o in overrides if not o.startswith("precision.recipe=")]
            prefix = f"WORLD_SIZE={spec.gpus} " if spec.gpus > 1 else ""
            print(f"# {spec.label()} {recipe}" + (" (B=max: found at run time by dry runs; B=1 shown)"
                                                   if spec.micro_batch == MAX_BATCH else ""))
            print(prefix + shlex.join(trainer_command(args.train_gpt, config, overrides, dry_run=True)))
            run = trainer_command(args.train_gpt, config, overrides)
            if spec.gpus > 1:
                run = [os.path.join("scripts", "run_local.sh"), str(spec.gpus), "--"] + run
            print(shlex.join(run))
        spec_peers = list(peers) if spec.gpus == 1 else []
        config, _ = config_for(spec.model, recipes[0], args.configs)
        dims = model_dims({}, read_preset(config, spec.model))
        for peer in list(spec_peers):
            if dims is None:
                print(f"# {peer} peer: model sizes of {config} come from its --dry-run output at run time")
            elif peer == "torch":
                print(shlex.join(peer_command(args.python, dims, spec, args.warmup, args.steps, args.accum)))
            else:
                try:
                    plan = llmc_plan(dims, spec, args.accum)
                except PeerUnsupported as e:
                    print(f"# note: no llm.c peer for {spec.label()}: {e}")
                    spec_peers.remove(peer)
                    continue
                print(shlex.join(llmc_command(llmc_binary, plan, args.steps, args.data,
                                              f"{args.workdir}/llmc_<run>")))
        print("# order: " + "; ".join(f"round {i + 1}: {', '.join(seq)}"
                                         for i, seq in enumerate(run_order(args.rounds, spec_peers))))


def median_of(outcomes, key="tokens_per_s"):
    values = [o.row[key] for o in outcomes if o.ok and o.row.get(key) is not None]
    return statistics.median(values) if values else None


def print_summary(results):
    """Side-by-side table per run spec: ours per recipe and each peer, tokens/s per round and their median, and
    ours / peer from the medians (one ratio per recipe of ours)."""
    header = f"{'run':<30} {'recipe':<22} {'tok/s per round':<24} {'median':>9} {'MFU bf16':>8} {'mem GiB':>7} " \
             f"{'loss':>7}  ours/peer"
    print("\n" + header + "\n" + "-" * len(header))

    def line(run, recipe, outcomes, ratios):
        ok = [o for o in outcomes if o.ok]
        if not ok:
            error = outcomes[-1].error
            print(f"{run:<30} {recipe:<22} {error if error.startswith('skipped') else 'FAILED: ' + error}")
            return
        rounds = " ".join(fmt(o.row["tokens_per_s"], ",.0f") if o.ok else "FAILED" for o in outcomes)
        mems = [o.row["mem_gib"] for o in ok if o.row.get("mem_gib") is not None]
        print(f"{run:<30} {recipe:<22} {rounds:<24} {fmt(median_of(ok), ',.0f'):>9} "
              f"{fmt(median_of(ok, 'mfu_bf16'), '.1f'):>8} {fmt(max(mems) if mems else None, '.1f'):>7} "
              f"{fmt(ok[-1].row['loss'], '.4f'):>7}  {ratio_text(ratios, 2) if ratios is not None else '-'}")
        for o in outcomes:
            if not o.ok:
                print(f"{'':<30} {'':<22} a round FAILED: {o.error}")

    for res in results:
        run = res.spec.label()
        ours_medians = []
        for recipe, outcomes in res.ours.items():
            line(run, recipe, outcomes, None)
            run = ""
            if median_of(outcomes):
                ours_medians.append((recipe, median_of(outcomes)))
            comms = [o.raw["metrics"]["comm"] for o in outcomes if o.ok and o.raw.get("metrics", {}).get("comm")]
            if comms:
                comm = comms[-1]
                print(f"{'':<30} {'comm':<22} reductions {comm['reduce_ms']:.2f} ms/step, exposed after backward "
                      f"{comm['exposed_reduce_ms']:.2f} ms ({fmt(comm['hidden_pct'], '.0f')}% hidden), "
                      f"optimizer + all-gather {comm['optimizer_ms']:.2f} ms")
        for peer, outcomes in res.peers.items():
            peer_median = median_of(outcomes)
            line("", res.labels[peer], outcomes,
                 [(recipe, tok / peer_median) for recipe, tok in ours_medians] if peer_median else [])
        for peer, why in res.skipped.items():
            print(f"{'':<30} {peer_recipe(peer, None):<22} skipped: {why}")
    print_scaling(results)


def print_scaling(results):
    """Tokens/s per GPU count for every (model, B, T, recipe) that ran on more than one count: speed-up over the
    smallest count and the scaling efficiency (speed-up / GPU ratio)."""
    groups = {}
    for res in results:
        spec = res.spec
        for recipe, outcomes in res.ours.items():
            if median_of(outcomes):
                groups.setdefault((spec.model, spec.micro_batch, spec.seq_len, recipe), {})[spec.gpus] = \
                    median_of(outcomes)
    rows = [(k, v) for k, v in groups.items() if len(v) > 1]
    if not rows:
        return
    print(f"\n{'scaling (weak: micro-batch per GPU fixed)':<44} {'GPUs':>4} {'tok/s':>11} {'speed-up':>8} "
          f"{'efficiency':>10}")
    for (model, b, t, recipe), by_gpus in rows:
        base_gpus = min(by_gpus)
        for g in sorted(by_gpus):
            up = by_gpus[g] / by_gpus[base_gpus]
            print(f"{os.path.basename(model) + f' B={b} T={t} {recipe}':<44} {g:>4} {by_gpus[g]:>11,.0f} "
                  f"{up:>8.2f} {100 * up * base_gpus / g:>9.0f}%")


def preset_dims(spec, recipes, args):
    """(model name, model sizes from the preset tables or None) of a spec before anything runs."""
    config, _ = config_for(spec.model, recipes[0], args.configs)
    preset = read_preset(config, spec.model)
    return preset or spec.model, model_dims({}, preset)


def run_spec(args, spec, recipes, peers, llmc_binary, gpu_name, workdir, commit, date, results_md, raw_path):
    """Every round of one spec (run_order), each round's runs recorded after it with the peers' ours/peer ratios."""
    res = SpecResults(spec)
    model_name, dims = preset_dims(spec, recipes, args)
    spec_peers = list(peers) if spec.gpus == 1 else []
    why = llmc_skip_reason(dims, spec, args.accum) if "llmc" in spec_peers else None
    if why:
        res.skipped["llmc"] = why
        print(f"note: no llm.c peer for {spec.label()}: {why}", flush=True)
    for round_index, sequence in enumerate(run_order(args.rounds, spec_peers)):
        tag = f" round {round_index + 1}/{args.rounds}" if args.rounds > 1 else ""
        done = []  # (who, Outcome) in the order they ran
        for who in sequence:
            if who in res.skipped:
                continue
            if who == "ours":
                for recipe in recipes:
                    print(f"[{spec.label()} {recipe}{tag}] running {args.steps} steps ...", flush=True)
                    ours, found = run_ours(args, spec, recipe, gpu_name, workdir, commit, date, round_index)
                    dims = found or dims
                    res.ours.setdefault(recipe, []).append(ours)
                    done.append((who, ours))
                    print(f"  {'ok: %s tok/s' % fmt(ours.row['tokens_per_s'], ',.0f') if ours.ok else 'FAILED: ' + ours.error}",
                          flush=True)
                continue
            label = res.labels[who] = peer_recipe(who, dims)
            if who == "llmc":
                try:
                    plan = llmc_plan(dims, spec, args.accum)
                except PeerUnsupported as e:
                    res.skipped[who] = str(e)
                    print(f"note: no llm.c peer for {spec.label()}: {e}", flush=True)
                    continue
                print(f"[{spec.label()} {label}{tag}] running {args.steps} steps of B={plan.micro_batch} x "
                      f"{plan.accum} ...", flush=True)
                outcome = run_llmc(args, spec, plan, dims, model_name, llmc_binary, gpu_name, workdir, commit, date,
                                   round_index)
            elif dims is None:
                outcome = Outcome(False, error="model sizes unknown (the dry run failed and the preset is not known)")
            else:
                print(f"[{spec.label()} {label}{tag}] running ...", flush=True)
                outcome = run_torch(args, spec, dims, model_name, gpu_name, workdir, commit, date, round_index)
            res.peers.setdefault(who, []).append(outcome)
            done.append((who, outcome))
            print(f"  {'ok: %s tok/s' % fmt(outcome.row['tokens_per_s'], ',.0f') if outcome.ok else outcome.error}",
                  flush=True)
        ours_here = [(o.row["recipe"], o.row["tokens_per_s"]) for who, o in done if who == "ours" and o.ok]
        for who, outcome in done:
            if who != "ours" and outcome.ok:
                outcome.row["ours_per_peer"] = [(recipe, tok / outcome.row["tokens_per_s"]) for recipe, tok in ours_here]
            record(outcome, results_md, raw_path, gpu_name, args.no_record)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="CMake build directory holding train_gpt (default: build)")
    ap.add_argument("--runs", help="comma-separated model:micro_batch:seq_len[:gpus], e.g. 124m:32:1024,350m:16:1024;"
                                   " model is a configs/gpt2_<model>_<recipe>.json name or a config path")
    ap.add_argument("--suite", help="named run lists: " + "; ".join(f"{k} = {' '.join(v)}" for k, v in SUITES.items())
                    + " (default gpt2 when --runs is not given)")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing (default 5)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra train_gpt override for our runs (repeatable), e.g. "
                         "precision.cache_weight_transpose=false; shown in the results' recipe column")
    ap.add_argument("--headroom-gib", type=float, default=1.5,
                    help="B=max runs (model:max:seq_len): GPU memory left free beyond the memory plan (the CUDA context "
                         "and allocator slack; default 1.5)")
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-steps per optimizer step (gradient accumulation; default 1), for ours and the peers "
                         "(llm.c: the same tokens per step)")
    ap.add_argument("--recipe", default="bf16", help="comma-separated precision recipes (default bf16)")
    ap.add_argument("--gpus", help="comma-separated GPU counts, e.g. 1,2: every run spec runs once per count through "
                                   "scripts/run_local.sh (overrides the specs' own :gpus)")
    ap.add_argument("--peer", default="torch",
                    help="peers run beside each single-GPU run, comma-separated: torch (the PyTorch reference), "
                         "llmc (llm.c's train_gpt2cu, GPT-2 only, needs --llmc-dir), or none (default torch)")
    ap.add_argument("--llmc-dir", help="an extracted copy of llm.c-cuda13.tar.gz (the folder holding its Makefile) "
                                       "for --peer llmc; train_gpt2cu is built there when missing")
    ap.add_argument("--rounds", type=int,
                    help="rounds of ours and the peers, alternating: ours first in rounds 1, 3, ..., last in "
                         "rounds 2, 4, ... (default 2 with a peer, 1 without)")
    ap.add_argument("--results", default=os.path.join("dev", "bench", "results"), help="results directory")
    ap.add_argument("--configs", default="configs", help="config directory (default configs)")
    ap.add_argument("--data", default=DEFAULT_DATA,
                    help="training shard glob (default the bundled KJV corpus, prepared if missing)")
    ap.add_argument("--workdir", help="logs and JSONL metrics of the runs (default runs/bench/<UTC time>)")
    ap.add_argument("--python", default=sys.executable or "python3", help="python for the peer and data preparation")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds before a run is killed (default 1800)")
    ap.add_argument("--no-record", action="store_true", help="print the table but do not append to the results")
    ap.add_argument("--dry", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)

    try:
        specs = parse_run_list(args.runs, args.suite if (args.suite or args.runs) else "gpt2")
        peers = parse_peers(args.peer)
    except ValueError as e:
        ap.error(str(e))
    if args.gpus:
        try:
            counts = [int(g) for g in args.gpus.split(",") if g.strip()]
        except ValueError:
            ap.error(f"--gpus {args.gpus}: expected comma-separated GPU counts, e.g. 1,2")
        if not counts or min(counts) < 1:
            ap.error(f"--gpus {args.gpus}: GPU counts must be >= 1")
        specs = [RunSpec(s.model, s.micro_batch, s.seq_len, g) for s in specs for g in counts]
    recipes = [r.strip() for r in args.recipe.split(",") if r.strip()]
    if not specs or not recipes:
        ap.error("nothing to run (give --runs or --suite, and --recipe)")
    if args.accum < 1:
        ap.error(f"--accum {args.accum} must be >= 1")
    if args.warmup < 0 or args.steps <= args.warmup:
        ap.error(f"--steps ({args.steps}) must be larger than --warmup ({args.warmup})")
    args.rounds = args.rounds if args.rounds is not None else (2 if peers else 1)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds} must be >= 1")
    if peers and any(s.micro_batch == MAX_BATCH for s in specs):
        ap.error("a B=max run spec resolves its micro-batch per recipe; peers need one: use --peer none or a number")
    if "llmc" in peers and not args.llmc_dir:
        ap.error(f"--peer llmc needs --llmc-dir DIR; {LLMC_EXTRACT_HINT}")
    os.chdir(REPO_ROOT)  # every relative path (build, configs, data, results, workdir) is relative to the repository
    if "llmc" in peers and not os.path.isfile(os.path.join(args.llmc_dir, "Makefile")):
        ap.error(f"--llmc-dir {args.llmc_dir}: no Makefile there (relative paths are relative to the repository "
                 f"root); {LLMC_EXTRACT_HINT}")
    now = datetime.datetime.now(datetime.timezone.utc)
    args.workdir = args.workdir or os.path.join("runs", "bench", now.strftime("%Y%m%dT%H%M%SZ"))
    args.train_gpt = os.path.join(args.build, "train_gpt")
    gpu_name, gpu_count = detect_gpus()

    if args.dry:
        print_dry(args, specs, recipes, gpu_name, peers)
        return 0

    if gpu_name is None:
        print("bench.py: nvidia-smi finds no GPU; run on a GPU machine (or use --dry)", file=sys.stderr)
        return 1
    if not os.access(os.path.join(REPO_ROOT, args.train_gpt), os.X_OK):
        print(f"bench.py: {args.train_gpt} not found; build first: cmake -S . -B {args.build} "
              f"-DCMAKE_BUILD_TYPE=Release && cmake --build {args.build} -j", file=sys.stderr)
        return 1
    if not ensure_data(args, dry=False):
        return 1
    llmc_binary = None
    if "llmc" in peers and any(spec.gpus == 1 and not llmc_skip_reason(preset_dims(spec, recipes, args)[1], spec,
                                                                         args.accum) for spec in specs):
        error = check_llmc_shards(args.data, 1)
        if not error:
            llmc_binary, error = ensure_llmc_binary(args.llmc_dir, args.timeout)
        if error:
            print(f"bench.py: --peer llmc: {error}", file=sys.stderr)
            return 1
    workdir = os.path.join(REPO_ROOT, args.workdir)
    os.makedirs(workdir, exist_ok=True)
    commit, date = git_commit(), now.strftime("%Y-%m-%d %H:%M UTC")
    results_md = os.path.join(args.results, slug(gpu_name) + ".md")
    raw_path = os.path.join(args.results, "raw", f"{now.strftime('%Y-%m-%d')}_{slug(gpu_name)}.jsonl")
    if not args.no_record and os.path.exists(results_md):
        try:
            with open(results_md) as f:
                with_current_header(f.read(), gpu_name)
        except ValueError as e:
            print(f"bench.py: {results_md}: not a bench.py results table ({e}); move it away or use --no-record",
                  file=sys.stderr)
            return 1
    print(f"GPU: {gpu_name} x{gpu_count}; peaks {gpu_peaks(gpu_name) or 'unknown (MFU n/a)'}; commit {commit}; "
          f"logs in {args.workdir}", flush=True)

    results = []
    for spec in specs:
        if spec.gpus > gpu_count:
            results.append(SpecResults(spec, ours={recipes[0]: [
                Outcome(False, error=f"needs {spec.gpus} GPUs, found {gpu_count}")]}))
            continue
        results.append(run_spec(args, spec, recipes, peers, llmc_binary, gpu_name, workdir, commit, date, results_md,
                                raw_path))
    print_summary(results)
    if not args.no_record:
        print(f"\nresults: {results_md}\nraw:     {raw_path}")
    return 0 if all(o.ok for res in results for outcomes in res.ours.values() for o in outcomes) else 2


def record(outcome, results_md, raw_path, gpu_name, no_record):
    """Appends a successful run's row to the results table; every run (failed ones too) goes to the raw JSONL."""
    if no_record:
        return
    os.makedirs(os.path.dirname(raw_path), exist_ok=True)
    with open(raw_path, "a") as f:
        f.write(json.dumps({"ok": outcome.ok, "row": outcome.row, "error": outcome.error, "gpu": gpu_name,
                            **outcome.raw}) + "\n")
    if outcome.ok:
        append_results(results_md, gpu_name, [outcome.row])


if __name__ == "__main__":
    sys.exit(main())
