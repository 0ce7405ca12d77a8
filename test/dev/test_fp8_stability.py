#!/usr/bin/env python3
"""test/dev/test_fp8_stability.py: the FP8 stability grid (scripts/repro/fp8_stability.sh) and its analyser
(scripts/repro/fp8_stability_report.py, scripts/repro/runlog.py), on CPU, run from the repository root.

The analyser on synthetic run directories: loss spikes counted by the documented definition (window 50, > 0.5 nats
above the median, consecutive steps one spike, skipped steps and the first 50 steps never spikes, exactly 0.5 not a
spike); divergence from the guard (the log's message, or the skip records alone), from a non-finite final loss and
from a final loss above the initial one; a failed run and a missing one told apart from divergence; skipped steps
counted; the per-cell means and the relative-loss arithmetic against BF16 of the same seed; the Markdown table; the
check "FP8 diverges in no cell where BF16 does not" and --check's exit code; the heat map (or its note without
matplotlib); no runs is an error. The script's --dry: the grid size, one command per cell with the right --set
overrides, the same data and seed across recipes, unknown recipe / model / corpus rejected, and the estimate from
train_gpt --dry-run's FLOPs within an H100-hour where the binary is built (LLM8_TRAIN_GPT, set by CTest).
"""
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "repro", "fp8_stability.sh")
REPORT = os.path.join(REPO_ROOT, "scripts", "repro", "fp8_stability_report.py")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, os.path.dirname(REPORT))
runlog = load("runlog", os.path.join(os.path.dirname(REPORT), "runlog.py"))
report = load("fp8_stability_report", REPORT)


def make_run(root, model, recipe, lr, seed, losses, evals=(), skips=(), exit_code=0, log="", max_skipped=5):
    """A run directory as fp8_stability.sh leaves it. losses: list of per-step losses (None = skipped step);
    evals: [(step, val_loss or None)]; skips: [(step, consecutive)]; exit_code None = no exit_code file."""
    d = os.path.join(root, model, recipe, f"lr{lr:g}_seed{seed}")
    os.makedirs(d)
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump({"model": model, "recipe": recipe, "lr": lr, "seed": seed, "steps": len(losses),
                   "tokens_per_step": 1000, "max_skipped_steps": max_skipped}, f)
    records = []
    skip_at, eval_at = dict(skips), dict(evals)
    if 0 in eval_at:
        records.append({"type": "eval", "step": 0, "val_loss": eval_at[0]})
    # As train_gpt writes them: a skipped step's skip record, then its train record (loss null); the step that trips
    # the divergence guard has its skip record only (the run stops before logging it).
    for i in range(1, max([len(losses), *skip_at]) + 1):
        if i in skip_at:
            records.append({"type": "skip", "step": i, "loss": None, "grad_norm": None, "consecutive": skip_at[i]})
        if i <= len(losses):
            records.append({"type": "train", "step": i, "loss": losses[i - 1], "lr": lr, "norm": 1.0, "ms": 10.0,
                            "tokens": 1000})
        if i in eval_at:
            records.append({"type": "eval", "step": i, "val_loss": eval_at[i]})
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    with open(os.path.join(d, "train.log"), "w") as f:
        f.write(log)
    if exit_code is not None:
        with open(os.path.join(d, "exit_code"), "w") as f:
            f.write(f"{exit_code}\n")
    return d


def flat(n, value=2.0):
    return [value] * n


