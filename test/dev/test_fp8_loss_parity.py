#!/usr/bin/env python3
"""test/dev/test_fp8_loss_parity.py: scripts/fp8_loss_parity.sh's --dry output and its table
(scripts/repro/fp8_parity_report.py), on CPU, run from the repository root.

--dry: GPT-2 124M by default (its config, 32 x 1024 tokens, lr 6e-4, runs/fp8_parity) and Llama 350M with --model or
MODEL (its config, 16 x 2048, lr 3e-4), one command per recipe, identical but for the recipe and the log (same seed,
data and schedule), >= 100M tokens per run by default, --seed, --set / --tag placed last, --variant's runs and
names; unknown model, recipe, corpus directory and malformed variants are rejected (exit 2). With the stand-in
trainer: --gpus, --seeds, --variant with its tables, finished runs kept (and trained again with --force), a run of
another seed under a call's run name refused (finished or cut short), runs
trained into a directory without BF16 (exit 0, no table; --report alone: exit 2), --checkpoint-every (a run cut short
continues from its newest checkpoint). The report on synthetic logs:
final val loss, the difference to BF16 in percent, the tolerance column and exit code, tokens and steps, variants
against the plain BF16 run, a missing log.
"""
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_train_gpt  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "fp8_loss_parity.sh")
REPORT = os.path.join(REPO_ROOT, "scripts", "repro", "fp8_parity_report.py")
RECIPES = ["bf16", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise"]


def run(*args, env=None):
    e = dict(os.environ)
    e.pop("MODEL", None)
    e.update(env or {})
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, cwd=REPO_ROOT, env=e, timeout=120)


def commands(stdout):
    return [shlex.split(line) for line in stdout.splitlines() if "--config" in line]


def overrides(cmd):
    return {v.partition("=")[0]: v.partition("=")[2] for f, v in zip(cmd, cmd[1:]) if f == "--set"}


