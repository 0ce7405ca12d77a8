#!/usr/bin/env python3
"""test/dev/test_product_compare.py: scripts/repro/product_compare.py on the CPU, on hand-written probe logs: the
logs found by name (NAME_POINT.jsonl[.gz], others ignored), the per-kind mean over the blocks, each recipe's
difference to the base in dB and its mean over the kinds, the table and --md, and the exit status 2 for an empty
directory, a log without product records, an unknown --base and a recipe missing a point; then
scripts/repro/product_probe.sh --dry (the BF16 run, one probe per recipe and point, its argument errors)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..", "..")
SCRIPT = os.path.join(REPO, "scripts", "repro", "product_compare.py")
PROBE = os.path.join(REPO, "scripts", "repro", "product_probe.sh")
sys.path.insert(0, os.path.dirname(SCRIPT))
import product_compare  # noqa: E402
from test_numerics_report import product, write_log  # noqa: E402  (the same log records and writer)


def probe_records(fc_fprop, fc_wgrad):
    """Two blocks; block 1's SNR is block 0's + 2 dB, so the kind's mean is block 0's + 1."""
    out = []
    for block, extra in ((0, 0.0), (1, 2.0)):
        out.append(product(1, f"transformer.h.{block}.mlp.c_fc.fprop", fc_fprop + extra))
        out.append(product(1, f"transformer.h.{block}.mlp.c_fc.wgrad", fc_wgrad + extra))
        out.append(product(1, f"transformer.h.{block}.attn.c_attn.fprop", 30.0 + extra))
    return out


class TestCompare(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        write_log(os.path.join(self.dir, "tw_0.jsonl"), probe_records(28.0, 40.0))
        write_log(os.path.join(self.dir, "tw_768.jsonl.gz"), probe_records(34.0, 27.0))
        write_log(os.path.join(self.dir, "bw_0.jsonl"), probe_records(27.5, 41.0))
        write_log(os.path.join(self.dir, "bw_768.jsonl"), probe_records(34.5, 26.0))
        write_log(os.path.join(self.dir, "bf16_run.jsonl"), [])  # not a probe log: ignored

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_logs_found_by_name(self):
        logs = product_compare.find_logs(self.dir)
        self.assertEqual(sorted(logs), ["bw", "tw"])
        self.assertEqual(sorted(logs["tw"]), [0, 768])

    def test_differences(self):
        layers, others, rows = product_compare.compare(product_compare.find_logs(self.dir), "tw")
        self.assertEqual(layers, ["transformer.h.*.attn.c_attn", "transformer.h.*.mlp.c_fc"])
        self.assertEqual(others, ["bw"])
        by = {(p, prod): (cells, means) for p, prod, cells, means in rows}
        self.assertEqual(sorted(by), [(0, "fprop"), (0, "wgrad"), (768, "fprop"), (768, "wgrad")])  # no dgrad
        cells, means = by[(0, "fprop")]
        self.assertAlmostEqual(cells["transformer.h.*.mlp.c_fc"][0], 29.0)  # block mean
        self.assertAlmostEqual(cells["transformer.h.*.mlp.c_fc"][1]["bw"], -0.5)
        self.assertAlmostEqual(cells["transformer.h.*.attn.c_attn"][1]["bw"], 0.0)
        self.assertAlmostEqual(means["bw"], -0.25)
        cells, means = by[(768, "wgrad")]
        self.assertAlmostEqual(cells["transformer.h.*.mlp.c_fc"][1]["bw"], -1.0)
        self.assertAlmostEqual(means["bw"], -1.0)

    def test_table_and_md(self):
        md = os.path.join(self.dir, "t.md")
        out = subprocess.run([sys.executable, SCRIPT, self.dir, "--base", "tw", "--md", md], capture_output=True,
                             text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("| 0 | fprop | 31.0 +0.00 | 29.0 -0.50 | -0.25 |", out.stdout)
        self.assertIn("| 768 | wgrad | — | 28.0 -1.00 | -1.00 |", out.stdout)
        with open(md) as f:
            self.assertEqual(f.read(), out.stdout)

    def test_default_base_is_first_name(self):
        out = subprocess.run([sys.executable, SCRIPT, self.dir], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("Product SNR in dB of bw", out.stdout)
        self.assertIn("| 0 | fprop | 31.0 +0.00 | 28.5 +0.50 | +0.25 |", out.stdout)  # tw against bw

    def errors(self, *args):
        out = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
        self.assertEqual(out.returncode, 2, out.stdout)
        return out.stderr

    def test_errors(self):
        self.assertIn("--base xx is not among", self.errors(self.dir, "--base", "xx"))
        empty = tempfile.mkdtemp()
        try:
            self.assertIn("holds no NAME_POINT.jsonl", self.errors(empty))
            write_log(os.path.join(empty, "tw_0.jsonl"), [])
            self.assertIn("no product_numerics record", self.errors(empty))
        finally:
            shutil.rmtree(empty)
        os.remove(os.path.join(self.dir, "bw_768.jsonl"))
        self.assertIn("recipe bw has no log at point 768", self.errors(self.dir, "--base", "tw"))
        self.assertIn("cannot read", self.errors(os.path.join(self.dir, "missing")))


class TestProbeDry(unittest.TestCase):
    def run_probe(self, *args):
        return subprocess.run(["bash", PROBE, *args], capture_output=True, text=True)

    def test_commands(self):
        out = self.run_probe("--dry", "--every", "1536", "--out", "/tmp/pp")
        self.assertEqual(out.returncode, 0, out.stderr)
        cmds = [l for l in out.stdout.splitlines() if "train_gpt" in l]
        self.assertEqual(len(cmds), 1 + 3 * 3)  # the BF16 run, then 3 recipes at 0, 1536 and 3072
        self.assertIn("checkpoint.every=1536", cmds[0])
        self.assertIn("checkpoint.dir=/tmp/pp/ck", cmds[0])
        self.assertIn("precision.recipe=fp8_tensorwise", cmds[1])
        self.assertIn("train.init_from= ", cmds[1] + " ")  # the random initialisation
        self.assertIn("precision.pow2_scales=false", cmds[2])
        self.assertIn("precision.pow2_scales=true", cmds[3])
        self.assertIn("train.init_from=/tmp/pp/ck/step_00003072", cmds[9])
        for c in cmds[1:]:
            for s in ("log.numerics_products=true", "precision.fp8_activations=false", "train.steps=1"):
                self.assertIn(s, c)

    def test_own_probes(self):
        out = self.run_probe("--dry", "--steps", "10", "--every", "10", "--probe", "d precision.recipe=fp8_delayed")
        self.assertEqual(out.returncode, 0, out.stderr)
        cmds = [l for l in out.stdout.splitlines() if "train_gpt" in l]
        self.assertEqual(len(cmds), 3)
        self.assertIn("log.jsonl=runs/product_probe_gpt2-124m/d_10.jsonl", cmds[2])
        self.assertIn("precision.recipe=fp8_delayed", cmds[2])

    def test_llama(self):
        out = self.run_probe("--dry", "--model", "llama-350m", "--steps", "8", "--every", "8")
        self.assertEqual(out.returncode, 0, out.stderr)
        cmds = [l for l in out.stdout.splitlines() if "train_gpt" in l]
        self.assertEqual(len(cmds), 1 + 3 * 2)
        for c in cmds:
            for s in ("configs/llama_350m_bf16.json", "train.micro_batch=16", "train.seq_len=2048", "train.lr=3e-4"):
                self.assertIn(s, c)
        self.assertIn("checkpoint.dir=runs/product_probe_llama-350m/ck", cmds[0])

    def test_argument_errors(self):
        out = self.run_probe("--every", "0")
        self.assertEqual(out.returncode, 2)
        self.assertIn("positive integers", out.stderr)
        out = self.run_probe("--model", "gpt5")
        self.assertEqual(out.returncode, 2)
        self.assertIn("unknown model", out.stderr)
        out = self.run_probe("--bogus")
        self.assertEqual(out.returncode, 2)
        self.assertIn("unknown argument", out.stderr)


if __name__ == "__main__":
    unittest.main()
