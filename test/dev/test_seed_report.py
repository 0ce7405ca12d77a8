#!/usr/bin/env python3
"""test/dev/test_seed_report.py: scripts/repro/seed_report.py on the CPU, on hand-written logs: run names and seeds
from the file names (<recipe>[_<variant>][_seed<N>], no suffix = --base-seed), the recipe of a variant, the mean and
sample standard deviation of a row, differences paired by seed over the common seeds only, the held-out table (mean
train loss of the last 300 steps), .jsonl.gz logs, logs without a validation loss left out, runs that stopped before
their end (an eval, then more train steps) left out, the exit status 2 for a directory without any, and the GPU model
of each run (from the train_gpt output beside its log): pairs across GPU models counted in the paired cells, the
GPU of every run listed when the runs used more than one model, and the logged models in the title without --gpu;
--goal's verdicts (met, not met, undecided with the seeds that would decide it, one seed) in both tables."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "repro", "seed_report.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import seed_report  # noqa: E402


def write_log(path, val):
    """A log whose train losses are 3.0 then val - 0.5 (the held-out loss: the mean of the last 300 of 301 steps)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write(json.dumps({"type": "train", "step": 1, "loss": 3.0, "tokens": 10}) + "\n")
        for step in range(2, 302):
            loss = val - 0.5 if val is not None else 3.0
            f.write(json.dumps({"type": "train", "step": step, "loss": loss, "tokens": 10}) + "\n")
        if val is not None:
            f.write(json.dumps({"type": "eval", "step": 301, "val_loss": val}) + "\n")


class TestNames(unittest.TestCase):
    def test_split_name(self):
        self.assertEqual(seed_report.split_name("bf16", 42), ("bf16", 42))
        self.assertEqual(seed_report.split_name("bf16_seed43", 42), ("bf16", 43))
        self.assertEqual(seed_report.split_name("fp8_blockwise_nopow2_seed7", 1), ("fp8_blockwise_nopow2", 7))
        self.assertEqual(seed_report.split_name("fp8_blockwise_seedless", 1), ("fp8_blockwise_seedless", 1))

    def test_recipe_of(self):
        self.assertEqual(seed_report.recipe_of("fp8_blockwise_nopow2"), "fp8_blockwise")
        self.assertEqual(seed_report.recipe_of("fp8_delayed"), "fp8_delayed")
        self.assertEqual(seed_report.recipe_of("nvfp4_no_sr"), "nvfp4")
        self.assertIsNone(seed_report.recipe_of("fp8"))
        self.assertIsNone(seed_report.recipe_of("bf16x"))


class TestArithmetic(unittest.TestCase):
    def test_mean_sd(self):
        m, sd = seed_report.mean_sd([2.0, 2.2, 2.4])
        self.assertAlmostEqual(m, 2.2)
        self.assertAlmostEqual(sd, 0.2)
        self.assertEqual(seed_report.mean_sd([3.0]), (3.0, None))

    def test_paired_uses_common_seeds(self):
        run = {1: 2.02, 2: 1.98, 3: 5.0}
        ref = {1: 2.0, 2: 2.0, 4: 1.0}
        mean, se, lo, hi, n, mixed = seed_report.paired(run, ref)
        self.assertEqual(n, 2)
        self.assertEqual(mixed, 0)
        self.assertAlmostEqual(se, 1.0)  # sd of (+1, -1) = sqrt(2), / sqrt(2)
        self.assertAlmostEqual(lo, -1.0)
        self.assertAlmostEqual(hi, 1.0)
        self.assertAlmostEqual(mean, 0.0)
        self.assertIsNone(seed_report.paired({1: 2.0}, {2: 2.0}))

    def test_pairs_across_gpu_models_are_counted(self):
        run, ref = {1: 2.02, 2: 1.98, 3: 2.0}, {1: 2.0, 2: 2.0, 3: 2.0}
        # seed 1 on two models, seed 2 on one, seed 3's reference model unknown: one mixed pair of three
        p = seed_report.paired(run, ref, {1: "H100", 2: "H200", 3: "H100"}, {1: "H200", 2: "H200"})
        self.assertEqual(p[5], 1)
        self.assertTrue(seed_report.fmt_paired(p).endswith("3 seeds) (1 of 3 across GPU models)"),
                        seed_report.fmt_paired(p))
        p = seed_report.paired({1: 2.02}, {1: 2.0}, {1: "H100"}, {1: "H200"})
        self.assertEqual(seed_report.fmt_paired(p), "+1.00% across GPU models")


