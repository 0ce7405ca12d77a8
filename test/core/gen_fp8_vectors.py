#!/usr/bin/env python3
"""test/core/gen_fp8_vectors.py: writes test/core/data/fp8_vectors.txt, the ml_dtypes vectors that llmc/core/dtypes.cpp's
fp8_encode / fp8_decode / bf16_encode, e2m1_encode / e2m1_decode (FP4) and e8m0_encode / e8m0_decode are tested
against bit for bit (test/core/test_dtypes.cpp). The file is committed; test/core/test_fp8_vectors.py regenerates it
and checks it is unchanged.

    python3 test/core/gen_fp8_vectors.py [--out PATH]      (run from anywhere; default: the committed file)

What it holds, for FP8 E4M3 (ml_dtypes.float8_e4m3fn), E5M2 (ml_dtypes.float8_e5m2) and FP4 E2M1
(ml_dtypes.float4_e2m1fn, 16 codes, no NaN):
  decode: all 256 (E2M1: 16) codes -> their FP32 value (NaN codes -> the quiet NaN 0x7FC00000 with the code's sign; the test
    only asks for a NaN).
  encode: FP32 -> code for
    every representable value (both zeros, subnormals, normals, +-max);
    every midpoint between adjacent representable values (exact in FP32: ties go to the even code), and the
      midpoints +- 1 FP32 ulp (they must round away from the tie);
    values beyond +-max (just above, the half-ulp point above, 2x, huge, FLT_MAX) and +-inf;
    the subnormal range: the smallest subnormal, half of it (a tie to 0) +- 1 ulp, 1.5x it (a tie to 2 quanta), the
      largest subnormal, the midpoint to the smallest normal, FP32 subnormals and FP32's smallest normal;
    2000 random floats (random sign and mantissa, exponent uniform over the format's range widened by 12 binades below
      and 4 above), from a fixed splitmix64 stream so the file is reproducible.
  bf16: FP32 -> bf16 bits (round to nearest even) for specials, exact ties, ties +- 1 ulp, and 2000 random floats over
    the whole FP32 exponent range.
  E8M0 (ml_dtypes.float8_e8m0fnu): decode of all 256 codes; encode of every power of two 2^-126 .. 2^127 and its
    neighbours +- 1 ulp, every halfway point 1.5 * 2^k (rounds up) +- 1 ulp, zero, negatives, +-inf, values above
    2^127 (NaN code) and 2000 random positive normal floats. FP32 subnormal inputs are left out (dtypes.h says why).
Saturation: ml_dtypes does not saturate (E4M3 overflows to NaN, E5M2 to inf), while llm8 encodes like CUDA's
__NV_SATFINITE conversion (finite overflow and +-inf -> +-max). For every input beyond +-max (inf included) the
expected code is therefore the ml_dtypes cast of the input clipped to [-max, max], i.e. +-max: saturating
round-to-nearest-even (E2M1: ml_dtypes already saturates). NaN inputs are left out: ml_dtypes keeps the NaN's sign
(and gives 0x7E for E5M2, +-0 for E2M1) where CUDA gives 0x7F (E2M1: 0x7, +6); test_dtypes.cpp checks NaN encodes
against CUDA's conversion instead.

File format: '#' comment lines, '@ <section>' headers (decode e4m3, encode e4m3, decode e5m2, encode e5m2, encode
bf16, decode e2m1, encode e2m1, decode e8m0, encode e8m0), then one vector per line: '<input hex> <expected hex>' (codes
2 hex digits, bf16 4, FP32 bits 8).
"""

import argparse
import os
import struct
import sys

import numpy as np

try:
    import ml_dtypes
except ImportError:  # the caller decides (test_fp8_vectors.py skips)
    ml_dtypes = None

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "data", "fp8_vectors.txt")
RANDOM_PER_FORMAT = 2000


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", float(np.float32(x))))[0]


def bits_f32(b):
    return np.frombuffer(struct.pack("<I", b & 0xFFFFFFFF), dtype=np.float32)[0]


def next_up(x):
    return np.nextafter(np.float32(x), np.float32(np.inf), dtype=np.float32)


def next_down(x):
    return np.nextafter(np.float32(x), np.float32(-np.inf), dtype=np.float32)


