#!/usr/bin/env python3
"""test/precision/test_group_numpy.py: the C++ CPU reference of the FP8 1x16 group copies (test/reference/
group_quant_ref.cpp, which the GPU producers and the standalone quantiser match byte for byte in test_group_quant.cu
and test_fp8_activations.cu) against an independent NumPy reference written here from the definition in
llmc/kernels/fp8_groups.h, bit for bit: E4M3 codes, E8M0 scale codes (padding included), group maxima and dequantised
values, on random normal, heavy-tailed and wide-range inputs, odd row counts, and groups that are all zero, hold an
inf or a NaN, sit near FP32's largest value, or are tiny (BF16 subnormals, below the scale's 2^-126 clamp). The C++
side runs through the group_ref_dump tool (CTest passes its path in LLM8_GROUP_REF_DUMP; by hand it is looked for in
build/test/).

The NumPy reference shares no code with the C++ one: the scale exponent is found by search over float64 comparisons
(the smallest k >= -126 with amax * 2^-k <= 448), the E4M3 rounding and the E8M0 values are ml_dtypes' casts
(float8_e4m3fn, float8_e8m0fnu), and E4M3's saturation (cvt.rn.satfinite: +-inf to +-448, NaN to 0x7F) is applied by
hand where ml_dtypes' cast differs (it gives NaN for an infinity).

Exit code 77 (skipped under CTest) when numpy or ml_dtypes (0.5 or later: float8_e8m0fnu) is not installed.
"""

import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:
    print(f"test_group_numpy.py: skipped: {e} (pip install numpy ml_dtypes)")
    sys.exit(77)
if not all(hasattr(ml_dtypes, t) for t in ("float8_e4m3fn", "float8_e8m0fnu")):
    print(f"test_group_numpy.py: skipped: ml_dtypes {ml_dtypes.__version__} has no E8M0 type "
          "(pip install -U ml_dtypes: 0.5 or later)")
    sys.exit(77)

import os
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = np.float32
GROUP = 16
E4M3_MAX = 448.0
MIN_EXP = -126


def dump_tool():
    path = os.environ.get("LLM8_GROUP_REF_DUMP") or os.path.join(HERE, "..", "..", "build", "test", "group_ref_dump")
    return path if os.path.isfile(path) else None


def bf16(values):
    """float32 values exactly representable in bf16 (what the producers read)."""
    return np.asarray(values, F32).astype(ml_dtypes.bfloat16).astype(F32)


def bits(v):
    return np.asarray(v, F32).view(np.uint32)


# ---------------------------------------------------------------------------------------------------------------------
# The NumPy reference