class TestDry(unittest.TestCase):
    def check_same_but_recipe(self, cmds):
        stripped = {tuple(a for a in c if not a.startswith(("precision.recipe=", "log.jsonl="))) for c in cmds}
        self.assertEqual(len(stripped), 1)

    def test_gpt2_default(self):
        proc = run("--dry")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        cmds = commands(proc.stdout)
        self.assertEqual([overrides(c)["precision.recipe"] for c in cmds], RECIPES)
        self.check_same_but_recipe(cmds)
        for c in cmds:
            o = overrides(c)
            self.assertEqual(c[1:3], ["--config", "configs/gpt2_124m_bf16.json"])
            self.assertEqual((o["train.micro_batch"], o["train.seq_len"], o["train.lr"], o["train.seed"],
                              o["data.train"], o["data.val"]),
                             ("32", "1024", "6e-4", "42", "data/pysrc/pysrc_train_*.bin", "data/pysrc/pysrc_val_*.bin"))
            self.assertEqual(o["log.jsonl"], f"runs/fp8_parity/{o['precision.recipe']}.jsonl")
            tokens = int(o["train.steps"]) * int(o["train.micro_batch"]) * int(o["train.seq_len"])
            self.assertGreaterEqual(tokens, 100_000_000)
        self.assertIn("100663296 tokens per run", proc.stdout)

    def test_llama(self):
        for args, env in ((["--model", "llama-350m"], None), ([], {"MODEL": "llama-350m"})):
            proc = run("--dry", *args, "--seed", "7", env=env)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            cmds = commands(proc.stdout)
            self.assertEqual(len(cmds), 4)
            self.check_same_but_recipe(cmds)
            o = overrides(cmds[0])
            self.assertIn("configs/llama_350m_bf16.json", cmds[0])
            self.assertEqual((o["train.micro_batch"], o["train.seq_len"], o["train.lr"], o["train.seed"]),
                             ("16", "2048", "3e-4", "7"))
            self.assertEqual(o["log.jsonl"], "runs/fp8_parity_llama-350m/bf16.jsonl")
        proc = run("--dry", "--model", "llama-125m", "--steps", "500")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        o = overrides(commands(proc.stdout)[0])
        self.assertEqual((o["train.micro_batch"], o["train.seq_len"], o["train.lr"], o["train.steps"]),
                         ("16", "2048", "1e-3", "500"))
        self.assertEqual(o["log.jsonl"], "runs/fp8_parity_llama-125m/bf16.jsonl")

    def test_variant(self):
        proc = run("--dry", "--recipes", "fp8_blockwise", "--set", "precision.pow2_scales=false", "--tag", "nopow2",
                   "--set", "train.seed=43")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        (cmd,) = commands(proc.stdout)
        self.assertEqual(cmd[-4:], ["--set", "precision.pow2_scales=false", "--set", "train.seed=43"])
        self.assertEqual(overrides(cmd)["train.seed"], "43")  # the variant's override is the last one: it wins
        self.assertEqual(overrides(cmd)["log.jsonl"], "runs/fp8_parity/fp8_blockwise_nopow2.jsonl")

    def test_variants(self):
        """--variant: beside the plain runs, one run per recipe and seed with the variant's overrides (last, after
        --set), named <recipe>_<variant>[_seed<N>]."""
        proc = run("--dry", "--recipes", "bf16 fp8_blockwise", "--seeds", "42 43", "--set", "train.lr=1e-3",
                   "--variant", "nopow2 precision.pow2_scales=false",
                   "--variant", "ends precision.bf16_layers=[0,-1] precision.margin=1")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        cmds = commands(proc.stdout)
        names = [os.path.basename(overrides(c)["log.jsonl"]) for c in cmds]
        self.assertEqual(names, ["bf16.jsonl", "bf16_seed43.jsonl", "bf16_nopow2.jsonl", "bf16_nopow2_seed43.jsonl",
                                 "bf16_ends.jsonl", "bf16_ends_seed43.jsonl", "fp8_blockwise.jsonl",
                                 "fp8_blockwise_seed43.jsonl", "fp8_blockwise_nopow2.jsonl",
                                 "fp8_blockwise_nopow2_seed43.jsonl", "fp8_blockwise_ends.jsonl",
                                 "fp8_blockwise_ends_seed43.jsonl"])
        self.assertEqual(cmds[0][-2:], ["--set", "train.lr=1e-3"])
        self.assertEqual(cmds[3][-4:], ["--set", "train.lr=1e-3", "--set", "precision.pow2_scales=false"])
        self.assertEqual(cmds[4][-4:], ["--set", "precision.bf16_layers=[0,-1]", "--set", "precision.margin=1"])
        self.assertEqual(overrides(cmds[5])["train.seed"], "43")

    def test_checkpoints(self):
        """--checkpoint-every: each run checkpoints into OUT/checkpoints/<run>, keeps the newest, and resumes an
        unfinished run (its log appended to in a queue); --force starts over (the trainer moves old checkpoints
        aside); without it no checkpoint is written."""
        o = overrides(commands(run("--dry", "--recipes", "bf16").stdout)[0])
        self.assertEqual(o["checkpoint.dir"], "")
        self.assertNotIn("checkpoint.resume", o)
        proc = run("--dry", "--recipes", "bf16 coat", "--checkpoint-every", "768", "--set", "train.lr=1e-3")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("checkpoints every 768 steps in runs/fp8_parity/checkpoints/<run>", proc.stdout)
        cmds = commands(proc.stdout)
        for recipe, cmd in zip(("bf16", "coat"), cmds):
            o = overrides(cmd)
            self.assertEqual((o["checkpoint.dir"], o["checkpoint.every"], o["checkpoint.keep"], o["checkpoint.resume"]),
                             (f"runs/fp8_parity/checkpoints/{recipe}", "768", "1", "auto"))
            self.assertEqual(cmd[-2:], ["--set", "train.lr=1e-3"])  # the user's overrides stay last
        o = overrides(commands(run("--dry", "--recipes", "bf16", "--checkpoint-every", "768", "--force").stdout)[0])
        self.assertEqual((o["checkpoint.resume"], o["checkpoint.overwrite"]), ("none", "true"))

    def test_errors(self):
        for args, env, word in ((["--model", "gpt2-xl"], None, "unknown model 'gpt2-xl'"),
                                ([], {"MODEL": "bogus"}, "unknown model 'bogus'"),
                                (["--recipes", "bf16 fp8_x"], None, "unknown recipe 'fp8_x'"),
                                (["--corpus", "/no/such/dir"], None, "--corpus '/no/such/dir' is not a directory"),
                                (["--steps", "x"], None, "--steps"),
                                (["--seeds", "42 x"], None, "--seeds: 'x'"),
                                (["--seeds", "42 43 42"], None, "names a seed twice"),
                                (["--variant", "nopow2"], None, "give its overrides after the name"),
                                (["--variant", "x_seed3 a.b=1"], None, "not end in seed<N>"),
                                (["--variant", "a/b a.b=1"], None, "must be letters, digits"),
                                (["--variant", "v pow2=false"], None, "'pow2=false' is not section.key=value"),
                                (["--variant", "v a.b=1", "--variant", "v a.b=2"], None, "'v' is given twice"),
                                (["--checkpoint-every", "-1"], None, "--checkpoint-every must be")):
            with self.subTest(args=args, env=env):
                proc = run("--dry", *args, env=env)
                self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
                self.assertIn(word, proc.stderr)
        proc = run("--out", os.path.join(tempfile.gettempdir(), "never"), env={"TRAIN_GPT": "/nonexistent/train_gpt"})
        self.assertEqual(proc.returncode, 2)
        self.assertIn("not found: build first", proc.stderr)