class SplitMix64:
    """A tiny fixed PRNG (splitmix64), so the vectors never depend on numpy's generator streams."""

    def __init__(self, seed):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def random_float(rng, exp_lo, exp_hi):
    """Random sign and 23-bit mantissa, unbiased exponent uniform in [exp_lo, exp_hi] (FP32 normals only)."""
    e = exp_lo + rng.below(exp_hi - exp_lo + 1)
    e = max(-126, min(127, e))
    bits = (rng.below(2) << 31) | ((e + 127) << 23) | rng.below(1 << 23)
    return bits_f32(bits)


FORMATS = [
    # name, ml_dtypes type name, smallest normal exponent, largest exponent, max, mantissa bits, codes
    ("e4m3", "float8_e4m3fn", -6, 8, 448.0, 3, 256),
    ("e5m2", "float8_e5m2", -14, 15, 57344.0, 2, 256),
]
E2M1 = ("e2m1", "float4_e2m1fn", 0, 2, 6.0, 1, 16)


def fp8_sections(name, type_name, emin, emax, fmax, mantissa_bits, n_codes, seed):
    t = getattr(ml_dtypes, type_name)
    codes = np.arange(n_codes, dtype=np.uint8)
    values = codes.view(t).astype(np.float32)

    lines = [f"@ decode {name}"]
    for c, v in zip(codes, values):
        bits = f32_bits(v)
        if np.isnan(v):  # canonical quiet NaN with the code's sign: the payload is not part of the contract
            bits = (bits & 0x80000000) | 0x7FC00000
        lines.append(f"{int(c):02x} {bits:08x}")

    finite_codes = [int(c) for c, v in zip(codes, values) if np.isfinite(v)]
    positives = sorted({float(values[c]) for c in finite_codes if values[c] >= 0})  # 0 .. max
    inputs = []  # (comment, [float32 values])

    inputs.append(("every representable value", [values[c] for c in finite_codes]))
    mids, around = [], []
    for a, b in zip(positives[:-1], positives[1:]):
        m = np.float32((a + b) / 2)
        assert float(m) == (a + b) / 2, "midpoints of adjacent FP8 values are exact in FP32"
        for s in (1, -1):
            mids.append(np.float32(s * m))
            around += [next_down(s * m), next_up(s * m)]
    inputs.append(("midpoints between adjacent representable values (ties to even)", mids))
    inputs.append(("midpoints +- 1 FP32 ulp", around))

    top_ulp = positives[-1] - positives[-2]
    beyond = [next_up(fmax), fmax + top_ulp / 4, fmax + top_ulp / 2, next_up(fmax + top_ulp / 2), fmax + top_ulp,
              2 * fmax, 1e6, 1e30, np.finfo(np.float32).max, np.inf]
    inputs.append(("beyond +-max and +-inf (expected: the cast of the value clipped to +-max)",
                   [np.float32(s * v) for v in beyond for s in (1, -1)]))

    min_sub = positives[1]
    max_sub = positives[(1 << mantissa_bits) - 1]
    min_norm = 2.0 ** emin
    sub = [min_sub, min_sub / 2, next_down(min_sub / 2), next_up(min_sub / 2), 1.5 * min_sub, min_sub / 4, max_sub,
           (max_sub + min_norm) / 2, min_norm, next_down(min_norm), bits_f32(1), bits_f32(0x007FFFFF),
           np.finfo(np.float32).tiny, 0.0]
    inputs.append(("subnormals and the edges of the subnormal range", [np.float32(s * v) for v in sub for s in (1, -1)]))

    rng = SplitMix64(seed)
    inputs.append((f"{RANDOM_PER_FORMAT} random floats, exponents {emin - 12} .. {emax + 4}",
                   [random_float(rng, emin - 12, emax + 4) for _ in range(RANDOM_PER_FORMAT)]))

    lines.append(f"@ encode {name}")
    for comment, vals in inputs:
        lines.append(f"# {comment}")
        x = np.array(vals, dtype=np.float32)
        assert not np.isnan(x).any()
        expected = np.clip(x, np.float32(-fmax), np.float32(fmax)).astype(t).view(np.uint8)
        for v, e in zip(x, expected):
            lines.append(f"{f32_bits(v):08x} {int(e):02x}")
    return lines


