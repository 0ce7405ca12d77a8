#!/usr/bin/env python3
"""dev/data/prepare.py: text -> GPT-2 token shards in llm.c's format, fully offline.

Owns: reading text inputs (files, .gz files, directories), splitting them into documents, the deterministic
train/val split by document, GPT-2 tokenisation with the bundled vocabulary (dev/data/gpt2), and writing shards.

Shard format (llm.c compatible): a header of 256 little-endian int32, h[0] = 20240520, h[1] = 1, h[2] = token count,
then the tokens as uint16; or h[0] = 20240801, h[1] = 7 with uint32 tokens (--uint32, or --vocab-size > 65536).
Every document starts with <|endoftext|> (50256). Output: <out>/<name>_{train,val}_NNNNNN.bin, --shard-tokens per
shard (a document may continue in the next shard). Shards are written to a temporary name and renamed.

The train/val split is decided per document from a hash of its text (and --seed), so it does not depend on input
order or on the number of workers; identical documents always land in the same split. If --val-fraction > 0 and the
hash gives no validation document, the document with the smallest hash goes to val (and symmetrically for train).

Examples:
    python3 dev/data/prepare.py --kjv                       # bundled KJV -> data/kjv/kjv_{train,val}_000000.bin
    python3 dev/data/prepare.py --name code --out data/code --ext .py,.md --split-docs file  src/ docs/
    python3 dev/data/prepare.py --name notes --split-docs blank-lines notes.txt.gz --val-fraction 0.05

Tokenisation never touches the network: the tiktoken Encoding is built here from encoder.json + vocab.bpe
(tiktoken.get_encoding is never called).
"""

import argparse
import concurrent.futures
import gzip
import hashlib
import json
import os
import re
import sys
import time

import numpy as np

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(SCRIPT_DIR))
DEFAULT_VOCAB_DIR = os.path.join(SCRIPT_DIR, "gpt2")
KJV_CORPUS = os.path.join(SCRIPT_DIR, "kjv", "kjv.txt.gz")

# GPT-2's pre-tokenisation regex, exactly as in OpenAI's gpt-2 encoder.py.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT_TEXT = "<|endoftext|>"
EOT_TOKEN = 50256
GPT2_VOCAB_SIZE = 50257

HEADER_INTS = 256
MAGIC_UINT16, VERSION_UINT16 = 20240520, 1
MAGIC_UINT32, VERSION_UINT32 = 20240801, 7
MAX_SHARD_TOKENS = 2**31 - 1  # h[2] is an int32

SPLIT_MODES = ("file", "kjv-books", "blank-lines")
# A KJV verse line starts with its reference: book abbreviation (maybe with a leading digit), chapter:verse.
KJV_REFERENCE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) ")


class PrepareError(Exception):
    """A user-facing error: the message names the file or option and says how to fix it."""


