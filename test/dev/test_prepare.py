#!/usr/bin/env python3
"""test/dev/test_prepare.py: dev/data/prepare.py (text -> GPT-2 token shards), run from the repository root.

Checks that the offline tiktoken Encoding built by prepare.py gives exactly GPT-2's tokens, against a pure-Python
reference written here (OpenAI's original encoder.py algorithm: encoder.json + vocab.bpe + the GPT-2 regex) on KJV
lines, unicode, digits, contractions, whitespace runs, emoji and random strings, plus known ids. End to end (the
script as a subprocess): shard headers and names, <|endoftext|> before every document, tokens that decode back to
the input texts, the deterministic split (identical bytes across runs and --workers, independent of input order),
stale shards removed, --uint32 shards, directory inputs, inspect_shards.py on the output, and bad inputs that exit
non-zero with a message and no traceback. Document splitting (kjv-books, blank-lines) is tested in-process.

All or nothing (TestOutputSafety): a failure half-way (ENOSPC or SIGTERM injected at a shard's fsync, a real EFBIG
from RLIMIT_FSIZE, a real ENOSPC on a small tmpfs mounted in a user namespace (skipped where unshare -rm cannot),
writer exceptions in-process, a failing swap) leaves the previous output and its parent folder byte-identical with
no temporary files; after SIGKILL the output is intact and the next run names the one temporary directory left. A
re-run (atomic exchange, and the two-rename fallback) replaces exactly this name's shards and keeps other entries;
a symbolic link --out stays a link. OS errors (output under a file, a corrupt .gz, a FIFO, permissions when not
root, an input changed between the passes) are one "prepare.py: error:" line, the output checked before the inputs
are read. The manifest (<name>_manifest.json) lists the inputs with their sizes and hashes, the vocabulary files'
hashes, the options and every shard with its tokens, size and sha256, and is byte-identical across output folders
and worker counts (inspect_shards.py's check of it: test_inspect_shards.py).

Exit code 77 (skipped under CTest) when numpy, regex or tiktoken is not installed.
"""

import sys

try:
    import numpy as np
    import regex
    import tiktoken  # noqa: F401  (prepare.py imports it when building the Encoding)
except ImportError as e:
    print(f"test_prepare.py: skipped: {e} (pip install numpy regex tiktoken)")
    sys.exit(77)

import contextlib
import errno
import gzip
import hashlib
import importlib.util
import io
import json
import os
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import tempfile
import unittest
import unittest.mock

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREPARE_PY = os.path.join(REPO_ROOT, "dev", "data", "prepare.py")
INSPECT_PY = os.path.join(REPO_ROOT, "dev", "data", "inspect_shards.py")
VOCAB_DIR = os.path.join(REPO_ROOT, "dev", "data", "gpt2")
KJV_GZ = os.path.join(REPO_ROOT, "dev", "data", "kjv", "kjv.txt.gz")
EOT = 50256


def load_prepare_module():
    spec = importlib.util.spec_from_file_location("prepare_under_test", PREPARE_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prepare = load_prepare_module()


# ---------------------------------------------------------------------------------------------------------------
# The reference: OpenAI's gpt-2 src/encoder.py, written out independently of prepare.py


def ref_bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word):
    return set(zip(word[:-1], word[1:]))


class ReferenceGPT2:
    PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self):
        with open(os.path.join(VOCAB_DIR, "encoder.json"), "r", encoding="utf-8") as f:
            self.encoder = json.load(f)
        self.decoder = {v: k for k, v in self.encoder.items()}
        with open(os.path.join(VOCAB_DIR, "vocab.bpe"), "r", encoding="utf-8") as f:
            bpe_data = f.read()
        bpe_merges = [tuple(merge_str.split()) for merge_str in bpe_data.split("\n")[1:-1]]
        self.bpe_ranks = dict(zip(bpe_merges, range(len(bpe_merges))))
        self.byte_encoder = ref_bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.pat = regex.compile(self.PATTERN)
        self.cache = {}

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:  # every pass merges at least one pair, so at most len(token) passes
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        word = " ".join(word)
        self.cache[token] = word
        return word

    def encode(self, text):
        bpe_tokens = []
        for token in regex.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            bpe_tokens.extend(self.encoder[bpe_token] for bpe_token in self.bpe(token).split(" "))
        return bpe_tokens

    def decode_bytes(self, tokens):
        return bytes(self.byte_decoder[c] for t in tokens for c in self.decoder[t])


_REFERENCE = None
_ENCODING = None


def reference():
    global _REFERENCE
    if _REFERENCE is None:
        _REFERENCE = ReferenceGPT2()
    return _REFERENCE


def encoding():
    global _ENCODING
    if _ENCODING is None:
        _ENCODING = prepare.load_gpt2_encoding(VOCAB_DIR)
    return _ENCODING


def kjv_lines(n):
    lines = []
    with gzip.open(KJV_GZ, "rt", encoding="utf-8") as f:
        for line in f:
            if len(lines) >= n:
                break
            lines.append(line)
    return lines


VARIED_TEXTS = [
    "Hello world",
    "Hello, world!\n",
    "I'm sure you're right: he's gone, we've won, they'll stay, she'd go. I'M YOU'RE It'S can't won't o'clock",
    "'s 's's ''s 'll'd 'S 'T",
    "3.14159 1234567890 12,345 0x1F 2024-05-20 1e-9 ½ ² Ⅻ ٣ 一二三",
    "a  b   c\t\td\n\n\n  e \n   \n\tx\r\ny  \n",
    "   leading spaces and trailing   ",
    "\n\n\n",
    " ",
    "",
    "Café naïve résumé façade — “smart quotes” ‘single’ … «guillemets» ¿Qué? ¡Sí!",
    "Ελληνικά, русский язык, עברית, العربية, हिन्दी, ไทย, 한국어, 日本語のテキスト, 中文字符测试。",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨🎉 🤖",
    "combining e\u0301 a\u0308 n\u0303; zero\u200bwidth; nbsp\u00a0here; ideographic\u3000space; \u2028sep",
    "control \x00\x01\x07\x7f bytes and tabs\t\t\t.",
    "<|endoftext|> is ordinary text here <|endoftext|><|endoftext|>",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\n\tif x != 0: pass\n",
    "∑∫√∞≈≠ ≤≥ ∀∃ ℝ ℕ → ⇒ ⟨x|y⟩ §¶†‡ ©®™ €£¥₹",
    "!!!??? ... --- ___ *** +++ === ~~~ ``` \"\"\" '''",
]


