#!/usr/bin/env python3
"""dev/data/inspect_shards.py: prints and validates llm.c-format token shards and prepare.py's manifests.

For each shard: header fields (magic, version, token count), file size check, token range, number of documents
(<|endoftext|> tokens), and the first tokens decoded with the bundled GPT-2 vocabulary.

Manifests: for a shard named <name>_{train,val}_NNNNNN.bin with a <name>_manifest.json beside it (written by
dev/data/prepare.py), or a manifest given directly, the whole set is checked: every listed shard exists with the
listed size and token count, no unlisted <name>_{train,val}_NNNNNN.bin sits beside them (shards of another run: a
mix), and the sha256 matches for the shards given (for all listed shards, which are then also inspected, when the
manifest itself is given). Shards without a manifest (older prepare.py output, llm.c's own scripts) get a note
only. --no-manifest skips these checks.

Exits 1 if any shard is invalid (bad magic/version, size not matching the header, tokens outside the vocabulary) or
any manifest does not match (or cannot be read); the last lines count both.

    python3 dev/data/inspect_shards.py data/kjv/kjv_*.bin
    python3 dev/data/inspect_shards.py --first 0 --vocab-size 50257 'data/kjv/*.bin'
    python3 dev/data/inspect_shards.py --first 0 data/kjv/kjv_manifest.json    # the set a manifest lists
"""

import argparse
import glob
import hashlib
import json
import os
import re
import sys

import numpy as np

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
FORMATS = {  # magic -> (version, token dtype, name)
    20240520: (1, "<u2", "uint16"),
    20240801: (7, "<u4", "uint32"),
}
EOT_TOKEN = 50256
MANIFEST_SUFFIX = "_manifest.json"
MANIFEST_FORMAT, MANIFEST_VERSION = "llm8 token shards", 1  # as prepare.py writes them
SHARD_NAME = re.compile(r"(?P<name>.+?)_(?P<split>train|val)_(?P<index>\d{6,})\.bin")  # prepare.py's shard names


def load_decoder(encoder_path):
    """id -> bytes for GPT-2 tokens (through GPT-2's byte <-> unicode map)."""
    sys.path.insert(0, SCRIPT_DIR)
    from prepare import bytes_to_unicode
    _, byte_encoder = bytes_to_unicode()
    byte_decoder = {c: b for b, c in byte_encoder.items()}
    with open(encoder_path, "r", encoding="utf-8") as f:
        encoder = json.load(f)
    return {i: (s.encode("utf-8") if s.startswith("<|") else bytes(byte_decoder[c] for c in s))
            for s, i in encoder.items()}


def read_shard(path):
    """Returns (header (256,) int32, tokens) or raises ValueError with what is wrong."""
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(f"file is {size} bytes, smaller than the {HEADER_BYTES}-byte header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)  # (256,)
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    if magic not in FORMATS:
        raise ValueError(f"bad magic {magic} (expected 20240520 or 20240801): not a token shard")
    want_version, dtype, _ = FORMATS[magic]
    if version != want_version:
        raise ValueError(f"unsupported version {version} for magic {magic} (expected {want_version})")
    expected_size = HEADER_BYTES + count * np.dtype(dtype).itemsize
    if count < 0 or size != expected_size:
        raise ValueError(f"file is {size} bytes but the header's {count} tokens need {expected_size} (truncated?)")
    tokens = np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,))  # (count,)
    return header, tokens


def inspect(path, decoder, vocab_size, first):
    print(f"== {path}")
    try:
        header, tokens = read_shard(path)
    except (OSError, ValueError) as e:
        print(f"   INVALID: {e}")
        return False
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    print(f"   magic {magic}, version {version} ({FORMATS[magic][2]} tokens), {count:,} tokens, "
          f"{os.path.getsize(path):,} bytes")
    if count == 0:
        print("   (empty shard)")
        return True
    lo, hi = int(tokens.min()), int(tokens.max())
    print(f"   token range [{lo}, {hi}], documents (<|endoftext|>): {int(np.count_nonzero(tokens == EOT_TOKEN)):,}")
    ok = True
    if hi >= vocab_size:
        print(f"   INVALID: token {hi} is outside the vocabulary of {vocab_size} (hint: --vocab-size)")
        ok = False
    if int(tokens[0]) != EOT_TOKEN:
        print("   note: the shard does not start with <|endoftext|> (a document continues from the previous shard)")
    if first > 0 and decoder is not None:
        head = [int(t) for t in tokens[:first]]
        text = b"".join(decoder.get(t, f"<?{t}>".encode()) for t in head).decode("utf-8", errors="replace")
        print(f"   first {len(head)} tokens: {head[:16]}{' ...' if len(head) > 16 else ''}")
        print("   decoded: " + repr(text))
    return ok


