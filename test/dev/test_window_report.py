#!/usr/bin/env python3
"""test/dev/test_window_report.py: scripts/repro/window_report.py on the CPU, on hand-written logs: the window ranges
(a shorter last window, the extra row of the last steps), the means and their difference to the base run, runs cut
off at different steps compared up to the last shared step, skipped steps left out of a mean and counted, the shared
validation steps only, the median gradient norms of --norms (null norms left out), .jsonl.gz logs, the GPU model of
each run named when the runs used more than one, and the exit status 2 for a missing log, a log without train records
and a base run not among the runs."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "repro", "window_report.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import window_report  # noqa: E402


def write_log(path, losses, evals=(), norms=None):
    """losses: {step: loss or None}; evals: [(step, val_loss)]; norms: {step: gradient norm or None} (default 1.0)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        for step, loss in sorted(losses.items()):
            norm = (norms or {}).get(step, 1.0)
            f.write(json.dumps({"type": "train", "step": step, "loss": loss, "norm": norm, "tokens": 8}) + "\n")
        for step, val in evals:
            f.write(json.dumps({"type": "eval", "step": step, "val_loss": val}) + "\n")


class TestWindows(unittest.TestCase):
    def test_ranges(self):
        self.assertEqual(window_report.windows(10, 4, 3), [(1, 4), (5, 8), (9, 10), (8, 10)])
        self.assertEqual(window_report.windows(8, 4, 0), [(1, 4), (5, 8)])
        self.assertEqual(window_report.windows(2, 4, 5), [(1, 2), (1, 2)])

    def test_mean_skips_missing(self):
        self.assertEqual(window_report.window_mean({1: 2.0, 2: None, 3: 4.0}, 1, 3), (3.0, 1))
        self.assertEqual(window_report.window_mean({1: None}, 1, 1), (None, 1))


class TestCommandLine(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test_window_report_")
        self.addCleanup(shutil.rmtree, self.dir)
        write_log(os.path.join(self.dir, "bf16.jsonl"), {s: 2.0 for s in range(1, 9)}, [(4, 2.0), (8, 1.0)])
        # stopped at step 6; step 2 skipped; its eval at step 8 never came
        fp8 = {s: 2.2 for s in range(1, 7)}
        fp8[2] = None
        write_log(os.path.join(self.dir, "fp8.jsonl.gz"), fp8, [(4, 2.1)])

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, self.dir, *args], capture_output=True, text=True)

    def test_table(self):
        r = self.run_script("bf16", "fp8", "--window", "4", "--last", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Steps every run reached: 1-6 (last step per run: bf16 8, fp8 6)", r.stdout)
        self.assertIn("| 1-4 | 2.0000 | 2.2000 (+10.00%), 1 skipped |", r.stdout)
        self.assertIn("| 5-6 | 2.0000 | 2.2000 (+10.00%) |", r.stdout)
        self.assertEqual(r.stdout.count("| 5-6 |"), 2)  # the window and the last-2-steps row
        self.assertIn("| 4 | 2.0000 | 2.1000 (+5.00%) |", r.stdout)
        self.assertNotIn("| 8 |", r.stdout)  # only fp8's log lacks it: not shared

    def test_norms(self):
        r = self.run_script("bf16", "fp8", "--window", "4", "--last", "0")
        self.assertNotIn("gradient norm", r.stdout)  # only with --norms
        # medians per window: bf16 steps 1-4 (1, 2, 3, 10) -> 2.5; fp8 (2.0, null, 4.0, 6.0) -> 4.0
        write_log(os.path.join(self.dir, "bf16.jsonl"), {s: 2.0 for s in range(1, 9)}, [(4, 2.0), (8, 1.0)],
                  norms={1: 1.0, 2: 2.0, 3: 3.0, 4: 10.0, 5: 4.0, 6: 4.0})
        fp8 = {s: 2.2 for s in range(1, 7)}
        write_log(os.path.join(self.dir, "fp8.jsonl.gz"), fp8, [(4, 2.1)],
                  norms={1: 2.0, 2: None, 3: 4.0, 4: 6.0, 5: 5.0, 6: 3.0})
        r = self.run_script("bf16", "fp8", "--window", "4", "--last", "0", "--norms")
        self.assertEqual(r.returncode, 0, r.stderr)
        table = r.stdout.split("Median gradient norm")[1]
        self.assertIn("| 1-4 | 2.5000 | 4.0000 (+60.00%) |", table)
        self.assertIn("| 5-6 | 4.0000 | 4.0000 (+0.00%) |", table)
        self.assertEqual(window_report.window_median({1: 3.0}, 2, 5), None)

    def test_md_and_title(self):
        md = os.path.join(self.dir, "w.md")
        r = self.run_script("fp8", "bf16", "--base", "fp8", "--title", "T", "--md", md)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(md, encoding="utf-8") as f:
            text = f.read()
        self.assertEqual(text, r.stdout)
        self.assertTrue(text.startswith("T\n"))
        self.assertIn("| 1-6 | 2.2000, 1 skipped | 2.0000 (-9.09%) |", text)

    def test_gpu_models(self):
        r = self.run_script("bf16", "fp8")
        self.assertNotIn("GPU model", r.stdout)  # no train_gpt output beside the logs
        for run, device in (("bf16", "NVIDIA H100 80GB HBM3"), ("fp8", "NVIDIA H200")):
            with open(os.path.join(self.dir, run + ".log"), "w") as f:
                f.write(f"device: {device} (sm_90, 132 SMs, 79.2 GiB)\n")
        r = self.run_script("bf16", "fp8")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("recipe): bf16 NVIDIA H100 80GB HBM3, fp8 NVIDIA H200.", r.stdout)

    def test_errors(self):
        self.assertEqual(self.run_script("bf16", "nothere").returncode, 2)
        r = self.run_script("fp8", "--base", "bf16")
        self.assertEqual(r.returncode, 2)
        self.assertIn("base run 'bf16'", r.stderr)
        write_log(os.path.join(self.dir, "empty.jsonl"), {}, [(4, 1.0)])
        r = self.run_script("bf16", "empty")
        self.assertEqual(r.returncode, 2)
        self.assertIn("no train records", r.stderr)


if __name__ == "__main__":
    unittest.main()