def write_log(path, final_val, steps=8, tokens=1000):
    with open(path, "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"type": "train", "step": s, "loss": 3.0 - 0.1 * s, "ms": 10.0 + s,
                                "tokens": tokens}) + "\n")
        f.write(json.dumps({"type": "eval", "step": steps, "val_loss": final_val}) + "\n")


class TestGpus(unittest.TestCase):
    """--gpus: the recipes go to OUT/jobs.txt and run through scripts/repro/gpu_queue.py, one per GPU, then the table
    is written; --queue only appends the commands. train_gpt is test/dev/fake_train_gpt.py."""

    def setUp(self):
        self.data, self.out = fake_train_gpt.workspace(self, "test_parity_gpus_")
        self.env = {"TRAIN_GPT": fake_train_gpt.PATH}

    def test_gpus(self):
        proc = run("--gpus", "3,5", "--steps", "8", "--recipes", "bf16 fp8_tensorwise coat", "--out", self.out,
                   "--data", self.data, "--tolerance", "1", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(self.out, "jobs.txt")) as f:
            jobs = f.read().splitlines()
        self.assertEqual(len(jobs), 3)
        for recipe, line in zip(("bf16", "fp8_tensorwise", "coat"), jobs):
            self.assertIn(f"precision.recipe={recipe} ", line)
            self.assertTrue(line.endswith(f"> {self.out}/{recipe}.log 2>&1"), line)
        gpus = set()
        for recipe in ("bf16", "fp8_tensorwise", "coat"):
            with open(os.path.join(self.out, recipe + ".log")) as f:
                gpus.add(f.read().split("GPU ")[1].strip())
        self.assertEqual(gpus, {"3", "5"})
        self.assertIn("| coat | 2.0040 | +0.20% | yes |", proc.stdout)
        self.assertTrue(os.path.exists(os.path.join(self.out, "summary.md")))

    def test_seeds(self):
        """--seeds: every recipe once per seed (the first seed's logs keep their plain names), the first seed's
        table, and seeds.md with the seeds' spread and the differences paired by seed, judged against --tolerance."""
        proc = run("--gpus", "0,1", "--steps", "8", "--recipes", "bf16 fp8_blockwise", "--seeds", "42 43 44", "--out",
                   self.out, "--data", self.data, "--tolerance", "1",
                   env=dict(self.env, FAKE_TRAIN_GPT_SEED_STEP="0.01"))
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(self.out, "jobs.txt")) as f:
            jobs = f.read().splitlines()
        self.assertEqual(len(jobs), 6)
        self.assertIn("train.seed=43 ", jobs[1])
        self.assertIn("log.jsonl=" + os.path.join(self.out, "bf16_seed43.jsonl"), jobs[1])
        self.assertIn("same seed (42)", proc.stdout)
        with open(os.path.join(self.out, "seeds.md")) as f:
            seeds = f.read()
        # bf16: 2.00, 2.01, 2.02; fp8_blockwise: 2.004, 2.014, 2.024 (the fake trainer's losses)
        self.assertIn("| bf16 | 42 43 44 | 2.0000 2.0100 2.0200 | 2.0100 | 0.0100 (0.50%) | — | — |", seeds)
        self.assertRegex(seeds, r"\| fp8_blockwise \| 42 43 44 \| 2\.0040 2\.0140 2\.0240 \| 2\.0140 \| .* \| "
                                r"\+0\.20% ± 0\.00 \(\+0\.20\.\.\+0\.20, 3 seeds\) \| — \|")
        # --tolerance is seeds.md's goal: +0.20% with no spread is within 1%
        self.assertIn("| at most 1% above bf16 (mean ± 2 SE) |", seeds)
        self.assertRegex(seeds, r"\| fp8_blockwise \| 42 43 44 \| .* \| met \(\+0\.20\.\.\+0\.20\) \|\n")

    def test_variants_and_finished_runs(self):
        """--variant with --seeds: every recipe x (plain, variant) x seed, the variant's own table and its row in
        seeds.md against the plain recipe; a second call trains nothing (every log holds its final validation) and
        rewrites the tables; --force trains everything again."""
        args = ["--gpus", "0,1", "--steps", "8", "--recipes", "bf16 fp8_blockwise", "--seeds", "42 43", "--out",
                self.out, "--data", self.data, "--tolerance", "1", "--variant", "nopow2 precision.pow2_scales=false"]
        env = dict(self.env, FAKE_TRAIN_GPT_SEED_STEP="0.01")
        proc = run(*args, env=env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        jobs_file = os.path.join(self.out, "jobs.txt")
        with open(jobs_file) as f:
            jobs = f.read().splitlines()
        self.assertEqual(len(jobs), 8)
        self.assertIn("precision.pow2_scales=false", jobs[6])
        self.assertIn("log.jsonl=" + os.path.join(self.out, "fp8_blockwise_nopow2_seed43.jsonl"), jobs[7])
        with open(os.path.join(self.out, "seeds.md")) as f:
            seeds = f.read()
        # the fake trainer: fp8_blockwise_nopow2 = fp8_blockwise + 0.001 at every seed
        self.assertRegex(seeds, r"\| fp8_blockwise_nopow2 \| 42 43 \| 2\.0050 2\.0150 \| .* \| "
                                r"\+0\.0[45]% ± 0\.00 \(.*, 2 seeds\) \|")
        with open(os.path.join(self.out, "summary_nopow2.md")) as f:
            self.assertIn("| fp8_blockwise_nopow2 | 2.0050 | +0.20% |", f.read())  # against bf16_nopow2
        os.remove(os.path.join(self.out, "summary.md"))
        proc = run(*args, env=env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.count("finished already"), 8, proc.stdout)
        self.assertEqual(os.path.getsize(jobs_file), 0)
        self.assertTrue(os.path.exists(os.path.join(self.out, "summary.md")))
        proc = run(*args, "--force", env=env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertNotIn("finished already", proc.stdout)
        with open(jobs_file) as f:
            self.assertEqual(len(f.read().splitlines()), 8)

    def test_a_failed_run_is_exit_3(self):
        """A crashed run is not a result: exit 3 (1 means a recipe outside the tolerance, its table written)."""
        proc = run("--gpus", "0,1", "--steps", "8", "--recipes", "bf16 coat", "--out", self.out, "--data", self.data,
                   env=dict(self.env, FAKE_TRAIN_GPT_FAIL="coat"))
        self.assertEqual(proc.returncode, 3, proc.stdout + proc.stderr)
        self.assertIn("a run failed", proc.stderr)
        self.assertIn("job 1 (exit 1)", proc.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.out, "summary.md")))

    def test_runs_without_bf16_are_trained_and_not_judged(self):
        """Another seed of one recipe into a directory without a BF16 run: trained, exit 0, and a line saying how to
        get the table, instead of the report's missing-log exit 2."""
        proc = run("--gpus", "0", "--steps", "8", "--recipes", "coat", "--seed", "43", "--out", self.out, "--data",
                   self.data, env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("no bf16 run in " + self.out + " to compare the runs with", proc.stdout)
        self.assertTrue(os.path.exists(os.path.join(self.out, "coat.jsonl")))
        self.assertFalse(os.path.exists(os.path.join(self.out, "summary.md")))
        # --report alone asked for the table: an error
        proc = run("--recipes", "coat", "--seed", "43", "--out", self.out, "--report", env=self.env)
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertIn("no bf16 run in", proc.stderr)
        # with BF16's log beside it the same call writes the table
        proc = run("--gpus", "0", "--steps", "8", "--recipes", "bf16", "--seed", "43", "--out", self.out, "--data",
                   self.data, env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        proc = run("--gpus", "0", "--steps", "8", "--recipes", "coat", "--seed", "43", "--out", self.out, "--data",
                   self.data, "--report", env=self.env)
        self.assertIn("| coat | ", proc.stdout)
        self.assertTrue(os.path.exists(os.path.join(self.out, "summary.md")))

    def test_checkpoints_resume_a_run_cut_short(self):
        """A run killed at step 7 of 8 (exit 3) continues from its step-6 checkpoint when the same command runs
        again: every step once in its JSONL log, the records after the checkpoint moved aside, the console log
        appended to; --force trains it from step 1, its checkpoints moved aside, not deleted."""
        args = ["--steps", "8", "--recipes", "bf16 coat", "--out", self.out, "--data", self.data, "--tolerance", "1",
                "--checkpoint-every", "3"]
        proc = run(*args, env=dict(self.env, FAKE_TRAIN_GPT_STOP_AT="7"))
        self.assertEqual(proc.returncode, 3, proc.stdout + proc.stderr)
        self.assertIn("the bf16 run failed", proc.stderr)
        ckpts = os.path.join(self.out, "checkpoints")
        self.assertEqual(os.listdir(os.path.join(ckpts, "bf16")), ["step_00000006"])  # checkpoint.keep=1

        def steps(name):
            with open(os.path.join(self.out, name)) as f:
                return [(r["type"], r["step"]) for r in map(json.loads, f)]

        self.assertEqual(steps("bf16.jsonl"), [("train", s) for s in range(1, 8)])
        proc = run(*args, env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(steps("bf16.jsonl"), [("train", s) for s in range(1, 9)] + [("eval", 8)])
        self.assertEqual(steps("bf16.jsonl.after-step-6"), [("train", 7)])
        with open(os.path.join(self.out, "bf16.log")) as f:
            log = f.read()
        self.assertLess(log.index("killed after step 7"), log.index("bf16 again"))
        self.assertLess(log.index("bf16 again"), log.index("resumed from " + os.path.join(ckpts, "bf16", "step_")))
        self.assertEqual(os.listdir(os.path.join(ckpts, "coat")), ["step_00000008"])  # the final one
        self.assertIn("| coat | 2.0040 | +0.20% | yes |", proc.stdout)
        proc = run(*args, "--force", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertTrue(os.path.isdir(os.path.join(ckpts, "bf16", "abandoned", "1", "step_00000008")))
        with open(os.path.join(self.out, "bf16.log")) as f:
            self.assertNotIn("again", f.read())
        self.assertEqual(steps("bf16.jsonl"), [("train", s) for s in range(1, 9)] + [("eval", 8)])
        # in a queue the resuming runs append to their console logs
        queue = os.path.join(os.path.dirname(self.out), "jobs.txt")
        proc = run("--queue", queue, "--steps", "8", "--recipes", "nvfp4", "--out", self.out, "--data", self.data,
                   "--checkpoint-every", "3", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(queue) as f:
            self.assertTrue(f.read().rstrip().endswith(f">> {self.out}/nvfp4.log 2>&1"))

    def test_another_seed_under_the_same_name_is_refused(self):
        """`--seed 43` then `--seed 44` into one --out name both runs mxfp4.jsonl (a call's first seed has no suffix):
        the second call is refused before anything trains (exit 2, naming both seeds and the ways out), instead of
        keeping seed 43's finished run, or resuming its checkpoint, as seed 44's. --seeds "43 44" trains 44 beside
        it; --force trains the name again as the new seed."""
        args = ["--steps", "8", "--recipes", "mxfp4", "--out", self.out, "--data", self.data, "--checkpoint-every", "3"]
        proc = run(*args, "--seed", "43", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        log = os.path.join(self.out, "mxfp4.log")
        with open(log) as f:
            self.assertIn("train.seed = 43", f.read())
        for cut in ("", "7"):  # finished, and cut short with a checkpoint to resume from
            if cut:
                os.remove(os.path.join(self.out, "mxfp4.jsonl"))
                proc = run(*args, "--seed", "43", "--force", env=dict(self.env, FAKE_TRAIN_GPT_STOP_AT=cut))
                self.assertEqual(proc.returncode, 3, proc.stdout + proc.stderr)
            proc = run(*args, "--seed", "44", env=self.env)
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertIn(f"{log} is the log of a train.seed 43 run", proc.stderr)
            self.assertIn('--seeds "43 44"', proc.stderr)
            self.assertNotIn("== mxfp4", proc.stdout)
            with open(log) as f:
                self.assertNotIn("train.seed = 44", f.read())
        proc = run(*args, "--seeds", "43 44", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(self.out, "mxfp4_seed44.log")) as f:
            self.assertIn("train.seed = 44", f.read())
        proc = run(*args, "--seed", "44", "--force", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(log) as f:
            text = f.read()
        self.assertIn("train.seed = 44", text)
        self.assertNotIn("train.seed = 43", text)

    def test_queue_only_appends(self):
        queue = os.path.join(os.path.dirname(self.out), "jobs.txt")
        for args in (["--recipes", "bf16 nvfp4"], ["--recipes", "nvfp4", "--set", "precision.wgrad_hadamard=0",
                                                   "--tag", "no_rht"]):
            proc = run("--queue", queue, "--steps", "8", "--out", self.out, "--data", self.data, *args, env=self.env)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            self.assertIn("queued in", proc.stdout)
        with open(queue) as f:
            jobs = f.read().splitlines()
        self.assertEqual(len(jobs), 3)
        self.assertIn("log.jsonl=" + os.path.join(self.out, "nvfp4_no_rht.jsonl"), jobs[2])
        self.assertFalse(os.path.exists(os.path.join(self.out, "bf16.jsonl")))  # nothing ran

    def test_bad_gpus(self):
        for args, word in ((["--gpus", "0,a"], "--gpus '0,a'"), (["--gpus", "0", "--queue", "q"], "give one")):
            proc = run("--dry", *args)
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertIn(word, proc.stderr)


class TestReport(unittest.TestCase):
    def setUp(self):
        self.out = tempfile.mkdtemp(prefix="test_parity_")
        self.addCleanup(shutil.rmtree, self.out)

    def report(self, *args):
        return subprocess.run([sys.executable, REPORT, self.out, *args, "--title", "T"], capture_output=True,
                              text=True, timeout=60)

    def test_table(self):
        for recipe, val in zip(RECIPES, (2.0, 2.004, 1.99, 2.01)):
            write_log(os.path.join(self.out, recipe + ".jsonl"), val)
        proc = self.report(*RECIPES)
        self.assertEqual(proc.returncode, 1, proc.stderr)  # blockwise +0.50% and delayed -0.50% exceed 0.25%
        with open(os.path.join(self.out, "summary.md")) as f:
            text = f.read()
        self.assertIn("| recipe | final val loss | vs bf16 | within 0.25% |", text)
        self.assertIn("| bf16 | 2.0000 | +0.00% | yes | 2.2000 | 17.0 | 0 | 8,000 | 8 |", text)
        self.assertIn("| fp8_tensorwise | 2.0040 | +0.20% | yes |", text)
        self.assertIn("| fp8_delayed | 1.9900 | -0.50% | NO |", text)
        self.assertIn("| fp8_blockwise | 2.0100 | +0.50% | NO |", text)
        self.assertEqual(self.report(*RECIPES, "--tolerance", "1").returncode, 0)

    def test_script_report_only(self):
        """--report: the table of the logs already there, without the binary, data or runs."""
        for recipe, val in zip(RECIPES, (2.0, 2.001, 2.002, 2.003)):
            write_log(os.path.join(self.out, recipe + ".jsonl"), val)
        proc = run("--report", "--out", self.out, env={"TRAIN_GPT": "/nonexistent/train_gpt"})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("== bf16", proc.stdout)
        self.assertIn("| fp8_blockwise | 2.0030 | +0.15% | yes |", proc.stdout)
        self.assertTrue(os.path.exists(os.path.join(self.out, "summary.md")))

    def test_tail_train_loss_and_compressed_logs(self):
        """The last columns: the mean train loss of the last 300 steps and its difference to BF16's; a log kept as
        <run>.jsonl.gz (the results folder) is read like <run>.jsonl."""
        def write(path, loss_at):
            with open(path, "w") as f:
                for s in range(1, 401):
                    f.write(json.dumps({"type": "train", "step": s, "loss": loss_at(s), "ms": 1.0,
                                        "tokens": 1000}) + "\n")
                f.write(json.dumps({"type": "eval", "step": 400, "val_loss": 2.0 + 0.001 * loss_at(400)}) + "\n")
        write(os.path.join(self.out, "bf16.jsonl"), lambda s: 1.0 if s > 100 else 5.0)
        with open(os.path.join(self.out, "bf16.jsonl"), "rb") as f, \
                gzip.open(os.path.join(self.out, "bf16.jsonl.gz"), "wb") as g:
            g.write(f.read())
        os.remove(os.path.join(self.out, "bf16.jsonl"))
        write(os.path.join(self.out, "coat.jsonl"), lambda s: 1.01 if s > 100 else 5.0)
        proc = self.report("bf16", "coat")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("| train loss, last 300 steps | vs bf16 |", proc.stdout)
        self.assertIn("| bf16 | 2.0010 | +0.00% | yes | 1.0000 | 1.0 | 0 | 400,000 | 400 | 1.0000 | +0.00% |",
                      proc.stdout)
        self.assertIn("| coat | 2.0010 | +0.00% | yes | 1.0100 | 1.0 | 0 | 400,000 | 400 | 1.0100 | +1.00% |",
                      proc.stdout)

    def test_gpu_column_when_the_runs_used_two_gpu_models(self):
        for recipe, val in zip(RECIPES, (2.0, 2.004, 1.99, 2.01)):
            write_log(os.path.join(self.out, recipe + ".jsonl"), val)
        for recipe, device in (("bf16", "NVIDIA H100 80GB HBM3"), ("fp8_tensorwise", "NVIDIA H200"),
                               ("fp8_delayed", "NVIDIA H200")):
            with open(os.path.join(self.out, recipe + ".log"), "w") as f:
                f.write(f"device: {device} (sm_90, 132 SMs, 139.8 GiB)\nstep 0/8 | val loss 9.0\n")
        proc = self.report(*RECIPES)
        self.assertIn("| vs bf16 | GPU |", proc.stdout)
        self.assertIn("|---|---|---|---|---|---|---|---|---|---|---|---|", proc.stdout)
        rows = {line.split(" | ")[0][2:]: line for line in proc.stdout.splitlines() if line.startswith("| fp8")}
        self.assertTrue(rows["fp8_tensorwise"].endswith("| NVIDIA H200 |"), rows["fp8_tensorwise"])
        self.assertTrue(rows["fp8_blockwise"].endswith("| unknown |"), rows["fp8_blockwise"])
        # one GPU model: no column
        for recipe in ("fp8_tensorwise", "fp8_delayed"):
            os.remove(os.path.join(self.out, recipe + ".log"))
        proc = self.report(*RECIPES)
        self.assertNotIn("GPU |", proc.stdout)
        self.assertIn("| fp8_tensorwise | 2.0040 | +0.20% | yes |", proc.stdout)

    def test_variant_against_plain_bf16_and_missing_log(self):
        write_log(os.path.join(self.out, "bf16.jsonl"), 2.0)
        write_log(os.path.join(self.out, "fp8_blockwise_v.jsonl"), 2.002)
        proc = self.report("fp8_blockwise", "--tag", "_v")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(self.out, "summary_v.md")) as f:
            self.assertIn("| fp8_blockwise_v | 2.0020 | +0.10% | yes |", f.read())
        proc = self.report("fp8_delayed")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("cannot read the fp8_delayed run", proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
