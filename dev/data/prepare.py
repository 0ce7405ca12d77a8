#!/usr/bin/env python3
"""dev/data/prepare.py: text -> GPT-2 token shards in llm.c's format, fully offline.

Owns: reading text inputs (files, .gz files, directories), splitting them into documents, the deterministic
train/val split by document, GPT-2 tokenisation with the bundled vocabulary (dev/data/gpt2), writing shards and
their manifest, and replacing the output directory's shard set as a whole.

Shard format (llm.c compatible): a header of 256 little-endian int32, h[0] = 20240520, h[1] = 1, h[2] = token count,
then the tokens as uint16; or h[0] = 20240801, h[1] = 7 with uint32 tokens (--uint32, or --vocab-size > 65536).
Every document starts with <|endoftext|> (50256). Output: <out>/<name>_{train,val}_NNNNNN.bin, --shard-tokens per
shard (a document may continue in the next shard), and <out>/<name>_manifest.json: the inputs (path as given, size,
sha256), the tokenizer (size and sha256 of encoder.json and vocab.bpe), the options, and every shard with its split,
token count, size and sha256; dev/data/inspect_shards.py checks it. The manifest holds no timestamps, output path
or worker count: the same inputs and options give the same bytes.

All or nothing: the new output is built in a temporary directory beside <out> (.<out name>.prepare-XXXX, same
filesystem) and swapped in whole at the end (an atomic exchange where Linux offers renameat2, else two renames), so
a run that fails or is interrupted leaves the previous output untouched and no temporary files; a successful run
never leaves shards of two runs mixed. Entries of <out> that are not this --name's shards or manifest (other names'
shards, notes, subfolders) are carried into the new directory as hard links. The output location is checked (a directory
or creatable, writable, the folder above it writable, one filesystem) before the inputs are read. OS errors end in
one line "prepare.py: error: ..." naming the path, exit code 1; Ctrl-C or SIGTERM clean up and exit 130 / 143.

The train/val split is decided per document from a hash of its text (and --seed), so it does not depend on input
order or on the number of workers; identical documents always land in the same split. If --val-fraction > 0 and the
hash gives no validation document, the document with the smallest hash goes to val (and symmetrically for train).

Presets: --kjv (the bundled KJV, one document per book) and --python-sources (every *.py file under the given
directories, by default this Python's site-packages: a large public text tree on every machine with Python, used as
the long-run corpus; one document per file, 0.5% of the files held out for validation, undecodable bytes replaced).
A preset only fills options the command line leaves out.

Examples:
    python3 dev/data/prepare.py --kjv                       # bundled KJV -> data/kjv/kjv_{train,val}_000000.bin
    python3 dev/data/prepare.py --python-sources            # site-packages *.py -> data/pysrc/pysrc_{train,val}_*.bin
    python3 dev/data/prepare.py --name code --out data/code --ext .py,.md --split-docs file  src/ docs/
    python3 dev/data/prepare.py --name notes --split-docs blank-lines notes.txt.gz --val-fraction 0.05

Tokenisation never touches the network: the tiktoken Encoding is built here from encoder.json + vocab.bpe
(tiktoken.get_encoding is never called).
"""

import argparse
import concurrent.futures
import ctypes
import errno
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
import zlib

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
DEFAULT_VAL_FRACTION = 0.1
PYTHON_SOURCES_VAL_FRACTION = 0.005  # ~0.5% of the files: still thousands of documents in a site-packages tree
# A KJV verse line starts with its reference: book abbreviation (maybe with a leading digit), chapter:verse.
KJV_REFERENCE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) ")


