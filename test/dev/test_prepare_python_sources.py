#!/usr/bin/env python3
"""test/dev/test_prepare_python_sources.py: dev/data/prepare.py --python-sources (the long-run corpus of the FP8
scripts), on a tiny synthetic directory tree, run from the repository root.

Checks: only the *.py files of the tree are read (nested folders yes, hidden folders and other extensions no), in
sorted path order; every file is one document starting with <|endoftext|> whose tokens decode back to the file's text
(undecodable bytes replaced); the held-out split (0.5% of the files, at least one) and the train split hold every
file once; the shards and the manifest are byte-identical across runs and worker counts; the manifest records the
preset's options; the preset's defaults (site-packages, pysrc, data/pysrc) and that explicit options override them;
--kjv keeps its defaults; a missing corpus directory, a file instead of a directory and --kjv with --python-sources
are one-line errors (exit 2) that name the problem.

Exit code 77 (skipped under CTest) when numpy, regex or tiktoken is not installed.
"""
import sys

try:
    import numpy as np
    import regex  # noqa: F401
    import tiktoken  # noqa: F401
except ImportError as e:
    print(f"test_prepare_python_sources.py: skipped: {e} (pip install numpy regex tiktoken)")
    sys.exit(77)

import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
import unittest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREPARE_PY = os.path.join(REPO_ROOT, "dev", "data", "prepare.py")
EOT = 50256

spec = importlib.util.spec_from_file_location("prepare_under_test", PREPARE_PY)
prepare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare)


def read_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[0] == 20240520 and header[1] == 1, path
    tokens = np.fromfile(path, dtype="<u2", offset=256 * 4)
    assert len(tokens) == header[2], path
    return tokens


def split_documents(tokens):
    """The documents of a token stream: each starts with <|endoftext|>."""
    starts = [i for i, t in enumerate(tokens) if t == EOT]
    assert starts and starts[0] == 0
    return [tokens[a + 1:b] for a, b in zip(starts, starts[1:] + [len(tokens)])]


