#!/usr/bin/env python3
"""test/dev/test_inspect_shards.py: dev/data/inspect_shards.py's check of prepare.py's manifest, run from the repo root.

Shards are made with dev/data/prepare.py (a subprocess) from a few small texts; inspect_shards.py runs as a subprocess
on them. Covered: a clean set passes (given as shards, as a glob, or as the manifest itself); the set a failed re-run
of the old prepare.py left behind (new first shards over old ones) fails; so do a tampered shard of the same size, a
truncated or extended shard, a missing shard, a stray shard of another run beside the set, a shard given directly
that the manifest does not list, and broken manifests (not JSON, wrong types, a path outside the folder, a name
that does not match) - all with exit 1, a line naming the file, and no traceback. Shards without a manifest keep the
old behaviour (a note, exit 0); --no-manifest skips the check; the existing per-shard checks and output stay.

Exit code 77 (skipped under CTest) when numpy, regex or tiktoken is not installed.
"""

import sys

try:
    import numpy as np
    import regex  # noqa: F401  (prepare.py's tokenizer needs both)
    import tiktoken  # noqa: F401
except ImportError as e:
    print(f"test_inspect_shards.py: skipped: {e} (pip install numpy regex tiktoken)")
    sys.exit(77)

import json
import os
import shutil
import subprocess
import tempfile
import unittest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREPARE_PY = os.path.join(REPO_ROOT, "dev", "data", "prepare.py")
INSPECT_PY = os.path.join(REPO_ROOT, "dev", "data", "inspect_shards.py")
HEADER_BYTES = 1024

TEXTS = [
    "In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void.\n",
    "Café naïve — “quotes” 😀 中文\n" * 4,
    "I'm here; you're there. 12,345 items at 3.14 each!\n",
    "def f(x):\n    return x ** 2\n" * 3,
    "A document about nothing much, long enough to span a shard or two of this small size.\n" * 2,
    "Short.",
]
COMMON = ["--quiet", "--name", "t", "--val-fraction", "0.3", "--shard-tokens", "40"]