def scale_exponent(amax):
    """k = the smallest integer >= -126 with amax * 2^-k <= 448 (amax finite, > 0), by search in float64 (exact:
    amax * 2^-k only moves the exponent)."""
    a = float(amax)
    k = max(int(np.floor(np.log2(a / E4M3_MAX))) - 1, MIN_EXP)
    while np.ldexp(a, -k) > E4M3_MAX:
        k += 1
    return k


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
    """(codes (rows * cols), scale codes, group maxima (cols / 16, round_up(rows, 4)), dequantised values)."""
    x = np.asarray(x, F32).reshape(rows, cols)
    ld = (rows + 3) // 4 * 4
    groups = cols // GROUP
    codes = np.zeros((rows, cols), np.uint8)
    scale = np.full((groups, ld), 127, np.uint8)
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
            if not np.isfinite(amax):
                s, q, d = 0xFF, F32(1), F32(np.nan)
            elif amax == 0:
                s, q, d = 127, F32(1), F32(1)
            else:
                k = scale_exponent(amax)
                s = k + 127
                d = np.array([s], np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(F32)[0]  # ml_dtypes' 2^k
                q = F32(np.ldexp(1.0, -k))
            scale[g, r] = s
            c = e4m3_satfinite(v * q)
            codes[r, g * GROUP:(g + 1) * GROUP] = c
            with np.errstate(over="ignore"):  # a value near FP32's largest can round up to 2^128: inf, as in FP32
                values[r, g * GROUP:(g + 1) * GROUP] = c.view(ml_dtypes.float8_e4m3fn).astype(F32) * F32(d)
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
            elif word in ("codes", "scale_inv"):
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
    x[4, :GROUP] = bf16(rng.normal(size=GROUP) * 2.0 ** -130)                  # BF16 subnormals: the 2^-126 clamp
    x[5, :GROUP] = bf16(np.ldexp(1.0 + np.arange(GROUP) / 16.0, -120))         # tiny normal values, clamped scale
    x[6, :GROUP] = bf16(rng.uniform(-1, 1, GROUP) * 3.0e38)                     # near FP32's largest value
    x[6, GROUP] = bf16(3.389e38)
    x[7, :GROUP] = np.ldexp(1.75, np.arange(GROUP) - 8)                         # maxima on the 1.75 mantissa edge
    x[7, GROUP:2 * GROUP] = bf16(np.ldexp(1.0078125 + 0.75, np.arange(GROUP) - 8))  # just above it
    return x.reshape(-1)


class NumpyReferenceOnItsOwn(unittest.TestCase):
    def test_scale_exponent_by_hand(self):
        self.assertEqual(scale_exponent(F32(448)), 0)
        self.assertEqual(scale_exponent(np.nextafter(F32(448), F32(1e9))), 1)
        self.assertEqual(scale_exponent(F32(3.5)), -7)
        self.assertEqual(scale_exponent(F32(3.75)), -6)
        self.assertEqual(scale_exponent(F32(1)), -8)
        self.assertEqual(scale_exponent(np.finfo(F32).max), 120)
        self.assertEqual(scale_exponent(F32(2.0 ** -130)), MIN_EXP)

    def test_hand_computed_group(self):
        x = np.zeros(GROUP, F32)
        x[:] = 0.25 * np.arange(GROUP)  # max 3.75: scale 2^-6, the values 16 k, all exact in E4M3
        codes, scale, amax, values = quantize(x, 1, GROUP)
        self.assertEqual(scale[0], 127 - 6)
        self.assertEqual(codes[15], 0x77)  # 240
        self.assertEqual(amax[0], F32(3.75))
        np.testing.assert_array_equal(values, x)
        self.assertTrue((scale[1:] == 127).all())  # padding rows 1..3
        self.assertTrue((amax[1:] == 0).all())

    def test_saturation_and_nan_codes(self):
        self.assertEqual(list(e4m3_satfinite([np.inf, -np.inf, np.nan, 448.0, -448.0, 0.0, -0.0])),
                         [0x7E, 0xFE, 0x7F, 0x7E, 0xFE, 0x00, 0x80])

    def test_error_within_e4m3_half_ulp(self):
        rng = np.random.default_rng(5)
        x = bf16(rng.normal(size=64 * 256) * np.ldexp(1.0, rng.integers(-12, 12, 64 * 256)))
        codes, scale, amax, values = quantize(x, 64, 256)
        d = np.repeat(scale.reshape(16, 64).T.astype(np.int64) - 127, GROUP, axis=1).reshape(-1)
        normal = np.abs(x) * np.ldexp(1.0, -d) >= 2.0 ** -6
        err = np.abs(values.astype(np.float64) - x)
        self.assertTrue((err[normal] <= np.abs(x[normal]) * 2.0 ** -4).all())
        self.assertTrue((err[~normal] <= np.ldexp(1.0, d[~normal] - 10)).all())
        top = amax.reshape(16, 64) * np.ldexp(1.0, -(scale.reshape(16, 64).astype(np.int64) - 127))
        self.assertTrue(((top > 224) & (top <= 448)).all())


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
                np.testing.assert_array_equal(g["scale_inv"], scale)
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