class TestCommandLine(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test_seed_report_")
        self.addCleanup(shutil.rmtree, self.dir)

    def report(self, *args):
        return subprocess.run([sys.executable, SCRIPT, self.dir, "--gpu", "test GPU", *args], capture_output=True,
                              text=True, timeout=60)

    def test_table(self):
        for name, val in (("bf16", 2.0), ("bf16_seed43", 2.1), ("fp8_blockwise.jsonl.gz", 1.98),
                          ("fp8_blockwise_seed43", 2.142), ("fp8_blockwise_nopow2", 2.02), ("fp8_tensorwise", None)):
            path = os.path.join(self.dir, name if name.endswith(".gz") else name + ".jsonl")
            write_log(path, val)
        with open(os.path.join(self.dir, "fp8_delayed.jsonl"), "w") as f:  # cut off after its step-1 eval
            for r in ({"type": "train", "step": 1, "loss": 3.0, "tokens": 10}, {"type": "eval", "step": 1, "val_loss": 2.5},
                      {"type": "train", "step": 2, "loss": 2.9, "tokens": 10}):
                f.write(json.dumps(r) + "\n")
        proc = self.report("--title", "tiny")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(self.dir, "seeds.md")) as f:
            text = f.read()
        self.assertTrue(text.startswith("tiny, test GPU, "))
        val_text, held_text = text.split("Held-out loss per seed")
        self.assertIn("| run | seeds | held-out loss per seed |", held_text)
        rows = [line for line in val_text.splitlines() if line.startswith("| ") and not line.startswith("| run")]
        self.assertEqual([r.split(" | ")[0] for r in rows], ["| bf16", "| fp8_blockwise", "| fp8_blockwise_nopow2"])
        self.assertEqual(rows[0], "| bf16 | 42 43 | 2.0000 2.1000 | 2.0500 | 0.0707 (3.45%) | — | — |")
        # fp8_blockwise: -1% at seed 42, +2% at seed 43
        self.assertEqual(rows[1], "| fp8_blockwise | 42 43 | 1.9800 2.1420 | 2.0610 | 0.1146 (5.56%) | "
                                  "+0.50% ± 1.50 (-1.00..+2.00, 2 seeds) | — |")
        self.assertEqual(rows[2], "| fp8_blockwise_nopow2 | 42 | 2.0200 | 2.0200 | — | +1.00% | +2.02% |")
        held = [line for line in held_text.splitlines() if line.startswith("| ") and not line.startswith("| run")]
        # train losses val - 0.5: bf16 1.5 / 1.6, fp8_blockwise 1.48 (-1.33%) / 1.642 (+2.62%)
        self.assertEqual(held[0], "| bf16 | 42 43 | 1.5000 1.6000 | 1.5500 | 0.0707 (4.56%) | — | — |")
        self.assertEqual(held[1], "| fp8_blockwise | 42 43 | 1.4800 1.6420 | 1.5610 | 0.1146 (7.34%) | "
                                  "+0.65% ± 1.98 (-1.33..+2.62, 2 seeds) | — |")
        proc = self.report("--base-seed", "7", "--md", os.path.join(self.dir, "other.md"))
        self.assertIn("| bf16 | 7 43 |", proc.stdout)

    def test_against(self):
        for name, val in (("bf16", 2.0), ("bf16_seed43", 2.1), ("fp8_tensorwise", 2.02), ("fp8_tensorwise_seed43", 2.1),
                          ("fp8_blockwise", 2.0402), ("fp8_blockwise_seed43", 2.121)):
            write_log(os.path.join(self.dir, name + ".jsonl"), val)
        proc = self.report("--against", "fp8_tensorwise")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        val_text = proc.stdout.split("Held-out loss per seed")[0]
        self.assertIn("| vs its recipe, paired by seed | vs fp8_tensorwise, paired by seed |", val_text)
        self.assertIn("|---|---|---|---|---|---|---|---|", val_text)
        rows = {line.split(" | ")[0][2:]: line for line in val_text.splitlines() if line.startswith("| ")}
        # fp8_blockwise against fp8_tensorwise: +1% at both seeds; fp8_tensorwise against itself: —
        self.assertTrue(rows["fp8_blockwise"].endswith("| +1.00% ± 0.00 (+1.00..+1.00, 2 seeds) |"),
                        rows["fp8_blockwise"])
        self.assertTrue(rows["fp8_tensorwise"].endswith("| — | — |"), rows["fp8_tensorwise"])
        proc = self.report("--against", "fp8_nothing")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--against fp8_nothing: no such run", proc.stderr)

    def test_goal(self):
        # paired differences to bf16: met (+0.10, +0.10), not met (+1, +1.2), undecided (-1, +2.5), one seed (+5)
        for name, val in (("bf16", 2.0), ("bf16_seed43", 2.0), ("fp8_tensorwise", 2.002),
                          ("fp8_tensorwise_seed43", 2.002), ("fp8_delayed", 2.02), ("fp8_delayed_seed43", 2.024),
                          ("fp8_blockwise", 1.98), ("fp8_blockwise_seed43", 2.05), ("nvfp4", 2.1)):
            write_log(os.path.join(self.dir, name + ".jsonl"), val)
        proc = self.report("--goal", "0.25")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        val_text, held_text = proc.stdout.split("Held-out loss per seed")
        self.assertIn("| at most 0.25% above bf16 (mean ± 2 SE) |", val_text)
        self.assertIn("|---|---|---|---|---|---|---|---|", val_text)
        rows = {line.split(" | ")[0][2:]: line for line in val_text.splitlines() if line.startswith("| ")}
        self.assertTrue(rows["bf16"].endswith("| — |"), rows["bf16"])
        self.assertTrue(rows["fp8_tensorwise"].endswith("| met (+0.10..+0.10) |"), rows["fp8_tensorwise"])
        self.assertTrue(rows["fp8_delayed"].endswith("| not met (+0.90..+1.30) |"), rows["fp8_delayed"])
        # -1% and +2.5%: mean +0.75, SE 1.75 -> -2.75..+4.25; sd 2.47: 2 sd / sqrt(n) < 0.5 for n > 98
        self.assertTrue(rows["fp8_blockwise"].endswith("| undecided (-2.75..+4.25; ~99 seeds) |"),
                        rows["fp8_blockwise"])
        self.assertTrue(rows["nvfp4"].endswith("| one seed |"), rows["nvfp4"])
        self.assertIn("| at most 0.25% above bf16 (mean ± 2 SE) |", held_text)  # the held-out table is judged too
        self.assertEqual(seed_report.goal_verdict(None, 0.25), "—")
        self.assertEqual(seed_report.goal_verdict((0.5, 0.1, 0.4, 0.6, 2, 0), 0.25), "not met (+0.30..+0.70)")
        self.assertEqual(seed_report.goal_verdict((0.05, 0.1, 0.0, 0.1, 2, 0), 0.25), "met (-0.15..+0.250)")
        # sd = 0.11 sqrt(2) = 0.156: 2 sd / sqrt(n) < 0.2 from n = 3
        self.assertEqual(seed_report.goal_verdict((0.05, 0.11, 0.0, 0.1, 2, 0), 0.25),
                         "undecided (-0.17..+0.27; ~3 seeds)")
        at_goal = "; the mean is at the goal: more seeds alone do not decide it)"
        self.assertEqual(seed_report.goal_verdict((0.25, 0.1, 0.1, 0.4, 2, 0), 0.25),
                         "undecided (+0.05..+0.45" + at_goal)
        # 0.0001 points from the goal (prints as +0.25): millions of seeds by the formula, so no count is given
        self.assertEqual(seed_report.goal_verdict((0.2499, 0.16, 0.0, 0.6, 4, 0), 0.25),
                         "undecided (-0.07..+0.57" + at_goal)
        # 0.02 points away with SE 0.02 at 4 seeds: sd 0.04, 2 sd / sqrt(n) < 0.02 from n = 17 (still a count)
        self.assertEqual(seed_report.goal_verdict((0.23, 0.02, 0.2, 0.26, 4, 0), 0.25),
                         "undecided (+0.19..+0.27; ~17 seeds)")
        # an edge that would print as the goal gets a third decimal, so the verdict can be read off the interval
        self.assertEqual(seed_report.goal_verdict((0.61, 0.1776, 0.2, 1.2, 5, 0), 0.25), "not met (+0.255..+0.97)")
        self.assertEqual(seed_report.goal_verdict((0.0, 0.1238, -0.2, 0.2, 5, 0), 0.25), "met (-0.248..+0.248)")
        # two-sided ("within 0.25% either way"): well below the reference is outside it, not inside
        self.assertEqual(seed_report.goal_verdict((-1.0, 0.1, -1.1, -0.9, 2, 0), 0.25), "met (-1.20..-0.80)")
        self.assertEqual(seed_report.goal_verdict((-1.0, 0.1, -1.1, -0.9, 2, 0), 0.25, two_sided=True),
                         "not met (-1.20..-0.80)")
        self.assertEqual(seed_report.goal_verdict((0.0, 0.1, -0.1, 0.1, 2, 0), 0.25, two_sided=True),
                         "met (-0.20..+0.20)")
        # -0.2 with SE 0.1: -0.40..0.00 straddles -0.25; the nearer edge is 0.05 away: 2 sd / sqrt(n) < 0.05 for n > 32
        self.assertEqual(seed_report.goal_verdict((-0.2, 0.1, -0.3, -0.1, 2, 0), 0.25, two_sided=True),
                         "undecided (-0.40..+0.00; ~33 seeds)")
        proc = self.report("--goal", "-1")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--goal must be a non-negative percentage", proc.stderr)

    def test_gpu_models(self):
        for name, val, device in (("bf16", 2.0, "NVIDIA H200"), ("bf16_seed43", 2.1, "NVIDIA H200"),
                                  ("fp8_tensorwise", 2.02, "NVIDIA H100 80GB HBM3"),
                                  ("fp8_tensorwise_seed43", 2.121, "NVIDIA H200"), ("fp8_blockwise", 2.0, None)):
            write_log(os.path.join(self.dir, name + ".jsonl.gz"), val)
            if device:
                with open(os.path.join(self.dir, name + ".log"), "w") as f:
                    f.write(f"device: {device} (sm_90, 132 SMs, 79.2 GiB)\ndata: ...\nstep 0/301 | val loss 9.0\n")
        self.assertEqual(seed_report.runlog.run_device(os.path.join(self.dir, "fp8_tensorwise.jsonl.gz")),
                         "NVIDIA H100 80GB HBM3")
        self.assertIsNone(seed_report.runlog.run_device(os.path.join(self.dir, "fp8_blockwise.jsonl.gz")))
        proc = self.report()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        val_text = proc.stdout.split("Held-out loss per seed")[0]
        rows = {line.split(" | ")[0][2:]: line for line in val_text.splitlines() if line.startswith("| ")}
        self.assertIn("+1.00% ± 0.00 (+1.00..+1.00, 2 seeds) (1 of 2 across GPU models) |", rows["fp8_tensorwise"])
        self.assertIn("| +0.00% | — |", rows["fp8_blockwise"])  # its GPU is unknown: not marked
        self.assertIn("- fp8_tensorwise: 42 NVIDIA H100 80GB HBM3, 43 NVIDIA H200", proc.stdout)
        self.assertIn("- fp8_blockwise: 42 unknown", proc.stdout)
        # without --gpu the title names the models the logs name (not this machine's)
        unnamed = subprocess.run([sys.executable, SCRIPT, self.dir], capture_output=True, text=True, timeout=60)
        self.assertEqual(unnamed.returncode, 0, unnamed.stderr)
        self.assertTrue(unnamed.stdout.startswith("NVIDIA H100 80GB HBM3 and NVIDIA H200 (the GPU of each run is listed "
                                                  "below the tables), "), unnamed.stdout[:200])
        # one model only: no list
        os.remove(os.path.join(self.dir, "fp8_tensorwise.log"))
        proc = self.report()
        self.assertNotIn("GPU model per run", proc.stdout)
        self.assertNotIn("across GPU models", proc.stdout)
        unnamed = subprocess.run([sys.executable, SCRIPT, self.dir], capture_output=True, text=True, timeout=60)
        self.assertTrue(unnamed.stdout.startswith("NVIDIA H200, "), unnamed.stdout[:200])

    def test_no_logs(self):
        write_log(os.path.join(self.dir, "bf16.jsonl"), None)
        proc = self.report()
        self.assertEqual(proc.returncode, 2)
        self.assertIn("no JSONL log with a validation loss", proc.stderr)


if __name__ == "__main__":
    unittest.main()