class PrepareError(Exception):
    """A user-facing error: the message names the file or option and says how to fix it."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the same cleanup runs."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def os_error_text(e):
    """The reason of an OSError without the path that Python repeats in str(e): "No space left on device"."""
    return e.strerror or str(e)


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


def vocabulary_fingerprint(vocab_dir=DEFAULT_VOCAB_DIR):
    """[{file, bytes, sha256}] of encoder.json and vocab.bpe: which vocabulary the shards were made with."""
    files = []
    for name in ("encoder.json", "vocab.bpe"):
        path = os.path.join(vocab_dir, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise PrepareError(f"cannot read '{path}': {os_error_text(e)}")
        files.append({"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return files


# ---------------------------------------------------------------------------------------------------------------
# Inputs and documents


def has_extension(filename, extensions):
    """True when filename ends with one of the extensions, looking through a trailing .gz (a.txt.gz matches .txt)."""
    if not extensions:
        return True
    name = filename[:-3] if filename.endswith(".gz") else filename
    return any(name.endswith(ext) or filename.endswith(ext) for ext in extensions)


def python_site_packages():
    """The running Python's site-packages directories (purelib, then platlib where it differs), those that exist."""
    import sysconfig
    paths = sysconfig.get_paths()
    found = []
    for key in ("purelib", "platlib"):
        path = paths.get(key)
        if path and os.path.isdir(path) and path not in found:
            found.append(path)
    return found


def list_input_files(paths, extensions):
    """Expands files and directories (recursively, sorted, hidden entries skipped) into a list of files.
    Explicitly named files are always taken; files found in directories are filtered by extension.
    A directory that cannot be listed is an error (never silently skipped); entries in directories that are not
    regular files (FIFOs, sockets, devices) are skipped, as reading them could block."""
    def walk_error(e):
        raise PrepareError(f"cannot list the input directory '{e.filename}': {os_error_text(e)}")

    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path, onerror=walk_error):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if not name.startswith(".") and has_extension(name, extensions):
                        full = os.path.join(root, name)
                        if os.path.exists(full) and not os.path.isfile(full):
                            continue  # a FIFO, socket or device: reading it could block
                        files.append(full)
        elif os.path.isfile(path):
            files.append(path)
        elif os.path.islink(path) and not os.path.exists(path):
            raise PrepareError(f"input '{path}' is a broken symbolic link (hint: give text files, .gz files or "
                               f"directories)")
        elif os.path.exists(path):
            raise PrepareError(f"input '{path}' is not a regular file or directory (a FIFO, socket or device) "
                               f"(hint: give text files, .gz files or directories)")
        else:
            raise PrepareError(f"input '{path}' does not exist (hint: give text files, .gz files or directories)")
    if not files:
        raise PrepareError(f"no input files found in {paths}" +
                           (f" with extensions {','.join(extensions)} (hint: check --ext)" if extensions else ""))
    return files