class TestPythonSources(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="test_pysrc_")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.tree = os.path.join(self.tmp, "site-packages")
        self.texts = {}
        files = {f"pkg_{chr(97 + i)}/mod_{j}.py": f"def f_{i}_{j}(x):\n    return x * {i} + {j}  # ç\n"
                 for i in range(5) for j in range(4)}
        files["pkg_b/sub/deep.py"] = "class Deep:\n    pass\n"
        for rel, text in files.items():
            self.write(rel, text.encode())
            self.texts[os.path.join(self.tree, rel)] = text
        self.write("pkg_c/latin1.py", b"s = 'caf\xe9'\n")  # not UTF-8: replaced
        self.texts[os.path.join(self.tree, "pkg_c/latin1.py")] = "s = 'caf\ufffd'\n"
        self.write("pkg_a/README.txt", b"not python\n")
        self.write("pkg_a/data.json", b"{}\n")
        self.write(".hidden/secret.py", b"hidden = True\n")
        self.write("pkg_d/__pycache__/x.cpython-311.pyc", b"\x00\x01")

    def write(self, rel, data):
        path = os.path.join(self.tree, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def run_prepare(self, *args):
        return subprocess.run([sys.executable, PREPARE_PY, "--quiet", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=300)

    def prepare_into(self, out, *extra):
        proc = self.run_prepare("--python-sources", "--out", out, *extra, self.tree)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return out

    def test_documents_split_and_manifest(self):
        out = self.prepare_into(os.path.join(self.tmp, "out"))
        self.assertEqual(sorted(os.listdir(out)), ["pysrc_manifest.json", "pysrc_train_000000.bin",
                                                   "pysrc_val_000000.bin"])
        with open(os.path.join(out, "pysrc_manifest.json")) as f:
            manifest = json.load(f)
        inputs = [entry["path"] for entry in manifest["inputs"]]
        self.assertEqual(inputs, sorted(self.texts, key=lambda p: os.path.relpath(p, self.tree).split(os.sep)))
        self.assertEqual(sorted(inputs), sorted(self.texts))  # only the .py files, none hidden
        self.assertEqual(manifest["name"], "pysrc")
        options = manifest["options"]
        self.assertEqual((options["split_docs"], options["extensions"], options["encoding_errors"],
                          options["val_fraction"]), ("file", [".py"], "replace", 0.005))
        # Every file exactly once over the two splits, one document each, its tokens decoding to its text.
        enc = prepare.load_gpt2_encoding()
        docs = {split: [enc.decode(d.tolist()) for d in split_documents(read_shard(
            os.path.join(out, f"pysrc_{split}_000000.bin")))] for split in ("train", "val")}
        self.assertEqual(len(docs["val"]), 1)  # 0.5% of 22 files rounds to none: the smallest hash is held out
        self.assertEqual(manifest["splits"]["val"]["documents"], 1)
        self.assertEqual(manifest["splits"]["train"]["documents"], len(self.texts) - 1)
        self.assertEqual(sorted(docs["train"] + docs["val"]), sorted(self.texts.values()))
        # The train documents are in sorted path order.
        ordered = [self.texts[p] for p in inputs if self.texts[p] != docs["val"][0]]
        self.assertEqual(docs["train"], ordered)

    def test_deterministic(self):
        a = self.prepare_into(os.path.join(self.tmp, "a"), "--workers", "1")
        b = self.prepare_into(os.path.join(self.tmp, "b"), "--workers", "3")
        for name in sorted(os.listdir(a)):
            with open(os.path.join(a, name), "rb") as f, open(os.path.join(b, name), "rb") as g:
                self.assertEqual(f.read(), g.read(), name)
        self.assertEqual(sorted(os.listdir(a)), sorted(os.listdir(b)))

    def test_explicit_options_override_the_preset(self):
        out = self.prepare_into(os.path.join(self.tmp, "o"), "--name", "code", "--val-fraction", "0.5",
                                "--ext", ".py,.txt")
        with open(os.path.join(out, "code_manifest.json")) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["options"]["val_fraction"], 0.5)
        self.assertEqual(manifest["options"]["extensions"], [".py", ".txt"])
        self.assertEqual(len(manifest["inputs"]), len(self.texts) + 1)  # README.txt too
        self.assertGreater(manifest["splits"]["val"]["documents"], 1)

    def test_preset_defaults(self):
        args = prepare.parse_args(["--python-sources"])
        purelib = sysconfig.get_paths()["purelib"]
        self.assertEqual(args.inputs[0], purelib)
        self.assertEqual(args.inputs, prepare.python_site_packages())
        self.assertEqual((args.name, args.out, args.extensions, args.split_docs, args.val_fraction,
                          args.encoding_errors),
                         ("pysrc", os.path.join(REPO_ROOT, "data", "pysrc"), [".py"], "file", 0.005, "replace"))
        # The other modes keep their defaults.
        kjv = prepare.parse_args(["--kjv"])
        self.assertEqual((kjv.val_fraction, kjv.encoding_errors, kjv.extensions, kjv.split_docs),
                         (0.1, "strict", [], "kjv-books"))
        plain = prepare.parse_args(["--name", "t", "x.txt"])
        self.assertEqual((plain.val_fraction, plain.encoding_errors, plain.split_docs), (0.1, "strict", "file"))

    def test_errors(self):
        missing = os.path.join(self.tmp, "no_such_dir")
        a_file = os.path.join(self.tree, "pkg_a", "mod_0.py")
        for args, words in ((["--python-sources", missing], [missing, "not a directory"]),
                            (["--python-sources", a_file], [a_file, "not a directory"]),
                            (["--python-sources", "--kjv"], ["--kjv", "--python-sources"])):
            with self.subTest(args=args):
                proc = self.run_prepare("--out", os.path.join(self.tmp, "err"), *args)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertNotIn("Traceback", proc.stderr)
                last = proc.stderr.strip().splitlines()[-1]
                for word in words:
                    self.assertIn(word, last)
                self.assertFalse(os.path.exists(os.path.join(self.tmp, "err")))
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            prepare.parse_args(["--python-sources", missing])


if __name__ == "__main__":
    unittest.main(verbosity=2)