# ---------------------------------------------------------------------------------------------------------------
# The GPT-2 tokenizer from the bundled vocabulary


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character map (from OpenAI's encoder.py).
    Returns the 256 bytes in GPT-2's order (printable ones first) and the dict byte -> character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, {b: chr(c) for b, c in zip(bs, cs)}


def load_gpt2_vocab(vocab_dir=DEFAULT_VOCAB_DIR):
    """Returns (encoder: token string -> id, merges: list of (a, b) token-string pairs) from encoder.json/vocab.bpe."""
    encoder_path = os.path.join(vocab_dir, "encoder.json")
    merges_path = os.path.join(vocab_dir, "vocab.bpe")
    try:
        with open(encoder_path, "r", encoding="utf-8") as f:
            encoder = json.load(f)
        with open(merges_path, "r", encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, ValueError) as e:
        raise PrepareError(f"cannot read the GPT-2 vocabulary in '{vocab_dir}': {e} "
                           f"(hint: it is bundled in dev/data/gpt2; restore it with git checkout)")
    merges = []
    for line_no, line in enumerate(lines, start=1):
        if not line or line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise PrepareError(f"{merges_path}:{line_no}: expected two space-separated tokens, got {line!r}")
        merges.append((parts[0], parts[1]))
    return encoder, merges


def gpt2_mergeable_ranks(vocab_dir=DEFAULT_VOCAB_DIR):
    """tiktoken's mergeable_ranks (token bytes -> rank) for GPT-2, built from the merges in vocab.bpe and checked
    against encoder.json: rank = 0..255 for single bytes in GPT-2's byte order, then 256 + merge index."""
    encoder, merges = load_gpt2_vocab(vocab_dir)
    byte_order, byte_encoder = bytes_to_unicode()
    byte_decoder = {c: b for b, c in byte_encoder.items()}

    def token_bytes(token_str):
        return bytes(byte_decoder[c] for c in token_str)

    ranks = {bytes([b]): rank for rank, b in enumerate(byte_order)}
    for i, (a, b) in enumerate(merges):
        ranks[token_bytes(a) + token_bytes(b)] = len(byte_order) + i

    # encoder.json must say exactly the same thing (minus the special token).
    expected = {token_bytes(s): i for s, i in encoder.items() if s != EOT_TEXT}
    if ranks != expected or encoder.get(EOT_TEXT) != EOT_TOKEN or len(encoder) != GPT2_VOCAB_SIZE:
        raise PrepareError(f"encoder.json and vocab.bpe in '{vocab_dir}' disagree or are not GPT-2's vocabulary "
                           f"(hint: restore the bundled files; md5s are in dev/data/gpt2/NOTICE)")
    return ranks


def load_gpt2_encoding(vocab_dir=DEFAULT_VOCAB_DIR):
    """A tiktoken Encoding equal to GPT-2's, built offline from the bundled vocabulary."""
    import tiktoken
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=gpt2_mergeable_ranks(vocab_dir),
        special_tokens={EOT_TEXT: EOT_TOKEN},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


# ---------------------------------------------------------------------------------------------------------------
# Inputs and documents


def has_extension(filename, extensions):
    """True when filename ends with one of the extensions, looking through a trailing .gz (a.txt.gz matches .txt)."""
    if not extensions:
        return True
    name = filename[:-3] if filename.endswith(".gz") else filename
    return any(name.endswith(ext) or filename.endswith(ext) for ext in extensions)


def list_input_files(paths, extensions):
    """Expands files and directories (recursively, sorted, hidden entries skipped) into a list of files.
    Explicitly named files are always taken; files found in directories are filtered by extension."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if not name.startswith(".") and has_extension(name, extensions):
                        files.append(os.path.join(root, name))
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise PrepareError(f"input '{path}' does not exist (hint: give text files, .gz files or directories)")
    if not files:
        raise PrepareError(f"no input files found in {paths}" +
                           (f" with extensions {','.join(extensions)} (hint: check --ext)" if extensions else ""))
    return files


def read_text(path, errors):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise PrepareError(f"cannot read '{path}': {e}")
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise PrepareError(f"'{path}' is not valid UTF-8 ({e}) (hint: pass --encoding-errors replace)")


def split_documents(text, mode, source="<text>"):
    """Splits one file's text into documents (non-empty strings), in order.
    file:        the whole file is one document.
    kjv-books:   one document per book of a KJV text with a verse reference at the start of each line ("Ge1:1 ...");
                 a new document starts where the book abbreviation changes. Lines without a reference stay with the
                 current book.
    blank-lines: documents are separated by one or more blank lines."""
    if mode == "file":
        return [text] if text.strip() else []
    if mode == "blank-lines":
        parts = re.split(r"\n[ \t\r]*\n", text)
        return [p.strip("\n") + "\n" for p in parts if p.strip()]
    if mode == "kjv-books":
        docs, current, current_book = [], [], None
        for line in text.splitlines(keepends=True):
            m = KJV_REFERENCE.match(line)
            if m and m.group(1) != current_book:
                if current:
                    docs.append("".join(current))
                current, current_book = [], m.group(1)
            current.append(line)
        if current:
            docs.append("".join(current))
        if text.strip() and current_book is None:
            raise PrepareError(f"'{source}' has no KJV verse references like 'Ge1:1 ' at line starts "
                               f"(hint: use --split-docs file or blank-lines for other text)")
        return [d for d in docs if d.strip()]
    raise PrepareError(f"unknown --split-docs '{mode}' (choose from {', '.join(SPLIT_MODES)})")


def iter_documents(files, mode, errors):
    for path in files:
        for doc in split_documents(read_text(path, errors), mode, source=path):
            yield doc


def document_hash_fraction(doc, seed):
    """A number in [0, 1) from the document's text and the seed: the deterministic train/val coin."""
    digest = hashlib.sha256(f"{seed}\0".encode() + doc.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") / 2.0**64


def assign_splits(hash_fractions, val_fraction):
    """Per document: True for val. Hash below val_fraction goes to val; both splits non-empty when possible."""
    is_val = [h < val_fraction for h in hash_fractions]
    n = len(is_val)
    if val_fraction > 0 and n >= 2 and not any(is_val):
        is_val[min(range(n), key=lambda i: hash_fractions[i])] = True
    if val_fraction < 1 and n >= 2 and all(is_val):
        is_val[max(range(n), key=lambda i: hash_fractions[i])] = False
    return is_val


# ---------------------------------------------------------------------------------------------------------------
# Shards


def shard_path(out_dir, name, split, index):
    return os.path.join(out_dir, f"{name}_{split}_{index:06d}.bin")


def write_shard(path, tokens, use_uint32):
    """Writes one shard atomically: temporary file, fsync, rename."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1] = (MAGIC_UINT32, VERSION_UINT32) if use_uint32 else (MAGIC_UINT16, VERSION_UINT16)
    header[2] = len(tokens)
    token_dtype = "<u4" if use_uint32 else "<u2"
    if not use_uint32 and len(tokens) and int(tokens.max()) >= 2**16:
        raise PrepareError(f"token {int(tokens.max())} does not fit uint16 shards (hint: pass --uint32)")
    tmp_path = f"{path}.tmp{os.getpid()}"
    with open(tmp_path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(token_dtype).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_path, path)


class ShardWriter:
    """Collects one split's tokens and writes <name>_<split>_NNNNNN.bin every shard_tokens tokens."""

    def __init__(self, out_dir, name, split, shard_tokens, use_uint32, log):
        self.out_dir, self.name, self.split = out_dir, name, split
        self.shard_tokens, self.use_uint32, self.log = shard_tokens, use_uint32, log
        self.buffer = np.empty(shard_tokens, dtype=np.uint32)  # (shard_tokens,)
        self.filled = 0
        self.paths = []
        self.total_tokens = 0
        self.documents = 0

    def add_document(self, tokens):
        self.documents += 1
        tokens = np.asarray(tokens, dtype=np.uint32)
        while len(tokens):
            take = min(len(tokens), self.shard_tokens - self.filled)
            self.buffer[self.filled:self.filled + take] = tokens[:take]
            self.filled += take
            tokens = tokens[take:]
            if self.filled == self.shard_tokens:
                self._flush()

    def _flush(self):
        path = shard_path(self.out_dir, self.name, self.split, len(self.paths))
        write_shard(path, self.buffer[:self.filled], self.use_uint32)
        self.log(f"wrote {path} ({self.filled:,} tokens)")
        self.paths.append(path)
        self.total_tokens += self.filled
        self.filled = 0

    def close(self):
        if self.filled:
            self._flush()
        self._remove_stale_shards()
        return self.paths

    def _remove_stale_shards(self):
        """Shards of an earlier run with more shards would be picked up by a glob: remove them."""
        pattern = re.compile(re.escape(f"{self.name}_{self.split}_") + r"(\d{6})\.bin$")
        for entry in sorted(os.listdir(self.out_dir)):
            m = pattern.match(entry)
            if m and int(m.group(1)) >= len(self.paths):
                os.remove(os.path.join(self.out_dir, entry))
                self.log(f"removed stale shard {os.path.join(self.out_dir, entry)}")


# ---------------------------------------------------------------------------------------------------------------
# The command line


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Tokenise text with GPT-2's BPE (bundled vocabulary, offline) into llm.c-format token shards.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python3 dev/data/prepare.py --kjv   (the bundled KJV corpus -> data/kjv/)")
    p.add_argument("inputs", nargs="*", help="text files, .gz files, or directories (searched recursively)")
    p.add_argument("--kjv", action="store_true",
                   help="prepare the bundled KJV corpus: input dev/data/kjv/kjv.txt.gz, --split-docs kjv-books, "
                        "--name kjv, --out <repo>/data/kjv (each can still be overridden)")
    p.add_argument("--name", help="shard name prefix: <out>/<name>_{train,val}_NNNNNN.bin")
    p.add_argument("--out", help="output directory (default: data/<name>)")
    p.add_argument("--ext", default="", help="comma-separated extensions for files found in directories, e.g. .txt,.py "
                                             "(a .gz suffix is looked through); default: all files")
    p.add_argument("--split-docs", choices=SPLIT_MODES, default=None,
                   help="what one document is: a whole file (default), a KJV book, or a blank-line-separated block")
    p.add_argument("--val-fraction", type=float, default=0.1, help="fraction of documents for validation (default 0.1)")
    p.add_argument("--seed", type=int, default=1337, help="salt of the document hash that decides the split")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default 100M)")
    p.add_argument("--vocab-size", type=int, default=GPT2_VOCAB_SIZE,
                   help="vocabulary size; above 65536 the shards hold uint32 tokens (default 50257)")
    p.add_argument("--uint32", action="store_true", help="write uint32 tokens (magic 20240801, version 7)")
    p.add_argument("--vocab-dir", default=DEFAULT_VOCAB_DIR, help="folder with encoder.json and vocab.bpe")
    p.add_argument("--encoding-errors", choices=("strict", "replace"), default="strict",
                   help="what to do with bytes that are not UTF-8 (default: stop with an error)")
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                   help="tokenising threads (tiktoken releases the GIL); the output does not depend on it")
    p.add_argument("--quiet", action="store_true", help="only print errors")
    args = p.parse_args(argv)

    if args.kjv:
        args.inputs = args.inputs or [KJV_CORPUS]
        args.name = args.name or "kjv"
        args.out = args.out or os.path.join(REPO_ROOT, "data", "kjv")
        args.split_docs = args.split_docs or "kjv-books"
    args.split_docs = args.split_docs or "file"
    if not args.inputs:
        p.error("give input files or directories, or --kjv for the bundled corpus")
    if not args.name:
        p.error("--name is required (the shard name prefix), e.g. --name mytext")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", args.name):
        p.error(f"--name '{args.name}' may only hold letters, digits, '.', '_' and '-'")
    args.out = args.out or os.path.join("data", args.name)
    if not 0.0 <= args.val_fraction <= 1.0:
        p.error(f"--val-fraction {args.val_fraction} must be in [0, 1]")
    if not 1 <= args.shard_tokens <= MAX_SHARD_TOKENS:
        p.error(f"--shard-tokens {args.shard_tokens} must be in [1, {MAX_SHARD_TOKENS}] (the header count is int32)")
    if args.vocab_size < GPT2_VOCAB_SIZE:
        p.error(f"--vocab-size {args.vocab_size} is smaller than GPT-2's vocabulary ({GPT2_VOCAB_SIZE})")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    args.extensions = [e if e.startswith(".") else "." + e for e in args.ext.split(",") if e]
    args.use_uint32 = args.uint32 or args.vocab_size > 65536
    return args