def read_text(path, errors, digests=None):
    """The text of a file (.gz decompressed). digests, if given, receives path -> (size, sha256) of the file's bytes
    as stored; if it already holds the path (the first pass), a different file now is an error."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        data = gzip.GzipFile(fileobj=io.BytesIO(raw), mode="rb").read() if path.endswith(".gz") else raw
    except (OSError, EOFError, zlib.error) as e:
        raise PrepareError(f"cannot read '{path}': {os_error_text(e) if isinstance(e, OSError) else e}")
    if digests is not None:
        digest = (len(raw), hashlib.sha256(raw).hexdigest())
        if digests.setdefault(path, digest) != digest:
            raise PrepareError(f"input '{path}' changed while it was being prepared (hint: run again once the inputs "
                               f"are stable)")
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


def iter_documents(files, mode, errors, digests=None):
    for path in files:
        for doc in split_documents(read_text(path, errors, digests), mode, source=path):
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


def shard_filename(name, split, index):
    return f"{name}_{split}_{index:06d}.bin"


def shard_path(out_dir, name, split, index):
    return os.path.join(out_dir, shard_filename(name, split, index))


def manifest_filename(name):
    return f"{name}_manifest.json"


def owned_entry_pattern(name):
    """The directory entries a run for --name owns (replaces): its shards and manifest, and the <shard>.tmp<pid>
    files that earlier versions of this script could leave behind."""
    return re.compile(re.escape(name) + r"_(?:(?:train|val)_\d{6,}\.bin(?:\.tmp\d+)?|manifest\.json)")


def write_error(shown_path, e):
    """The PrepareError for a failed write of an output file (before the swap: nothing was replaced)."""
    hint = (" (hint: the new output is built beside the previous one, so the disk must hold both until the swap; "
            "free space, or remove the previous output first)") if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return PrepareError(f"cannot write '{shown_path}': {os_error_text(e)} (nothing was replaced: the previous output "
                        f"is unchanged){hint}")


def write_shard(path, tokens, use_uint32, shown_path=None):
    """Writes one shard and fsyncs it; returns (size in bytes, sha256 hex). path is inside the temporary output
    directory; errors name shown_path (where the shard is going) and say that the previous output is unchanged."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1] = (MAGIC_UINT32, VERSION_UINT32) if use_uint32 else (MAGIC_UINT16, VERSION_UINT16)
    header[2] = len(tokens)
    token_dtype = "<u4" if use_uint32 else "<u2"
    if not use_uint32 and len(tokens) and int(tokens.max()) >= 2**16:
        raise PrepareError(f"token {int(tokens.max())} does not fit uint16 shards (hint: pass --uint32)")
    header_bytes, token_bytes = header.tobytes(), tokens.astype(token_dtype).tobytes()
    try:
        with open(path, "wb") as f:
            f.write(header_bytes)
            f.write(token_bytes)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_error(shown_path or path, e)
    digest = hashlib.sha256(header_bytes)
    digest.update(token_bytes)
    return len(header_bytes) + len(token_bytes), digest.hexdigest()


class ShardWriter:
    """Collects one split's tokens and writes <name>_<split>_NNNNNN.bin every shard_tokens tokens into out_dir (the
    temporary directory); paths are where the shards will be once the directory is swapped in (shown_dir)."""

    def __init__(self, out_dir, name, split, shard_tokens, use_uint32, log, shown_dir=None):
        self.out_dir, self.name, self.split = out_dir, name, split
        self.shown_dir = shown_dir or out_dir
        self.shard_tokens, self.use_uint32, self.log = shard_tokens, use_uint32, log
        self.buffer = np.empty(shard_tokens, dtype=np.uint32)  # (shard_tokens,)
        self.filled = 0
        self.paths = []
        self.shards = []  # the manifest's entries: {file, split, tokens, bytes, sha256}
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
        index = len(self.paths)
        shown = shard_path(self.shown_dir, self.name, self.split, index)
        size, sha256 = write_shard(shard_path(self.out_dir, self.name, self.split, index), self.buffer[:self.filled],
                                   self.use_uint32, shown_path=shown)
        self.shards.append({"file": shard_filename(self.name, self.split, index), "split": self.split,
                            "tokens": int(self.filled), "bytes": size, "sha256": sha256})
        self.log(f"wrote {shard_filename(self.name, self.split, index)} ({self.filled:,} tokens)")
        self.paths.append(shown)
        self.total_tokens += self.filled
        self.filled = 0

    def close(self):
        if self.filled:
            self._flush()
        return self.paths


MANIFEST_FORMAT, MANIFEST_VERSION = "llm8 token shards", 1


