#!/usr/bin/env python3
"""test/dev/test_bench_tools.py: the host-side logic of the benchmark tools, run from the repository root (no GPU).

dev/bench/bench.py: run specs, the train_gpt overrides (one micro-step per step, or gradient accumulation with the
global batch it implies), the peer's command line with --accum, the recipe label of extra --set overrides, the
results row (one cell per column, accum and the ours/peer ratio included), an older results file's header brought up
to date with its rows kept, and the JSONL metrics summary (warm-up dropped, median step time, tokens per step from the
records). The llm.c peer: --peer lists, the alternation of ours and the peers over rounds (and the ratio each peer row
gets from ours of its round), llm.c's command line for GPT-2 124M and 350M (the same tokens per step as ours), the
parsing of its step lines, the shard header check, and the error paths (no --llmc-dir, a failing build, a Llama
spec). B=max run specs: the dry-run total, the search for the largest micro-batch that fits (with a fake plan and
over train_gpt's real dry runs). dev/bench/kernel_profile.py: kernel-name shortening, ncu CSV parsing (units, one
row per kernel in launch order), the cut into steps at the embedding kernel, the kernel families and both tables
(also from a step saved with --csv), and --detail (the ncu command for matching launches, several metrics per launch
parsed, n/a values left out, the table with its three largest stall reasons).
"""

import contextlib
import gzip
import importlib.util
import io
import json
import os
import struct
import sys
import tempfile
import types
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


