#!/usr/bin/env python3
"""test/dev/test_plot_runs.py: scripts/plot_runs.py on the CPU: the relative series of --relative (the percent gap
between two smoothed curves at their common steps), the metrics reader (gzip, repeated steps, null losses), and the
command line (a PNG with the relative panel and its summary lines; argument errors). The PNG checks need matplotlib
(skipped without it)."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import plot_runs  # noqa: E402


def write_run(path, losses, val=None, tokens=100):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        for step, loss in enumerate(losses, 1):
            f.write(json.dumps({"type": "train", "step": step, "loss": loss, "tokens": tokens}) + "\n")
        for step, v in (val or []):
            f.write(json.dumps({"type": "eval", "step": step, "val_loss": v}) + "\n")


class TestRelativeSeries(unittest.TestCase):
    def test_constant_ratio(self):
        base = [(s, 2.0 + 1.0 / s) for s in range(1, 51)]
        other = [(s, 1.02 * l) for s, l in base]
        for beta in (0.0, 0.9, 0.99):
            rel = plot_runs.relative_series(base, other, beta)
            self.assertEqual([s for s, _ in rel], list(range(1, 51)))
            for _, p in rel:
                self.assertAlmostEqual(p, 2.0, places=9)

    def test_common_steps_only_and_sign(self):
        base = [(s, 3.0) for s in (1, 2, 3, 4)]
        other = [(s, 2.97) for s in (2, 4, 6)]
        self.assertEqual([(s, round(p, 9)) for s, p in plot_runs.relative_series(base, other, 0.0)],
                         [(2, -1.0), (4, -1.0)])
        self.assertEqual(plot_runs.relative_series(base, [(9, 1.0)], 0.0), [])


class TestLabels(unittest.TestCase):
    def test_default_labels(self):
        self.assertEqual(plot_runs.default_labels(["a/bf16.jsonl.gz", "b/fp8.jsonl"]), ["bf16", "fp8"])
        self.assertEqual(plot_runs.default_labels(["x/metrics.jsonl", "y/metrics.jsonl"]), ["x", "y"])


class TestReadMetrics(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test_plot_runs_")
        self.addCleanup(shutil.rmtree, self.dir)

    def test_gzip_repeats_and_nulls(self):
        path = os.path.join(self.dir, "run.jsonl.gz")
        with gzip.open(path, "wt") as f:
            for rec in ({"type": "train", "step": 1, "loss": 5.0, "tokens": 10},
                        {"type": "train", "step": 2, "loss": None, "tokens": 10},
                        {"type": "train", "step": 1, "loss": 4.0, "tokens": 10},
                        {"type": "eval", "step": 1, "val_loss": 4.5}):
                f.write(json.dumps(rec) + "\n")
        train, val = plot_runs.read_metrics(os.path.join(self.dir, "run.jsonl"))  # finds the .gz
        self.assertEqual(train, [(1, 4.0, 10)])
        self.assertEqual(val, [(1, 4.5)])


class TestCommandLine(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test_plot_runs_cli_")
        self.addCleanup(shutil.rmtree, self.dir)
        self.a, self.b = os.path.join(self.dir, "a.jsonl"), os.path.join(self.dir, "b.jsonl.gz")
        write_run(self.a, [3.0] * 40, val=[(20, 3.1), (40, 3.0)])
        write_run(self.b, [2.94] * 40, val=[(20, 3.1), (40, 2.97)])

    def plot(self, *args):
        return subprocess.run([sys.executable, os.path.join(SCRIPTS, "plot_runs.py"), *args],
                              capture_output=True, text=True, timeout=120)

    def test_relative_panel(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib is not installed")
        out = os.path.join(self.dir, "rel.png")
        proc = self.plot(self.a, self.b, "--label", "bf16", "--label", "fp8", "--relative", "--out", out, "--x",
                         "tokens")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("fp8 vs bf16: train -2.00% at step 40, val -1.00% at step 40", proc.stdout)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_errors(self):
        for args, word in (([self.a, "--relative"], "at least two"),
                           ([self.a, self.b, "--relative", "--relative-smooth", "1"], "--relative-smooth"),
                           ([self.a, self.b, "--label", "x"], "one --label per file")):
            with self.subTest(args=args):
                proc = self.plot(*args)
                self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
                self.assertIn(word, proc.stderr)


if __name__ == "__main__":
    unittest.main()
