#!/usr/bin/env python3
"""scripts/repro/gpu_queue.py: runs a list of shell commands over the GPUs of one machine, one command per GPU at a
time (or --per-gpu N at a time, for models too small to fill a GPU alone), so that the independent trainings of a
reproduction (every recipe and ablation of scripts/repro/*.sh, each a scripts/fp8_loss_parity.sh call) finish in the
time of the longest queue instead of the sum of them all.

    usage: python3 scripts/repro/gpu_queue.py JOBS [--gpus 0,1,2,3] [--per-gpu N] [--logdir DIR] [--dry]

JOBS is a text file with one shell command per line (blank lines and lines starting with '#' are skipped). Commands
start in file order, each on the first free GPU, with CUDA_VISIBLE_DEVICES set to that GPU alone: put the longest
first. --gpus defaults to every GPU that nvidia-smi lists; --per-gpu (default 1) is how many commands share one GPU
at a time (the slots are filled GPU by GPU in turn: with --gpus 0,1 --per-gpu 2 the first four commands go to GPUs
0, 1, 0, 1). Each command's output goes to DIR/job_<N>.log (default DIR: runs/gpu_queue); one line per start and
per end (exit status, minutes) is printed. Exit status: 0 when every
command exited 0, 1 otherwise (the failed ones are listed), 2 for bad arguments.
"""
import argparse
import os
import subprocess
import sys
import time


def read_jobs(path):
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


def visible_gpus():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


def slots(gpus, per_gpu):
    """The GPU of each slot, in the order slots are handed out: every GPU once, then every GPU again, per_gpu times."""
    return [gpu for _ in range(per_gpu) for gpu in gpus]


def run_queue(jobs, gpus, logdir, out=sys.stdout, poll_s=0.2, per_gpu=1):
    """Runs jobs (shell commands) with at most per_gpu at a time on each GPU; returns the list of (index, command,
    exit status) of the jobs that failed."""
    os.makedirs(logdir, exist_ok=True)
    free = slots(gpus, per_gpu)
    running = {}  # Popen -> (index, gpu, start time, log file)
    failed = []
    pending = list(enumerate(jobs))
    t0 = time.time()
    while pending or running:
        while pending and free:
            index, command = pending.pop(0)
            gpu = free.pop(0)
            log = open(os.path.join(logdir, f"job_{index}.log"), "w", encoding="utf-8")
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
            proc = subprocess.Popen(["bash", "-c", command], stdout=log, stderr=subprocess.STDOUT, env=env)
            running[proc] = (index, gpu, time.time(), log)
            print(f"[{(time.time() - t0) / 60:6.1f} min] start job {index} on GPU {gpu}: {command}", file=out,
                  flush=True)
        time.sleep(poll_s)
        for proc in [p for p in running if p.poll() is not None]:
            index, gpu, start, log = running.pop(proc)
            log.close()
            free.append(gpu)
            rc = proc.returncode
            print(f"[{(time.time() - t0) / 60:6.1f} min] end job {index} on GPU {gpu}: exit {rc} after "
                  f"{(time.time() - start) / 60:.1f} min (log: {log.name})", file=out, flush=True)
            if rc != 0:
                failed.append((index, jobs[index], rc))
    return failed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jobs", help="file with one shell command per line")
    p.add_argument("--gpus", help="comma-separated GPU indices (default: every GPU nvidia-smi lists)")
    p.add_argument("--per-gpu", type=int, default=1, metavar="N",
                   help="commands sharing one GPU at a time (default 1; more for models too small to fill a GPU)")
    p.add_argument("--logdir", default="runs/gpu_queue", help="where job_<N>.log go (default: runs/gpu_queue)")
    p.add_argument("--dry", action="store_true", help="print which command would run first on which GPU, run nothing")
    args = p.parse_args(argv)
    try:
        jobs = read_jobs(args.jobs)
    except OSError as e:
        p.error(f"cannot read the jobs file: {e}")
    if not jobs:
        p.error(f"{args.jobs} holds no command (one shell command per line; '#' starts a comment line)")
    if args.gpus is None:
        gpus = visible_gpus()
        if not gpus:
            p.error("nvidia-smi lists no GPU here: name them with --gpus (e.g. --gpus 0,1)")
    else:
        gpus = [g.strip() for g in args.gpus.split(",")]
        if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
            p.error(f"--gpus '{args.gpus}': give distinct non-negative integers separated by commas, e.g. 0,1,2,3")
    if not 1 <= args.per_gpu <= 64:
        p.error(f"--per-gpu {args.per_gpu}: give the number of commands that may share one GPU, 1 to 64")
    first = slots(gpus, args.per_gpu)
    if args.dry:
        for index, command in enumerate(jobs):
            slot = f"GPU {first[index]}" if index < len(first) else "the first GPU free"
            print(f"job {index} on {slot}: {command}")
        return 0
    print(f"gpu_queue: {len(jobs)} jobs on GPUs {','.join(gpus)}, {args.per_gpu} at a time on each, logs in "
          f"{args.logdir}", flush=True)
    failed = run_queue(jobs, gpus, args.logdir, per_gpu=args.per_gpu)
    if failed:
        print(f"gpu_queue: {len(failed)} of {len(jobs)} jobs failed:", flush=True)
        for index, command, rc in failed:
            print(f"  job {index} (exit {rc}): {command}", flush=True)
        return 1
    print(f"gpu_queue: all {len(jobs)} jobs exited 0", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