class MaxBatch(unittest.TestCase):
    """B=max: the run spec, the dry-run total it reads, and the search for the largest micro-batch that fits."""

    def test_max_spec(self):
        spec = bench.parse_run_spec("llama-1b:max:2048")
        self.assertEqual(spec.micro_batch, bench.MAX_BATCH)
        self.assertEqual(spec.label(), "llama-1b B=max T=2048 x1")
        with self.assertRaises(ValueError):
            bench.parse_run_spec("llama-1b:0:2048")
        with self.assertRaises(ValueError):
            bench.parse_run_spec("llama-1b:2048:max")

    def test_dry_run_total(self):
        text = ("memory/GPU   29.95 GiB estimated from the allocation plan (coat, ...):\n"
                "  weights              2.00 GiB       2,152,337,408 B  bf16 working copy\n"
                "  total               29.95 GiB      32,160,321,152 B  on one GPU\n")
        self.assertEqual(bench.dry_run_total_bytes(text), 32160321152)
        self.assertIsNone(bench.dry_run_total_bytes("error: no plan"))

    def test_search_finds_the_largest_fit_with_few_dry_runs(self):
        for fixed, per_sample, budget in [(10, 3, 100), (10, 3, 13), (0, 1, 4096), (5, 7, 1000), (1, 1, 10 ** 9)]:
            calls = []

            def planned(b):
                calls.append(b)
                return fixed + per_sample * b
            want = min((budget - fixed) // per_sample, 4096)
            self.assertEqual(bench.largest_micro_batch(planned, budget), want, (fixed, per_sample, budget))
            self.assertLessEqual(len(calls), 2 * 13 + 1)
        self.assertIsNone(bench.largest_micro_batch(lambda b: 100 * b, 99))
        # A refused config (None) counts as not fitting: B=3 is refused, so the answer is 2.
        self.assertEqual(bench.largest_micro_batch(lambda b: b if b < 3 else None, 100), 2)

    def test_search_over_real_dry_runs(self):
        """The search over train_gpt's own memory plan (CPU-only dry runs): llama-tiny under coat plans less per
        sample than under bf16, so more samples fit the same budget, and each answer is the largest that fits."""
        train_gpt = os.environ.get("LLM8_TRAIN_GPT")
        if not train_gpt:
            self.skipTest("LLM8_TRAIN_GPT is not set (ctest sets it)")
        import subprocess

        def planned(recipe):
            def at(b):
                out = subprocess.run([train_gpt, "--config", "configs/llama_tiny_bf16.json", "--set",
                                      f"train.micro_batch={b}", "--set", "train.global_batch_tokens=0", "--set",
                                      f"precision.recipe={recipe}", "--set", "model.n_layer=8", "--dry-run"],
                                     capture_output=True, text=True)
                return bench.dry_run_total_bytes(out.stdout)  # printed before the data checks
            return at
        budget = 3 * 1024 ** 3
        found = {}
        for recipe in ("bf16", "coat"):
            at = planned(recipe)
            b = bench.largest_micro_batch(at, budget)
            self.assertIsNotNone(b, recipe)
            self.assertLessEqual(at(b), budget)
            self.assertGreater(at(b + 1), budget)
            found[recipe] = b
        self.assertGreater(found["coat"], found["bf16"])


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

    def test_peer_rows_carry_ours_per_peer(self):
        cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
        ratio_col = bench.RESULT_COLUMNS.index("ours/peer")
        self.assertEqual(ratio_col, len(bench.RESULT_COLUMNS) - 1)  # last: older rows just lack it
        self.assertEqual(bench.RESULT_COLUMNS.index("commit"), 11)  # compare_builds.sh reads the label there
        ours = cells(bench.result_row(self.row()))
        self.assertEqual(len(ours), len(bench.RESULT_COLUMNS))
        self.assertEqual(ours[ratio_col], "")
        peer = cells(bench.result_row(self.row(recipe="llm.c-bf16", micro_batch=64, accum=8,
                                               ours_per_peer=[("bf16", 1.06345), ("fp8_tensorwise", 1.2712)])))
        self.assertEqual(len(peer), len(bench.RESULT_COLUMNS))
        self.assertEqual(peer[ratio_col], "1.063 (bf16), 1.271 (fp8_tensorwise)")
        self.assertEqual(cells(bench.result_row(self.row(ours_per_peer=[])))[ratio_col], "n/a")

    def test_older_header_is_brought_up_to_date_rows_kept(self):
        old_columns = bench.RESULT_COLUMNS[:-1]
        old_rows = "| gpt2-124m | bf16 | 1 | 32 | 16 | 1024 | 488,064 | 39.4% | 19.7% | 15.5 | 7.9989 | f58f4d1 | d |\n"
        old = ("# llm8 benchmarks on NVIDIA H100 80GB HBM3\n\nold prose\n\n| " + " | ".join(old_columns) + " |\n|"
               + "|".join("---" for _ in old_columns) + "|\n" + old_rows)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "gpu.md")
            with open(path, "w") as f:
                f.write(old)
            bench.append_results(path, "NVIDIA H100 80GB HBM3", [self.row(ours_per_peer=[("bf16", 1.1)])])
            with open(path) as f:
                text = f.read()
        self.assertTrue(text.startswith(bench.results_header("NVIDIA H100 80GB HBM3")))
        self.assertNotIn("old prose", text)
        body = text[len(bench.results_header("NVIDIA H100 80GB HBM3")):].splitlines()
        self.assertEqual(body[0] + "\n", old_rows)
        self.assertTrue(body[1].endswith("| 1.100 (bf16) |"))
        self.assertEqual(bench.with_current_header(text, "NVIDIA H100 80GB HBM3"), text)  # current: unchanged
        with self.assertRaises(ValueError):
            bench.with_current_header("no table here\n", "x")

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