def build_manifest(args, input_digests, files, vocab_files, writers):
    """The manifest: what went in (inputs, tokenizer, options) and what came out (every shard). No timestamps, no
    output path, no worker count: equal inputs and options give equal bytes."""
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "written_by": "dev/data/prepare.py",
        "name": args.name,
        "inputs": [{"path": path, "bytes": input_digests[path][0], "sha256": input_digests[path][1]}
                   for path in files],
        "tokenizer": {"name": "gpt2", "eot_token": EOT_TOKEN, "n_vocab": GPT2_VOCAB_SIZE, "files": vocab_files},
        "options": {"split_docs": args.split_docs, "extensions": args.extensions,
                    "encoding_errors": args.encoding_errors, "seed": args.seed, "val_fraction": args.val_fraction,
                    "shard_tokens": args.shard_tokens, "vocab_size": args.vocab_size,
                    "dtype": "uint32" if args.use_uint32 else "uint16"},
        "splits": {split: {"documents": w.documents, "tokens": int(w.total_tokens), "shards": len(w.shards)}
                   for split, w in writers.items()},
        "shards": [entry for w in writers.values() for entry in w.shards],
    }


def write_manifest(directory, shown_dir, manifest):
    name = manifest_filename(manifest["name"])
    path, shown = os.path.join(directory, name), os.path.join(shown_dir, name)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_error(shown, e)
    return shown


# ---------------------------------------------------------------------------------------------------------------
# The output directory: built beside the old one, swapped in whole


AT_FDCWD = -100
RENAME_EXCHANGE = 2


