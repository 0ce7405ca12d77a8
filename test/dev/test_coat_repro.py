#!/usr/bin/env python3
"""test/dev/test_coat_repro.py: scripts/repro/coat.sh's --dry output and its report (scripts/repro/coat_report.py), on
CPU, run from the repository root.

--dry: the benchmark at one micro-batch and at B=max (llama-1b, llama-3b; bf16, fp8_tensorwise, coat), coat at
BF16's largest micro-batch, llama-7b at B=max, and the loss comparison (bf16, fp8_tensorwise, coat through scripts/fp8_loss_parity.sh, llama-350m by default,
100M+ tokens, tolerance 0.5%); bad arguments exit 2. The report on synthetic records: memory and tokens/s ratios to
bf16 at one micro-batch and at B=max (medians of repeated rounds), the loss tables (one seed, and several paired by
seed: --seeds), each goal met or not with the exit code, and nothing to report; coat at BF16's largest micro-batch
paired with BF16's B=max run, and the --runs that pass takes from the B=max records.
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile
import unittest

from test_fp8_loss_parity import REPO_ROOT, commands, overrides

SCRIPT = os.path.join(REPO_ROOT, "scripts", "repro", "coat.sh")
REPORT = os.path.join(REPO_ROOT, "scripts", "repro", "coat_report.py")


def run(*args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)


def bench_commands(stdout):
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ python3 dev/bench/bench.py")]


def arg(cmd, flag):
    return cmd[cmd.index(flag) + 1]


class TestDry(unittest.TestCase):
    def test_bench_and_loss_commands(self):
        proc = run("--dry")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        bench = bench_commands(proc.stdout)
        self.assertEqual([arg(c, "--runs") for c in bench],
                         ["llama-1b:8:2048,llama-3b:4:2048", "llama-1b:max:2048,llama-3b:max:2048",
                          "llama-1b:BF16MAX:2048,llama-3b:BF16MAX:2048", "llama-7b:max:2048"])
        self.assertEqual([arg(c, "--recipe") for c in bench],
                         ["bf16,fp8_tensorwise,coat", "bf16,fp8_tensorwise,coat", "coat", "bf16,coat"])
        for c in bench:
            self.assertEqual((arg(c, "--peer"), arg(c, "--accum"), arg(c, "--results")),
                             ("none", "4", "runs/coat/bench"))
        cmds = commands(proc.stdout)
        self.assertEqual([overrides(c)["precision.recipe"] for c in cmds], ["bf16", "fp8_tensorwise", "coat"])
        self.assertIn("configs/llama_350m_bf16.json", cmds[0])
        o = overrides(cmds[2])
        self.assertEqual(o["log.jsonl"], "runs/coat/loss/coat.jsonl")
        self.assertGreaterEqual(int(o["train.steps"]) * int(o["train.micro_batch"]) * int(o["train.seq_len"]),
                                100_000_000)
        self.assertIn("--tolerance 0.5", proc.stdout)

    def test_options_and_errors(self):
        proc = run("--dry", "--batch-1b", "6", "--batch-3b", "2", "--accum", "8", "--model", "gpt2-124m",
                   "--skip-loss", "--out", "/tmp/x")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        bench = bench_commands(proc.stdout)
        self.assertEqual(arg(bench[0], "--runs"), "llama-1b:6:2048,llama-3b:2:2048")
        self.assertEqual(arg(bench[0], "--accum"), "8")
        self.assertEqual(commands(proc.stdout), [])
        self.assertEqual(bench_commands(run("--dry", "--skip-bench").stdout), [])
        cmds = commands(run("--dry", "--skip-bench", "--seeds", "43 44").stdout)  # one run per recipe and seed
        self.assertEqual([(overrides(c)["precision.recipe"], overrides(c)["train.seed"], overrides(c)["log.jsonl"])
                          for c in cmds if overrides(c)["precision.recipe"] == "coat"],
                         [("coat", "43", "runs/coat/loss/coat.jsonl"), ("coat", "44", "runs/coat/loss/coat_seed44.jsonl")])
        cmds = commands(run("--dry", "--skip-bench", "--checkpoint-every", "512").stdout)
        self.assertEqual([overrides(c)["checkpoint.every"] for c in cmds], ["512"] * 3)  # passed to the loss runs
        for bad in (["--model", "llama-1b"], ["--batch-1b", "0"], ["--accum", "x"], ["--bogus"]):
            with self.subTest(bad=bad):
                self.assertEqual(run("--dry", *bad).returncode, 2)


def bench_record(model, recipe, b, tok, mem, max_batch=False):
    return {"ok": True, "impl": "llm8", "max_batch": max_batch,
            "row": {"model": model, "recipe": recipe, "micro_batch": b, "tokens_per_s": tok, "mem_gib": mem}}


class TestReport(unittest.TestCase):
    def write(self, out, records, losses, train_loss=5.0):
        """losses: {log name: final val loss}; each log has one train record with train_loss (a number, or a dict
        by log name)."""
        os.makedirs(os.path.join(out, "bench", "raw"), exist_ok=True)
        with open(os.path.join(out, "bench", "raw", "2026-11-27_gpu.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        os.makedirs(os.path.join(out, "loss"), exist_ok=True)
        for name, val in losses.items():
            tail = train_loss[name] if isinstance(train_loss, dict) else train_loss
            with open(os.path.join(out, "loss", name + ".jsonl"), "w") as f:
                f.write(json.dumps({"type": "train", "step": 1, "loss": tail, "tokens": 10}) + "\n")
                f.write(json.dumps({"type": "eval", "step": 1, "val_loss": val}) + "\n")

    def report(self, out, *args):
        proc = subprocess.run([sys.executable, REPORT, out, *args], capture_output=True, text=True, cwd=REPO_ROOT)
        path = os.path.join(out, "coat.md")
        if not os.path.exists(path):
            return proc, ""
        with open(path) as f:
            return proc, f.read()

    def test_tables_ratios_and_goals(self):
        records = [bench_record("llama-1b", "bf16", 8, 80000, 40.0), bench_record("llama-1b", "coat", 8, 90000, 28.0),
                   bench_record("llama-1b", "coat", 8, 92000, 28.0),  # a second round: the median counts
                   bench_record("llama-1b", "fp8_tensorwise", 8, 100000, 39.0),
                   bench_record("llama-1b", "bf16", 40, 82000, 130.0, True),
                   bench_record("llama-1b", "coat", 70, 120000, 131.0, True),
                   {"ok": False, "row": None, "error": "OOM"}]
        with tempfile.TemporaryDirectory() as out:
            self.write(out, records, {"bf16": 2.0, "fp8_tensorwise": 2.002, "coat": 2.004})
            proc, text = self.report(out)
            self.assertEqual(proc.returncode, 1, proc.stderr)  # the memory goal is not met
            self.assertIn("| llama-1b | coat | 8 | 28.0 | 0.700 | 91,000 | 1.137 |", text)
            self.assertIn("| llama-1b | coat | 70 | 131.0 | 1.008 | 120,000 | 1.463 |", text)
            self.assertIn("| llama-1b, equal micro-batch (8): coat peak memory <= 0.65x bf16's | 0.700 | **not met** |",
                          text)
            self.assertIn("| llama-1b, largest micro-batches: coat tokens/s >= 1.4x bf16's | 1.463 | **met** |", text)
            self.assertIn("| coat | 2.0040 | +0.20% | +0.10% |", text)
            self.assertIn("| coat's final validation loss within 0.5% of bf16's | 0.200 | **met** |", text)
            self.assertIn("Table 7", text)
        with tempfile.TemporaryDirectory() as out:  # every goal met: exit 0
            met = [records[0], bench_record("llama-1b", "coat", 8, 90000, 24.0)] + records[4:6]
            self.write(out, met, {"bf16": 2.0, "fp8_tensorwise": 2.0, "coat": 2.001})
            proc, text = self.report(out)
            self.assertEqual(proc.returncode, 0, text)
        with tempfile.TemporaryDirectory() as out:  # the loss goal missed: exit 1
            self.write(out, [], {"bf16": 2.0, "fp8_tensorwise": 2.0, "coat": 2.02})
            proc, text = self.report(out)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("| coat's final validation loss within 0.5% of bf16's | 1.000 | **not met** |", text)
            self.assertNotIn("## At one micro-batch", text)

    def test_coat_at_bf16s_largest_micro_batch(self):
        # coat.sh's third pass: coat at BF16's B=max micro-batch (40), against BF16's B=max run; --bf16-max-runs
        # gives that pass its --runs.
        records = [bench_record("llama-1b", "bf16", 8, 80000, 40.0), bench_record("llama-1b", "coat", 8, 90000, 28.0),
                   bench_record("llama-1b", "bf16", 40, 82000, 130.0, True),
                   bench_record("llama-1b", "coat", 70, 120000, 131.0, True),
                   bench_record("llama-3b", "bf16", 16, 30000, 135.0, True)]
        with tempfile.TemporaryDirectory() as out:
            self.write(out, records, {})
            got = subprocess.run([sys.executable, REPORT, out, "--bf16-max-runs", "llama-1b,llama-3b"],
                                 capture_output=True, text=True, cwd=REPO_ROOT)
            self.assertEqual((got.returncode, got.stdout.strip()), (0, "llama-1b:40:2048,llama-3b:16:2048"))
            missing = subprocess.run([sys.executable, REPORT, out, "--bf16-max-runs", "llama-1b,llama-7b"],
                                     capture_output=True, text=True, cwd=REPO_ROOT)
            self.assertEqual(missing.returncode, 1)
            self.write(out, records + [bench_record("llama-1b", "coat", 40, 98000, 83.2)], {})
            proc, text = self.report(out)
            self.assertIn("| llama-1b | bf16 | 40 | 130.0 | 1.000 | 82,000 | 1.000 |", text)
            self.assertIn("| llama-1b | coat | 40 | 83.2 | 0.640 | 98,000 | 1.195 |", text)
            self.assertIn("| llama-1b, equal micro-batch (40): coat peak memory <= 0.65x bf16's | 0.640 | **met** |",
                          text)
            self.assertIn("| llama-1b, equal micro-batch (8): coat peak memory <= 0.65x bf16's | 0.700 | **not met** |",
                          text)

    def test_seeds_paired(self):
        # seeds 43 (the logs without a suffix: --base-seed 43) and 44; coat is +0.1% and +0.7% above bf16 (mean +0.4%,
        # met) and +0.6% / +0.8% above fp8_tensorwise (mean +0.7%, not met); held-out from the train losses
        losses = {"bf16": 2.0, "bf16_seed44": 1.0, "fp8_tensorwise": 1.99, "fp8_tensorwise_seed44": 0.999,
                  "coat": 2.002, "coat_seed44": 1.007}
        tails = {name: 4.0 if name.endswith("seed44") else 2.0 for name in losses}
        tails["coat_seed44"] = 4.04
        with tempfile.TemporaryDirectory() as out:
            self.write(out, [], losses, tails)
            proc, text = self.report(out, "--base-seed", "43")
            self.assertEqual(proc.returncode, 1, proc.stderr)
            self.assertIn("## Final validation loss (same data; seeds 43, 44)", text)
            self.assertIn("| coat | 2.0020 / 1.0070 | +0.40% ± 0.30 (+0.10..+0.70, 2 seeds) |", text)
            self.assertIn("| bf16 | 2.0000 / 1.0000 | — | ", text)
            self.assertIn("| coat | 2.0000 / 4.0400 | +0.50% ± 0.50 (+0.00..+1.00, 2 seeds) |", text)
            # +0.10% and +0.70%: mean 0.40, SE 0.30 -> -0.20..+1.00, sd 0.42: 2 sd / sqrt(n) < 0.1 from n = 72
            # (72 exactly at the boundary: the rounding of the logged losses decides 72 or 73)
            self.assertRegex(text, r"\| coat's final validation loss within 0.5% of bf16's \(mean of 2 seeds, paired\) "
                                   r"\| 0\.400 \| \*\*met\*\* on the mean; at two standard errors undecided "
                                   r"\(-0\.20\.\.\+1\.00; ~7[23] seeds\) \|")
            self.assertRegex(text, r"\| coat's final validation loss within 0.5% of fp8_tensorwise's \(mean of 2 "
                                   r"seeds, paired\) \| 0\.7\d\d \| \*\*not met\*\* on the mean; at two standard "
                                   r"errors ")

    def test_nothing_to_report(self):
        with tempfile.TemporaryDirectory() as out:
            proc, _ = self.report(out)
            self.assertEqual(proc.returncode, 2)
            self.assertIn("no benchmark records", proc.stderr)


if __name__ == "__main__":
    unittest.main()