class TestSpikes(unittest.TestCase):
    def test_definition(self):
        losses = [(i, 2.0) for i in range(1, 61)]
        losses[9] = (10, 5.0)                        # a jump in the first 50 steps: not judged
        losses += [(61, 3.0), (62, 3.1), (63, 2.0)]  # one spike of two steps
        losses += [(64, None), (65, 2.0)]            # a skipped step: never a spike
        losses += [(i, 2.0) for i in range(66, 80)]
        losses += [(80, 2.6), (81, 2.0), (82, 2.5), (83, 2.0), (84, 2.51)]  # 2.5: exactly 0.5 above, not a spike
        self.assertEqual(runlog.spike_steps(losses), [61, 80, 84])
        self.assertEqual(runlog.spike_steps([(i, 10.0 - i * 0.01) for i in range(1, 200)]), [])
        self.assertEqual((runlog.SPIKE_WINDOW, runlog.SPIKE_THRESHOLD), (50, 0.5))

    def test_window_is_the_previous_50_finite_losses(self):
        # 50 steps at 4.0, then 50 at 2.0: the median of the previous 50 is 2.0 from step 101 on.
        losses = [(i, 4.0) for i in range(1, 51)] + [(i, 2.0) for i in range(51, 101)] + [(101, 2.6)]
        self.assertEqual(runlog.spike_steps(losses), [101])
        self.assertEqual(runlog.spike_steps(losses[:60] + [(61, 4.4)]), [])  # median still 4.0 there

    def test_relative_and_median(self):
        self.assertAlmostEqual(runlog.relative_pct(2.01, 2.0), 0.5)
        self.assertAlmostEqual(runlog.relative_pct(1.98, 2.0), -1.0)
        self.assertIsNone(runlog.relative_pct(None, 2.0))
        self.assertIsNone(runlog.relative_pct(2.0, None))
        self.assertEqual(runlog.median([3, 1, 2]), 2)
        self.assertEqual(runlog.median([4, 1, 2, 3]), 2.5)