def exchange_paths(a, b):
    """Atomically swaps the directory entries a and b (Linux renameat2 with RENAME_EXCHANGE): each name then names
    what the other did, with no moment where either is missing. Returns False where that is not available (not
    Linux, an old C library or kernel, a filesystem without it); raises OSError for other failures."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), a, None, b)


def fsync_directory(path):
    """Makes renames and new entries in path durable; best effort (some filesystems refuse fsync on directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_tree(path):
    """shutil.rmtree that reports failure as the OSError of the first entry it could not remove, or None."""
    failures = []
    shutil.rmtree(path, onerror=lambda function, p, exc_info: failures.append(exc_info[1]))
    return failures[0] if failures else None


class StagedOutput:
    """The new output directory, built in a temporary directory beside <out> and swapped in whole by commit().

    Until commit() succeeds, <out> is never touched; leaving the with-block without commit() (an error, Ctrl-C)
    removes the temporary directory and any parent directories this run created. A symbolic link <out> stays a link:
    the directory it points to is the one replaced. Entries of the old <out> that the run does not own (see
    owned_entry_pattern) are carried into the new directory as hard links just before the swap."""

    def __init__(self, out, name, log):
        self.out, self.name, self.log = out, name, log
        self.target = os.path.realpath(out)
        self.parent, self.base = os.path.split(self.target)
        self.owned_pattern = owned_entry_pattern(name)
        self.tmp = None
        self.created_dirs = []  # parents of the target this run created, outermost first
        self.committed = False

    def __enter__(self):
        """Checks the output location and creates the temporary directory (before any slow work)."""
        try:
            self._check_and_create()
        except BaseException:
            self.__exit__(None, None, None)  # __exit__ is not called when __enter__ fails
            raise
        return self

    def _check_and_create(self):
        out = self.out
        if os.path.islink(out) and not os.path.exists(out):
            raise PrepareError(f"the output directory '{out}' is a broken symbolic link "
                               f"(hint: create its target or give another --out)")
        if os.path.lexists(self.target) and not os.path.isdir(self.target):
            raise PrepareError(f"the output directory '{out}' exists and is not a directory "
                               f"(hint: --out must name a directory)")
        if not self.base:
            raise PrepareError(f"cannot use '{out}' as the output directory (hint: give a directory below it)")
        exists = os.path.isdir(self.target)
        if exists:
            if not os.access(self.target, os.R_OK | os.W_OK | os.X_OK):
                raise PrepareError(f"cannot write to the output directory '{out}': permission denied "
                                   f"(hint: check its owner and mode, or give another --out)")
            if os.path.ismount(self.target):
                raise PrepareError(f"the output directory '{out}' is a mount point, which cannot be swapped for a new "
                                   f"directory (hint: give a directory inside it as --out)")
        else:
            self._make_parents()
            if not os.path.isdir(self.parent):
                raise PrepareError(f"cannot create the output directory '{out}': '{self.parent}' is not a directory "
                                   f"(hint: --out must name a directory)")
        try:
            self.tmp = tempfile.mkdtemp(prefix=f".{self.base}.prepare-", dir=self.parent)
        except OSError as e:
            raise PrepareError(f"cannot create a temporary directory in '{self.parent}' beside the output directory "
                               f"'{out}': {os_error_text(e)} (hint: prepare.py builds the new shards there and "
                               f"swaps them in whole, so that folder must be writable)")
        try:
            if exists:
                mode = stat.S_IMODE(os.stat(self.target).st_mode)
                if os.stat(self.tmp).st_dev != os.stat(self.target).st_dev:
                    raise PrepareError(f"'{self.parent}' and the output directory '{out}' are on different "
                                       f"filesystems, so the new shards cannot be swapped in (hint: give a directory "
                                       f"inside '{out}' as --out)")
            else:
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o777 & ~umask
            os.chmod(self.tmp, mode)  # mkdtemp makes it 0700; the output keeps its mode, or gets the usual one
        except OSError as e:
            raise PrepareError(f"cannot prepare the temporary directory '{self.tmp}': {os_error_text(e)}")
        # A run killed outright (SIGKILL, power loss) cannot clean up; it may also still be running: only say so.
        try:
            others = sorted(e for e in os.listdir(self.parent) if e.startswith(f".{self.base}.prepare-")
                            and os.path.join(self.parent, e) != self.tmp)
        except OSError:
            others = []
        for entry in others:
            self.log(f"warning: '{os.path.join(self.parent, entry)}' is left from a prepare.py run that was killed "
                     f"(or is another run still going): remove it if no run is")

    def _make_parents(self):
        missing, path = [], self.parent
        while path and not os.path.lexists(path):
            missing.append(path)
            path = os.path.dirname(path)
        for path in reversed(missing):
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            except OSError as e:
                raise PrepareError(f"cannot create the output directory '{self.out}': cannot create '{path}': "
                                   f"{os_error_text(e)} (hint: --out must name a directory)")
            self.created_dirs.append(path)

    def __exit__(self, exc_type, exc, tb):
        if self.tmp is not None:
            failure = remove_tree(self.tmp)
            if failure is not None:
                self.log(f"warning: could not remove the temporary directory '{self.tmp}': {os_error_text(failure)}")
            self.tmp = None
        if not self.committed:
            for path in reversed(self.created_dirs):
                try:
                    os.rmdir(path)
                except OSError:
                    break
        return False

    def owned(self, entry):
        return self.owned_pattern.fullmatch(entry) is not None

    def _carry(self, src, dst, top=True):
        """Hard links (files), re-creates (symbolic links) or mirrors (directories) what src holds into dst; at the
        top level only the entries this run does not own. Returns the number of top-level entries carried."""
        carried = 0
        with os.scandir(src) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            if top and self.owned(entry.name):
                continue
            destination = os.path.join(dst, entry.name)
            try:
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), destination)
                elif entry.is_dir(follow_symlinks=False):
                    os.mkdir(destination)
                    shutil.copystat(entry.path, destination, follow_symlinks=False)
                    self._carry(entry.path, destination, top=False)
                    shutil.copystat(entry.path, destination, follow_symlinks=False)
                elif entry.is_file(follow_symlinks=False):
                    os.link(entry.path, destination, follow_symlinks=False)
                else:
                    raise PrepareError(f"cannot keep '{entry.path}' in the new output directory: it is not a file, "
                                       f"directory or symbolic link (nothing was replaced; hint: move it out of "
                                       f"'{self.out}')")
            except OSError as e:
                raise PrepareError(f"cannot keep '{entry.path}' (not written by this run) in the new output directory: "
                                   f"{os_error_text(e)} (nothing was replaced; hint: move other files out of "
                                   f"'{self.out}')")
            carried += 1
        return carried

    def commit(self):
        """Swaps the temporary directory in for <out>, then removes the old output. On any failure before the swap
        <out> is as it was; after it, <out> is the new output and only a leftover old directory is reported."""
        lock_fd = self._lock_parent()
        try:
            old_owned = 0
            if os.path.isdir(self.target):
                old_owned = sum(1 for e in os.listdir(self.target) if self.owned(e))
                carried = self._carry(self.target, self.tmp)
                if carried:
                    self.log(f"kept {carried} other entr{'y' if carried == 1 else 'ies'} of {self.out}")
            fsync_directory(self.tmp)
            # No signal between the two renames of the fallback (the old output would be left aside).
            blocked = hasattr(signal, "pthread_sigmask")
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if blocked else None
            try:
                old = self._swap()
                self.committed = True
            finally:
                if blocked:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        fsync_directory(self.parent)
        if old is not None:
            failure = remove_tree(old)
            if failure is not None:
                self.log(f"warning: the new output is in place, but the previous one in '{old}' could not be removed: "
                         f"{os_error_text(failure)} (remove it by hand)")
        self.log(f"{'replaced' if old is not None else 'created'} {self.out}"
                 + (f" ({old_owned} previous file(s) of {self.name} removed)" if old_owned else ""))

    def _lock_parent(self):
        """Serialises commits of concurrent prepare.py runs into the same folder (best effort: an flock on it)."""
        try:
            import fcntl
            fd = os.open(self.parent, os.O_RDONLY)
        except (ImportError, OSError):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        return fd

    def _swap(self):
        """Puts the temporary directory at the target. Returns where the old output now is (to be removed), or
        None if there was none."""
        tmp, target, out = self.tmp, self.target, self.out
        if not os.path.isdir(target):
            try:
                os.rename(tmp, target)
            except OSError as e:
                raise PrepareError(f"cannot move the new output into place at '{out}': {os_error_text(e)}")
            self.tmp = None
            return None
        try:
            if exchange_paths(tmp, target):
                self.tmp = None
                return tmp  # the old output, under the temporary name
        except OSError as e:
            raise PrepareError(f"cannot swap the new output in for '{out}': {os_error_text(e)} "
                               f"(nothing was replaced: the previous output is unchanged)")
        # No atomic exchange here: move the old directory aside, the new one in, and the old one back on failure.
        try:
            aside = tempfile.mkdtemp(prefix=f".{self.base}.prepare-old-", dir=self.parent)
        except OSError as e:
            raise PrepareError(f"cannot create a directory in '{self.parent}' to move the old output aside: "
                               f"{os_error_text(e)} (nothing was replaced: the previous output is unchanged)")
        try:
            os.rename(target, aside)  # replaces the empty directory aside
        except OSError as e:
            os.rmdir(aside)
            raise PrepareError(f"cannot move the previous output '{out}' aside: {os_error_text(e)} "
                               f"(nothing was replaced: the previous output is unchanged)")
        try:
            os.rename(tmp, target)
        except OSError as e:
            try:
                os.rename(aside, target)
            except OSError as e2:
                raise PrepareError(f"cannot move the new output into place at '{out}': {os_error_text(e)}; nor "
                                   f"the previous output back: {os_error_text(e2)}: it is in '{aside}'")
            raise PrepareError(f"cannot move the new output into place at '{out}': {os_error_text(e)} "
                               f"(nothing was replaced: the previous output is unchanged)")
        self.tmp = None
        return aside