def prepare(args):
    log = (lambda msg: None) if args.quiet else (lambda msg: print(f"prepare: {msg}", file=sys.stderr, flush=True))
    encoding = load_gpt2_encoding(args.vocab_dir)
    files = list_input_files(args.inputs, args.extensions)
    log(f"{len(files)} input file(s), documents = {args.split_docs}, val fraction {args.val_fraction}, "
        f"{'uint32' if args.use_uint32 else 'uint16'} tokens")

    # Pass 1: the split of every document (hash of its text), so the split never depends on order or workers.
    hashes = [document_hash_fraction(doc, args.seed) for doc in iter_documents(files, args.split_docs, args.encoding_errors)]
    if not hashes:
        raise PrepareError(f"the inputs hold no non-empty documents: {args.inputs}")
    is_val = assign_splits(hashes, args.val_fraction)

    # Pass 2: tokenise (threads, results in document order) and write shards.
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise PrepareError(f"cannot create the output directory '{args.out}': {e} (hint: --out must name a directory)")
    writers = {split: ShardWriter(args.out, args.name, split, args.shard_tokens, args.use_uint32, log)
               for split in ("train", "val")}
    start = last_report = time.time()
    text_bytes = 0

    def tokenize(doc):
        return [EOT_TOKEN] + encoding.encode_ordinary(doc)

    docs = iter_documents(files, args.split_docs, args.encoding_errors)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.workers) as pool:
        doc_index = 0
        while True:
            chunk = [doc for _, doc in zip(range(64 * args.workers), docs)]
            if not chunk:
                break
            for doc, tokens in zip(chunk, pool.map(tokenize, chunk)):
                writers["val" if is_val[doc_index] else "train"].add_document(tokens)
                doc_index += 1
                text_bytes += len(doc.encode("utf-8"))
            now = time.time()
            if now - last_report > 1.0:
                last_report = now
                tokens_so_far = sum(w.total_tokens + w.filled for w in writers.values())
                log(f"{doc_index:,}/{len(hashes):,} documents, {tokens_so_far:,} tokens, "
                    f"{text_bytes / 1e6 / (now - start):.1f} MB/s")
    paths = {split: w.close() for split, w in writers.items()}
    elapsed = max(time.time() - start, 1e-9)
    for split, w in writers.items():
        log(f"{split}: {w.documents:,} documents, {w.total_tokens:,} tokens in {len(w.paths)} shard(s)")
    log(f"done: {text_bytes / 1e6:.1f} MB of text in {elapsed:.1f} s ({text_bytes / 1e6 / elapsed:.1f} MB/s)")
    return paths


def main(argv=None):
    args = parse_args(argv)
    try:
        prepare(args)
    except PrepareError as e:
        print(f"prepare.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
