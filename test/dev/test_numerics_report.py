#!/usr/bin/env python3
"""test/dev/test_numerics_report.py: scripts/repro/numerics_report.py on the CPU, on hand-written logs: tensor kinds
(the block number taken out, names without one kept), the per-kind means, worst block and lowest SNR at one step, the
default step (the last one every log has), the clipped fraction ("—" for a log written before clipped_frac), the
underflow list across runs, labels, .jsonl.gz logs, the product table
from "product_numerics" records (only where some log has them at the step), the --over-steps table (per-kind and
per-operand means at every step, "—" where a run has no record), and the exit status 2 for a log without telemetry, a
step without records, a wrong number of labels and --step with --over-steps."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "repro", "numerics_report.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import numerics_report  # noqa: E402


def record(step, tensor, under, snr=31.5, amax=1.0, sat=0.0, clip=None):
    """A numerics record; without clip, one of a log written before clipped_frac existed."""
    r = {"type": "numerics", "step": step, "tensor": tensor, "amax": amax, "scale": 2.0, "snr_db": snr,
         "underflow_frac": under, "saturated_frac": sat}
    if clip is not None:
        r["clipped_frac"] = clip
    return r


def product(step, name, snr, zeroed=0.0):
    return {"type": "product_numerics", "step": step, "product": name, "amax": 1.0, "snr_db": snr,
            "zeroed_frac": zeroed}


def write_log(path, records):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write(json.dumps({"type": "train", "step": 1, "loss": 3.0, "tokens": 10}) + "\n")
        for r in records:
            f.write(json.dumps(r) + "\n")


class TestKinds(unittest.TestCase):
    def test_kind_of(self):
        self.assertEqual(numerics_report.kind_of("transformer.h.3.mlp.c_fc.x"), ("transformer.h.*.mlp.c_fc.x", 3))
        self.assertEqual(numerics_report.kind_of("model.layers.11.mlp.down_proj.dy"),
                         ("model.layers.*.mlp.down_proj.dy", 11))
        self.assertEqual(numerics_report.kind_of("lm_head.x"), ("lm_head.x", None))

    def test_summarise(self):
        rows = numerics_report.summarise([record(8, "h.0.fc.x", 0.01, snr=30.0, amax=2.0, clip=0.1),
                                          record(8, "h.1.fc.x", 0.03, snr=32.0, amax=5.0, sat=0.5, clip=0.3),
                                          record(8, "h.0.fc.dy", 0.0, snr=None)])
        x = rows["h.*.fc.x"]
        self.assertEqual(x["blocks"], 2)
        self.assertAlmostEqual(x["under_mean"], 0.02)
        self.assertEqual((x["under_max"], x["under_block"], x["amax"]), (0.03, 1, 5.0))
        self.assertEqual((x["snr_mean"], x["snr_min"], x["sat_mean"], x["sat_max"]), (31.0, 30.0, 0.25, 0.5))
        self.assertAlmostEqual(x["clip_mean"], 0.2)
        self.assertEqual(x["clip_max"], 0.3)
        self.assertNotEqual(rows["h.*.fc.dy"]["snr_mean"], rows["h.*.fc.dy"]["snr_mean"])  # no finite SNR: NaN
        dy = rows["h.*.fc.dy"]  # an old record without clipped_frac: NaN, not 0
        self.assertNotEqual(dy["clip_mean"], dy["clip_mean"])
        self.assertNotEqual(dy["clip_max"], dy["clip_max"])


    def test_summarise_products(self):
        rows = numerics_report.summarise_products([product(8, "h.0.fc.wgrad", 20.0, 0.02),
                                                   product(8, "h.1.fc.wgrad", 26.0, 0.0),
                                                   product(8, "h.0.fc.fprop", None)])
        self.assertEqual(rows["h.*.fc.wgrad"], {"blocks": 2, "snr_mean": 23.0, "snr_min": 20.0, "zeroed_mean": 0.01})
        self.assertNotEqual(rows["h.*.fc.fprop"]["snr_mean"], rows["h.*.fc.fprop"]["snr_mean"])  # no finite SNR
        self.assertEqual(sorted(["h.*.fc.wgrad", "h.*.fc.fprop", "lm_head.fprop", "h.*.fc.dgrad"],
                                key=numerics_report.product_order),
                         ["h.*.fc.fprop", "h.*.fc.dgrad", "h.*.fc.wgrad", "lm_head.fprop"])


class TestCommandLine(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test_numerics_report_")
        self.addCleanup(shutil.rmtree, self.dir)
        self.a = os.path.join(self.dir, "fp8_tensorwise.jsonl")
        self.b = os.path.join(self.dir, "fp8_blockwise.jsonl.gz")
        write_log(self.a, [record(4, "h.0.fc.x", 0.5), record(8, "h.0.fc.x", 0.10), record(8, "h.1.fc.x", 0.20),
                           record(8, "h.0.fc.w", 0.0), record(12, "h.0.fc.x", 0.9)])
        write_log(self.b, [record(4, "h.0.fc.x", 0.4), record(8, "h.0.fc.x", 0.01, clip=0.002),
                           record(8, "h.1.fc.x", 0.03, clip=0.004),
                           product(4, "h.0.fc.dgrad", 19.0), product(8, "h.0.fc.wgrad", 21.0, 0.5),
                           product(8, "h.1.fc.wgrad", 25.0), product(8, "h.0.fc.fprop", 33.0)])

    def report(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)

    def test_tables(self):
        md = os.path.join(self.dir, "n.md")
        proc = self.report(self.a, self.b, "--top", "3", "--md", md)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(proc.stdout.startswith("Quantisation telemetry at step 8 "))  # 12: only in the first log
        with open(md) as f:
            self.assertEqual(f.read(), proc.stdout)
        rows = [line for line in proc.stdout.split("Product error")[0].splitlines() if line.startswith("| h.")]
        self.assertEqual([r.split(" | ")[:3] for r in rows],
                         [["| h.*.fc.x", "fp8_tensorwise", "2"], ["| h.*.fc.x", "fp8_blockwise", "2"],
                          ["| h.*.fc.w", "fp8_tensorwise", "1"]])
        self.assertIn("| 15% | 20% (1) |", rows[0])
        self.assertIn("| 0 | 0 | — | — |", rows[0])  # saturated; no clipped_frac in this log
        self.assertIn("| 2% | 3% (1) |", rows[1])
        self.assertIn("| 0 | 0 | 0.3% | 0.4% |", rows[1])  # saturated, clipped mean and worst
        self.assertIn("| 0 | 0 | 0 | 0 |", rows[2])  # nothing underflows: no worst block named
        top = proc.stdout.split("most elements quantised to zero")[1].splitlines()
        top = [line for line in top if line.startswith("| fp8")]
        self.assertEqual([line.split(" | ")[1] for line in top], ["h.1.fc.x", "h.0.fc.x", "h.1.fc.x"])
        self.assertTrue(top[2].startswith("| fp8_blockwise |"))
        products = proc.stdout.split("Product error at step 8")[1].splitlines()
        products = [line for line in products if line.startswith("| h.")]
        self.assertEqual(products, ["| h.*.fc.fprop | fp8_blockwise | 1 | 33.0 | 33.0 | 0 |",
                                    "| h.*.fc.wgrad | fp8_blockwise | 2 | 23.0 | 21.0 | 25% |"])

    def test_step_and_labels(self):
        proc = self.report(self.a, self.b, "--step", "4", "--label", "tw", "--label", "bw")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("| h.*.fc.x | tw | 1 |", proc.stdout)
        self.assertIn("| h.*.fc.x | bw | 1 |", proc.stdout)
        self.assertIn("| h.*.fc.dgrad | bw | 1 | 19.0 | 19.0 | 0 |", proc.stdout)
        proc = self.report(self.a, "--step", "8")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("Product error", proc.stdout)  # no product records: no product table

    def test_over_steps(self):
        proc = self.report(self.a, self.b, "--over-steps", "underflow_frac", "--label", "tw", "--label", "bw")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertTrue(lines[0].startswith("underflow_frac over the run"))
        self.assertEqual(lines[2], "| tensor | run | step 4 | step 8 | step 12 |")
        rows = [line for line in lines if line.startswith("| h.") or line.startswith("| all")]
        self.assertEqual(rows, ["| h.*.fc.x | tw | 50% | 15% | 90% |",   # step 8: (0.10 + 0.20) / 2
                                "| h.*.fc.x | bw | 40% | 2% | — |",      # no step 12 in this log
                                "| h.*.fc.w | tw | — | 0 | — |",
                                "| all .x | tw | 50% | 15% | 90% |",
                                "| all .x | bw | 40% | 2% | — |",
                                "| all .w | tw | — | 0 | — |"])
        proc = self.report(self.b, "--over-steps", "clipped_frac")
        self.assertIn("| h.*.fc.x | fp8_blockwise | — | 0.3% |", proc.stdout)  # step 4 was written without it
        proc = self.report(self.a, "--over-steps", "snr_db")
        self.assertIn("| h.*.fc.x | fp8_tensorwise | 31.5 | 31.5 | 31.5 |", proc.stdout)

    def test_errors(self):
        empty = os.path.join(self.dir, "bf16.jsonl")
        write_log(empty, [])
        for args, word in (([empty], "holds no numerics record"),
                           ([self.a, self.b, "--step", "12"], "no telemetry at step 12 in fp8_blockwise"),
                           ([os.path.join(self.dir, "none.jsonl")], "cannot read")):
            with self.subTest(args=args):
                proc = self.report(*args)
                self.assertEqual(proc.returncode, 2, proc.stdout)
                self.assertIn(word, proc.stderr)
        proc = self.report(self.a, "--over-steps", "clipped_frac", "--step", "8")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("leave --step out", proc.stderr)
        proc = self.report(self.a, "--over-steps", "loss")
        self.assertEqual(proc.returncode, 2)
        proc = self.report(self.a, self.b, "--label", "x")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("give one per log", proc.stderr)


if __name__ == "__main__":
    unittest.main()