# ---------------------------------------------------------------------------------------------------------------
# The command line


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Tokenise text with GPT-2's BPE (bundled vocabulary, offline) into llm.c-format token shards.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples: python3 dev/data/prepare.py --kjv   (the bundled KJV corpus -> data/kjv/)\n"
               "          python3 dev/data/prepare.py --python-sources   (site-packages *.py -> data/pysrc/)")
    p.add_argument("inputs", nargs="*", help="text files, .gz files, or directories (searched recursively)")
    p.add_argument("--kjv", action="store_true",
                   help="prepare the bundled KJV corpus: input dev/data/kjv/kjv.txt.gz, --split-docs kjv-books, "
                        "--name kjv, --out <repo>/data/kjv (each can still be overridden)")
    p.add_argument("--python-sources", action="store_true",
                   help="prepare Python sources: the *.py files under the input directories (default: this Python's "
                        "site-packages), --split-docs file, --val-fraction 0.005, --encoding-errors replace, "
                        "--name pysrc, --out <repo>/data/pysrc (each can still be overridden)")
    p.add_argument("--name", help="shard name prefix: <out>/<name>_{train,val}_NNNNNN.bin")
    p.add_argument("--out", help="output directory (default: data/<name>)")
    p.add_argument("--ext", default="", help="comma-separated extensions for files found in directories, e.g. .txt,.py "
                                             "(a .gz suffix is looked through); default: all files")
    p.add_argument("--split-docs", choices=SPLIT_MODES, default=None,
                   help="what one document is: a whole file (default), a KJV book, or a blank-line-separated block")
    p.add_argument("--val-fraction", type=float, default=None,
                   help=f"fraction of documents for validation (default {DEFAULT_VAL_FRACTION}; "
                        f"--python-sources: {PYTHON_SOURCES_VAL_FRACTION})")
    p.add_argument("--seed", type=int, default=1337, help="salt of the document hash that decides the split")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default 100M)")
    p.add_argument("--vocab-size", type=int, default=GPT2_VOCAB_SIZE,
                   help="vocabulary size; above 65536 the shards hold uint32 tokens (default 50257)")
    p.add_argument("--uint32", action="store_true", help="write uint32 tokens (magic 20240801, version 7)")
    p.add_argument("--vocab-dir", default=DEFAULT_VOCAB_DIR, help="folder with encoder.json and vocab.bpe")
    p.add_argument("--encoding-errors", choices=("strict", "replace"), default=None,
                   help="what to do with bytes that are not UTF-8 (default: stop with an error; --python-sources: "
                        "replace)")
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                   help="tokenising threads (tiktoken releases the GIL); the output does not depend on it")
    p.add_argument("--quiet", action="store_true", help="only print errors")
    args = p.parse_args(argv)

    if args.kjv and args.python_sources:
        p.error("--kjv and --python-sources are two presets: give one")
    if args.kjv:
        args.inputs = args.inputs or [KJV_CORPUS]
        args.name = args.name or "kjv"
        args.out = args.out or os.path.join(REPO_ROOT, "data", "kjv")
        args.split_docs = args.split_docs or "kjv-books"
    if args.python_sources:
        if not args.inputs:
            args.inputs = python_site_packages()
            if not args.inputs:
                p.error("--python-sources: this Python has no site-packages directory; give the directories to read")
        for path in args.inputs:
            if not os.path.isdir(path):
                p.error(f"--python-sources: '{path}' is not a directory (hint: give directories that hold .py files, "
                        f"or none for this Python's site-packages)")
        args.name = args.name or "pysrc"
        args.out = args.out or os.path.join(REPO_ROOT, "data", "pysrc")
        args.ext = args.ext or ".py"
        args.val_fraction = PYTHON_SOURCES_VAL_FRACTION if args.val_fraction is None else args.val_fraction
        args.encoding_errors = args.encoding_errors or "replace"
    args.split_docs = args.split_docs or "file"
    args.val_fraction = DEFAULT_VAL_FRACTION if args.val_fraction is None else args.val_fraction
    args.encoding_errors = args.encoding_errors or "strict"
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
    vocab_files = vocabulary_fingerprint(args.vocab_dir)
    files = list_input_files(args.inputs, args.extensions)
    log(f"{len(files)} input file(s), documents = {args.split_docs}, val fraction {args.val_fraction}, "
        f"{'uint32' if args.use_uint32 else 'uint16'} tokens")

    # The output location is checked (and the temporary directory made) before the inputs are read.
    with StagedOutput(args.out, args.name, log) as staged:
        log(f"writing into {staged.tmp}, swapped in for {args.out} when complete")

        # Pass 1: the split of every document (hash of its text), so the split never depends on order or workers.
        input_digests = {}  # path -> (size, sha256), for the manifest and to notice inputs changing under us
        hashes = [document_hash_fraction(doc, args.seed)
                  for doc in iter_documents(files, args.split_docs, args.encoding_errors, input_digests)]
        if not hashes:
            raise PrepareError(f"the inputs hold no non-empty documents: {args.inputs}")
        is_val = assign_splits(hashes, args.val_fraction)

        # Pass 2: tokenise (threads, results in document order) and write shards.
        writers = {split: ShardWriter(staged.tmp, args.name, split, args.shard_tokens, args.use_uint32, log,
                                      shown_dir=args.out)
                   for split in ("train", "val")}
        start = last_report = time.time()
        text_bytes = 0
        changed = PrepareError("the inputs changed while they were being prepared (a different number of documents "
                               "in the second pass) (hint: run again once they are stable)")

        def tokenize(doc):
            return [EOT_TOKEN] + encoding.encode_ordinary(doc)

        docs = iter_documents(files, args.split_docs, args.encoding_errors, input_digests)
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.workers) as pool:
            doc_index = 0
            while True:
                chunk = [doc for _, doc in zip(range(64 * args.workers), docs)]
                if not chunk:
                    break
                for doc, tokens in zip(chunk, pool.map(tokenize, chunk)):
                    if doc_index >= len(is_val):
                        raise changed
                    writers["val" if is_val[doc_index] else "train"].add_document(tokens)
                    doc_index += 1
                    text_bytes += len(doc.encode("utf-8"))
                now = time.time()
                if now - last_report > 1.0:
                    last_report = now
                    tokens_so_far = sum(w.total_tokens + w.filled for w in writers.values())
                    log(f"{doc_index:,}/{len(hashes):,} documents, {tokens_so_far:,} tokens, "
                        f"{text_bytes / 1e6 / (now - start):.1f} MB/s")
        if doc_index != len(is_val):
            raise changed
        paths = {split: w.close() for split, w in writers.items()}
        manifest = build_manifest(args, input_digests, files, vocab_files, writers)
        log(f"wrote {os.path.basename(write_manifest(staged.tmp, args.out, manifest))}")
        staged.commit()
    elapsed = max(time.time() - start, 1e-9)
    for split, w in writers.items():
        log(f"{split}: {w.documents:,} documents, {w.total_tokens:,} tokens in {len(w.paths)} shard(s)")
    log(f"done: {text_bytes / 1e6:.1f} MB of text in {elapsed:.1f} s ({text_bytes / 1e6 / elapsed:.1f} MB/s)")
    return paths


def describe_os_error(e):
    """One line for an OSError that no handler above put into words: the path(s) and the reason."""
    paths = " -> ".join(f"'{p}'" for p in (e.filename, e.filename2) if p is not None)
    return f"{paths}: {os_error_text(e)}" if paths else os_error_text(e)


def main(argv=None):
    args = parse_args(argv)

    def on_sigterm(signum, frame):
        raise Interrupted(signum)

    try:
        previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread (an embedding caller): keep its handler
        previous_sigterm = None
    try:
        prepare(args)
    except PrepareError as e:
        print(f"prepare.py: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # never a traceback for an OS error, even one without a message of its own above
        print(f"prepare.py: error: {describe_os_error(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        print(f"prepare.py: interrupted by {signal.Signals(signum).name}; the temporary files were removed",
              file=sys.stderr)
        return 128 + signum
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