# train_gpt2cu's console output (llm.c f1e2ace, the printf formats of train_gpt2.cu), GPT-2 124M at B=64 x 8.
LLMC_OUTPUT = """\
+-----------------------+----------------------------------------------------+
| Parameter             | Value                                              |
+-----------------------+----------------------------------------------------+
| train data pattern    | data/kjv/kjv_train_*.bin                           |
| batch size B          | 64                                                 |
| total batch size      | 524288                                             |
| recompute             | 0                                                  |
+-----------------------+----------------------------------------------------+
| train_num_batches     | 8                                                  |
| val_num_batches       | 1                                                  |
+-----------------------+----------------------------------------------------+
num_parameters: 124475904 => bytes: 248951808
allocated 237 MiB for model parameters
batch_size B=64 * seq_len T=1024 * num_processes=1 and total_batch_size=524288
=> setting grad_accum_steps=8
WARNING: Failed to open the tokenizer file gpt2_tokenizer.bin
allocating 237 MiB for parameter gradients
allocating 21216 MiB for activations
allocating 474 MiB for AdamW optimizer state m
allocating 474 MiB for AdamW optimizer state v
allocating 474 MiB for master copy of params
device memory usage: 24196 MiB / 81008 MiB
memory per sequence: 331 MiB
 -> estimated maximum batch size: 168
val loss 11.009873
step    1/8 | loss 11.010612 (+nanz)| norm 15.2412 (+nanz)| lr 3.00e-04 | 1620.55 ms | 31.9% bf16 MFU | 323522 tok/s
step    2/8 | loss 9.912345 (+nanz)| norm 6.1234 (+nanz)| lr 3.00e-04 | 1010.00 ms | 51.2% bf16 MFU | 519097 tok/s
step    3/8 | loss 9.401234 (+nanz)| norm 3.0012 (+nanz)| lr 3.00e-04 | 1004.00 ms | 51.5% bf16 MFU | 520647 tok/s
step    4/8 | loss 8.901234 (+1.10z)| norm 2.5012 (+0.30z)| lr 3.00e-04 | 1006.00 ms | 51.4% bf16 MFU | 521006 tok/s
step    5/8 | loss 8.501234 (+0.90z)| norm 2.1012 (-0.20z)| lr 3.00e-04 | 1002.00 ms | 51.6% bf16 MFU | 521645 tok/s
step    6/8 | loss 8.101234 (+0.70z)| norm 1.9012 (-0.40z)| lr 3.00e-04 | 1050.00 ms | 49.3% bf16 MFU | 517234 tok/s
step    7/8 | loss 7.801234 (+0.50z)| norm 1.7012 (-0.50z)| lr 3.00e-04 | 1004.00 ms | 51.5% bf16 MFU | 518098 tok/s
step    8/8 | loss 7.601234 (+0.40z)| norm 1.6012 (-0.60z)| lr 3.00e-04 | 1003.00 ms | 51.6% bf16 MFU | 518834 tok/s
val loss 7.512345
total average iteration time: 1011.285714 ms
"""

GPT2_124M = dict(arch="gpt2", n_layer=12, n_head=12, n_embd=768, max_seq_len=1024, vocab_size=50257)
GPT2_350M = dict(arch="gpt2", n_layer=24, n_head=16, n_embd=1024, max_seq_len=1024, vocab_size=50257)
LLAMA_1B = dict(arch="llama", n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, ffn_hidden=8192, max_seq_len=2048,
                vocab_size=50257, rope_theta=500000.0, tied_embeddings=True)


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def write_shard(path, magic, version, count):
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", magic, version, count) + bytes(256 * 4 - 12) + bytes(2 * count))


def quiet_main(argv):
    """bench.main with its output captured: (exit code, stdout, stderr); argparse errors give code 2."""
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = bench.main(argv)
    except SystemExit as e:
        code = e.code
    finally:
        os.chdir(cwd)
    return code, out.getvalue(), err.getvalue()


