#!/usr/bin/env python3
"""test/dev/test_gpu_queue.py: scripts/repro/gpu_queue.py on the CPU, with shell commands standing in for trainings:
every command runs once, with CUDA_VISIBLE_DEVICES naming one GPU of --gpus, never two at a time on one GPU (never
more than --per-gpu), in file order; comments and blank lines are skipped; a failing command makes the exit status 1 and is listed; bad --gpus and
an empty jobs file are errors (exit 2)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
QUEUE = os.path.join(HERE, "..", "..", "scripts", "repro", "gpu_queue.py")


class TestGpuQueue(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test_gpu_queue_")
        self.addCleanup(shutil.rmtree, self.dir)

    def queue(self, lines, *args):
        jobs = os.path.join(self.dir, "jobs.txt")
        with open(jobs, "w") as f:
            f.write("\n".join(lines) + "\n")
        return subprocess.run([sys.executable, QUEUE, jobs, "--logdir", os.path.join(self.dir, "logs"), *args],
                              capture_output=True, text=True, timeout=120)

    def test_one_command_per_gpu_at_a_time(self):
        # Each job records its GPU, then holds a lock file named after it for a moment: a second job on the same GPU
        # while the first runs would find the lock.
        trace = os.path.join(self.dir, "trace")
        job = (f'g=$CUDA_VISIBLE_DEVICES; lock={self.dir}/lock_$g; [ -e $lock ] && echo CLASH >> {trace}; '
               f'touch $lock; echo "$JOB $g" >> {trace}; sleep 0.3; rm $lock')
        lines = ["# six jobs on two GPUs", ""] + [f"JOB={i}; {job}" for i in range(6)]
        proc = self.queue(lines, "--gpus", "3,5")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("all 6 jobs exited 0", proc.stdout)
        with open(trace) as f:
            rows = f.read().split("\n")
        self.assertNotIn("CLASH", rows)
        ran = sorted(r.split() for r in rows if r)
        self.assertEqual([int(j) for j, _ in ran], list(range(6)))
        self.assertEqual({g for _, g in ran}, {"3", "5"})
        starts = [line for line in proc.stdout.splitlines() if "start job" in line]
        self.assertEqual([line.split("start job ")[1].split()[0] for line in starts], [str(i) for i in range(6)])
        self.assertTrue(os.path.exists(os.path.join(self.dir, "logs", "job_5.log")))

    def test_per_gpu_shares_a_gpu_up_to_n(self):
        # Each job adds a file for itself under its GPU's directory, records how many it finds there, and holds it
        # for a moment: with --per-gpu 2 the count reaches 2 and never 3.
        trace = os.path.join(self.dir, "trace")
        job = (f'd={self.dir}/busy_$CUDA_VISIBLE_DEVICES; mkdir -p $d; touch $d/$JOB; '
               f'echo "$CUDA_VISIBLE_DEVICES $(ls $d | wc -l)" >> {trace}; sleep 0.5; rm $d/$JOB')
        proc = self.queue([f"JOB={i}; {job}" for i in range(8)], "--gpus", "0,1", "--per-gpu", "2")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("2 at a time on each", proc.stdout)
        with open(trace) as f:
            rows = [r.split() for r in f.read().split("\n") if r]
        self.assertEqual(len(rows), 8)
        self.assertEqual(max(int(n) for _, n in rows), 2)
        self.assertEqual(sorted({g for g, _ in rows}), ["0", "1"])
        dry = self.queue(["a", "b", "c", "d", "e"], "--gpus", "0,1", "--per-gpu", "2", "--dry")
        self.assertEqual(dry.stdout.splitlines(), ["job 0 on GPU 0: a", "job 1 on GPU 1: b", "job 2 on GPU 0: c",
                                                   "job 3 on GPU 1: d", "job 4 on the first GPU free: e"])

    def test_failures_are_listed(self):
        proc = self.queue(["true", "echo out; exit 3", "true"], "--gpus", "0")
        self.assertEqual(proc.returncode, 1)
        self.assertIn("1 of 3 jobs failed", proc.stdout)
        self.assertIn("job 1 (exit 3): echo out; exit 3", proc.stdout)
        with open(os.path.join(self.dir, "logs", "job_1.log")) as f:
            self.assertEqual(f.read(), "out\n")

    def test_bad_arguments(self):
        for lines, args, word in ((["true"], ["--gpus", "0,x"], "--gpus '0,x'"),
                                  (["true"], ["--gpus", "1,1"], "distinct"),
                                  (["true"], ["--gpus", "0", "--per-gpu", "0"], "--per-gpu 0"),
                                  (["# nothing", ""], ["--gpus", "0"], "holds no command")):
            with self.subTest(args=args):
                proc = self.queue(lines, *args)
                self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
                self.assertIn(word, proc.stderr)

    def test_dry(self):
        proc = self.queue(["a", "b", "c"], "--gpus", "0,1", "--dry")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.splitlines(), ["job 0 on GPU 0: a", "job 1 on GPU 1: b",
                                                    "job 2 on the first GPU free: c"])


if __name__ == "__main__":
    unittest.main()