class TestInspectManifest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix=f"llm8_inspect_{os.getpid()}_")
        cls.inputs = []
        for i, text in enumerate(TEXTS):
            path = os.path.join(cls.base, f"doc{i}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            cls.inputs.append(path)
        # Two runs that differ (the seed moves documents between the splits): "a" is the set under test, "b" is
        # another run whose shards get mixed in.
        for name, seed in (("a", "1"), ("b", "2")):
            proc = subprocess.run([sys.executable, PREPARE_PY, *COMMON, "--seed", seed,
                                   "--out", os.path.join(cls.base, name), *cls.inputs],
                                  cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.base, ignore_errors=True)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="case_", dir=self.base)
        self.out = os.path.join(self.dir, "out")
        shutil.copytree(os.path.join(self.base, "a"), self.out)
        self.train = sorted(e for e in os.listdir(self.out) if e.startswith("t_train_"))
        self.assertGreaterEqual(len(self.train), 3)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, entry):
        return os.path.join(self.out, entry)

    def inspect(self, *args, expect_rc):
        proc = subprocess.run([sys.executable, INSPECT_PY, "--first", "4", *args], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, expect_rc, proc.stdout + proc.stderr)
        self.assertNotIn("Traceback", proc.stdout + proc.stderr)
        return proc.stdout

    def assert_problem(self, output, *words):
        lines = [line for line in output.splitlines() if "INVALID" in line]
        self.assertTrue(any(all(w in line for w in words) for line in lines), f"{words} not in:\n{output}")
        self.assertIn("1 manifest(s), 1 with problems", output)

    def test_clean_set_passes(self):
        shards = os.path.join(self.out, "t_*.bin")
        for args in ([shards], [self.path("t_manifest.json")], [self.path(self.train[0])],
                     [shards, self.path("t_manifest.json")]):
            with self.subTest(args=args):
                out = self.inspect(*args, expect_rc=0)
                self.assertIn("== manifest " + self.path("t_manifest.json"), out)
                self.assertIn("OK: ", out)
                self.assertIn("1 manifest(s), 0 with problems", out)
                self.assertIn(" 0 invalid", out)
                self.assertNotIn("INVALID", out)
        # The manifest named alone: every listed shard is inspected too (and hashed).
        out = self.inspect(self.path("t_manifest.json"), expect_rc=0)
        for entry in self.train:
            self.assertIn("== " + self.path(entry), out)
        self.assertIn("token range", out)  # the per-shard checks and output are still there
        self.assertIn("decoded: ", out)

    def test_mixed_runs_after_a_failed_rerun(self):
        """What the old prepare.py left when a re-run failed half-way: the other run's first shards over this run's,
        the rest (and this run's manifest) untouched. Every shard is well-formed, so only the manifest sees it."""
        other = os.path.join(self.base, "b")
        differ = []
        for entry in self.train[:2]:
            with open(os.path.join(other, entry), "rb") as f:
                new_bytes = f.read()
            with open(self.path(entry), "rb") as f:
                if f.read() != new_bytes:
                    differ.append(entry)
            with open(self.path(entry), "wb") as f:
                f.write(new_bytes)
        self.assertTrue(differ)
        out = self.inspect("--no-manifest", os.path.join(self.out, "t_*.bin"), expect_rc=0)
        self.assertIn(" 0 invalid", out)  # what inspect_shards.py said before it read manifests
        out = self.inspect(os.path.join(self.out, "t_*.bin"), expect_rc=1)
        for entry in differ:
            self.assert_problem(out, entry, "sha256")

    def test_tampered_shard(self):
        target = self.path(self.train[1])
        with open(target, "r+b") as f:  # one token changed: same size, valid header and token range
            f.seek(HEADER_BYTES + 2)
            token = f.read(2)
            f.seek(HEADER_BYTES + 2)
            f.write(bytes([token[0] ^ 1, token[1]]))
        out = self.inspect(os.path.join(self.out, "t_*.bin"), expect_rc=1)
        self.assert_problem(out, self.train[1], "sha256", "manifest lists")
        self.assertIn(" 0 invalid", out)  # the shard itself is well-formed
        # Named alone, the manifest also hashes it; a different shard named alone is not hashed, so it passes.
        self.assert_problem(self.inspect(self.path("t_manifest.json"), expect_rc=1), self.train[1], "sha256")
        out = self.inspect(self.path(self.train[0]), expect_rc=0)
        self.assertIn("sha256 for the 1 given", out)

    def test_resized_shards(self):
        target = self.path(self.train[0])
        with open(target, "rb") as f:
            data = f.read()
        for tampered, word in ((data[:-2], "truncated?"), (data + b"\0\0", "truncated?")):
            with self.subTest(size=len(tampered)):
                with open(target, "wb") as f:
                    f.write(tampered)
                out = self.inspect(os.path.join(self.out, "t_*.bin"), expect_rc=1)
                self.assert_problem(out, self.train[0], f"{len(tampered):,} bytes", "manifest lists")
                self.assertIn(word, out)  # the shard's own check, as before
        # A header that claims other tokens, with the size to match: the token count and hash disagree.
        header = np.frombuffer(data[:HEADER_BYTES], dtype="<i4").copy()
        header[2] -= 1
        with open(target, "wb") as f:
            f.write(header.tobytes() + data[HEADER_BYTES:-2] + b"\0\0")
        self.assert_problem(self.inspect(self.path("t_manifest.json"), expect_rc=1), self.train[0], "tokens")

    def test_missing_shard(self):
        os.remove(self.path(self.train[-1]))
        for args in ([os.path.join(self.out, "t_*.bin")], [self.path("t_manifest.json")]):
            with self.subTest(args=args):
                out = self.inspect(*args, expect_rc=1)
                self.assert_problem(out, self.train[-1], "listed but missing")

    def test_stray_shard_from_another_run(self):
        other = os.path.join(self.base, "b")
        stray = f"t_train_{len(self.train):06d}.bin"  # one past this run's last shard
        source = sorted(e for e in os.listdir(other) if e.startswith("t_train_"))[0]
        shutil.copy(os.path.join(other, source), self.path(stray))
        for args in ([os.path.join(self.out, "t_*.bin")], [self.path("t_manifest.json")], [self.path(self.train[0])],
                     [self.path(stray)]):
            with self.subTest(args=args):
                out = self.inspect(*args, expect_rc=1)
                self.assert_problem(out, stray, "not in the manifest")
        # Another name's shards beside the set are not this manifest's business.
        os.remove(self.path(stray))
        shutil.copy(os.path.join(other, source), self.path("u_train_000000.bin"))
        out = self.inspect(os.path.join(self.out, "t_*.bin"), expect_rc=0)
        self.assertNotIn("u_train", out)

    def test_broken_manifests(self):
        manifest_path = self.path("t_manifest.json")
        with open(manifest_path, "r", encoding="utf-8") as f:
            good = json.load(f)

        def variant(change):
            m = json.loads(json.dumps(good))
            change(m)
            return json.dumps(m)

        cases = [
            ("{ not json", "not valid JSON"),
            ("[1, 2]", "not a prepare.py manifest"),
            (variant(lambda m: m.update(version=99)), "unsupported manifest version"),
            (variant(lambda m: m.update(name="other")), "does not match its file name"),
            (variant(lambda m: m.update(shards={"a": 1})), "not a list"),
            (variant(lambda m: m["shards"][0].update(bytes="12")), "shards[0].bytes"),
            (variant(lambda m: m["shards"][0].update(sha256=None)), "shards[0].sha256"),
            (variant(lambda m: m["shards"][0].update(file="../a/t_train_000000.bin")), "not a shard name"),
            (variant(lambda m: m["shards"][1].update(file=m["shards"][0]["file"])), "listed twice"),
        ]
        for text, words in cases:
            with self.subTest(manifest=text[:60]):
                with open(manifest_path, "w", encoding="utf-8") as f:
                    f.write(text)
                for args in ([manifest_path], [os.path.join(self.out, "t_*.bin")]):
                    out = self.inspect(*args, expect_rc=1)
                    self.assert_problem(out, words)
        os.chmod(manifest_path, 0)
        if os.geteuid() != 0:  # root reads it anyway
            self.assert_problem(self.inspect(manifest_path, expect_rc=1), "cannot read it")

    def test_shards_without_a_manifest(self):
        os.remove(self.path("t_manifest.json"))
        out = self.inspect(os.path.join(self.out, "t_*.bin"), expect_rc=0)
        self.assertIn("note: no manifest " + self.path("t_manifest.json"), out)
        self.assertIn(f"{len(os.listdir(self.out))} shard(s), 0 invalid", out)
        self.assertNotIn("manifest(s)", out)
        # llm.c-style names that prepare.py does not use: no manifest is looked for.
        os.rename(self.path(self.train[0]), self.path("shard.bin"))
        out = self.inspect(self.path("shard.bin"), expect_rc=0)
        self.assertNotIn("manifest", out)
        # A bad shard is still found without a manifest.
        with open(self.path("shard.bin"), "r+b") as f:
            f.truncate(HEADER_BYTES + 1)
        out = self.inspect(self.path("shard.bin"), expect_rc=1)
        self.assertIn("INVALID", out)

    def test_no_manifest_switch_and_errors(self):
        out = self.inspect("--no-manifest", os.path.join(self.out, "t_*.bin"), expect_rc=0)
        self.assertNotIn("manifest", out)
        proc = subprocess.run([sys.executable, INSPECT_PY, "--no-manifest", self.path("t_manifest.json")],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("error", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        proc = subprocess.run([sys.executable, INSPECT_PY, "--encoder", self.path("missing.json"),
                               self.path(self.train[0])], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("missing.json", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