class LlmcPeer(unittest.TestCase):
    def test_parse_output_median_of_step_times_after_warmup(self):
        out = bench.parse_llmc_output(LLMC_OUTPUT, warmup=3)
        self.assertEqual(out["timed_steps"], 5)
        self.assertAlmostEqual(out["step_ms"], 1004.0)  # median of 1006, 1002, 1050, 1004, 1003
        self.assertEqual(out["tokens_per_step"], 524288)
        self.assertAlmostEqual(out["tokens_per_s"], 524288 / 1.004)
        self.assertEqual((out["micro_batch"], out["grad_accum"]), (64, 8))
        self.assertAlmostEqual(out["mem_gib"], 24196 / 1024)
        self.assertAlmostEqual(out["loss"], 7.601234)
        self.assertAlmostEqual(out["llmc_mfu"], 51.5)
        self.assertEqual(out["printed_tok_s"], 518834)  # its moving average, kept aside
        self.assertEqual(out["last_step"], 8)
        self.assertFalse(out["managed_memory"])

    def test_parse_output_errors(self):
        with self.assertRaises(ValueError):  # no batch line: not llm.c's output
            bench.parse_llmc_output("step    1/8 | loss 1.0 | 10.0 ms | 1.0% bf16 MFU | 10 tok/s\n", warmup=0)
        with self.assertRaises(ValueError):  # every step is warm-up
            bench.parse_llmc_output(LLMC_OUTPUT, warmup=8)

    def test_124m_runs_llmc_micro_batch_with_our_tokens_per_step(self):
        spec = bench.parse_run_spec("124m:32:1024")
        plan = bench.llmc_plan(GPT2_124M, spec, accum=16)
        self.assertEqual((plan.model, plan.micro_batch, plan.accum), ("d12", 64, 8))
        cmd = bench.llmc_command("/p/train_gpt2cu", plan, 8, "data/kjv/kjv_train_*.bin", "/w/out")
        ours = 16 * spec.micro_batch * spec.seq_len
        self.assertEqual(int(flag(cmd, "-d")), ours)
        self.assertEqual(int(flag(cmd, "-b")) * int(flag(cmd, "-t")) * plan.accum, ours)
        self.assertEqual((flag(cmd, "-e"), flag(cmd, "-b"), flag(cmd, "-t"), flag(cmd, "-x")), ("d12", "64", "1024", "8"))
        self.assertEqual(flag(cmd, "-i"), "data/kjv/kjv_train_*.bin")
        self.assertEqual(flag(cmd, "-j"), flag(cmd, "-i"))  # the validation loader needs B*T+1 tokens per shard
        self.assertEqual(flag(cmd, "-r"), "0")
        self.assertGreater(int(flag(cmd, "-v")), 8)  # never 0 (llm.c divides by it), no validation inside the run
        self.assertEqual(cmd[0], "/p/train_gpt2cu")

    def test_350m_runs_llmc_micro_batch_with_our_tokens_per_step(self):
        spec = bench.parse_run_spec("350m:16:1024")
        for accum, llmc_accum in ((32, 16), (16, 8)):
            plan = bench.llmc_plan(GPT2_350M, spec, accum=accum)
            cmd = bench.llmc_command("train_gpt2cu", plan, 8, "d*.bin", "o")
            self.assertEqual((flag(cmd, "-e"), flag(cmd, "-b")), ("d24", "32"))
            self.assertEqual(int(flag(cmd, "-d")), accum * 16 * 1024)
            self.assertEqual(plan.accum, llmc_accum)

    def test_resolved_sizes_match_llmc_models(self):
        spec = bench.parse_run_spec("124m:32:1024")
        for ffn in (3072, 0):  # the resolved config's width, or 0 = the family's default 4C
            self.assertEqual(bench.llmc_plan(dict(GPT2_124M, ffn_hidden=ffn), spec, 16).model, "d12")
        with self.assertRaisesRegex(bench.PeerUnsupported, "no model"):
            bench.llmc_plan(dict(GPT2_124M, ffn_hidden=2048), spec, 16)
        with self.assertRaisesRegex(bench.PeerUnsupported, "no model"):
            bench.llmc_plan(dict(GPT2_124M, vocab_size=32000), spec, 16)

    def test_our_micro_batch_when_llmc_one_does_not_divide_the_step(self):
        plan = bench.llmc_plan(GPT2_124M, bench.parse_run_spec("124m:32:1024"), accum=1)
        self.assertEqual((plan.micro_batch, plan.tokens_per_step, plan.accum), (32, 32768, 1))

    def test_what_llmc_cannot_train_is_unsupported(self):
        with self.assertRaisesRegex(bench.PeerUnsupported, "GPT-2 only"):
            bench.llmc_plan(LLAMA_1B, bench.parse_run_spec("llama-1b:8:2048"), 1)
        with self.assertRaisesRegex(bench.PeerUnsupported, "no model"):
            bench.llmc_plan(dict(GPT2_124M, n_layer=10), bench.parse_run_spec("x:8:1024"), 1)
        with self.assertRaisesRegex(bench.PeerUnsupported, "positions"):
            bench.llmc_plan(GPT2_124M, bench.parse_run_spec("124m:8:2048"), 1)
        with self.assertRaisesRegex(bench.PeerUnsupported, "GPUs"):
            bench.llmc_plan(GPT2_124M, bench.parse_run_spec("124m:8:1024:2"), 1)

    def test_shard_header_check(self):
        with tempfile.TemporaryDirectory() as tmp:
            good = os.path.join(tmp, "a_train_000000.bin")
            write_shard(good, 20240520, 1, 70000)
            self.assertIsNone(bench.check_llmc_shards(os.path.join(tmp, "a_*.bin"), 64 * 1024 + 1))
            error = bench.check_llmc_shards(os.path.join(tmp, "a_*.bin"), 128 * 1024 + 1)
            self.assertIn("B*T+1", error)
            write_shard(os.path.join(tmp, "b_train_000000.bin"), 20240801, 7, 10)
            error = bench.check_llmc_shards(os.path.join(tmp, "b_*.bin"), 1)
            self.assertIn("magic 20240801 version 7", error)
            self.assertIn("--uint32", error)
            self.assertIn("no shards", bench.check_llmc_shards(os.path.join(tmp, "c_*.bin"), 1))

    def test_build_failure_names_its_log(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertIn("tar -xzf", bench.ensure_llmc_binary(tmp, 60)[1])  # no Makefile: how to extract
            with open(os.path.join(tmp, "Makefile"), "w") as f:
                f.write("train_gpt2cu:\n\t@echo 'nvcc fatal   : Unsupported gpu architecture'; exit 3\n")
            with contextlib.redirect_stdout(io.StringIO()):
                binary, error = bench.ensure_llmc_binary(tmp, 60, jobs=1)
            log = os.path.join(tmp, "train_gpt2cu.build.log")
            self.assertIsNone(binary)
            self.assertIn("building llm.c failed", error)
            self.assertIn(log, error)
            self.assertIn("Unsupported gpu architecture", error)
            self.assertTrue(os.path.exists(log))

    def test_build_when_missing_then_reuse(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "Makefile"), "w") as f:
                f.write("train_gpt2cu:\n\tprintf '#!/bin/sh\\n' > $@ && chmod +x $@ && echo built >> count\n")
            with contextlib.redirect_stdout(io.StringIO()):
                for _ in range(2):
                    binary, error = bench.ensure_llmc_binary(tmp, 60, jobs=1)
                    self.assertIsNone(error)
                    self.assertEqual(binary, os.path.join(tmp, "train_gpt2cu"))
            with open(os.path.join(tmp, "count")) as f:
                self.assertEqual(f.read().split(), ["built"])  # built once

    def test_peer_list(self):
        self.assertEqual(bench.parse_peers("torch"), ["torch"])
        self.assertEqual(bench.parse_peers("none"), [])
        self.assertEqual(bench.parse_peers("torch,llmc"), ["torch", "llmc"])
        self.assertEqual(bench.parse_peers("llmc, torch,llmc"), ["llmc", "torch"])
        for bad in ("bogus", "none,llmc", ""):
            with self.assertRaises(ValueError):
                bench.parse_peers(bad)

    def test_llmc_needs_an_extracted_copy(self):
        code, _, err = quiet_main(["--dry", "--runs", "124m:32:1024", "--peer", "torch,llmc"])
        self.assertEqual(code, 2)
        self.assertIn("--llmc-dir", err)
        with tempfile.TemporaryDirectory() as tmp:
            code, _, err = quiet_main(["--dry", "--runs", "124m:32:1024", "--peer", "llmc", "--llmc-dir", tmp])
        self.assertEqual(code, 2)
        self.assertIn("no Makefile", err)

    def test_llama_spec_skips_llmc_with_a_note(self):
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, "Makefile"), "w").close()
            code, out, _ = quiet_main(["--dry", "--runs", "llama-1b:8:2048,124m:32:1024", "--accum", "16",
                                       "--peer", "torch,llmc", "--llmc-dir", tmp])
        self.assertEqual(code, 0)
        self.assertIn("note: no llm.c peer for llama-1b B=8 T=2048 x1: llm.c trains GPT-2 only", out)
        llmc_lines = [l for l in out.splitlines() if l.startswith(os.path.join(tmp, "train_gpt2cu"))]
        self.assertEqual(len(llmc_lines), 1)  # the 124M spec only
        self.assertIn("-d 524288", llmc_lines[0])
        self.assertIn("round 1: ours, torch; round 2: torch, ours", out)  # llama: the PyTorch peer only