def sha256_of_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_for(shard):
    """The manifest that would describe this shard (<dir>/<name>_manifest.json), or None if the file name is not
    prepare.py's <name>_{train,val}_NNNNNN.bin."""
    m = SHARD_NAME.fullmatch(os.path.basename(shard))
    return os.path.join(os.path.dirname(shard), m.group("name") + MANIFEST_SUFFIX) if m else None


def load_manifest(path):
    """(name, [shard entries]) of a manifest, or raises ValueError saying what is wrong with it."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            manifest = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read it: {e.strerror or e}")
    except ValueError as e:
        raise ValueError(f"not valid JSON: {e}")
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"not a prepare.py manifest (no \"format\": \"{MANIFEST_FORMAT}\")")
    if manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(f"unsupported manifest version {manifest.get('version')!r} (expected {MANIFEST_VERSION})")
    name = manifest.get("name")
    if not isinstance(name, str) or os.path.basename(path) != name + MANIFEST_SUFFIX:
        raise ValueError(f"its name {name!r} does not match its file name")
    shards = manifest.get("shards")
    if not isinstance(shards, list):
        raise ValueError("\"shards\" is not a list")
    seen = set()
    for i, entry in enumerate(shards):
        if not isinstance(entry, dict):
            raise ValueError(f"shards[{i}] is not an object")
        for key, kind in (("file", str), ("tokens", int), ("bytes", int), ("sha256", str)):
            if not isinstance(entry.get(key), kind) or isinstance(entry.get(key), bool):
                raise ValueError(f"shards[{i}].{key} is missing or not a {kind.__name__}")
        m = SHARD_NAME.fullmatch(entry["file"])
        if m is None or m.group("name") != name:
            raise ValueError(f"shards[{i}].file {entry['file']!r} is not a shard name of {name!r} "
                             f"({name}_{{train,val}}_NNNNNN.bin in the manifest's folder)")
        if entry["file"] in seen:
            raise ValueError(f"shards[{i}].file {entry['file']!r} is listed twice")
        seen.add(entry["file"])
    return name, shards


def check_manifest(path, hash_only=None):
    """Checks the shard set a manifest describes against its folder; prints what it finds. The sha256 of every listed
    shard is compared, or only of those in hash_only (a set of paths) when given. Returns (ok, [listed paths])."""
    print(f"== manifest {path}")
    try:
        name, shards = load_manifest(path)
    except ValueError as e:
        print(f"   INVALID: {e}")
        return False, []
    folder = os.path.dirname(path)
    problems, hashed = [], 0
    listed = {entry["file"] for entry in shards}
    for entry in shards:
        shard = os.path.join(folder, entry["file"])
        try:
            size = os.path.getsize(shard)
        except OSError as e:
            problems.append(f"{entry['file']} is listed but " +
                            ("missing" if not os.path.lexists(shard) else f"cannot be read: {e.strerror or e}"))
            continue
        if size != entry["bytes"]:
            problems.append(f"{entry['file']} is {size:,} bytes, the manifest lists {entry['bytes']:,}")
            continue
        try:
            count = int(np.fromfile(shard, dtype="<i4", count=3)[2]) if size >= HEADER_BYTES else None
            sha256 = sha256_of_file(shard) if hash_only is None or os.path.realpath(shard) in hash_only else None
        except OSError as e:
            problems.append(f"{entry['file']} cannot be read: {e.strerror or e}")
            continue
        hashed += sha256 is not None
        if count != entry["tokens"]:
            problems.append(f"{entry['file']} holds {count} tokens by its header, the manifest lists {entry['tokens']:,}")
        elif sha256 is not None and sha256 != entry["sha256"]:
            problems.append(f"{entry['file']} has sha256 {sha256[:16]}..., the manifest lists {entry['sha256'][:16]}... "
                            f"(changed since prepare.py wrote it, or from another run)")
    try:
        entries = sorted(os.listdir(folder or "."))
    except OSError as e:
        entries = []
        problems.append(f"cannot list '{folder}': {e.strerror or e}")
    for entry in entries:
        m = SHARD_NAME.fullmatch(entry)
        if m and m.group("name") == name and entry not in listed:
            problems.append(f"{entry} is not in the manifest: a shard of another run mixed in? (a data glob "
                            f"would read it; hint: re-run prepare.py, or remove it)")
    for problem in problems:
        print(f"   INVALID: {problem}")
    if not problems:
        splits = {}
        for entry in shards:
            split = SHARD_NAME.fullmatch(entry["file"]).group("split")
            count, tokens = splits.get(split, (0, 0))
            splits[split] = (count + 1, tokens + entry["tokens"])
        summary = "; ".join(f"{split} {count} shard(s), {tokens:,} tokens" for split, (count, tokens) in splits.items())
        checked = ("sha256" if hashed == len(shards) else
                   f"sha256 for the {hashed} given (name the manifest to check all)")
        print(f"   OK: {len(shards)} listed shard(s) present with the listed sizes, token counts and {checked}, and no "
              f"other {name}_{{train,val}}_*.bin beside them ({summary or 'no shards'})")
    return not problems, [os.path.join(folder, entry["file"]) for entry in shards]


def main(argv=None):
    p = argparse.ArgumentParser(description="Print and validate llm.c-format token shards.")
    p.add_argument("shards", nargs="+", help="shard files or glob patterns")
    p.add_argument("--first", type=int, default=64, help="how many leading tokens to decode (0 = none)")
    p.add_argument("--encoder", default=os.path.join(SCRIPT_DIR, "gpt2", "encoder.json"),
                   help="GPT-2 encoder.json for decoding")
    p.add_argument("--vocab-size", type=int, default=50257, help="tokens must be below this (default GPT-2's 50257)")
    p.add_argument("--no-manifest", action="store_true",
                   help="do not check <name>_manifest.json (the shard set, sizes and sha256s)")
    args = p.parse_args(argv)

    paths, manifests, seen = [], [], set()  # seen: real paths of both, so that each is inspected once
    for pattern in args.shards:
        matches = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
        if not matches:
            print(f"inspect_shards.py: error: no files match '{pattern}' "
                  f"(hint: run python3 dev/data/prepare.py first)", file=sys.stderr)
            return 1
        for match in matches:
            if os.path.realpath(match) not in seen:
                seen.add(os.path.realpath(match))
                (manifests if match.endswith(MANIFEST_SUFFIX) else paths).append(match)
    if args.no_manifest and manifests:
        print(f"inspect_shards.py: error: --no-manifest, but manifests given: {', '.join(manifests)}",
              file=sys.stderr)
        return 1

    try:
        decoder = load_decoder(args.encoder) if args.first > 0 else None
    except (OSError, ValueError) as e:
        print(f"inspect_shards.py: error: cannot read the vocabulary '{args.encoder}': "
              f"{getattr(e, 'strerror', None) or e} (hint: --encoder, or --first 0 to decode nothing)", file=sys.stderr)
        return 1

    manifest_results, unchecked = [], []
    if not args.no_manifest:
        given = set(manifests)  # named: all their shards are hashed and inspected; else only the shards named
        hash_only = {os.path.realpath(path) for path in paths}
        for path in paths:
            manifest = manifest_for(path)
            if manifest is not None and os.path.realpath(manifest) not in seen:
                seen.add(os.path.realpath(manifest))
                (manifests if os.path.exists(manifest) else unchecked).append(manifest)
        for manifest in manifests:
            ok, listed = check_manifest(manifest, None if manifest in given else hash_only)
            manifest_results.append(ok)
            for shard in listed if manifest in given else []:
                if os.path.realpath(shard) not in seen and os.path.exists(shard):
                    seen.add(os.path.realpath(shard))
                    paths.append(shard)

    results = [inspect(path, decoder, args.vocab_size, args.first) for path in paths]
    for manifest in unchecked:
        print(f"note: no manifest {manifest}: these shards were not written by this prepare.py (or by an older "
              f"one), so they are not checked for a mix of runs")
    bad = results.count(False)
    print(f"{len(paths)} shard(s), {bad} invalid")
    bad_manifests = manifest_results.count(False)
    if manifest_results:
        print(f"{len(manifest_results)} manifest(s), {bad_manifests} with problems")
    return 1 if bad or bad_manifests else 0


if __name__ == "__main__":
    sys.exit(main())
