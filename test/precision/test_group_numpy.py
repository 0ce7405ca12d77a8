#!/usr/bin/env python3
"""test/precision/test_group_numpy.py: the C++ CPU reference of the FP8 1x16 group copies (test/reference/
group_quant_ref.cpp, which the GPU producers and the standalone quantiser match byte for byte in test_group_quant.cu
and test_fp8_activations.cu) against an independent NumPy reference written here from the definition in
llmc/kernels/fp8_groups.h, bit for bit: E4M3 codes, FP32 scales (padding included), group maxima and dequantised
values, on random normal, heavy-tailed and wide-range inputs, odd row counts, and groups that are all zero, hold an
inf or a NaN, sit near FP32's largest value, or are tiny (BF16 subnormals, below the 2^-117 clamp of the amax). The
C++ side runs through the group_ref_dump tool (CTest passes its path in LLM8_GROUP_REF_DUMP; by hand it is looked for
in build/test/).

The NumPy reference shares no code with the C++ one: the scales are NumPy's float32 divisions (IEEE, correctly
rounded) of the clamped amax and 448, the E4M3 rounding is ml_dtypes' float8_e4m3fn cast, and E4M3's saturation
(cvt.rn.satfinite: +-inf to +-448, NaN to 0x7F) is applied by hand where ml_dtypes' cast differs (it gives NaN for an
infinity).

Exit code 77 (skipped under CTest) when numpy or ml_dtypes is not installed.
"""

import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:
    print(f"test_group_numpy.py: skipped: {e} (pip install numpy ml_dtypes)")
    sys.exit(77)

import os
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ref_dump_util import F32, bf16, bits, find_tool  # noqa: E402

GROUP = 16
E4M3_MAX = F32(448.0)
MIN_AMAX = F32(2.0 ** -117)  # the amax is clamped here: both scales stay normal FP32 numbers


def dump_tool():
    return find_tool("LLM8_GROUP_REF_DUMP", "group_ref_dump")


# ---------------------------------------------------------------------------------------------------------------------
# The NumPy reference

def scales(amax):
    """(d, q) of a group: the stored dequant scale and the cast's multiplier, float32."""
    if not np.isfinite(amax):
        return F32(np.nan), F32(1)
    if amax == 0:
        return F32(1), F32(1)
    a = max(F32(amax), MIN_AMAX)
    return F32(a / E4M3_MAX), F32(E4M3_MAX / a)


def e4m3_satfinite(v):
    """E4M3 codes of float32 values, rounded to nearest even, +-inf and finite overflow saturated to +-448, NaN to
    0x7F (cvt.rn.satfinite.e4m3x2.f32)."""
    v = np.asarray(v, F32)
    nan = np.isnan(v)
    clipped = np.clip(np.where(nan, F32(0), v), -E4M3_MAX, E4M3_MAX).astype(F32)
    codes = clipped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).copy()
    codes[nan] = 0x7F
    return codes


def quantize(x, rows, cols):
    """(codes (rows * cols), scales, group maxima (cols / 16, round_up(rows, 4)), dequantised values)."""
    x = np.asarray(x, F32).reshape(rows, cols)
    ld = (rows + 3) // 4 * 4
    groups = cols // GROUP
    codes = np.zeros((rows, cols), np.uint8)
    scale = np.ones((groups, ld), F32)
    group_amax = np.zeros((groups, ld), F32)
    values = np.zeros((rows, cols), F32)
    for r in range(rows):
        for g in range(groups):
            v = x[r, g * GROUP:(g + 1) * GROUP]
            a = np.abs(v)
            if np.isnan(a).any():
                amax = F32(np.nan)
            else:
                amax = a.max()
            group_amax[g, r] = amax
            d, q = scales(amax)
            scale[g, r] = d
            with np.errstate(invalid="ignore", over="ignore"):  # inf * q stays inf (saturated below)
                c = e4m3_satfinite((v * q).astype(F32))
            codes[r, g * GROUP:(g + 1) * GROUP] = c
            with np.errstate(invalid="ignore"):  # a non-finite group's NaN scale
                values[r, g * GROUP:(g + 1) * GROUP] = c.view(ml_dtypes.float8_e4m3fn).astype(F32) * d
    return codes.reshape(-1), scale.reshape(-1), group_amax.reshape(-1), values.reshape(-1)


# ---------------------------------------------------------------------------------------------------------------------
# The C++ reference through group_ref_dump

def run_dump(tool, cases):
    """cases: list of (x float32 (rows * cols), rows, cols) -> list of dicts of the tool's outputs."""
    with tempfile.TemporaryDirectory() as tmp:
        cin, cout = os.path.join(tmp, "cases.txt"), os.path.join(tmp, "out.txt")
        with open(cin, "w") as f:
            for x, rows, cols in cases:
                f.write(f"case {rows} {cols}\n")
                f.write(" ".join(f"{b:08x}" for b in bits(x)) + "\n")
        subprocess.run([tool, cin, cout], check=True)
        results, cur = [], None
        with open(cout) as f:
            lines = f.read().splitlines()
        for line in lines:
            word, _, rest = line.strip().partition(" ")
            if word == "case":
                cur = {}
            elif word == "end":
                results.append(cur)
            elif word == "codes":
                cur[word] = np.frombuffer(bytes.fromhex(rest), np.uint8)
            else:
                cur[word] = np.array([int(t, 16) for t in rest.split()], np.uint32)
        return results


