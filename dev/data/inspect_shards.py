#!/usr/bin/env python3
"""dev/data/inspect_shards.py: prints and validates llm.c-format token shards.

For each shard: header fields (magic, version, token count), file size check, token range, number of documents
(<|endoftext|> tokens), and the first tokens decoded with the bundled GPT-2 vocabulary. Exits 1 if any shard is
invalid (bad magic/version, size not matching the header, tokens outside the vocabulary).

    python3 dev/data/inspect_shards.py data/kjv/kjv_*.bin
    python3 dev/data/inspect_shards.py --first 0 --vocab-size 50257 'data/kjv/*.bin'
"""

import argparse
import glob
import json
import os
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


def main(argv=None):
    p = argparse.ArgumentParser(description="Print and validate llm.c-format token shards.")
    p.add_argument("shards", nargs="+", help="shard files or glob patterns")
    p.add_argument("--first", type=int, default=64, help="how many leading tokens to decode (0 = none)")
    p.add_argument("--encoder", default=os.path.join(SCRIPT_DIR, "gpt2", "encoder.json"),
                   help="GPT-2 encoder.json for decoding")
    p.add_argument("--vocab-size", type=int, default=50257, help="tokens must be below this (default GPT-2's 50257)")
    args = p.parse_args(argv)

    paths = []
    for pattern in args.shards:
        matches = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
        if not matches:
            print(f"inspect_shards.py: error: no files match '{pattern}' "
                  f"(hint: run python3 dev/data/prepare.py first)", file=sys.stderr)
            return 1
        paths.extend(matches)
    decoder = load_decoder(args.encoder) if args.first > 0 else None
    results = [inspect(path, decoder, args.vocab_size, args.first) for path in paths]
    bad = results.count(False)
    print(f"{len(paths)} shard(s), {bad} invalid")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