def bf16_section(seed):
    specials = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.finfo(np.float32).max, -np.finfo(np.float32).max,
                np.finfo(np.float32).tiny, bits_f32(1), bits_f32(0x00008000), bits_f32(0x00018000),
                bits_f32(0x7F7F8000), bits_f32(0x7F7F7FFF), 3.0e38]
    ties = []
    for hi in (0x3F80, 0x3F81, 0x4000, 0x4001, 0xC0A3, 0xC0A4, 0x0001, 0x0002, 0x7F7E, 0x7F7F, 0x0080, 0x007F):
        t = bits_f32((hi << 16) | 0x8000)
        ties += [t, next_down(t), next_up(t)]
    rng = SplitMix64(seed)
    rand = [random_float(rng, -126, 127) for _ in range(RANDOM_PER_FORMAT)]
    lines = ["@ encode bf16"]
    for comment, vals in (("specials", specials), ("exact ties (low half 0x8000) +- 1 ulp", ties),
                          (f"{RANDOM_PER_FORMAT} random floats over the whole exponent range", rand)):
        lines.append(f"# {comment}")
        x = np.array(vals, dtype=np.float32)
        expected = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        for v, e in zip(x, expected):
            lines.append(f"{f32_bits(v):08x} {int(e):04x}")
    return lines


def e8m0_sections(seed):
    t = ml_dtypes.float8_e8m0fnu
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(t).astype(np.float32)
    lines = ["@ decode e8m0"]
    for c, v in zip(codes, values):
        bits = 0x7FC00000 if np.isnan(v) else f32_bits(v)
        lines.append(f"{int(c):02x} {bits:08x}")
    pows = [np.float32(2.0 ** k) for k in range(-126, 128)]
    halves = [np.float32(1.5 * 2.0 ** k) for k in range(-126, 127)]
    inputs = [
        ("every power of two 2^-126 .. 2^127 and its neighbours +- 1 ulp",
         [v for p in pows for v in (p, next_down(p), next_up(p)) if v >= np.finfo(np.float32).tiny]),
        ("halfway points 1.5 * 2^k (round up) +- 1 ulp", [v for h in halves for v in (h, next_down(h), next_up(h))]),
        ("zero, negatives, +-inf, above 2^127 (no such value: the NaN code)",
         [0.0, -0.0, -1.0, -2.0 ** -126, -np.inf, np.inf, 1.5 * 2.0 ** 127, np.finfo(np.float32).max]),
    ]
    rng = SplitMix64(seed)
    inputs.append((f"{RANDOM_PER_FORMAT} random positive normal floats",
                   [abs(random_float(rng, -126, 127)) for _ in range(RANDOM_PER_FORMAT)]))
    lines.append("@ encode e8m0")
    for comment, vals in inputs:
        lines.append(f"# {comment}")
        x = np.array(vals, dtype=np.float32)
        expected = x.astype(t).view(np.uint8)
        for v, e in zip(x, expected):
            lines.append(f"{f32_bits(v):08x} {int(e):02x}")
    return lines


def generate():
    """The file's full text."""
    if ml_dtypes is None:
        raise RuntimeError("ml_dtypes is not installed (pip install ml_dtypes)")
    lines = [
        "# test/core/data/fp8_vectors.txt: bit-exact vectors from ml_dtypes for llmc/core/dtypes (fp8_encode, fp8_decode,",
        "# bf16_encode, e2m1_encode / e2m1_decode, e8m0_encode / e8m0_decode), written by test/core/gen_fp8_vectors.py",
        "# (its docstring describes every section; do not edit).",
        "# '@ <op> <format>' starts a section; each line is '<input hex> <expected hex>': decode: code -> FP32 bits;",
        "# encode: FP32 bits -> code (FP8, FP4, E8M0) or bits (bf16). Beyond +-max the expected code is the ml_dtypes",
        "# cast of the input clipped to +-max (saturation, as CUDA's __NV_SATFINITE). No NaN inputs (see the generator).",
    ]
    for i, fmt in enumerate(FORMATS):
        lines += fp8_sections(*fmt, seed=0x5EED0000 + i)
    lines += bf16_section(seed=0x5EEDBF16)
    lines += fp8_sections(*E2M1, seed=0x5EEDF4F4)
    lines += e8m0_sections(seed=0x5EEDE8E0)
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output path (default: %(default)s)")
    args = parser.parse_args()
    try:
        text = generate()
    except RuntimeError as e:
        print(f"gen_fp8_vectors.py: error: {e}", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"gen_fp8_vectors.py: wrote {text.count(chr(10))} lines to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