# ---------------------------------------------------------------------------------------------------------------
# Tokeniser equivalence


class TestTokenizer(unittest.TestCase):
    def test_known_ids(self):
        enc = encoding()
        self.assertEqual(enc.encode_ordinary("Hello world"), [15496, 995])
        self.assertEqual(enc.encode_ordinary("Hello, world!"), [15496, 11, 995, 0])
        self.assertEqual(enc.encode_ordinary("\n"), [198])
        self.assertEqual(enc.encode_ordinary(" "), [220])
        self.assertEqual(enc.encode_ordinary(" the"), [262])
        self.assertEqual(enc.n_vocab, 50257)
        self.assertEqual(enc.eot_token, EOT)
        self.assertEqual(enc.encode("<|endoftext|>", allowed_special="all"), [EOT])
        self.assertNotIn(EOT, enc.encode_ordinary("<|endoftext|>"))
        self.assertEqual(enc.decode_single_token_bytes(188), b"\x00")
        self.assertEqual(enc.decode_single_token_bytes(0), b"!")

    def test_matches_reference_on_varied_text(self):
        enc, ref = encoding(), reference()
        for text in VARIED_TEXTS:
            with self.subTest(text=text):
                expect = ref.encode(text)
                self.assertEqual(enc.encode_ordinary(text), expect)
                self.assertEqual(ref.decode_bytes(expect), text.encode("utf-8"))
        joined = "\n".join(VARIED_TEXTS)
        self.assertEqual(enc.encode_ordinary(joined), ref.encode(joined))

    def test_matches_reference_on_kjv(self):
        enc, ref = encoding(), reference()
        lines = kjv_lines(200)
        self.assertEqual(len(lines), 200)
        text = "".join(lines)
        tokens = enc.encode_ordinary(text)
        self.assertEqual(tokens, ref.encode(text))
        self.assertEqual(ref.decode_bytes(tokens), text.encode("utf-8"))
        self.assertEqual(tokens[:3], ref.encode("Ge1:1 In")[:3])
        for line in lines[:20]:
            self.assertEqual(enc.encode_ordinary(line), ref.encode(line))

    def test_matches_reference_on_random_strings(self):
        enc, ref = encoding(), reference()
        pool = list("abcxyzABCXYZ0123456789 \t\n\r'.,!?-_#\"") + list("éßøñ€中文😀👍\u00a0\u0301\u200bΩж") + [
            "'s", "'ll", "  ", "\n\n", "the", " the", "ing", "tion"]
        rng = random.Random(20240520)
        for _ in range(300):
            text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
            self.assertEqual(enc.encode_ordinary(text), ref.encode(text), repr(text))

    def test_mergeable_ranks(self):
        ranks = prepare.gpt2_mergeable_ranks(VOCAB_DIR)
        ref = reference()
        self.assertEqual(len(ranks), 50256)
        for token, rank in [("!", 0), ("Ġthe", 262), ("Hello", 15496), ("Ġworld", 995)]:
            self.assertEqual(ranks[bytes(ref.byte_decoder[c] for c in token)], rank)
        self.assertEqual(ref.encoder["<|endoftext|>"], EOT)

    def test_broken_vocabulary_dir(self):
        with tempfile.TemporaryDirectory(prefix="llm8_prepare_vocab_") as tmp:
            with self.assertRaises(prepare.PrepareError) as cm:
                prepare.gpt2_mergeable_ranks(os.path.join(tmp, "missing"))
            self.assertIn("missing", str(cm.exception))
            shutil.copy(os.path.join(VOCAB_DIR, "encoder.json"), tmp)
            with open(os.path.join(VOCAB_DIR, "vocab.bpe"), "r", encoding="utf-8") as f:
                merges = f.read().split("\n")
            with open(os.path.join(tmp, "vocab.bpe"), "w", encoding="utf-8") as f:
                f.write("\n".join(merges[:-3] + [""]))  # the last two merges dropped
            with self.assertRaises(prepare.PrepareError) as cm:
                prepare.gpt2_mergeable_ranks(tmp)
            self.assertIn("disagree", str(cm.exception))
            with open(os.path.join(tmp, "vocab.bpe"), "w", encoding="utf-8") as f:
                f.write("#version: 0.2\nĠ t x\n")
            with self.assertRaises(prepare.PrepareError) as cm:
                prepare.gpt2_mergeable_ranks(tmp)
            self.assertIn("vocab.bpe:2", str(cm.exception))


# ---------------------------------------------------------------------------------------------------------------
# Document splitting (in-process)


class TestSplitDocuments(unittest.TestCase):
    def test_kjv_books(self):
        lines = kjv_lines(1540)  # Genesis (1533 verses) and the start of Exodus
        docs = prepare.split_documents("".join(lines), "kjv-books", "kjv")
        self.assertEqual(len(docs), 2)
        self.assertTrue(docs[0].startswith("Ge1:1 In the beginning"))
        self.assertTrue(docs[0].endswith("coffin in Egypt.\n"))
        self.assertTrue(docs[1].startswith("Exo1:1 "))
        self.assertEqual("".join(docs), "".join(lines))
        text = "1Sa1:1 a\n1Sa1:2 b\nno reference\n2Sa1:1 c\n"
        self.assertEqual(prepare.split_documents(text, "kjv-books"), ["1Sa1:1 a\n1Sa1:2 b\nno reference\n", "2Sa1:1 c\n"])
        with self.assertRaises(prepare.PrepareError):
            prepare.split_documents("plain text\nwithout references\n", "kjv-books", "plain.txt")

    def test_blank_lines_and_file(self):
        text = "first para\nline two\n\n\n  \nsecond\n \t\nthird\n\n"
        self.assertEqual(prepare.split_documents(text, "blank-lines"), ["first para\nline two\n", "second\n", "third\n"])
        self.assertEqual(prepare.split_documents(text, "file"), [text])
        self.assertEqual(prepare.split_documents(" \n\t\n", "file"), [])
        self.assertEqual(prepare.split_documents("", "blank-lines"), [])

    def test_kjv_flag_defaults(self):
        args = prepare.parse_args(["--kjv"])
        self.assertEqual(args.inputs, [prepare.KJV_CORPUS])
        self.assertEqual(args.name, "kjv")
        self.assertEqual(args.split_docs, "kjv-books")
        self.assertEqual(args.out, os.path.join(REPO_ROOT, "data", "kjv"))
        self.assertFalse(args.use_uint32)
        self.assertTrue(prepare.parse_args(["--name", "x", "--vocab-size", "70000", "a"]).use_uint32)