class TestReport(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="test_fp8_stability_")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.runs = os.path.join(self.tmp, "runs")

    def run_report(self, *args):
        return subprocess.run([sys.executable, REPORT, self.runs, *args], capture_output=True, text=True,
                              cwd=REPO_ROOT, timeout=120)

    def test_statuses(self):
        m = "gpt2-mini"
        spiky = flat(60) + [3.0, 3.0] + flat(20) + [2.7] + flat(17)  # two spikes, 100 steps
        ok = make_run(self.runs, m, "bf16", 1e-3, 1, spiky, evals=[(0, 10.9), (100, 2.0)])
        guard = make_run(self.runs, m, "fp8_delayed", 1e-3, 1, flat(40) + [None] * 4,
                         skips=[(41, 1), (42, 2), (43, 3), (44, 4), (45, 5)], exit_code=1,
                         log="step 45/100 | skipped\nerror: training diverged: 5 consecutive steps ...\n")
        guard_jsonl_only = make_run(self.runs, m, "fp8_blockwise", 1e-3, 1, flat(40),
                                    skips=[(41, 1), (42, 2), (43, 3)], exit_code=1, max_skipped=3)
        nonfinite = make_run(self.runs, m, "fp8_tensorwise", 1e-3, 1, flat(100), evals=[(0, 10.9), (100, None)])
        above = make_run(self.runs, m, "fp8_tensorwise", 1e-3, 2, flat(100, 11.5), evals=[(0, 10.9), (100, 11.2)])
        above_no_eval = make_run(self.runs, m, "fp8_delayed", 1e-3, 2, [10.0] + flat(98) + [10.5])  # a spike too
        failed = make_run(self.runs, m, "bf16", 1e-3, 2, flat(10), exit_code=1, log="error: out of memory\n")
        missing = make_run(self.runs, m, "bf16", 1e-3, 3, flat(10), exit_code=None)
        some_skips = make_run(self.runs, m, "fp8_blockwise", 1e-3, 2, flat(30) + [None] + flat(69),
                              skips=[(31, 1)], evals=[(0, 10.9), (100, 2.1)])
        results = {r["dir"]: r for r in report.find_runs(self.runs)}
        expect = {ok: ("ok", 2, 0, 2.0), guard: ("diverged", 0, 5, 2.0), guard_jsonl_only: ("diverged", 0, 3, 2.0),
                  nonfinite: ("diverged", 0, 0, None), above: ("diverged", 0, 0, 11.2),
                  above_no_eval: ("diverged", 1, 0, 10.5), failed: ("failed", 0, 0, 2.0),
                  missing: ("missing", 0, 0, 2.0), some_skips: ("ok", 0, 1, 2.1)}
        for d, (status, spikes, skipped, final) in expect.items():
            with self.subTest(run=os.path.relpath(d, self.runs)):
                r = results[d]
                self.assertEqual((r["status"], r["spikes"], r["skipped"]), (status, spikes, skipped), r)
                if final is None:
                    self.assertIsNone(r["final"])
                else:
                    self.assertAlmostEqual(r["final"], final)
        self.assertIn("guard", results[guard]["reason"])
        self.assertIn("above the initial", results[above]["reason"])
        self.assertIn("non-finite", results[nonfinite]["reason"])

    def test_table_relative_loss_and_check(self):
        m, lr = "llama-mini", 2.4e-3
        # seed 1: bf16 2.0, tensorwise 2.01 (+0.5%); seed 2: bf16 2.0, tensorwise 1.98 (-1.0%): mean -0.25%.
        for seed, fp8 in ((1, 2.01), (2, 1.98)):
            make_run(self.runs, m, "bf16", lr, seed, flat(100), evals=[(0, 10.9), (100, 2.0)])
            make_run(self.runs, m, "fp8_tensorwise", lr, seed, flat(100), evals=[(0, 10.9), (100, fp8)])
        # seed 3: both diverge (no violation); at the higher lr seed 1 only FP8 diverges (a violation).
        make_run(self.runs, m, "bf16", lr, 3, flat(10), skips=[(11, 5)], exit_code=1, log="training diverged")
        make_run(self.runs, m, "fp8_tensorwise", lr, 3, flat(10), skips=[(11, 5)], exit_code=1,
                 log="training diverged")
        make_run(self.runs, m, "bf16", 4.8e-3, 1, flat(100), evals=[(0, 10.9), (100, 2.2)])
        make_run(self.runs, m, "fp8_tensorwise", 4.8e-3, 1, flat(10), skips=[(11, 5)], exit_code=1,
                 log="training diverged")
        runs = report.find_runs(self.runs)
        summary, violations = report.summarise(runs)
        cell = summary[m][(lr, "fp8_tensorwise")]
        self.assertAlmostEqual(cell["rel"], -0.25)
        self.assertAlmostEqual(cell["final"], (2.01 + 1.98) / 2)
        self.assertEqual((cell["diverged"], cell["runs"], cell["skipped"]), (1, 3, 1))
        self.assertEqual(violations, [(m, 4.8e-3, 1, "fp8_tensorwise")])

        proc = self.run_report("--out", os.path.join(self.tmp, "stab"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(self.tmp, "stab.md")) as f:
            text = f.read()
        self.assertIn("| 0.0024 | bf16 | 2.0000 | — | 0 | 1 | 1/3 | 3 |", text)
        self.assertIn("| 0.0024 | fp8_tensorwise | 1.9950 | -0.25% | 0 | 1 | 1/3 | 3 |", text)
        self.assertIn("| 0.0048 | fp8_tensorwise | — | — | 0 | 1 | 1/1 | 1 |", text)
        self.assertIn("| llama-mini | 0.0024 | 2 | fp8_tensorwise | 1.9800 | 0 | 0 | ok |", text)
        self.assertIn("Check FAILED: FP8 diverges where BF16 does not: llama-mini lr 0.0048 seed 1 fp8_tensorwise",
                      text)
        # The bf16 row comes before the FP8 rows of its learning rate.
        self.assertLess(text.index("| 0.0024 | bf16 |"), text.index("| 0.0024 | fp8_tensorwise |"))
        try:
            import matplotlib  # noqa: F401
            self.assertTrue(os.path.getsize(os.path.join(self.tmp, "stab.png")) > 0)
        except ImportError:
            self.assertIn("heat map skipped: matplotlib is not installed", proc.stdout)
        self.assertEqual(self.run_report("--check", "--out", os.path.join(self.tmp, "s2")).returncode, 1)

    def test_check_passes_and_default_output(self):
        for recipe in ("bf16", "fp8_blockwise"):
            make_run(self.runs, "gpt2-mini", recipe, 1e-3, 1, flat(100), evals=[(100, 2.0)])
        proc = self.run_report("--check")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Check: FP8 diverges in no (model, lr, seed) where BF16 does not.", proc.stdout)
        self.assertTrue(os.path.exists(os.path.join(self.runs, "stability.md")))

    def test_errors(self):
        proc = self.run_report()
        self.assertEqual(proc.returncode, 2)
        self.assertIn("is not a directory", proc.stderr)
        os.makedirs(self.runs)
        proc = self.run_report()
        self.assertEqual(proc.returncode, 2)
        self.assertIn("no run directories", proc.stderr)
        d = make_run(self.runs, "gpt2-mini", "bf16", 1e-3, 1, flat(5))
        with open(os.path.join(d, "metrics.jsonl"), "a") as f:
            f.write("not json\n{}\n")
        proc = self.run_report()
        self.assertEqual(proc.returncode, 2)
        self.assertIn("metrics.jsonl:6: not a JSON line", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)


def train_gpt():
    path = os.environ.get("LLM8_TRAIN_GPT") or os.path.join(REPO_ROOT, "build", "train_gpt")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def run_script(script, *args, env_binary=True):
    env = dict(os.environ)
    env.pop("TRAIN_GPT", None)
    binary = train_gpt()
    if env_binary and binary:
        env["TRAIN_GPT"] = binary
    elif not env_binary:
        env["TRAIN_GPT"] = "/nonexistent/train_gpt"
    return subprocess.run(["bash", script, *args], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                          timeout=300)


def commands(stdout):
    return [shlex.split(line) for line in stdout.splitlines() if "train_gpt " in line and "--config" in line]


def overrides(cmd):
    """{key: value} of a command's --set arguments (the last one wins, as in train_gpt)."""
    out = {}
    for flag, value in zip(cmd, cmd[1:]):
        if flag == "--set":
            key, _, v = value.partition("=")
            out[key] = v
    return out


class TestStabilityGpus(unittest.TestCase):
    """--gpus: every cell's command goes to OUT/jobs.txt with its exit code written by the job, the cells train over
    the GPUs at once (scripts/repro/gpu_queue.py), and the report covers them; train_gpt is test/dev/fake_train_gpt.py.
    A cell that fails for another reason than divergence is named after the others have run (exit 1)."""

    def setUp(self):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import fake_train_gpt
        self.data, self.out = fake_train_gpt.workspace(self, "test_stability_gpus_")
        self.fake = fake_train_gpt.PATH

    def grid(self, *args, **env):
        e = dict(os.environ, TRAIN_GPT=self.fake, **env)
        return subprocess.run(["bash", SCRIPT, "--gpus", "0,1", "--models", "gpt2-mini", "--recipes",
                               "bf16 fp8_tensorwise", "--seeds", "1 2", "--lrs", "1e-3", "--steps", "10", "--out",
                               self.out, "--data", self.data, *args], capture_output=True, text=True, cwd=REPO_ROOT,
                              env=e, timeout=300)

    def test_cells_through_the_queue(self):
        proc = self.grid("--per-gpu", "2")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("2 at a time on each", proc.stdout)
        with open(os.path.join(self.out, "jobs.txt")) as f:
            self.assertEqual(len(f.read().splitlines()), 4)
        for recipe in ("bf16", "fp8_tensorwise"):
            for seed in ("1", "2"):
                cell = os.path.join(self.out, "gpt2-mini", recipe, f"lr1e-3_seed{seed}")
                with open(os.path.join(cell, "exit_code")) as f:
                    self.assertEqual(f.read().strip(), "0")
                with open(os.path.join(cell, "train.log")) as f:
                    self.assertRegex(f.read(), r"on GPU [01]")
        self.assertTrue(os.path.exists(os.path.join(self.out, "stability.md")))
        # A second call finds every cell done and queues nothing.
        proc = self.grid()
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("done before (exit code 0), not run again", proc.stdout)
        with open(os.path.join(self.out, "jobs.txt")) as f:
            self.assertEqual(f.read(), "")

    def test_a_failed_cell_is_named(self):
        proc = self.grid(FAKE_TRAIN_GPT_FAIL="fp8_tensorwise")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("2 run(s) failed for a reason other than divergence", proc.stderr)
        self.assertIn("gpt2-mini/fp8_tensorwise/lr1e-3_seed2", proc.stderr)


class TestStabilityDry(unittest.TestCase):
    def test_default_grid(self):
        proc = run_script(SCRIPT, "--dry", env_binary=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("= 144 runs of 500 steps x 16384 tokens", proc.stdout)
        self.assertIn("estimate: unavailable", proc.stdout)
        cmds = commands(proc.stdout)
        self.assertEqual(len(cmds), 144)
        cells = {}
        for cmd in cmds:
            o = overrides(cmd)
            model = "llama-mini" if "configs/llama_125m_bf16.json" in cmd else "gpt2-mini"
            key = (model, o["train.lr"], o["train.seed"])
            cells.setdefault(key, {})[o["precision.recipe"]] = (cmd, o)
            self.assertEqual(o["log.jsonl"], f"runs/fp8_stability/{model}/{o['precision.recipe']}/"
                                             f"lr{o['train.lr']}_seed{o['train.seed']}/metrics.jsonl")
            self.assertEqual((o["data.train"], o["data.val"]), ("data/pysrc/pysrc_train_*.bin",
                                                                "data/pysrc/pysrc_val_*.bin"))
            self.assertEqual((o["train.steps"], o["train.warmup_steps"], o["train.micro_batch"], o["train.seq_len"],
                              o["train.max_skipped_steps"], o["checkpoint.dir"]), ("500", "50", "32", "512", "5", ""))
            if model == "llama-mini":
                self.assertEqual((o["model.n_layer"], o["model.n_embd"], o["model.n_head"], o["model.n_kv_head"]),
                                 ("6", "384", "6", "2"))
        self.assertEqual({k[1] for k in cells}, {"1.2e-3", "2.4e-3", "4.8e-3", "9.6e-3", "1.92e-2", "3.84e-2"})
        self.assertEqual({k[2] for k in cells}, {"1", "2", "3"})
        for key, recipes in cells.items():
            self.assertEqual(sorted(recipes), ["bf16", "fp8_blockwise", "fp8_delayed", "fp8_tensorwise"])
            # Within a cell the commands differ only in the recipe and the log.
            stripped = {tuple(a for a in cmd if not a.startswith(("precision.recipe=", "log.jsonl=")))
                        for cmd, _ in recipes.values()}
            self.assertEqual(len(stripped), 1, key)

    def test_custom_grid_and_estimate(self):
        proc = run_script(SCRIPT, "--dry", "--models", "gpt2-mini", "--recipes", "bf16 fp8_blockwise",
                          "--seeds", "7 8", "--lrs", "1e-3 2e-3 4e-3", "--steps", "200", "--out", "/tmp/x")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("= 12 runs of 200 steps", proc.stdout)
        cmds = commands(proc.stdout)
        self.assertEqual(len(cmds), 12)
        self.assertTrue(all(overrides(c)["log.jsonl"].startswith("/tmp/x/gpt2-mini/") for c in cmds))
        self.assertEqual({overrides(c)["train.seed"] for c in cmds}, {"7", "8"})
        if train_gpt() is None:
            self.skipTest("train_gpt is not built: the FLOPs estimate is not checked")
        # The default grid's estimate fits one and a half H100-hours.
        proc = run_script(SCRIPT, "--dry")
        m = re.search(r"estimate: ([0-9.e+]+) FLOPs in total.* = ([0-9.]+) GPU-minutes", proc.stdout)
        self.assertIsNotNone(m, proc.stdout)
        self.assertGreater(float(m.group(1)), 1e16)
        self.assertLessEqual(float(m.group(2)), 90.0)
        self.assertRegex(proc.stdout, r"gpt2-mini: [0-9.e+]+ FLOPs per run")

    def test_errors(self):
        for args, words in ((["--recipes", "bf16 fp8_rowwise"], ["unknown recipe 'fp8_rowwise'"]),
                            (["--models", "gpt2-xl"], ["unknown model 'gpt2-xl'"]),
                            (["--corpus", "/no/such/corpus"], ["--corpus '/no/such/corpus' is not a directory"]),
                            (["--seeds", "a"], ["--seeds"]), (["--lrs", "fast"], ["--lrs"]),
                            (["--bogus"], ["unknown argument"])):
            with self.subTest(args=args):
                proc = run_script(SCRIPT, "--dry", *args)
                self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
                for word in words:
                    self.assertIn(word, proc.stderr)
        proc = run_script(SCRIPT, "--out", tempfile.gettempdir() + "/never", env_binary=False)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("not found: build first", proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
