#!/usr/bin/env python3
"""test/core/test_fp8_vectors.py: the committed ml_dtypes vectors (test/core/data/fp8_vectors.txt) are exactly what
test/core/gen_fp8_vectors.py produces with the installed ml_dtypes, and they cover what the generator promises.
test/core/test_dtypes.cpp then checks llmc's encoders against every line.

Exit code 77 (skipped under CTest) when numpy or ml_dtypes is not installed.
"""

import sys

try:
    import numpy  # noqa: F401
    import ml_dtypes  # noqa: F401
except ImportError as e:
    print(f"test_fp8_vectors.py: skipped: {e} (pip install numpy ml_dtypes)")
    sys.exit(77)

import difflib
import importlib.util
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
GEN_PY = os.path.join(HERE, "gen_fp8_vectors.py")
VECTORS = os.path.join(HERE, "data", "fp8_vectors.txt")


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_fp8_vectors_under_test", GEN_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sections(text):
    out, name = {}, None
    for line in text.splitlines():
        if line.startswith("@ "):
            name = line[2:]
            out[name] = []
        elif line and not line.startswith("#"):
            out[name].append(line.split())
    return out


class Fp8Vectors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.generated = load_generator().generate()
        with open(VECTORS) as f:
            cls.committed = f.read()

    def test_committed_file_is_regenerated_exactly(self):
        if self.generated != self.committed:
            diff = "".join(list(difflib.unified_diff(self.committed.splitlines(True), self.generated.splitlines(True),
                                                     "committed", "regenerated"))[:40])
            self.fail(f"{VECTORS} differs from what gen_fp8_vectors.py writes now (rerun it and commit):\n{diff}")

    def test_sections_and_coverage(self):
        s = sections(self.committed)
        self.assertEqual(list(s), ["decode e4m3", "encode e4m3", "decode e5m2", "encode e5m2", "encode bf16",
                                   "decode e2m1", "encode e2m1", "decode e8m0", "encode e8m0"])
        for fmt, max_code in (("e4m3", 0x7E), ("e5m2", 0x7B)):
            dec = s[f"decode {fmt}"]
            self.assertEqual([int(c, 16) for c, _ in dec], list(range(256)))
            enc = {int(x, 16): int(c, 16) for x, c in s[f"encode {fmt}"]}
            self.assertGreater(len(enc), 3000)
            # every finite code is the expected output of some input, both saturation codes included
            finite = {int(c, 16) for c, v in dec if (int(v, 16) & 0x7F800000) != 0x7F800000}
            self.assertTrue(finite <= set(enc.values()), sorted(finite - set(enc.values())))
            self.assertEqual(enc[0x7F800000], max_code)            # +inf saturates
            self.assertEqual(enc[0xFF800000], 0x80 | max_code)     # -inf saturates
            self.assertEqual(enc[0x7F7FFFFF], max_code)            # FLT_MAX saturates
        self.assertGreater(len(s["encode bf16"]), 2000)
        # E2M1: 16 codes, every one the expected output of some input, +-inf and FLT_MAX saturate to +-6
        dec = s["decode e2m1"]
        self.assertEqual([int(c, 16) for c, _ in dec], list(range(16)))
        enc = {int(x, 16): int(c, 16) for x, c in s["encode e2m1"]}
        self.assertEqual(set(enc.values()), set(range(16)))
        self.assertEqual(enc[0x7F800000], 0x7)
        self.assertEqual(enc[0xFF800000], 0xF)
        self.assertEqual(enc[0x7F7FFFFF], 0x7)
        self.assertEqual(enc[0x40A00000], 0x6)  # 5.0: the tie between 4 and 6 goes to 4 (even mantissa)
        # E8M0: 256 codes; every code 0..254 is the expected output of its power of two, 0xFF of zero and negatives
        dec = s["decode e8m0"]
        self.assertEqual([int(c, 16) for c, _ in dec], list(range(256)))
        enc = {int(x, 16): int(c, 16) for x, c in s["encode e8m0"]}
        self.assertTrue(set(range(1, 255)) <= set(enc.values()))
        self.assertEqual(enc[0x3F800000], 127)  # 1.0
        self.assertEqual(enc[0x3FC00000], 128)  # 1.5 rounds up
        self.assertEqual(enc[0x00000000], 0xFF)


if __name__ == "__main__":
    unittest.main(verbosity=1)
