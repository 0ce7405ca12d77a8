#!/usr/bin/env python3
"""test/dev/test_memory_plan.py: dev/bench/memory_plan.py, run from the repository root (no GPU). The parsing of a
--dry-run plan (rows, exact bytes, the saved activations' split and the quantised operands; a refused config has no
plan), the table (one row per recipe, the ratio to the base), and over train_gpt's real dry runs on llama-tiny: every
plan's rows add up to its total, the recipes order as their formats do (FP8 linear inputs one byte per element, FP4
about half of that, so nvfp4 and mxfp4 save less than fp8_tensorwise and BF16 more), and an unknown recipe stops with
the trainer's message.
"""

import contextlib
import importlib.util
import io
import os
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("memory_plan", os.path.join(REPO, "dev/bench/memory_plan.py"))
memory_plan = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory_plan)

PLAN = """memory/GPU   37.57 GiB estimated from the allocation plan (nvfp4, optimizer.state_format fp32):
  weights              2.00 GiB       2,152,337,408 B  bf16 working copy of the parameter table
  master weights       4.01 GiB       4,304,674,816 B  fp32
  precision state      0.80 GiB         858,111,232 B  quantised weight caches, scales and amax histories of the recipe
  saved activations   14.88 GiB      15,982,460,928 B  for backward at 8 x 2048 tokens (recompute 0): bf16 13.41 GiB + quantised linear inputs 1.48 GiB
  transient buffers    2.28 GiB       2,445,412,096 B  unsaved forward outputs, backward gradients, reduction and attention scratch, token ids; quantised operands 1.40 GiB
  cuBLASLt workspace   0.03 GiB          33,554,432 B
  total               37.57 GiB      40,339,002,368 B  on one GPU
resolved config:
"""


class Parsing(unittest.TestCase):
    def test_rows_bytes_and_details(self):
        rows = memory_plan.parse_memory_plan(PLAN)
        self.assertEqual(list(rows)[:2], ["weights", "master weights"])
        self.assertEqual(rows["total"][0], 40339002368)
        self.assertEqual(rows["cuBLASLt workspace"], (33554432, ""))
        self.assertEqual(rows["master weights"][1], "fp32")
        self.assertEqual(memory_plan.saved_split(rows), (13.41, 1.48))
        self.assertEqual(memory_plan.quantised_operands(rows), 1.40)

    def test_unquantised_rows(self):
        text = ("  saved activations   18.66 GiB      20,034,158,592 B  for backward at 8 x 2048 tokens (recompute 0)\n"
                "  transient buffers    0.88 GiB         943,849,472 B  unsaved forward outputs, token ids\n"
                "  total               39.14 GiB      42,031,026,176 B  on one GPU\n")
        rows = memory_plan.parse_memory_plan(text)
        self.assertAlmostEqual(memory_plan.saved_split(rows)[0], 20034158592 / 1024 ** 3)
        self.assertEqual(memory_plan.saved_split(rows)[1], 0.0)
        self.assertEqual(memory_plan.quantised_operands(rows), 0.0)

    def test_no_plan(self):
        self.assertEqual(memory_plan.parse_memory_plan("error: precision.recipe: unknown recipe 'x'\n"), {})
        # rows without the total are not a plan either (a cut-off output)
        self.assertEqual(memory_plan.parse_memory_plan(PLAN.split("  total")[0]), {})

    def test_table(self):
        rows = memory_plan.parse_memory_plan(PLAN)
        half = dict(rows)
        half["saved activations"] = (rows["saved activations"][0] // 2, rows["saved activations"][1])
        report = memory_plan.table([("fp8_tensorwise", rows), ("nvfp4", half)], "fp8_tensorwise", "T")
        lines = [l for l in report.splitlines() if l.startswith("| fp8_tensorwise") or l.startswith("| nvfp4")]
        self.assertEqual(len(lines), 2)
        self.assertTrue(lines[0].endswith("| — |"), lines[0])
        self.assertTrue(lines[1].endswith("| 0.500x |"), lines[1])
        self.assertIn("| 37.57 | 0.80 | 14.88 | 13.41 | 1.48 | 2.28 (1.40) |", lines[0])


class RealDryRuns(unittest.TestCase):
    def setUp(self):
        self.train_gpt = os.environ.get("LLM8_TRAIN_GPT")
        if not self.train_gpt:
            self.skipTest("LLM8_TRAIN_GPT is not set (ctest sets it)")

    def plan(self, recipe):
        return memory_plan.dry_run(self.train_gpt, "configs/llama_tiny_bf16.json", 4, recipe,
                                   ["precision.bf16_layers=[]"] if recipe == "nvfp4" else [])

    def test_rows_add_up_and_formats_order(self):
        plans = {r: self.plan(r) for r in ("bf16", "fp8_tensorwise", "nvfp4", "mxfp4")}
        for recipe, rows in plans.items():
            self.assertEqual(sum(b for name, (b, _) in rows.items() if name != "total"), rows["total"][0], recipe)
        saved = {r: rows["saved activations"][0] for r, rows in plans.items()}
        self.assertGreater(saved["bf16"], saved["fp8_tensorwise"])
        self.assertLess(saved["nvfp4"], saved["fp8_tensorwise"])
        self.assertLess(saved["mxfp4"], saved["fp8_tensorwise"])
        self.assertEqual(memory_plan.saved_split(plans["bf16"])[1], 0.0)

    def test_saved_split_adds_up(self):
        # a model large enough for the split's two 0.01-GiB figures: they add up to the row, within their rounding
        rows = memory_plan.dry_run(self.train_gpt, "configs/llama_125m_bf16.json", 8, "fp8_tensorwise", [])
        model_part, quantised = memory_plan.saved_split(rows)
        self.assertGreater(quantised, 0.0)
        self.assertAlmostEqual(model_part + quantised, rows["saved activations"][0] / 1024 ** 3, delta=0.011)

    def test_main_writes_the_table(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            md = os.path.join(d, "plan.md")
            with contextlib.redirect_stdout(io.StringIO()) as out:
                memory_plan.main(["--config", "configs/llama_tiny_bf16.json", "--micro-batch", "2", "--recipes",
                                  "fp8_tensorwise,mxfp4", "--train-gpt", self.train_gpt, "--md", md])
            with open(md) as f:
                self.assertEqual(f.read(), out.getvalue())
            self.assertIn("| mxfp4 |", out.getvalue())

    def test_unknown_recipe_stops_with_the_trainers_message(self):
        with self.assertRaises(SystemExit) as stop:
            memory_plan.dry_run(self.train_gpt, "configs/llama_tiny_bf16.json", 2, "fp5", [])
        self.assertIn("recipe 'fp5'", str(stop.exception))
        self.assertIn("unknown recipe", str(stop.exception))


if __name__ == "__main__":
    unittest.main()
