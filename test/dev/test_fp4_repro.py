#!/usr/bin/env python3
"""test/dev/test_fp4_repro.py: scripts/repro/nvfp4.sh's --dry output and its table (scripts/repro/fp4_report.py), on
CPU, run from the repository root.

--dry: the comparison (bf16, fp8_tensorwise, nvfp4) and the four NVFP4 ablations, each one command identical to the
plain nvfp4 run but for its one override (placed last, so it wins) and its log name; GPT-2 124M by default into
runs/nvfp4, Llama 350M or 125M with --model into runs/nvfp4_<model>; an unknown model or argument exits 2. The report on
synthetic logs: final losses against bf16 and fp8_tensorwise, each ablation against nvfp4 and whether it raised the
loss, the paper's column, the goal line and its exit code, the seeds' table and the goal on seeds paired with bf16's,
a missing log.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from test_fp8_loss_parity import REPO_ROOT, commands, overrides

SCRIPT = os.path.join(REPO_ROOT, "scripts", "repro", "nvfp4.sh")
REPORT = os.path.join(REPO_ROOT, "scripts", "repro", "fp4_report.py")
ABLATIONS = {"no_sr": "precision.dy_rounding=nearest", "no_rht": "precision.wgrad_hadamard=0",
             "w1x16": "precision.w_granularity=1x16", "all_fp4": "precision.bf16_layers=[]"}


def run(*args, env=None):
    e = dict(os.environ)
    e.pop("MODEL", None)
    e.update(env or {})
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, cwd=REPO_ROOT, env=e, timeout=120)


class TestDry(unittest.TestCase):
    def test_comparison_and_ablations(self):
        proc = run("--dry")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        cmds = commands(proc.stdout)
        self.assertEqual([overrides(c)["precision.recipe"] for c in cmds],
                         ["bf16", "fp8_tensorwise", "nvfp4"] + ["nvfp4"] * len(ABLATIONS))
        logs = [overrides(c)["log.jsonl"] for c in cmds]
        self.assertEqual(logs, [f"runs/nvfp4/{r}.jsonl" for r in ["bf16", "fp8_tensorwise", "nvfp4"]] +
                         [f"runs/nvfp4/nvfp4_{t}.jsonl" for t in ABLATIONS])
        plain = cmds[2]
        for cmd, (tag, setting) in zip(cmds[3:], ABLATIONS.items()):
            with self.subTest(tag=tag):
                self.assertEqual(cmd[-2:], ["--set", setting])
                # identical to the plain nvfp4 run but for the override and the log
                strip = lambda c: [a for a in c if not a.startswith("log.jsonl=")]  # noqa: E731
                self.assertEqual(strip(cmd)[:-2], strip(plain))
        o = overrides(plain)
        self.assertEqual((o["train.micro_batch"], o["train.seq_len"], o["train.seed"]), ("32", "1024", "42"))
        self.assertGreaterEqual(int(o["train.steps"]) * 32 * 1024, 100_000_000)

    def test_llama_and_errors(self):
        proc = run("--dry", "--model", "llama-350m", "--seed", "5")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        cmds = commands(proc.stdout)
        self.assertEqual(len(cmds), 3 + len(ABLATIONS))
        self.assertIn("configs/llama_350m_bf16.json", cmds[0])
        self.assertEqual(overrides(cmds[0])["log.jsonl"], "runs/nvfp4_llama-350m/bf16.jsonl")
        self.assertEqual(overrides(cmds[-1])["train.seed"], "5")
        cmds = commands(run("--dry", "--seeds", "43 44").stdout)  # every run once per seed
        self.assertEqual(len(cmds), 2 * (3 + len(ABLATIONS)))
        self.assertEqual([(overrides(c)["train.seed"], overrides(c)["log.jsonl"]) for c in cmds[4:6]],
                         [("43", "runs/nvfp4/nvfp4.jsonl"), ("44", "runs/nvfp4/nvfp4_seed44.jsonl")])
        for c in commands(run("--dry", "--checkpoint-every", "256").stdout):  # passed to every run
            o = overrides(c)
            self.assertEqual(o["checkpoint.every"], "256")
            self.assertEqual(o["checkpoint.dir"], "runs/nvfp4/checkpoints/" + os.path.basename(o["log.jsonl"])[:-6])
        check_llama_125m(self, run, "nvfp4")
        for args, word in ((["--model", "gpt2-xl"], "unknown model 'gpt2-xl'"), (["--bogus"], "unknown argument")):
            proc = run("--dry", *args)
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertIn(word, proc.stderr)


class TestGpus(unittest.TestCase):
    def test_every_run_in_one_queue_then_the_report(self):
        """--gpus: the comparison and all four ablations go to OUT/jobs.txt, train over the GPUs at once
        (scripts/repro/gpu_queue.py), and the report covers them; train_gpt is test/dev/fake_train_gpt.py."""
        import fake_train_gpt
        data, out = fake_train_gpt.workspace(self, "test_nvfp4_gpus_")
        proc = run("--gpus", "0,1,2", "--steps", "8", "--out", out, "--data", data,
                   env={"TRAIN_GPT": fake_train_gpt.PATH})
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(out, "jobs.txt")) as f:
            self.assertEqual(len(f.read().splitlines()), 3 + len(ABLATIONS))
        self.assertIn("gpu_queue: all 7 jobs exited 0", proc.stdout)
        with open(os.path.join(out, "nvfp4.md")) as f:
            text = f.read()
        self.assertIn("| nvfp4 | 2.0300 | +1.50% | +1.40% | — |", text)
        for tag in ABLATIONS:
            self.assertIn(f"| nvfp4_{tag} | 2.0310 | +1.55% | +1.45% | +0.05% (raises the loss) |", text)
        self.assertIn("- nvfp4 within 2% of BF16: +1.50%, met", text)
        self.assertEqual(run("--gpus", "x", "--dry").returncode, 2)


def check_llama_125m(test, run, name):
    """--model llama-125m: Llama 125M's config, learning rate and sequence, into runs/<name>_llama-125m."""
    proc = run("--dry", "--model", "llama-125m")
    test.assertEqual(proc.returncode, 0, proc.stderr)
    first = commands(proc.stdout)[0]
    test.assertIn("configs/llama_125m_bf16.json", first)
    o = overrides(first)
    test.assertEqual((o["log.jsonl"], o["train.lr"], o["train.seq_len"]),
                     (f"runs/{name}_llama-125m/bf16.jsonl", "1e-3", "2048"))


