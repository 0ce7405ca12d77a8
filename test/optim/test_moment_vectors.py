#!/usr/bin/env python3
"""test/optim/test_moment_vectors.py: the committed NumPy vectors of the FP8 optimizer-state formats
(test/optim/data/moment_vectors.txt) are exactly what test/optim/gen_moment_vectors.py produces now, and its reference
keeps the properties the formats promise. test/optim/test_moment_vectors.cpp then checks the C++ host codecs and the
CPU reference of the fused update against every case.

Exit code 77 (skipped under CTest) when numpy or ml_dtypes is not installed.
"""

import sys

try:
    import numpy as np
    import ml_dtypes  # noqa: F401
except ImportError as e:
    print(f"test_moment_vectors.py: skipped: {e} (pip install numpy ml_dtypes)")
    sys.exit(77)

import difflib
import importlib.util
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
GEN_PY = os.path.join(HERE, "gen_moment_vectors.py")
VECTORS = os.path.join(HERE, "data", "moment_vectors.txt")


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_moment_vectors_under_test", GEN_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class MomentVectors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gen = load_generator()

    def test_committed_file_is_regenerated_exactly(self):
        generated = self.gen.generate()
        with open(VECTORS) as f:
            committed = f.read()
        if generated != committed:
            diff = "".join(list(difflib.unified_diff(committed.splitlines(True), generated.splitlines(True),
                                                     "committed", "regenerated"))[:40])
            self.fail(f"{VECTORS} differs from what gen_moment_vectors.py writes now (rerun it and commit):\n{diff}")

    def test_series_are_accurate(self):
        x = np.float32(np.exp(np.linspace(np.log(1e-44), np.log(3e38), 2000)))
        np.testing.assert_allclose(self.gen.log2_series(x), np.log2(x.astype(np.float64)), rtol=0, atol=2e-5)
        y = np.float32(np.linspace(-126, 127.9, 2000))  # normal results (subnormals keep fewer bits)
        np.testing.assert_allclose(self.gen.exp2_series(y), np.exp2(y.astype(np.float64)), rtol=1e-6)

    def test_round_trip_error_and_the_expansion_gain(self):
        rng = np.random.default_rng(7)
        x = np.float32(rng.standard_normal(128 * 64) * 1e-3)
        err = {}
        for fmt in ("fp8", "fp8_expand"):
            codes, meta = self.gen.encode(fmt, x)
            back = self.gen.decode(fmt, codes, meta)
            err[fmt] = float(np.mean(((back - x) / x) ** 2))
            self.assertLess(err[fmt], 2e-3, fmt)
        self.assertLess(err["fp8_expand"], err["fp8"])  # COAT's Table 1: the expansion lowers the error

    def test_zero_and_constant_groups(self):
        for fmt in ("fp8", "fp8_expand"):
            for value in (0.0, 0.37, -2.5e-7):
                x = np.full(128, value, dtype=np.float32)
                codes, meta = self.gen.encode(fmt, x)
                self.assertTrue(np.all(np.isfinite(meta)), (fmt, value, meta))
                back = self.gen.decode(fmt, codes, meta)
                np.testing.assert_allclose(back, x, rtol=1e-5, err_msg=f"{fmt} {value}")
            if fmt == "fp8_expand":
                self.assertEqual(meta[1], 8.0)  # k clamped at its top for a constant group


if __name__ == "__main__":
    unittest.main()