class Rounds(unittest.TestCase):
    def test_order_alternates(self):
        self.assertEqual(bench.run_order(2, ["torch", "llmc"]),
                         [["ours", "torch", "llmc"], ["llmc", "torch", "ours"]])
        self.assertEqual(bench.run_order(3, ["llmc"]), [["ours", "llmc"], ["llmc", "ours"], ["ours", "llmc"]])
        self.assertEqual(bench.run_order(1, []), [["ours"]])  # --peer none: one run, as without rounds

    def test_runs_alternate_and_peer_rows_get_the_ratio_of_their_round(self):
        calls, recorded = [], []
        speeds = {"bf16": [550000.0, 560000.0], "llmc": [500000.0, 520000.0], "torch": [450000.0, 460000.0]}

        def outcome(who, recipe, round_index):
            calls.append((round_index, who))
            return bench.Outcome(True, row=dict(recipe=recipe, tokens_per_s=speeds[who][round_index]))

        def fake_ours(args, spec, recipe, gpu_name, workdir, commit, date, round_index=0):
            return outcome(recipe, recipe, round_index), GPT2_124M

        saved = (bench.run_ours, bench.run_torch, bench.run_llmc, bench.record)
        bench.run_ours = fake_ours
        bench.run_torch = lambda *a: outcome("torch", bench.PEER_RECIPE, a[-1])
        bench.run_llmc = lambda *a: outcome("llmc", bench.LLMC_RECIPE, a[-1])
        bench.record = lambda o, *a: recorded.append(o)
        try:
            args = types.SimpleNamespace(rounds=2, steps=8, warmup=3, accum=16, configs="configs", no_record=True)
            with contextlib.redirect_stdout(io.StringIO()):
                res = bench.run_spec(args, bench.parse_run_spec("124m:32:1024"), ["bf16"], ["torch", "llmc"],
                                     "train_gpt2cu", "NVIDIA H100 80GB HBM3", "/w", "abc", "d", "r.md", "r.jsonl")
        finally:
            bench.run_ours, bench.run_torch, bench.run_llmc, bench.record = saved
        self.assertEqual(calls, [(0, "bf16"), (0, "torch"), (0, "llmc"), (1, "llmc"), (1, "torch"), (1, "bf16")])
        self.assertEqual([o.row["recipe"] for o in recorded],
                         ["bf16", bench.PEER_RECIPE, bench.LLMC_RECIPE, bench.LLMC_RECIPE, bench.PEER_RECIPE, "bf16"])
        self.assertEqual(recorded[2].row["ours_per_peer"], [("bf16", 550000.0 / 500000.0)])
        self.assertEqual(recorded[3].row["ours_per_peer"], [("bf16", 560000.0 / 520000.0)])
        self.assertNotIn("ours_per_peer", recorded[0].row)
        self.assertEqual(len(res.ours["bf16"]), 2)
        self.assertEqual(len(res.peers["llmc"]), 2)

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

    def test_families(self):
        for name, family in (("<unnamed>::fp4_run_kernel<16>", "quantisation"), ("quantize_tile_kernel<1>", "quant"),
                             ("void llmc::(anonymous namespace)::attention_forward_sm90_kernel<64>(float *)",
                              "attention"), ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "GEMMs"),
                             ("cublasLt::splitKreduce_kernel<32, 16, int>", "GEMMs"),
                             ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", "GEMMs"),
                             ("<unnamed>::nvfp4_gemm_alpha_kernel", "GEMMs"),
                             ("<unnamed>::rotated_column_amax_kernel", "quantisation"),
                             ("adamw_kernel<llmc::Fp32Moments, 4>", "optimizer"),
                             ("fp8_adamw_expand_cuda_kernel", "optimizer"), ("fused_residual_rmsnorm_kernel", "Norm"),
                             ("gelu_backward_inplace_kernel<llmc::Bf16Loader>", "GELU"), ("rope_kernel", "RoPE"),
                             ("fused_classifier_smem_kernel", "classifier"), ("wte_backward_kernel", "embeddings"),
                             ("hash_words_kernel", "other")):
            with self.subTest(name=name):
                self.assertIn(family, kprof.category(name))

    def test_tables_and_from_csv(self):
        step = kprof.last_step(kprof.parse_ncu_csv(NCU_CSV))
        text = kprof.tables(step, top=1)
        self.assertIn("one step: 3 kernels, 1.84 ms of kernel time", text)
        lines = text.splitlines()
        self.assertEqual(lines[3].split(), ["1.500", "81.7%", "1", "adamw_kernel<4>"])
        self.assertEqual(lines[4].split()[:3], ["0.336", "18.3%", "2"])  # the other two kernels, summed
        families = lines[lines.index(next(line for line in lines if line.endswith("family"))) + 1:]
        self.assertEqual([" ".join(line.split()[3:]) for line in families],
                         ["optimizer and gradient norm", "attention", "embeddings"])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "step.csv")
            with open(path, "w") as f:
                f.write("launch,kernel,ns\n")
                for i, (name, ns) in enumerate(step):
                    f.write(f'{i},"{name}",{ns:.0f}\n')
            self.assertEqual(kprof.tables(kprof.read_step_csv(path), 1), text)
            with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:  # the recorded profiles are gzipped
                g.write(f.read())
            self.assertEqual(kprof.tables(kprof.read_step_csv(path + ".gz"), 1), text)
            with open(path, "w") as f:
                f.write("a,b\n1,2\n")
            with self.assertRaises(SystemExit):
                kprof.read_step_csv(path)

    def test_detail_metrics_and_table(self):
        head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
                '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')

        def row(i, name, metric, unit, value):
            return f'"{i}","1","train_gpt","h","{name}","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","",' \
                   f'"{metric}","{unit}","{value}"\n'
        remap = "void llmc::(anonymous namespace)::mxfp4_to_e4m3_kernel(unsigned char *, float *)"
        text = "==PROF== Connected\n" + head
        text += row(0, remap, "gpu__time_duration.sum", "nsecond", "65,888")
        text += row(0, remap, "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "12.5")
        text += row(0, remap, "smsp__inst_executed.sum", "inst", "33,554,432")
        text += row(0, remap, kprof.stall_metric("long_scoreboard"), "", "3.25")
        text += row(0, remap, kprof.stall_metric("wait"), "", "1.5")
        text += row(0, remap, kprof.stall_metric("barrier"), "", "n/a")
        text += row(0, remap, kprof.stall_metric("math_pipe_throttle"), "", "4.75")
        text += row(0, remap, kprof.stall_metric("not_selected"), "", "0.5")
        text += row(1, remap, "gpu__time_duration.sum", "nsecond", "26400")
        launches = kprof.parse_ncu_metrics(text)
        self.assertEqual(len(launches), 2)
        self.assertAlmostEqual(launches[0][1]["gpu__time_duration.sum"], 65888.0)
        self.assertNotIn(kprof.stall_metric("barrier"), launches[0][1])  # n/a is left out
        lines = kprof.detail_table(launches).splitlines()
        self.assertEqual(len(lines), 3)
        first = lines[1].split()
        self.assertEqual(first[:4], ["0", "65.9", "12.5", "-"])  # us, DRAM%, SM% missing
        self.assertIn("33.6", first)  # million warp instructions
        self.assertTrue(lines[1].endswith("mxfp4_to_e4m3_kernel; math_pipe_throttle 4.75, long_scoreboard 3.25, "
                                          "wait 1.50"))
        self.assertTrue(lines[2].endswith("mxfp4_to_e4m3_kernel; "))  # no stall metrics: none listed
        with self.assertRaises(SystemExit):
            kprof.parse_ncu_metrics("==PROF== nothing matched\n")

    def test_detail_command(self):
        args = types.SimpleNamespace(ncu="ncu", train_gpt="build/train_gpt", config="c.json", detail="fp4_run",
                                     detail_skip=3, detail_count=2)
        cmd = kprof.ncu_command(args, ["train.steps=2"])
        metrics = cmd[cmd.index("--metrics") + 1].split(",")
        self.assertIn("gpu__time_duration.sum", metrics)
        self.assertIn(kprof.stall_metric("long_scoreboard"), metrics)
        self.assertEqual(cmd[cmd.index("--kernel-name") + 1], "regex:fp4_run")
        self.assertEqual(cmd[cmd.index("--launch-skip") + 1], "3")
        self.assertEqual(cmd[cmd.index("--launch-count") + 1], "2")
        self.assertEqual(cmd[-4:], ["--config", "c.json", "--set", "train.steps=2"])
        args.detail = None
        cmd = kprof.ncu_command(args, [])
        self.assertEqual(cmd[cmd.index("--metrics") + 1], "gpu__time_duration.sum")
        self.assertNotIn("--kernel-name", cmd)

    def test_run_overrides_train_on_data(self):
        """The profiled run trains on --data (the bench's KJV shards by default), the user's --set last; a --data that
        matches no shard stops before ncu runs."""
        args = types.SimpleNamespace(steps=3, data=bench.DEFAULT_DATA, set=["train.micro_batch=16"])
        o = kprof.run_overrides(args)
        self.assertIn("data.train=" + bench.DEFAULT_DATA, o)
        self.assertIn("train.steps=3", o)
        self.assertEqual(o[-1], "train.micro_batch=16")
        argv = sys.argv
        try:
            sys.argv = ["kernel_profile.py", "--config", "configs/llama_1b_bf16.json", "--ncu", "/nonexistent/ncu",
                        "--data", "/nonexistent/shard_*.bin"]
            with self.assertRaises(SystemExit) as cm:
                kprof.main()
            self.assertIn("no training shards for --data /nonexistent/shard_*.bin", str(cm.exception))
        finally:
            sys.argv = argv

    def test_needs_two_steps_and_a_csv(self):
        one_step = "\n".join(NCU_CSV.splitlines()[:5])
        with self.assertRaises(SystemExit):
            kprof.last_step(kprof.parse_ncu_csv(one_step))
        with self.assertRaises(SystemExit):
            kprof.parse_ncu_csv("==PROF== nothing profiled\n")


if __name__ == "__main__":
    unittest.main(verbosity=1)