def write_log(path, final_val, steps=8, tokens=1000, skips=0):
    with open(path, "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"type": "train", "step": s, "loss": 3.0 - 0.1 * s, "ms": 10.0, "tokens": tokens}) + "\n")
        for s in range(skips):
            f.write(json.dumps({"type": "skip", "step": s + 1}) + "\n")
        f.write(json.dumps({"type": "eval", "step": steps, "val_loss": final_val}) + "\n")


class TestReport(unittest.TestCase):
    RUNS = ["bf16", "fp8_tensorwise", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht", "nvfp4_w1x16", "nvfp4_all_fp4"]

    def setUp(self):
        self.out = tempfile.mkdtemp(prefix="test_fp4_report_")
        self.addCleanup(shutil.rmtree, self.out)

    def report(self, *args):
        return subprocess.run([sys.executable, REPORT, self.out, "--paper", "nvfp4", "--no-plot", *args],
                              capture_output=True, text=True, timeout=60)

    def test_table_and_goal(self):
        for run, val in zip(self.RUNS, (2.0, 2.01, 2.03, 2.05, 2.04, 2.02, 2.06)):
            write_log(os.path.join(self.out, run + ".jsonl"), val, skips=1 if run == "nvfp4_all_fp4" else 0)
        proc = self.report("--runs", *self.RUNS, "--goal", "nvfp4=2")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(self.out, "nvfp4.md")) as f:
            text = f.read()
        self.assertIn("| run | final val loss | vs bf16 | vs fp8_tensorwise | ablation vs its recipe |", text)
        self.assertIn("| bf16 | 2.0000 | +0.00% | -0.50% | — | 0 | 8,000 | — |", text)
        self.assertIn("| nvfp4 | 2.0300 | +1.50% | +1.00% | — | 0 | 8,000 | 12B, 10T tokens", text)
        self.assertIn("| nvfp4_no_sr | 2.0500 | +2.50% | +1.99% | +0.99% (raises the loss) |", text)
        self.assertIn("| nvfp4_w1x16 | 2.0200 | +1.00% | +0.50% | -0.49% (does not raise the loss) |", text)
        self.assertIn("| nvfp4_all_fp4 | 2.0600 | +3.00% | +2.49% | +1.48% (raises the loss) | 1 |", text)
        self.assertIn("- nvfp4 within 2% of BF16: +1.50%, met", text)
        self.assertIn("FP4 numerics, not FP4 speed", text)
        proc = self.report("--runs", *self.RUNS, "--goal", "nvfp4=1")
        self.assertEqual(proc.returncode, 1)
        self.assertIn("NOT met", proc.stdout)

    def test_seeds_paired_and_goal(self):
        # seeds 43 (no suffix: --base-seed 43) and 44: nvfp4 +1.5% and +2.9% above bf16 (mean +2.2%: the 2% goal is
        # not met, though seed 43 alone would meet it); the ablation has seed 43 only
        for name, val in (("bf16", 2.0), ("bf16_seed44", 1.0), ("nvfp4", 2.03), ("nvfp4_seed44", 1.029),
                          ("nvfp4_no_sr", 2.05)):
            write_log(os.path.join(self.out, name + ".jsonl"), val)
        proc = self.report("--runs", "bf16", "nvfp4", "nvfp4_no_sr", "--goal", "nvfp4=2", "--base-seed", "43")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        with open(os.path.join(self.out, "nvfp4.md")) as f:
            text = f.read()
        self.assertIn("Same seed (the first table: seed 43)", text)
        self.assertIn("| nvfp4 | 2.0300 | +1.50% |", text)
        self.assertIn("Every seed (43, 44;", text)
        self.assertIn("| nvfp4 | 2.0300 / 1.0290 | +2.20% ± 0.70 (+1.50..+2.90, 2 seeds) | — |", text)
        self.assertIn("| nvfp4_no_sr | 2.0500 / — | +2.50% | +0.99% |", text)
        self.assertIn("- nvfp4 within 2% of BF16: +2.20% ± 0.70 over 2 seeds, paired, NOT met on the mean; at two "
                      "standard errors undecided (+0.80..+3.60; ~", text)

    def test_missing_and_bad_arguments(self):
        write_log(os.path.join(self.out, "bf16.jsonl"), 2.0)
        proc = self.report("--runs", "bf16", "nvfp4")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("cannot read the nvfp4 run", proc.stderr)
        proc = self.report("--runs", "bf16", "--goal", "nvfp4=2")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("not among --runs", proc.stderr)
        with open(os.path.join(self.out, "nvfp4.jsonl"), "w") as f:
            f.write(json.dumps({"type": "train", "step": 1, "loss": 3.0}) + "\n")
        proc = self.report("--runs", "bf16", "nvfp4")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("no finite validation loss", proc.stderr)


if __name__ == "__main__":
    unittest.main()