# ---------------------------------------------------------------------------------------------------------------
# End to end: prepare.py as a subprocess


DOCS = {  # file name -> text (one document each with --split-docs file)
    "a.txt": "In the beginning God created the heaven and the earth.\nAnd the earth was without form.\n",
    "b.txt": "Café naïve — “quotes” 😀 中文\n" * 5,
    "c.txt": "I'm here; you're there. 12,345 items at 3.14 each!\n\n  indented\tand\ttabbed  \n",
    "d.txt.gz": "A gzipped document.\n" + "word " * 60 + "\n",
    "e.txt": "<|endoftext|> literally, then more text.\n",
    "f.txt": "Short.",
    "g.txt": "def f(x):\n    return x ** 2\n" * 4,
}
ORDER = ["a.txt", "b.txt", "c.txt", "d.txt.gz", "e.txt", "f.txt", "g.txt"]
SHARD_TOKENS = 48
HEADER_BYTES = 1024


def read_shard(path):
    """(header (256,) int32, tokens) with the dtype the header says."""
    with open(path, "rb") as f:
        data = f.read()
    header = np.frombuffer(data[:HEADER_BYTES], dtype="<i4")
    dtype = {20240520: "<u2", 20240801: "<u4"}[int(header[0])]
    tokens = np.frombuffer(data[HEADER_BYTES:], dtype=dtype)
    return header, tokens