def special_rows(cols, rng):
    """Rows of groups with special values (cols a multiple of 16, at least 8 groups)."""
    x = bf16(rng.normal(size=(8, cols)))
    x[0, :GROUP] = 0.0
    x[0, 3] = -0.0
    x[1, 5] = np.inf
    x[2, GROUP + 2] = -np.inf
    x[3, 7] = np.nan
    x[4, :GROUP] = bf16(rng.normal(size=GROUP) * 2.0 ** -130)                  # BF16 subnormals, below the clamp
    x[5, :GROUP] = bf16(np.ldexp(1.0 + np.arange(GROUP) / 16.0, -120))         # tiny normal values, below it too
    x[6, :GROUP] = bf16(rng.uniform(-1, 1, GROUP) * 3.0e38)                     # near FP32's largest value
    x[6, GROUP] = bf16(3.389e38)
    x[7, :GROUP] = np.ldexp(1.0, np.arange(GROUP) - 8)                          # powers of two: exact copies
    x[7, GROUP:2 * GROUP] = bf16(np.ldexp(1.0, -117) * (1 + np.arange(GROUP)))  # maxima just above the clamp
    return x.reshape(-1)


class NumpyReferenceOnItsOwn(unittest.TestCase):
    def test_scales_by_hand(self):
        self.assertEqual(scales(F32(448)), (F32(1), F32(1)))
        self.assertEqual(scales(F32(3.5)), (F32(3.5 / 448), F32(128)))  # 448 / 3.5 = 128 exactly
        self.assertEqual(scales(F32(0)), (F32(1), F32(1)))
        self.assertEqual(scales(F32(2.0 ** -130)), (F32(2.0 ** -117) / E4M3_MAX, E4M3_MAX / F32(2.0 ** -117)))
        d, q = scales(F32(np.inf))
        self.assertTrue(np.isnan(d))
        self.assertEqual(q, F32(1))

    def test_hand_computed_group(self):
        x = (F32(0.25) * np.arange(GROUP)).astype(F32)  # max 3.75: on 448 (0x7E), d = 3.75 / 448
        codes, scale, amax, values = quantize(x, 1, GROUP)
        self.assertEqual(scale[0], F32(3.75) / E4M3_MAX)
        self.assertEqual(codes[15], 0x7E)
        self.assertEqual(amax[0], F32(3.75))
        self.assertTrue((scale[1:] == 1).all())  # padding rows 1..3
        self.assertTrue((amax[1:] == 0).all())

    def test_saturation_and_nan_codes(self):
        self.assertEqual(list(e4m3_satfinite([np.inf, -np.inf, np.nan, 448.0, -448.0, 0.0, -0.0])),
                         [0x7E, 0xFE, 0x7F, 0x7E, 0xFE, 0x00, 0x80])

    def test_largest_on_448_and_error_within_e4m3_half_ulp(self):
        rng = np.random.default_rng(5)
        x = bf16(rng.normal(size=64 * 256) * np.ldexp(1.0, rng.integers(-12, 12, 64 * 256)))
        codes, scale, amax, values = quantize(x, 64, 256)
        d = np.repeat(scale.reshape(16, 64).T, GROUP, axis=1).reshape(-1).astype(np.float64)
        scaled = np.abs(x) / d
        normal = scaled >= 2.0 ** -6
        err = np.abs(values.astype(np.float64) - x)
        self.assertTrue((err[normal] <= np.abs(x[normal]) * 2.0 ** -4 * (1 + 1e-6)).all())
        self.assertTrue((err[~normal] <= d[~normal] * 2.0 ** -10 * (1 + 1e-6)).all())
        largest = np.abs(x.reshape(64, 16, GROUP)).argmax(axis=2)
        top = np.take_along_axis(codes.reshape(64, 16, GROUP), largest[..., None], axis=2)
        self.assertTrue(((top & 0x7F) == 0x7E).all())


class CppReferenceMatchesNumpy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tool = dump_tool()
        if cls.tool is None:
            raise unittest.SkipTest("group_ref_dump not built (cmake --build build --target group_ref_dump)")

    def check(self, cases):
        got = run_dump(self.tool, cases)
        self.assertEqual(len(got), len(cases))
        for (x, rows, cols), g in zip(cases, got):
            with self.subTest(rows=rows, cols=cols):
                codes, scale, amax, values = quantize(x, rows, cols)
                np.testing.assert_array_equal(g["codes"], codes)
                np.testing.assert_array_equal(g["scale_inv"], bits(scale))
                np.testing.assert_array_equal(g["group_amax"], bits(amax))
                np.testing.assert_array_equal(g["dequantized"], bits(values))

    def test_random_inputs(self):
        rng = np.random.default_rng(11)
        cases = []
        for rows, cols in ((1, 16), (3, 48), (5, 128), (37, 768), (64, 256)):
            n = rows * cols
            cases.append((bf16(rng.normal(size=n)), rows, cols))
            cases.append((bf16(rng.standard_t(2, size=n) * 3), rows, cols))                            # heavy tails
            cases.append((bf16(rng.normal(size=n) * np.ldexp(1.0, rng.integers(-40, 40, n))), rows, cols))  # wide
        self.check(cases)

    def test_special_groups(self):
        rng = np.random.default_rng(12)
        self.check([(special_rows(cols, rng), 8, cols) for cols in (128, 256)])


if __name__ == "__main__":
    unittest.main()
