#!/usr/bin/env python3
"""test/dev/test_bench_tools.py: the host-side logic of the benchmark tools, run from the repository root (no GPU).

dev/bench/bench.py: run specs, the train_gpt overrides (one micro-step per step, or gradient accumulation with the
global batch it implies), the peer's command line with --accum, the recipe label of extra --set overrides, the
results row (one cell per column, accum included) and the JSONL metrics summary (warm-up dropped, median step time,
tokens per step from the records). dev/bench/kernel_profile.py: kernel-name shortening, ncu CSV parsing (units, one
row per kernel in launch order) and the cut into steps at the embedding kernel.
"""

import importlib.util
import json
import os
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load("bench", "dev/bench/bench.py")
kprof = load("kernel_profile", "dev/bench/kernel_profile.py")


def overrides_dict(overrides):
    return dict(o.split("=", 1) for o in overrides)


class BenchOverrides(unittest.TestCase):
    def test_one_micro_step_per_step_by_default(self):
        spec = bench.parse_run_spec("124m:32:1024")
        o = overrides_dict(bench.bench_overrides(spec, "bf16", 30, 5, "/tmp/x.jsonl", "data/*.bin"))
        self.assertEqual(o["train.global_batch_tokens"], "0")
        self.assertEqual(o["train.micro_batch"], "32")
        self.assertEqual(o["train.seq_len"], "1024")
        self.assertEqual(o["train.steps"], "30")
        self.assertEqual(o["train.warmup_steps"], "5")
        self.assertEqual(o["precision.recipe"], "bf16")

    def test_accumulation_sets_the_global_batch(self):
        spec = bench.parse_run_spec("llama-1b:4:2048:2")
        o = overrides_dict(bench.bench_overrides(spec, "fp8_tensorwise", 4, 1, "/tmp/x.jsonl", "d", accum=16))
        self.assertEqual(o["train.global_batch_tokens"], str(16 * 4 * 2048 * 2))
        o1 = overrides_dict(bench.bench_overrides(spec, "fp8_tensorwise", 4, 1, "/tmp/x.jsonl", "d", accum=1))
        self.assertEqual(o1["train.global_batch_tokens"], "0")

    def test_peer_gets_the_same_accumulation(self):
        spec = bench.parse_run_spec("124m:32:1024")
        dims = dict(arch="gpt2", n_layer=12, n_head=12, n_embd=768, max_seq_len=1024, vocab_size=50257)
        cmd = bench.peer_command("python3", dims, spec, 1, 6, accum=16)
        self.assertIn("--accum", cmd)
        self.assertEqual(cmd[cmd.index("--accum") + 1], "16")
        self.assertEqual(cmd[cmd.index("--iters") + 1], "5")
        self.assertNotIn("--accum", bench.peer_command("python3", dims, spec, 1, 6))

    def test_recipe_label_names_extra_overrides(self):
        self.assertEqual(bench.recipe_label("bf16", []), "bf16")
        self.assertEqual(bench.recipe_label("fp8_blockwise", ["precision.cache_weight_transpose=false"]),
                         "fp8_blockwise (precision.cache_weight_transpose=false)")