def hash_fraction(doc, seed):
    digest = hashlib.sha256(f"{seed}\0".encode() + doc.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") / 2.0**64


class TestPrepareEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix=f"llm8_prepare_{os.getpid()}_")
        cls.inputs = os.path.join(cls.tmp, "in")
        os.makedirs(os.path.join(cls.inputs, "sub"))
        cls.paths = []
        for name in ORDER:
            path = os.path.join(cls.inputs, "sub" if name == "g.txt" else "", name)
            data = DOCS[name].encode("utf-8")
            with open(path, "wb") as f:
                f.write(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
            cls.paths.append(path)
        with open(os.path.join(cls.inputs, ".hidden.txt"), "w") as f:
            f.write("hidden files in directories are skipped\n")
        with open(os.path.join(cls.inputs, "notes.md"), "w") as f:
            f.write("filtered out by --ext .txt\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_prepare(self, *args, expect_rc=0):
        proc = subprocess.run([sys.executable, PREPARE_PY, "--quiet", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=120)
        if expect_rc is not None:
            self.assertEqual(proc.returncode, expect_rc, f"args {args}\nstdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def out_dir(self, name):
        return os.path.join(self.tmp, name)

    def shards(self, out, name="t"):
        """{split: [paths in index order]}; checks that nothing but the manifest else is in the folder and indices
        are contiguous."""
        result = {"train": [], "val": []}
        pattern = re.compile(re.escape(name) + r"_(train|val)_(\d{6})\.bin$")
        self.assertTrue(os.path.isfile(os.path.join(out, f"{name}_manifest.json")))
        for entry in sorted(os.listdir(out)):
            if entry == f"{name}_manifest.json":
                continue
            m = pattern.fullmatch(entry)
            self.assertIsNotNone(m, f"unexpected file {entry} in {out}")
            result[m.group(1)].append((int(m.group(2)), os.path.join(out, entry)))
        for split in result:
            self.assertEqual([i for i, _ in result[split]], list(range(len(result[split]))), split)
            result[split] = [p for _, p in result[split]]
        return result

    def split_tokens(self, paths, magic=20240520, version=1, shard_tokens=SHARD_TOKENS):
        """All tokens of one split, checking every header."""
        parts = []
        for i, path in enumerate(paths):
            header, tokens = read_shard(path)
            self.assertEqual(int(header[0]), magic, path)
            self.assertEqual(int(header[1]), version, path)
            self.assertEqual(int(header[2]), len(tokens), path)
            self.assertTrue(np.all(header[3:] == 0), path)
            if i + 1 < len(paths):
                self.assertEqual(len(tokens), shard_tokens, path)
            else:
                self.assertTrue(1 <= len(tokens) <= shard_tokens, path)
            parts.append(tokens.astype(np.int64))
        return np.concatenate(parts).tolist() if parts else []

    def documents_of(self, tokens):
        """Splits a split's tokens at <|endoftext|> (which must come first) and decodes every document."""
        self.assertEqual(tokens[0], EOT)
        docs, current = [], None
        for t in tokens:
            if t == EOT:
                if current is not None:
                    docs.append(current)
                current = []
            else:
                current.append(t)
        docs.append(current)
        ref = reference()
        return [ref.decode_bytes(d).decode("utf-8") for d in docs], docs

    def expected_splits(self, texts, val_fraction, seed=1337):
        """The documented rule: hash < val_fraction -> val; both splits non-empty when possible."""
        h = [hash_fraction(t, seed) for t in texts]
        is_val = [x < val_fraction for x in h]
        if val_fraction > 0 and len(h) >= 2 and not any(is_val):
            is_val[h.index(min(h))] = True
        if val_fraction < 1 and len(h) >= 2 and all(is_val):
            is_val[h.index(max(h))] = False
        return ([t for t, v in zip(texts, is_val) if not v], [t for t, v in zip(texts, is_val) if v])

    def read_all_bytes(self, out):
        result = {}
        for entry in sorted(os.listdir(out)):
            with open(os.path.join(out, entry), "rb") as f:
                result[entry] = f.read()
        return result

    def test_shards_round_trip_and_determinism(self):
        out1, out2 = self.out_dir("run1"), self.out_dir("run2")
        common = ["--name", "t", "--val-fraction", "0.5", "--shard-tokens", str(SHARD_TOKENS)]
        self.run_prepare(*common, "--out", out1, "--workers", "1", *self.paths)
        self.run_prepare(*common, "--out", out2, "--workers", "3", *self.paths)
        shards = self.shards(out1)
        self.assertGreaterEqual(len(shards["train"]), 2)  # documents continue across shards
        self.assertGreaterEqual(len(shards["val"]), 1)

        texts = [DOCS[name] for name in ORDER]
        expect_train, expect_val = self.expected_splits(texts, 0.5)
        self.assertTrue(expect_train and expect_val)
        ref = reference()
        for split, expect in (("train", expect_train), ("val", expect_val)):
            tokens = self.split_tokens(shards[split])
            self.assertEqual(tokens.count(EOT), len(expect), split)
            decoded, token_docs = self.documents_of(tokens)
            self.assertEqual(decoded, expect, split)  # in input order
            self.assertEqual(token_docs, [ref.encode(t) for t in expect], split)  # exactly GPT-2's tokens

        # Identical bytes (shards and manifest) across runs, output folders and worker counts.
        self.assertEqual(self.read_all_bytes(out1), self.read_all_bytes(out2))

        # Reversed input order: the same documents in each split (in the new order).
        out3 = self.out_dir("run3")
        self.run_prepare(*common, "--out", out3, *reversed(self.paths))
        shards3 = self.shards(out3)
        for split, expect in (("train", expect_train), ("val", expect_val)):
            decoded, _ = self.documents_of(self.split_tokens(shards3[split]))
            self.assertEqual(decoded, list(reversed(expect)), split)

        # A rerun with larger shards replaces the old ones and removes the stale higher-numbered shards.
        self.run_prepare(*common[:-2], "--shard-tokens", "100000", "--out", out3, *self.paths)
        shards3 = self.shards(out3)
        self.assertEqual(len(shards3["train"]), 1)
        self.assertEqual(len(shards3["val"]), 1)
        for split in ("train", "val"):
            self.assertEqual(self.split_tokens(shards3[split], shard_tokens=100000),
                             self.split_tokens(shards[split]))

        # inspect_shards.py accepts the output and flags a truncated shard.
        proc = subprocess.run([sys.executable, INSPECT_PY, "--first", "8", os.path.join(out1, "t_*.bin")],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("0 invalid", proc.stdout)
        bad = os.path.join(self.tmp, "bad.bin")
        with open(shards["train"][0], "rb") as f:
            data = f.read()
        with open(bad, "wb") as f:
            f.write(data[:-2])
        proc = subprocess.run([sys.executable, INSPECT_PY, "--first", "0", bad], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("INVALID", proc.stdout)

    def test_manifest(self):
        """<name>_manifest.json describes exactly what went in and what came out."""
        out = self.out_dir("manifest")
        args = ["--name", "t", "--val-fraction", "0.5", "--shard-tokens", str(SHARD_TOKENS), "--seed", "9", "--uint32",
                "--ext", ".txt,md", "--split-docs", "blank-lines", "--encoding-errors", "replace"]
        self.run_prepare(*args, "--out", out, *self.paths)
        with open(os.path.join(out, "t_manifest.json"), "r", encoding="utf-8") as f:
            manifest = json.load(f)
        self.assertEqual((manifest["format"], manifest["version"], manifest["name"]), ("llm8 token shards", 1, "t"))

        inputs = []
        for path in self.paths:
            with open(path, "rb") as f:
                raw = f.read()
            inputs.append({"path": path, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()})
        self.assertEqual(manifest["inputs"], inputs)  # in input order, hashes of the bytes as stored (.gz too)

        vocab = []
        for name in ("encoder.json", "vocab.bpe"):
            with open(os.path.join(VOCAB_DIR, name), "rb") as f:
                data = f.read()
            vocab.append({"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        self.assertEqual(manifest["tokenizer"], {"name": "gpt2", "eot_token": EOT, "n_vocab": 50257, "files": vocab})
        self.assertEqual(manifest["options"], {
            "split_docs": "blank-lines", "extensions": [".txt", ".md"], "encoding_errors": "replace", "seed": 9,
            "val_fraction": 0.5, "shard_tokens": SHARD_TOKENS, "vocab_size": 50257, "dtype": "uint32"})

        shards = self.shards(out)
        listed = []
        for split in ("train", "val"):
            tokens = self.split_tokens(shards[split], magic=20240801, version=7)
            self.assertEqual(manifest["splits"][split], {"documents": tokens.count(EOT), "tokens": len(tokens),
                                                         "shards": len(shards[split])})
            for path in shards[split]:
                with open(path, "rb") as f:
                    data = f.read()
                listed.append({"file": os.path.basename(path), "split": split, "tokens": (len(data) - 1024) // 4,
                               "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        self.assertEqual(manifest["shards"], listed)

        # Equal inputs and options give an equal manifest, whatever the output folder and worker count.
        again = self.out_dir("manifest_again")
        self.run_prepare(*args, "--workers", "3", "--out", again, *self.paths)
        self.assertEqual(self.read_all_bytes(out), self.read_all_bytes(again))

    def test_uint32_and_directory_input(self):
        out16, out32 = self.out_dir("u16"), self.out_dir("u32")
        common = ["--name", "t", "--val-fraction", "0.5", "--shard-tokens", str(SHARD_TOKENS), "--ext", "txt"]
        self.run_prepare(*common, "--out", out16, self.inputs)
        self.run_prepare(*common, "--out", out32, "--uint32", self.inputs)
        s16, s32 = self.shards(out16), self.shards(out32)
        # The directory: sorted, recursive (sub/g.txt after the top-level files), .gz looked through for --ext,
        # hidden files and notes.md skipped.
        texts = [DOCS[name] for name in ORDER]
        expect_train, expect_val = self.expected_splits(texts, 0.5)
        for split, expect in (("train", expect_train), ("val", expect_val)):
            t16 = self.split_tokens(s16[split])
            t32 = self.split_tokens(s32[split], magic=20240801, version=7)
            self.assertEqual(t16, t32, split)
            self.assertEqual(self.documents_of(t16)[0], expect, split)
        header, tokens = read_shard(s32["train"][0])
        self.assertEqual(tokens.dtype, np.dtype("<u4"))
        self.assertEqual(os.path.getsize(s32["train"][0]), HEADER_BYTES + 4 * int(header[2]))

    def test_val_fraction_extremes(self):
        out0, out1 = self.out_dir("v0"), self.out_dir("v1")
        self.run_prepare("--name", "t", "--val-fraction", "0", "--out", out0, *self.paths)
        self.run_prepare("--name", "t", "--val-fraction", "1", "--out", out1, *self.paths)
        s0, s1 = self.shards(out0), self.shards(out1)
        self.assertEqual((len(s0["train"]), len(s0["val"])), (1, 0))
        self.assertEqual((len(s1["train"]), len(s1["val"])), (0, 1))
        self.assertEqual(self.split_tokens(s0["train"], shard_tokens=10**8),
                         self.split_tokens(s1["val"], shard_tokens=10**8))

    def test_bad_inputs(self):
        good_file = self.paths[0]
        not_utf8 = os.path.join(self.tmp, "latin1.txt")
        with open(not_utf8, "wb") as f:
            f.write("caf\xe9\n".encode("latin-1"))
        blank = os.path.join(self.tmp, "blank.txt")
        with open(blank, "w") as f:
            f.write("  \n\n\t\n")
        broken_gz = os.path.join(self.tmp, "broken.txt.gz")
        with open(broken_gz, "wb") as f:
            f.write(gzip.compress(b"some text " * 100)[:-6])  # the end of the stream and the trailer cut off
        a_file = os.path.join(self.tmp, "a_file")
        with open(a_file, "w") as f:
            f.write("x")
        out = self.out_dir("bad")
        missing = os.path.join(self.tmp, "no_such_input.txt")
        cases = [  # (args, words the error output must hold)
            (["--name", "t", "--out", out, missing], ["does not exist", missing]),
            (["--name", "t", "--out", out, "--val-fraction", "1.5", good_file], ["--val-fraction"]),
            (["--name", "t", "--out", out, "--val-fraction", "-0.1", good_file], ["--val-fraction"]),
            (["--name", "t", "--out", out, "--val-fraction", "nan", good_file], ["--val-fraction"]),
            (["--name", "t", "--out", out, "--val-fraction", "abc", good_file], ["--val-fraction"]),
            (["--name", "t", "--out", out, "--shard-tokens", "0", good_file], ["--shard-tokens"]),
            (["--name", "t", "--out", out, "--workers", "0", good_file], ["--workers"]),
            (["--name", "t", "--out", out, "--vocab-size", "100", good_file], ["--vocab-size"]),
            (["--name", "a/b", "--out", out, good_file], ["--name"]),
            (["--out", out, good_file], ["--name"]),
            (["--name", "t", "--out", out], ["input"]),
            (["--name", "t", "--out", out, not_utf8], ["UTF-8", not_utf8]),
            (["--name", "t", "--out", out, blank], ["no non-empty documents"]),
            (["--name", "t", "--out", out, broken_gz], ["cannot read", broken_gz]),
            (["--name", "t", "--out", out, "--split-docs", "kjv-books", good_file], ["KJV", good_file]),
            (["--name", "t", "--out", out, "--vocab-dir", self.tmp, good_file], ["vocabulary", self.tmp]),
            (["--name", "t", "--out", a_file, good_file], ["output directory", a_file]),
        ]
        for args, words in cases:
            with self.subTest(args=args):
                proc = self.run_prepare(*args, expect_rc=None)
                self.assertNotEqual(proc.returncode, 0)
                self.assertNotIn("Traceback", proc.stderr)
                self.assertIn("error", proc.stderr)
                for word in words:
                    self.assertIn(word, proc.stderr)
        self.assertFalse(os.path.exists(out) and os.listdir(out), "a failed run left shards behind")


# ---------------------------------------------------------------------------------------------------------------
# All or nothing: failures leave the previous output and no debris; OS errors are one line


# Runs prepare.py with a fault injected at the fsync of a shard file (the first `after` shards succeed):
# "enospc" makes it fail with ENOSPC as a full disk would, "sigterm" / "sigkill" send the process that signal.
FAULT_WRAPPER = r"""
import errno, os, runpy, signal, stat, sys
fault, after, script = sys.argv[1], int(sys.argv[2]), sys.argv[3]
real_fsync, shards = os.fsync, [0]
def fsync(fd):
    if stat.S_ISREG(os.fstat(fd).st_mode):
        shards[0] += 1
        if shards[0] > after:
            if fault == "enospc":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.kill(os.getpid(), signal.SIGKILL if fault == "sigkill" else signal.SIGTERM)
    return real_fsync(fd)
os.fsync = fsync
sys.argv = [script] + sys.argv[4:]
runpy.run_path(script, run_name="__main__")
"""


def snapshot(root):
    """Everything under root: relative path -> ("file", bytes, inode) / ("link", target) / ("dir", mode)."""
    result = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                result[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                result[rel] = ("dir", st.st_mode)
            else:
                with open(path, "rb") as f:
                    result[rel] = ("file", f.read(), st.st_ino)
    return result


class TestOutputSafety(unittest.TestCase):
    COMMON = ["--name", "t", "--val-fraction", "0.5", "--shard-tokens", str(SHARD_TOKENS)]

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix=f"llm8_prepare_safety_{os.getpid()}_")
        self.parent = os.path.join(self.tmp, "parent")  # holds only the output: any debris shows here
        os.makedirs(self.parent)
        self.out = os.path.join(self.parent, "out")
        self.inputs = []
        for name in ORDER:
            path = os.path.join(self.tmp, name)
            data = DOCS[name].encode("utf-8")
            with open(path, "wb") as f:
                f.write(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
            self.inputs.append(path)

    def tearDown(self):
        for dirpath, dirs, _ in os.walk(self.tmp):  # tests may leave read-only folders
            for d in dirs:
                os.chmod(os.path.join(dirpath, d), 0o755)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_script(self, *args, wrapper=None, timeout=120, preexec_fn=None):
        cmd = [sys.executable, PREPARE_PY, *args]
        if wrapper is not None:
            cmd = [sys.executable, "-c", FAULT_WRAPPER, *wrapper, PREPARE_PY, *args]
        return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=preexec_fn)

    def make_previous_output(self):
        """A previous run's output with several shards, plus entries that are not this run's: another name's shard,
        a note, a subfolder and a symbolic link. Returns the snapshot of the parent folder."""
        proc = self.run_script("--quiet", *self.COMMON, "--out", self.out, *self.inputs)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertGreaterEqual(len([e for e in os.listdir(self.out) if e.startswith("t_train_")]), 3)
        with open(os.path.join(self.out, "u_train_000000.bin"), "wb") as f:
            f.write(b"another dataset's shard")
        with open(os.path.join(self.out, "README.txt"), "w") as f:
            f.write("notes kept beside the shards\n")
        os.makedirs(os.path.join(self.out, "sub", "deeper"))
        with open(os.path.join(self.out, "sub", "deeper", "x.txt"), "w") as f:
            f.write("x")
        os.symlink("README.txt", os.path.join(self.out, "link_to_readme"))
        os.chmod(self.out, 0o750)
        return snapshot(self.parent)

    def assert_one_line_error(self, proc, rc=1, words=()):
        self.assertEqual(proc.returncode, rc, proc.stdout + proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        lines = proc.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertTrue(lines[0].startswith("prepare.py: "), proc.stderr)
        for word in words:
            self.assertIn(word, proc.stderr)

    def test_full_disk_half_way_keeps_previous_output(self):
        before = self.make_previous_output()
        # A different shard size: every new shard differs from the old one of the same name.
        args = ["--quiet", *self.COMMON[:-1], "40", "--out", self.out, *self.inputs]
        proc = self.run_script(*args, wrapper=["enospc", "2"])
        self.assert_one_line_error(proc, words=["error", os.strerror(errno.ENOSPC), "unchanged",
                                                os.path.join(self.out, "t_")])
        self.assertEqual(snapshot(self.parent), before)  # byte-identical, no temporary files anywhere

    def test_sigterm_half_way_keeps_previous_output(self):
        before = self.make_previous_output()
        proc = self.run_script("--quiet", "--seed", "7", *self.COMMON, "--out", self.out, *self.inputs,
                               wrapper=["sigterm", "1"])
        self.assert_one_line_error(proc, rc=128 + signal.SIGTERM, words=["interrupted", "SIGTERM"])
        self.assertEqual(snapshot(self.parent), before)

    def test_sigkill_half_way_keeps_previous_output(self):
        """SIGKILL allows no cleanup: the temporary directory stays, but the previous output is untouched, and the
        next run names the leftover."""
        before = self.make_previous_output()
        proc = self.run_script("--quiet", "--seed", "8", *self.COMMON, "--out", self.out, *self.inputs,
                               wrapper=["sigkill", "1"])
        self.assertEqual(proc.returncode, -signal.SIGKILL)
        after = snapshot(self.parent)
        leftovers = sorted({k.split(os.sep)[0] for k in after if k.startswith(".out.prepare-")})
        self.assertEqual(len(leftovers), 1, sorted(after))
        self.assertEqual({k: v for k, v in after.items() if not k.startswith(".out.prepare-")}, before)
        proc = self.run_script(*self.COMMON, "--out", self.out, *self.inputs)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(f"warning: '{os.path.join(self.parent, leftovers[0])}' is left from a prepare.py run", proc.stderr)

    def test_file_size_limit_keeps_previous_output(self):
        """A real error from the kernel (EFBIG from RLIMIT_FSIZE, the closest to a full disk a test can get)."""
        before = self.make_previous_output()

        def limit_file_size():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, no signal
            resource.setrlimit(resource.RLIMIT_FSIZE, (HEADER_BYTES + 10, HEADER_BYTES + 10))

        proc = self.run_script("--quiet", *self.COMMON, "--seed", "3", "--out", self.out, *self.inputs,
                               preexec_fn=limit_file_size)
        self.assert_one_line_error(proc, words=["error", os.strerror(errno.EFBIG), self.out])
        self.assertEqual(snapshot(self.parent), before)

    def test_real_full_disk(self):
        """A real ENOSPC: a 3 MiB tmpfs (in a private user and mount namespace, so no privileges are needed and
        nothing outlives the test) holds the KJV shards once but not twice."""
        disk = os.path.join(self.tmp, "disk")
        os.makedirs(disk)
        if shutil.which("unshare") is None or subprocess.run(
                ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=3m tmpfs "$0"', disk],
                capture_output=True, timeout=60).returncode != 0:
            self.skipTest("cannot mount a tmpfs in a user namespace here (unshare -rm)")
        script = r"""
set -e
mount -t tmpfs -o size=3m tmpfs "$1"
"$2" "$3" --kjv --quiet --out "$1/kjv" --shard-tokens 300000
cp -a "$1" "$4/before"
set +e
"$2" "$3" --kjv --quiet --out "$1/kjv" --shard-tokens 200000 --seed 5 2> "$4/stderr"
echo $? > "$4/rc"
cp -a "$1" "$4/after"
"""
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", disk, sys.executable, PREPARE_PY, self.tmp],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(self.tmp, "rc")) as f, open(os.path.join(self.tmp, "stderr")) as g:
            rc, stderr = int(f.read()), g.read()
        self.assertEqual(rc, 1, stderr)
        self.assertNotIn("Traceback", stderr)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn(os.strerror(errno.ENOSPC), stderr)
        self.assertIn(os.path.join(disk, "kjv", "kjv_train_"), stderr)

        def contents(root):  # (path -> bytes) of the copied tmpfs: the previous output and nothing else
            return {k: v[1] for k, v in snapshot(root).items()}

        before, after = contents(os.path.join(self.tmp, "before")), contents(os.path.join(self.tmp, "after"))
        self.assertEqual(after, before)
        self.assertEqual(sorted(before), ["kjv", "kjv/kjv_manifest.json", "kjv/kjv_train_000000.bin",
                                          "kjv/kjv_train_000001.bin", "kjv/kjv_train_000002.bin",
                                          "kjv/kjv_train_000003.bin", "kjv/kjv_val_000000.bin"])

    def run_in_process(self, *args):
        """prepare.main in this process (so that its functions can be patched): (exit code, stderr)."""
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = prepare.main(["--quiet", *args])
        return rc, err.getvalue()

    def test_writer_failure_after_first_shard_in_process(self):
        before = self.make_previous_output()
        real_write_shard = prepare.write_shard
        for exception, rc in ((OSError(errno.EIO, "injected I/O error"), 1), (KeyboardInterrupt(), 130),
                              (prepare.PrepareError("injected"), 1)):
            calls = []

            def failing_write_shard(path, *a, **kw):
                calls.append(path)
                if len(calls) > 1:
                    raise exception
                return real_write_shard(path, *a, **kw)

            with self.subTest(exception=exception), \
                    unittest.mock.patch.object(prepare, "write_shard", failing_write_shard):
                code, stderr = self.run_in_process(*self.COMMON, "--seed", "11", "--out", self.out, *self.inputs)
                self.assertEqual(code, rc, stderr)
                self.assertEqual(len(calls), 2)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertEqual(snapshot(self.parent), before)

    def test_failed_swap_keeps_previous_output(self):
        """The last step itself fails: the atomic exchange, or either rename of the fallback."""
        before = self.make_previous_output()
        args = [*self.COMMON, "--seed", "5", "--out", self.out, *self.inputs]

        def exchange_fails(a, b):
            raise OSError(errno.EIO, "injected", a)

        code, stderr = None, None
        with unittest.mock.patch.object(prepare, "exchange_paths", exchange_fails):
            code, stderr = self.run_in_process(*args)
        self.assertEqual(code, 1)
        self.assertIn("unchanged", stderr)
        self.assertEqual(snapshot(self.parent), before)

        real_rename = os.rename
        for failing in ("aside", "new"):
            def rename(src, dst):
                moving_new = os.path.basename(src).startswith(".out.prepare-") and "-old-" not in src
                if (failing == "aside" and src == os.path.realpath(self.out)) or (failing == "new" and moving_new):
                    raise OSError(errno.EIO, "injected", src)
                return real_rename(src, dst)

            with self.subTest(failing=failing), \
                    unittest.mock.patch.object(prepare, "exchange_paths", lambda a, b: False), \
                    unittest.mock.patch.object(prepare.os, "rename", rename):
                code, stderr = self.run_in_process(*args)
                self.assertEqual(code, 1)
                self.assertIn("unchanged", stderr)
                self.assertEqual(snapshot(self.parent), before)

    def test_input_changed_between_passes(self):
        """An input rewritten between the split pass and the tokenising pass is an error, not a wrong split."""
        before = self.make_previous_output()
        real_read_text, seen = prepare.read_text, []

        def read_text(path, errors, *rest):
            if path in seen and path == self.inputs[0]:  # a.txt, as pass 2 reads it again
                with open(path, "a") as f:
                    f.write("appended while prepare.py ran\n")
            seen.append(path)
            return real_read_text(path, errors, *rest)

        with unittest.mock.patch.object(prepare, "read_text", read_text):
            code, stderr = self.run_in_process(*self.COMMON, "--seed", "4", "--out", self.out, *self.inputs)
        self.assertEqual(code, 1)
        self.assertIn("changed while it was being prepared", stderr)
        self.assertIn(self.inputs[0], stderr)
        self.assertEqual(snapshot(self.parent), before)

    def test_rerun_replaces_the_whole_set(self):
        before = self.make_previous_output()
        fresh = os.path.join(self.tmp, "fresh")
        for exchange in (True, False):  # renameat2's exchange, and the two renames where it is missing
            args = [*self.COMMON[:-1], "100000", "--seed", "1" if exchange else "2", *self.inputs]
            if exchange:
                proc = self.run_script("--quiet", *args, "--out", self.out)
                self.assertEqual(proc.returncode, 0, proc.stderr)
            else:
                with unittest.mock.patch.object(prepare, "exchange_paths", lambda a, b: False):
                    self.assertEqual(self.run_in_process(*args, "--out", self.out), (0, ""))
            proc = self.run_script("--quiet", *args, "--out", fresh)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            after, expect = snapshot(self.parent), snapshot(fresh)
            shutil.rmtree(fresh)
            # Exactly the new set (byte-identical to a run into an empty folder), none of the old shards.
            ours = {k: v[1] for k, v in after.items() if k.startswith("out/t_")}
            self.assertEqual(ours, {"out/" + k: v[1] for k, v in expect.items()})
            self.assertEqual(sorted(ours), ["out/t_manifest.json", "out/t_train_000000.bin", "out/t_val_000000.bin"])
            # Everything else as it was: the same files (hard links: the same inodes), link, folders and mode.
            others = {k: v for k, v in after.items() if not k.startswith("out/t_")}
            self.assertEqual(others, {k: v for k, v in before.items() if not k.startswith("out/t_")})
            self.assertEqual(stat.S_IMODE(os.stat(self.out).st_mode), 0o750)

    def test_output_through_a_symbolic_link(self):
        real = os.path.join(self.tmp, "real_out")
        os.makedirs(real)
        os.symlink(real, self.out)
        for shard_tokens in (str(SHARD_TOKENS), "100000"):
            proc = self.run_script("--quiet", *self.COMMON[:-1], shard_tokens, "--out", self.out, *self.inputs)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertTrue(os.path.islink(self.out))
            self.assertEqual(os.readlink(self.out), real)
        self.assertEqual(sorted(os.listdir(real)), ["t_manifest.json", "t_train_000000.bin", "t_val_000000.bin"])
        self.assertEqual(sorted(os.listdir(self.tmp)), sorted(["parent", "real_out", *ORDER]))

    def test_new_output_and_created_parents(self):
        nested = os.path.join(self.parent, "a", "b", "out")
        not_utf8 = os.path.join(self.tmp, "latin1.txt")
        with open(not_utf8, "wb") as f:
            f.write("caf\xe9\n".encode("latin-1"))
        proc = self.run_script("--quiet", *self.COMMON, "--out", nested, not_utf8)  # fails after making a/b
        self.assert_one_line_error(proc, words=["UTF-8"])
        self.assertEqual(os.listdir(self.parent), [])  # the folders it created for the output are gone again

        def chmod_fails(path, mode, **kw):
            raise OSError(errno.EPERM, "injected", path)

        with unittest.mock.patch.object(prepare.os, "chmod", chmod_fails):  # fails inside the output set-up
            code, stderr = self.run_in_process(*self.COMMON, "--out", nested, *self.inputs)
        self.assertEqual(code, 1)
        self.assertIn("temporary directory", stderr)
        self.assertEqual(os.listdir(self.parent), [])
        proc = self.run_script("--quiet", *self.COMMON, "--out", nested, *self.inputs)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(sorted(os.listdir(os.path.join(self.parent, "a", "b"))), ["out"])
        umask = os.umask(0)
        os.umask(umask)
        self.assertEqual(stat.S_IMODE(os.stat(nested).st_mode), 0o777 & ~umask)  # not mkdtemp's 0700

    def test_os_errors_are_one_line(self):
        a_file = os.path.join(self.tmp, "a_file")
        with open(a_file, "w") as f:
            f.write("x")
        not_utf8 = os.path.join(self.tmp, "latin1.txt")
        with open(not_utf8, "wb") as f:
            f.write("caf\xe9\n".encode("latin-1"))
        corrupt_gz = os.path.join(self.tmp, "corrupt.txt.gz")
        data = gzip.compress(b"hello world " * 1000, mtime=0)
        with open(corrupt_gz, "wb") as f:
            f.write(data[:20] + bytes(200) + data[220:])  # a valid header, then a broken deflate stream
        fifo = os.path.join(self.tmp, "fifo.txt")
        os.mkfifo(fifo)
        cases = [  # (args, words the one error line must hold)
            (["--out", a_file, self.inputs[0]], ["output directory", a_file, "not a directory"]),
            (["--out", os.path.join(a_file, "sub"), self.inputs[0]], ["cannot create the output directory", a_file]),
            # The output is checked before the inputs are read: the bad output is reported, not the bad input.
            (["--out", os.path.join(a_file, "sub"), not_utf8], ["output directory", a_file]),
            (["--out", self.out, corrupt_gz], ["cannot read", corrupt_gz]),
            (["--out", self.out, fifo], ["not a regular file", fifo]),
            (["--out", "/", self.inputs[0]], ["'/'"]),
        ]
        self.check_error_cases(cases)

    def check_error_cases(self, cases):
        for args, words in cases:
            with self.subTest(args=args):
                proc = self.run_script("--quiet", "--name", "t", *args, timeout=60)
                self.assert_one_line_error(proc, words=["prepare.py: error: ", *words])
                self.assertEqual(os.listdir(self.parent), [])
        self.assertEqual([e for e in os.listdir(self.tmp) if e.startswith(".")], [])  # no temporary directories
        for dirpath, dirs, files in os.walk(self.tmp):
            self.assertEqual([e for e in dirs + files if ".prepare-" in e or ".tmp" in e], [], dirpath)

    def test_permission_errors_are_one_line(self):
        if os.geteuid() == 0:
            self.skipTest("root reads and writes regardless of permissions (run as another user to cover this)")
        not_utf8 = os.path.join(self.tmp, "latin1.txt")
        with open(not_utf8, "wb") as f:
            f.write("caf\xe9\n".encode("latin-1"))
        locked_dir = os.path.join(self.tmp, "locked_dir")
        os.makedirs(os.path.join(locked_dir, "inner"))
        with open(os.path.join(locked_dir, "inner", "doc.txt"), "w") as f:
            f.write("unreachable document\n")
        os.chmod(os.path.join(locked_dir, "inner"), 0)
        unreadable = os.path.join(self.tmp, "unreadable.txt")
        with open(unreadable, "w") as f:
            f.write("secret\n")
        os.chmod(unreadable, 0)
        read_only_out = os.path.join(self.tmp, "ro_out")
        os.makedirs(read_only_out)
        os.chmod(read_only_out, 0o555)
        read_only_parent = os.path.join(self.tmp, "ro_parent")
        os.makedirs(os.path.join(read_only_parent, "out"))
        os.chmod(read_only_parent, 0o555)
        denied = os.strerror(errno.EACCES)
        cases = [
            (["--out", self.out, locked_dir], ["cannot list", os.path.join(locked_dir, "inner"), denied]),
            (["--out", self.out, unreadable], ["cannot read", unreadable, denied]),
            (["--out", read_only_out, not_utf8], ["cannot write to the output directory", read_only_out]),
            (["--out", os.path.join(read_only_parent, "out"), not_utf8], [read_only_parent, denied]),
            (["--out", os.path.join(read_only_parent, "new"), not_utf8], [read_only_parent, denied]),
        ]
        self.check_error_cases(cases)

    def test_directory_with_a_fifo(self):
        """A FIFO inside an input directory is skipped (reading it would block), not read."""
        folder = os.path.join(self.tmp, "folder")
        os.makedirs(folder)
        shutil.copy(self.inputs[0], folder)
        os.mkfifo(os.path.join(folder, "pipe.txt"))
        proc = self.run_script("--quiet", *self.COMMON, "--out", self.out, folder, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(sorted(os.listdir(self.out)), ["t_manifest.json", "t_train_000000.bin"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
