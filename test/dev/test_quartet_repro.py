#!/usr/bin/env python3
"""test/dev/test_quartet_repro.py: scripts/repro/quartet.sh's --dry output and its table (scripts/repro/fp4_report.py
--paper quartet), on CPU, run from the repository root.

--dry: the comparison (bf16, fp8_tensorwise, mxfp4) and the four Quartet ablations (SR backward, no trust mask, no
rotations, Table 2's RTN-absmax forward), each identical to the plain mxfp4 run but for its overrides (placed last,
so they win) and its log name; GPT-2 124M by default into runs/quartet, Llama 350M or 125M with --model into
runs/quartet_<model>; an unknown model or argument exits 2. The report on synthetic logs: final losses against bf16
and fp8_tensorwise, each ablation against mxfp4 and whether it raised the loss, the paper's column, the products'
honest label, the goal line and its exit code.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from test_fp4_repro import check_llama_125m, write_log
from test_fp8_loss_parity import REPO_ROOT, commands, overrides

SCRIPT = os.path.join(REPO_ROOT, "scripts", "repro", "quartet.sh")
REPORT = os.path.join(REPO_ROOT, "scripts", "repro", "fp4_report.py")
ABLATIONS = {"sr": ["precision.dy_rounding=stochastic"], "no_mask": ["precision.trust_mask=false"],
             "no_rotation": ["precision.forward_hadamard=0", "precision.backward_hadamard=0"],
             "rtn_absmax": ["precision.forward_hadamard=0", "precision.forward_scale=absmax",
                            "precision.trust_mask=false"]}


def run(*args):
    env = dict(os.environ)
    env.pop("MODEL", None)
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120)


class TestDry(unittest.TestCase):
    def test_comparison_and_ablations(self):
        proc = run("--dry")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        cmds = commands(proc.stdout)
        self.assertEqual([overrides(c)["precision.recipe"] for c in cmds],
                         ["bf16", "fp8_tensorwise", "mxfp4"] + ["mxfp4"] * len(ABLATIONS))
        logs = [overrides(c)["log.jsonl"] for c in cmds]
        self.assertEqual(logs, [f"runs/quartet/{r}.jsonl" for r in ["bf16", "fp8_tensorwise", "mxfp4"]] +
                         [f"runs/quartet/mxfp4_{t}.jsonl" for t in ABLATIONS])
        plain = cmds[2]
        strip = lambda c: [a for a in c if not a.startswith("log.jsonl=")]  # noqa: E731
        for cmd, (tag, settings) in zip(cmds[3:], ABLATIONS.items()):
            with self.subTest(tag=tag):
                tail = [a for s in settings for a in ("--set", s)]
                self.assertEqual(cmd[-len(tail):], tail)
                self.assertEqual(strip(cmd)[:-len(tail)], strip(plain))
        o = overrides(plain)
        self.assertEqual((o["train.micro_batch"], o["train.seq_len"], o["train.seed"]), ("32", "1024", "42"))
        self.assertGreaterEqual(int(o["train.steps"]) * 32 * 1024, 100_000_000)

    def test_llama_and_errors(self):
        proc = run("--dry", "--model", "llama-350m", "--seed", "5")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        cmds = commands(proc.stdout)
        self.assertEqual(len(cmds), 3 + len(ABLATIONS))
        self.assertIn("configs/llama_350m_bf16.json", cmds[0])
        self.assertEqual(overrides(cmds[0])["log.jsonl"], "runs/quartet_llama-350m/bf16.jsonl")
        self.assertEqual(overrides(cmds[-1])["train.seed"], "5")
        check_llama_125m(self, run, "quartet")
        for args, word in ((["--model", "gpt2-xl"], "unknown model 'gpt2-xl'"), (["--bogus"], "unknown argument")):
            proc = run("--dry", *args)
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertIn(word, proc.stderr)


class TestReport(unittest.TestCase):
    RUNS = ["bf16", "fp8_tensorwise", "mxfp4", "mxfp4_sr", "mxfp4_no_mask", "mxfp4_no_rotation", "mxfp4_rtn_absmax"]

    def setUp(self):
        self.out = tempfile.mkdtemp(prefix="test_quartet_report_")
        self.addCleanup(shutil.rmtree, self.out)

    def report(self, *args):
        return subprocess.run([sys.executable, REPORT, self.out, "--paper", "quartet", "--no-plot", *args],
                              capture_output=True, text=True, timeout=60)

    def test_table_and_goal(self):
        for run, val in zip(self.RUNS, (2.0, 2.01, 2.05, 2.04, 2.08, 2.1, 2.06)):
            write_log(os.path.join(self.out, run + ".jsonl"), val)
        proc = self.report("--runs", *self.RUNS, "--goal", "mxfp4=3")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(self.out, "quartet.md")) as f:
            text = f.read()
        self.assertIn("Quartet (arXiv 2505.14669) in our numbers", text)
        self.assertIn("exactly on FP8 tensor cores (exact E4M3 remap)", text)
        self.assertIn("FP4 numerics, not FP4 speed", text)
        self.assertIn("| mxfp4 | 2.0500 | +2.50% | +1.99% | — | 0 | 8,000 | 30M Llama on C4", text)
        self.assertIn("| mxfp4_sr | 2.0400 | +2.00% | +1.49% | -0.49% (does not raise the loss) |", text)
        self.assertIn("| mxfp4_no_mask | 2.0800 | +4.00% | +3.48% | +1.46% (raises the loss) |", text)
        self.assertIn("| mxfp4_no_rotation | 2.1000 | +5.00% | +4.48% | +2.44% (raises the loss) |", text)
        self.assertIn("| mxfp4_rtn_absmax | 2.0600 | +3.00% | +2.49% | +0.49% (raises the loss) | 0 | 8,000 | Table 2: "
                      "RTN-absmax", text)
        self.assertIn("- mxfp4 within 3% of BF16: +2.50%, met", text)
        proc = self.report("--runs", *self.RUNS, "--goal", "mxfp4=2")
        self.assertEqual(proc.returncode, 1)
        self.assertIn("NOT met", proc.stdout)


if __name__ == "__main__":
    unittest.main()