class BenchResults(unittest.TestCase):
    def row(self, **kw):
        r = dict(model="llama-1b", recipe="bf16", gpus=1, micro_batch=4, accum=16, seq_len=2048,
                 tokens_per_s=70673.2, mfu_bf16=49.0, mfu_fp8=24.5, mem_gib=29.4, loss=8.7703, commit="abc1234",
                 date="2026-11-23 06:15 UTC")
        r.update(kw)
        return r

    def test_row_has_one_cell_per_column_with_accum(self):
        line = bench.result_row(self.row())
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        self.assertEqual(len(cells), len(bench.RESULT_COLUMNS))
        self.assertEqual(cells[bench.RESULT_COLUMNS.index("accum")], "16")
        self.assertEqual(cells[bench.RESULT_COLUMNS.index("micro-batch")], "4")
        self.assertEqual(cells[bench.RESULT_COLUMNS.index("tokens/s")], "70,673")

    def test_missing_values_print_na(self):
        line = bench.result_row(self.row(mfu_bf16=None, mfu_fp8=None, mem_gib=None))
        self.assertIn("n/a", line)

    def test_metrics_median_after_warmup(self):
        records = [{"type": "train", "step": i, "ms": ms, "tokens": 131072, "loss": 10.0 - i, "mem_gib": 29.0 + i / 10}
                   for i, ms in enumerate([5000.0, 1800.0, 1850.0, 1830.0, 9000.0])]
        records.insert(2, {"type": "eval", "step": 2, "val_loss": 7.5})
        m = bench.parse_metrics("\n".join(json.dumps(r) for r in records), warmup=1)
        self.assertEqual(m["timed_steps"], 4)
        self.assertAlmostEqual(m["step_ms"], (1830.0 + 1850.0) / 2)
        self.assertEqual(m["tokens_per_step"], 131072)
        self.assertAlmostEqual(m["tokens_per_s"], 131072 / (1840.0 / 1000.0))
        self.assertAlmostEqual(m["mem_gib"], 29.4)
        self.assertEqual(m["loss"], 6.0)
        self.assertEqual(m["val_loss"], 7.5)

    def test_metrics_without_timed_steps_is_an_error(self):
        text = json.dumps({"type": "train", "step": 0, "ms": 10.0, "tokens": 8})
        with self.assertRaises(ValueError):
            bench.parse_metrics(text, warmup=1)
        with self.assertRaises(ValueError):
            bench.parse_metrics("not json", warmup=0)


NCU_CSV = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","train_gpt","h","encoder_forward_kernel(__nv_bfloat16 *, const int *)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","17,000"
"1","1","train_gpt","h","void llmc::(anonymous namespace)::attention_forward_kernel<64>(float *, int)","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","324.5"
"2","1","train_gpt","h","nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT","1","7","(384, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","138600"
"3","1","train_gpt","h","encoder_forward_kernel(__nv_bfloat16 *, const int *)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","16000"
"4","1","train_gpt","h","void llmc::(anonymous namespace)::attention_forward_kernel<64>(float *, int)","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","320"
"5","1","train_gpt","h","void llmc::adamw_kernel<4>(float *, __nv_bfloat16 *)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","1.5"
'''


class KernelProfile(unittest.TestCase):
    def test_short_names(self):
        self.assertEqual(kprof.short_name("void llmc::(anonymous namespace)::foo_kernel<128, (bool)1>(float *, int)"),
                         "foo_kernel<128, (bool)1>")
        self.assertEqual(kprof.short_name("void llmc::adamw_kernel<4>(float *)"), "adamw_kernel<4>")
        name = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
        self.assertEqual(kprof.short_name(name), name)

    def test_parse_units_and_order(self):
        kernels = kprof.parse_ncu_csv(NCU_CSV)
        self.assertEqual(len(kernels), 6)
        self.assertTrue(kernels[0][0].startswith("encoder_forward_kernel"))
        self.assertAlmostEqual(kernels[0][1], 17000.0)   # "17,000" nsecond
        self.assertAlmostEqual(kernels[1][1], 324500.0)  # usecond -> ns
        self.assertAlmostEqual(kernels[5][1], 1.5e6)     # msecond -> ns

    def test_last_step_starts_at_the_last_embedding_kernel(self):
        step = kprof.last_step(kprof.parse_ncu_csv(NCU_CSV))
        self.assertEqual(len(step), 3)  # the second encoder launch to the end
        self.assertTrue(step[0][0].startswith("encoder_forward_kernel"))
        self.assertAlmostEqual(sum(ns for _, ns in step), 16000 + 320000 + 1.5e6)

    def test_needs_two_steps_and_a_csv(self):
        one_step = "\n".join(NCU_CSV.splitlines()[:5])
        with self.assertRaises(SystemExit):
            kprof.last_step(kprof.parse_ncu_csv(one_step))
        with self.assertRaises(SystemExit):
            kprof.parse_ncu_csv("==PROF== nothing profiled\n")


if __name__ == "__main__":
    unittest.main(verbosity=1)
