#!/usr/bin/env python3
"""test/dev/fake_train_gpt.py: a stand-in for build/train_gpt in the CPU tests of the loss-comparison scripts
(scripts/fp8_loss_parity.sh and the repro scripts over it, TRAIN_GPT=this file): it reads the --set overrides those
scripts pass and writes what a run writes to log.jsonl (a train record per step, a final eval record), with a loss
that depends on the recipe and the tag (a _seed<N> suffix of the log name is not a tag), and prints the GPU it was
given (CUDA_VISIBLE_DEVICES); a recipe named in FAKE_TRAIN_GPT_FAIL fails (exit 1) as a crashed run would;
FAKE_TRAIN_GPT_SEED_STEP=D adds D x (train.seed - 42) to the loss, so that runs of several seeds differ. A fresh
start prints train_gpt's "init: random weights (train.seed = N)" line.
With checkpoint.dir set it keeps train_gpt's checkpoint contract as the scripts see it: a checkpoint (dir/step_<S>,
complete with its DONE file) every checkpoint.every steps and at the end, the newest checkpoint.keep kept;
checkpoint.resume=auto continues from the newest complete one ("resumed from ... at step S", the log's records after
S moved to <log>.after-step-S); resume=none in a dir with checkpoints moves them to dir/abandoned/<n> with
checkpoint.overwrite=true and fails without it. FAKE_TRAIN_GPT_STOP_AT=N ends a run that started before step N right
after step N's record, with exit 137, as a killed job would.
make_shards() writes the data files the scripts look for; workspace() gives a test a temporary directory with them.
"""
import json
import os
import re
import shutil
import sys
import tempfile

PATH = os.path.abspath(__file__)  # what the tests put in TRAIN_GPT

# The final loss of each recipe above 2.0 (bf16); a tagged variant's log name adds 0.001.
OFFSETS = {"bf16": 0.0, "fp8_tensorwise": 0.002, "fp8_delayed": 0.003, "fp8_blockwise": 0.004, "coat": 0.004,
           "nvfp4": 0.03, "mxfp4": 0.05}


def make_shards(data_dir, tokens=1_000_000):
    """pysrc_train_000.bin / pysrc_val_000.bin with the shard header (magic, version, token count) and no tokens:
    enough for the scripts, which read only the header."""
    os.makedirs(data_dir, exist_ok=True)
    for split in ("train", "val"):
        header = [20240520, 1, tokens] + [0] * 253
        with open(os.path.join(data_dir, f"pysrc_{split}_000.bin"), "wb") as f:
            f.write(b"".join(int(h).to_bytes(4, "little") for h in header))


def workspace(test, prefix):
    """(data dir with the shards, output dir) in a temporary directory that is removed after the unittest `test`."""
    root = tempfile.mkdtemp(prefix=prefix)
    test.addCleanup(shutil.rmtree, root)
    data = os.path.join(root, "data")
    make_shards(data)
    return data, os.path.join(root, "out")


def checkpoints(directory):
    """The complete checkpoints in directory, oldest first: (step, path)."""
    found = []
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        path = os.path.join(directory, name)
        if re.fullmatch(r"step_\d{8}", name) and os.path.exists(os.path.join(path, "DONE")):
            found.append((int(name[5:]), path))
    return sorted(found)


def write_checkpoint(ckpt, step):
    path = os.path.join(ckpt["dir"], f"step_{step:08d}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "DONE"), "w") as f:
        f.write(f"{step}\n")
    if ckpt["keep"] > 0:
        for _, old in checkpoints(ckpt["dir"])[:-ckpt["keep"]]:
            shutil.rmtree(old)


def resume_point(sets, log):
    """(first step to train - 1, checkpoint settings or None); (None, None) when the run must stop."""
    directory = sets.get("checkpoint.dir", "")
    if not directory:
        return 0, None
    ckpt = {"dir": directory, "every": int(sets.get("checkpoint.every", "0")),
            "keep": int(sets.get("checkpoint.keep", "0"))}
    found = checkpoints(directory)
    resume = sets.get("checkpoint.resume", "auto")
    if found and resume == "auto":
        step = found[-1][0]
        print(f"resumed from {found[-1][1]} at step {step}")
        if os.path.exists(log):
            with open(log) as f:
                lines = f.readlines()
            keep = [line for line in lines if json.loads(line)["step"] <= step]
            with open(log + f".after-step-{step}", "w") as f:
                f.writelines(lines[len(keep):])
            with open(log, "w") as f:
                f.writelines(keep)
        return step, ckpt
    if found:
        if sets.get("checkpoint.overwrite", "false") != "true":
            print(f"error: checkpoint.dir {directory} holds checkpoints and checkpoint.resume is {resume}",
                  file=sys.stderr)
            return None, None
        n = 1
        while os.path.exists(os.path.join(directory, "abandoned", str(n))):
            n += 1
        os.makedirs(os.path.join(directory, "abandoned", str(n)))
        for _, path in found:
            shutil.move(path, os.path.join(directory, "abandoned", str(n)))
    return 0, ckpt


def main(argv):
    if "--dry-run" in argv:  # what scripts/repro/fp8_stability.sh reads for its estimate
        print("training 8 steps x 100 tokens, 1.0e+12 FLOPs in total")
        return 0
    sets = dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-"))
    recipe, steps, log = sets["precision.recipe"], int(sets["train.steps"]), sets["log.jsonl"]
    if recipe == os.environ.get("FAKE_TRAIN_GPT_FAIL"):
        print(f"fake train_gpt: {recipe} fails", file=sys.stderr)
        return 1
    start, ckpt = resume_point(sets, log)
    if start is None:
        return 1
    if start == 0:  # train_gpt's line for a fresh start (the loss scripts read the seed from it)
        print(f"init: random weights (train.seed = {int(sets.get('train.seed', '42'))}) in 0.0 s")
    tagged = re.sub(r"_seed\d+(?=\.jsonl$)", "", os.path.basename(log)) != recipe + ".jsonl"
    loss = 2.0 + OFFSETS.get(recipe, 0.1) + (0.001 if tagged else 0.0)
    loss += float(os.environ.get("FAKE_TRAIN_GPT_SEED_STEP", "0")) * (int(sets.get("train.seed", "42")) - 42)
    stop_at = int(os.environ.get("FAKE_TRAIN_GPT_STOP_AT", "0"))
    with open(log, "a" if start > 0 else "w") as f:
        for s in range(start + 1, steps + 1):
            f.write(json.dumps({"type": "train", "step": s, "loss": loss + 1.0 / s, "ms": 1.0, "tokens": 100}) + "\n")
            f.flush()
            if ckpt and (s == steps or (ckpt["every"] > 0 and s % ckpt["every"] == 0)):
                write_checkpoint(ckpt, s)
            if s == stop_at:
                print(f"fake train_gpt: killed after step {s}", file=sys.stderr)
                return 137
        f.write(json.dumps({"type": "eval", "step": steps, "val_loss": loss}) + "\n")
    print(f"fake train_gpt: {recipe} on GPU {os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
