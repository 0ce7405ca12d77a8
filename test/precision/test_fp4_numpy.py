#!/usr/bin/env python3
"""test/precision/test_fp4_numpy.py: the FP4 quantisers' C++ CPU reference (test/reference/fp4_ref.cpp, which the
GPU kernels match byte for byte in test_fp4_quant.cu) against the independent NumPy reference fp4_numpy_ref.py,
bit for bit: codes, scale codes (padding included) and NVFP4 tensor decode scales of NVFP4 1x16, NVFP4 16x16 tiles
and MXFP4 1x32, row-wise and transposed copies, round to nearest and stochastic rounding, with and without a supplied
tensor amax and Hadamard transforms, on random normal and heavy-tailed inputs, odd shapes, zeros, huge and tiny
values and blocks holding inf or NaN. The C++ side runs through the fp4_ref_dump tool (CTest passes its path in
LLM8_FP4_REF_DUMP; by hand it is looked for in build/test/).

Hadamard transforms: the C++ FP32 butterflies and the NumPy dense float64 product agree within a stated bound
(fp4_numpy_ref.hadamard_error_bound), not always to the last bit (the FP32 partial sums and 1/sqrt(32) round); the
quantiser comparison of a rotated copy then takes the C++ rotated values as its input so that it is bit exact.
The NumPy reference is also checked on its own: Philox4x32-10 known-answer vectors, E2M1 rounding against the
spec's thresholds, stochastic rounding unbiased over many Philox draws within a stated bound and keyed by seed, step
and tensor, and hand-computed blocks.

Exit code 77 (skipped under CTest) when numpy or ml_dtypes (0.5 or later: float4_e2m1fn, float8_e8m0fnu) is not
installed.
"""

import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:
    print(f"test_fp4_numpy.py: skipped: {e} (pip install numpy ml_dtypes)")
    sys.exit(77)
if not all(hasattr(ml_dtypes, t) for t in ("float4_e2m1fn", "float8_e4m3fn", "float8_e8m0fnu")):
    print(f"test_fp4_numpy.py: skipped: ml_dtypes {ml_dtypes.__version__} has no FP4 / E8M0 types "
          "(pip install -U ml_dtypes: 0.5 or later)")
    sys.exit(77)

import os
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fp4_numpy_ref as ref  # noqa: E402
from ref_dump_util import F32, bf16, bits, find_tool  # noqa: E402


def dump_tool():
    return find_tool("LLM8_FP4_REF_DUMP", "fp4_ref_dump")


# ---------------------------------------------------------------------------------------------------------------------
# Inputs
def inputs():
    """name -> float32 (rows, cols), bf16-exact."""
    rng = np.random.default_rng(15)
    out = {}
    out["normal_64x256"] = bf16(rng.standard_normal((64, 256)))
    # heavy tails: Student t with 1.5 degrees of freedom, rows spread over 2^-20 .. 2^20
    out["heavy_96x64"] = bf16(rng.standard_t(1.5, (96, 64)) * np.exp2(rng.integers(-20, 21, (96, 1))))
    for shape in ((1, 1), (3, 17), (37, 45), (17, 33), (5, 100)):
        out[f"odd_{shape[0]}x{shape[1]}"] = bf16(rng.standard_normal(shape) * 3)
    out["zeros_32x64"] = np.zeros((32, 64), F32)
    z = bf16(rng.standard_normal((48, 64)))
    z[:16, :32] = 0.0       # zero blocks and tiles among non-zero ones
    z[20, :] = -0.0
    out["zero_blocks_48x64"] = z
    out["huge_32x64"] = bf16(rng.standard_normal((32, 64)) * 1e37)
    out["huge_max_32x64"] = bf16(np.where(rng.random((32, 64)) < 0.05, 3.38e38, rng.standard_normal((32, 64)) * 1e30))
    # tiny: normal and subnormal FP32 values (bf16 keeps FP32's exponent range) beside some zeros
    t = bf16(rng.standard_normal((32, 64)) * np.exp2(rng.integers(-140, -110, (32, 64))))
    t[rng.random((32, 64)) < 0.1] = 0.0
    out["tiny_32x64"] = t
    out["tiny_row_spread_32x64"] = bf16(rng.standard_normal((32, 64)) * np.exp2(rng.integers(-133, -60, (32, 1))))
    # a tensor amax below 6 * 448 * 2^9 / FLT_MAX: blocks far below it have E4M3 scales under 1 and s_enc / s_b
    # beyond FLT_MAX
    o = bf16(rng.standard_normal((16, 64)) * 2.0**-130)
    o[0, 0] = 2.0**-120
    o[:, 17] = 0.0
    o[3, 40:48] = 0.0
    out["scale_overflow_16x64"] = o
    s = bf16(rng.standard_normal((64, 64)))
    s[3, 5] = np.inf
    s[20, 40] = -np.inf
    s[33, 7] = np.nan
    s[40, 60] = np.nan
    s[41, 61] = np.inf
    out["specials_64x64"] = s
    # values on and next to the E2M1 rounding thresholds after NVFP4 scaling with amax 6 (s_enc = 448, s_b = 448)
    grid = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    near = np.concatenate([grid, grid * (1 - 2.0**-8), grid * (1 + 2.0**-7)])  # the bf16 neighbours
    ties = np.zeros((16, 64), F32)
    ties[:, :] = bf16(np.resize(near, 16 * 64).reshape(16, 64) * rng.choice([-1.0, 1.0], (16, 64)))
    ties[:, ::16] = 6.0
    out["ties_16x64"] = ties
    # NVFP4 block scales that depend on the order of the FP32 operations: with tensor amax 25.5, the bf16 block amaxes
    # a_b whose E4M3 code of (a_b / 6) * s_enc differs from that of a_b * (s_enc / 6)
    s_enc = F32(2688.0) / F32(25.5)
    cand = (np.arange(0x3D80, 0x41CC, dtype=np.uint32) << 16).view(F32)  # bf16 values 2^-4 .. 25.5
    e4m3 = lambda v: np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # noqa: E731
    sensitive = cand[e4m3((cand / F32(6)) * s_enc) != e4m3(cand * (s_enc / F32(6)))]
    amaxes = np.resize(sensitive, 32 * 4)
    st = bf16(rng.uniform(-1, 1, (32, 4, 16)) * amaxes.reshape(32, 4, 1))
    st[:, :, 5] = amaxes.reshape(32, 4) * rng.choice([-1.0, 1.0], (32, 4))  # exactly a_b, the others below it
    st = st.reshape(32, 64)
    st[0, 0] = 25.5
    out["scale_ties_32x64"] = st
    return out


def cases():
    """(name, encoding, input name, options) for every comparison."""
    out = []
    names = list(inputs())
    for enc in ("nvfp4", "nvfp4_2d", "mxfp4"):
        for x in names:
            for sr in (None, (0x123456789ABCDEF, 7, 3)):
                out.append((f"{enc}/{x}/{'sr' if sr else 'rtn'}", enc, x, dict(sr=sr)))
    for x in ("normal_64x256", "heavy_96x64", "specials_64x64", "odd_37x45"):
        for enc in ("nvfp4", "nvfp4_2d"):
            for amax in (0.5, 3.0, 1e6):  # below the real amax (saturating blocks), near it, far above
                out.append((f"{enc}/{x}/amax={amax}", enc, x, dict(amax=F32(amax))))
    out.append(("nvfp4/normal_64x256/amax=0", "nvfp4", "normal_64x256", dict(amax=F32(0.0))))
    out.append(("nvfp4/normal_64x256/amax=inf", "nvfp4", "normal_64x256", dict(amax=F32(np.inf))))
    out.append(("nvfp4/normal_64x256/only_data", "nvfp4", "normal_64x256", dict(data_t=False)))
    out.append(("mxfp4/normal_64x256/only_data_t", "mxfp4", "normal_64x256", dict(data=False)))
    hadamard_inputs = ("normal_64x256", "heavy_96x64", "zeros_32x64", "huge_32x64", "tiny_32x64", "specials_64x64")
    for x in hadamard_inputs:
        for enc, size, which in (("nvfp4", 16, (False, True)), ("nvfp4", 16, (True, True)),
                                 ("mxfp4", 32, (True, True)), ("mxfp4", 16, (True, False))):
            for sr in (None, (99, 1, 2)):
                opts = dict(sr=sr, hadamard=(size, 0xA5C3F00F & ((1 << size) - 1), *which))
                out.append((f"{enc}/{x}/rht{size}{'d' if which[0] else ''}{'t' if which[1] else ''}/"
                            f"{'sr' if sr else 'rtn'}", enc, x, opts))
    out.append(("nvfp4/normal_64x256/rht16_unsigned", "nvfp4", "normal_64x256",
                dict(hadamard=(16, 0, True, True), amax=F32(2.0))))
    # QuEST's Gaussian MXFP4 scales and trust mask (mxfp4_quest): whole blocks of 32 along the quantised directions,
    # with the fixed Hadamard-32 of Quartet's forward (signs 0), a randomised one, and none
    xs = inputs()
    for x in names:
        rows, cols = xs[x].shape
        if cols % 32:
            continue
        both = rows % 32 == 0
        rotations = [None] if x == "huge_max_32x64" else [None, (32, 0, True, both), (32, 0x9E3779B9, True, both)]
        for h in rotations:  # (huge_max's butterflies overflow where the dense product does not: no rotation)
            for sr in (None, (7, 2, 1)):
                opts = dict(sr=sr, hadamard=h, data_t=both)
                tag = "plain" if h is None else f"h32{'s' if h[1] else ''}"
                out.append((f"mxfp4_quest/{x}/{tag}/{'sr' if sr else 'rtn'}", "mxfp4_quest", x, opts))
    # Quartet's range-matched backward scales (mxfp4_matched): any shape, unrotated, and under a re-randomised
    # Hadamard-32 along both copies where the shape allows it
    for x in names:
        rows, cols = xs[x].shape
        rotations = [None]
        if cols % 32 == 0 and x != "huge_max_32x64":
            rotations.append((32, 0x5BD1E995, True, rows % 32 == 0))
        for h in rotations:
            for sr in (None, (11, 4, 6)):
                opts = dict(sr=sr, hadamard=h, data_t=h is None or h[3])
                tag = "plain" if h is None else "h32s"
                out.append((f"mxfp4_matched/{x}/{tag}/{'sr' if sr else 'rtn'}", "mxfp4_matched", x, opts))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The C++ side
def case_line(enc, x, opts):
    rows, cols = x.shape
    sr = opts.get("sr")
    h = opts.get("hadamard") or (0, 0, False, False)
    amax = opts.get("amax")
    fields = ["case", enc, rows, cols, int(sr is not None), *(sr or (0, 0, 0)), h[0], f"{h[1]:x}", int(h[2]),
              int(h[3]), "-" if amax is None else f"{int(bits(amax)):08x}", int(opts.get("data", True)),
              int(opts.get("data_t", True))]
    values = " ".join(f"{int(b):08x}" for b in bits(x).reshape(-1))
    return " ".join(str(f) for f in fields) + "\n" + values + "\n"


def run_cpp(tool, all_cases, xs):
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, out_path = os.path.join(tmp, "cases.txt"), os.path.join(tmp, "out.txt")
        with open(cases_path, "w") as f:
            for _, enc, x, opts in all_cases:
                f.write(case_line(enc, xs[x], opts))
        subprocess.run([tool, cases_path, out_path], check=True)
        with open(out_path) as f:
            text = f.read()
    results, current = [], None
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        if key == "case":
            current = {}
        elif key == "end":
            results.append(current)
        elif key in ("data", "data_t", "scale_inv", "scale_inv_t", "trust_mask"):
            current[key] = np.frombuffer(bytes.fromhex(rest), np.uint8)
        else:  # tensor scales and rotated values: FP32 bit patterns
            current[key] = np.array([int(w, 16) for w in rest.split()], np.uint32).view(F32)
    return results


def describe_mismatch(key, got, want):
    bad = np.flatnonzero(np.asarray(got).reshape(-1) != np.asarray(want).reshape(-1))
    i = bad[0]
    return (f"{key}: {len(bad)} of {np.size(want)} differ, first at flat index {i}: C++ "
            f"{np.asarray(got).reshape(-1)[i]!r}, NumPy {np.asarray(want).reshape(-1)[i]!r}")


# ---------------------------------------------------------------------------------------------------------------------
class NumpyReferenceOnItsOwn(unittest.TestCase):
    def test_philox_known_answers(self):
        for counter, key, want in ref.PHILOX_KAT:
            got = [int(v) for v in ref.philox4x32_10(counter, key)]
            self.assertEqual(got, list(want), [hex(v) for v in got])

    def test_random_bits16_follow_the_keying(self):
        seed, step, tensor = 0x0123456789ABCDEF, 5, 9
        index = np.arange(8 * 2 + 6, dtype=np.uint64) + np.uint64(2**33)
        got = ref.random_bits16(index, 1, seed, step, tensor)
        for i, w in zip(index, got):
            g = int(i) >> 3
            v = ref.philox4x32_10((g & 0xFFFFFFFF, (g >> 32) | (1 << 31), step, tensor),
                                  (seed & 0xFFFFFFFF, seed >> 32))
            self.assertEqual(int(w), (int(v[(int(i) % 8) // 2]) >> (16 * (int(i) % 2))) & 0xFFFF)
        # the constants test_fp4_ref's Philox.SixteenBitStreamFollowsTheKeying expects of the C++ random_bits16
        self.assertEqual(int(ref.random_bits16(np.uint64(0), 0, seed, step, tensor)), 0x4DF1)
        self.assertEqual(int(ref.random_bits16(np.uint64(13), 0, seed, step, tensor)), 0x85F3)
        self.assertEqual(int(ref.random_bits16(np.uint64(13), 1, seed, step, tensor)), 0xA0ED)

    def test_random_signs_constants(self):
        # the constants test_fp4_ref's Fp4Rng.QuartetRotationSignsAreKeyedAndRepeat expects of the C++ random_signs
        seed = 0x0123456789ABCDEF
        self.assertEqual(ref.random_signs(seed, 7, 5, 32), 0x935ED6DD)
        self.assertEqual(ref.random_signs(seed, 7, 6, 32), 0x8E06D38B)
        self.assertEqual(ref.random_signs(seed, 8, 5, 32), 0x2E2795B6)
        self.assertEqual(ref.random_signs(seed, 7, 5, 16), 0xD6DD)

    def test_e2m1_round_to_nearest_even_thresholds(self):
        # reference doc §0: thresholds 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5; a tie goes to the even mantissa
        cases = {0.25: 0, 0.2500001: 1, 0.75: 2, 0.7499999: 1, 1.25: 2, 1.2500001: 3, 1.75: 4, 2.5: 4, 2.5000002: 5,
                 3.5: 6, 3.4999998: 5, 5.0: 6, 5.0000005: 7, 6.0: 7, 1e30: 7, np.inf: 7, 0.0: 0}
        for x, code in cases.items():
            self.assertEqual(int(ref.e2m1_rtn(F32(x))), code, x)
            self.assertEqual(int(ref.e2m1_rtn(F32(-x))), code | 8, -x)

    def test_stochastic_rounding_neighbours_and_probability(self):
        self.assertEqual(int(ref.e2m1_stochastic(F32(0.6), np.uint32(0))), 0x2)
        self.assertEqual(int(ref.e2m1_stochastic(F32(0.6), np.uint32(0xFFFFFFFF))), 0x1)
        self.assertEqual(int(ref.e2m1_stochastic(F32(0.6), np.uint32(0xFFFF0000))), 0x2)  # the high half is unused
        self.assertEqual(int(ref.e2m1_stochastic(F32(-2.25), np.uint32(0))), 0xD)
        self.assertEqual(int(ref.e2m1_stochastic(F32(7.0), np.uint32(0))), 0x7)
        # f = 0.25 at 2.25: exactly 2^14 of the 2^16 draws round up; at 2.25 + 2^-20 (f = 0.25 + 2^-20, more bits
        # than the draw has) the same 2^14: P(up) rounds down to a multiple of 2^-16
        bits = np.arange(0, 2**16, dtype=np.uint32)
        up = ref.e2m1_stochastic(np.full(bits.shape, F32(2.25)), bits) == 0x5
        self.assertEqual(int(up.sum()), 2**14)
        up = ref.e2m1_stochastic(np.full(bits.shape, F32(2.25 + 2.0**-20)), bits) == 0x5
        self.assertEqual(int(up.sum()), 2**14)

    def test_stochastic_rounding_is_unbiased_and_keyed(self):
        # n Philox draws per value: the mean of the rounded values is y within 6 standard deviations of a Bernoulli
        # mean on the step g (at most g / (2 sqrt n)) plus the drawing's own bias (below g * 2^-16)
        n = 1 << 16
        index = np.arange(n, dtype=np.uint64)
        e2m1 = ml_dtypes.float4_e2m1fn
        for k, y in enumerate([0.1, 0.3, 0.6, 1.1, 1.9, 2.2, 3.7, 4.5, 5.99, -0.7, -2.9, -5.2]):
            g = 0.5 if abs(y) < 2 else 1.0 if abs(y) < 4 else 2.0
            bits = ref.random_bits16(index, 0, 0xC0FFEE + k, 3, 4)
            codes = ref.e2m1_stochastic(np.full(n, F32(y)), bits)
            mean = codes.astype(np.uint8).view(e2m1).astype(np.float64).mean()
            self.assertLessEqual(abs(mean - float(F32(y))), g * (6 / (2 * np.sqrt(n)) + 2.0**-16), y)
        x = bf16(np.random.default_rng(3).standard_normal((32, 64)))
        a = ref.quantize(x, "nvfp4", sr=(5, 1, 2))
        self.assertTrue(all(np.array_equal(a[k], b) for k, b in ref.quantize(x, "nvfp4", sr=(5, 1, 2)).items()))
        for other in ((6, 1, 2), (5, 2, 2), (5, 1, 3)):  # seed, step and tensor each change the bits
            self.assertFalse(np.array_equal(a["data"], ref.quantize(x, "nvfp4", sr=other)["data"]), other)

    def test_hand_computed_blocks(self):
        # NVFP4 with tensor amax 6: s_enc = 448, a block of amax 6 has s_b = 448 and multiplier 1
        x = np.array([[6.0, -3.0, 1.0, 0.5, 0.0, 2.0, 4.0, -6.0] * 2], F32)
        q = ref.quantize(x, "nvfp4", data_t=False)
        self.assertEqual(int(q["scale_inv"][0]), int(ref.code_of(F32(448.0), ref.E4M3)))
        self.assertEqual(float(q["tensor_scale_inv"]), float(F32(1.0) / F32(448.0)))
        self.assertEqual(q["data"].reshape(-1)[:4].tolist(), [0xD7, 0x12, 0x40, 0xF6])
        # MXFP4: amax 1 -> X = floor(log2 1) - 2 = -2, code 125; elements x * 4
        x = np.array([[1.0, 0.5, -0.25, 0.125] + [0.0] * 28], F32)
        q = ref.quantize(x, "mxfp4", data_t=False)
        self.assertEqual(q["scale_inv"].tolist(), [125, 127, 127, 127])  # padding rows have scale 1
        self.assertEqual(q["data"].reshape(-1)[:2].tolist(), [0x46, 0x1A])
        # special blocks: all zero -> zero codes; inf -> NaN scale, zero codes
        x = np.zeros((1, 32), F32)
        x[0, 20] = np.inf
        x[0, 21] = 5.0
        q = ref.quantize(x, "nvfp4", data_t=False, amax=F32(6.0))
        # scale_inv[kb * 4 + r] for one row: the zero block's E4M3 scale rounds to 0, the padding rows' are 1.0
        self.assertEqual(q["scale_inv"].tolist(), [0] + [ref.E4M3_ONE] * 3 + [ref.E4M3_NAN] + [ref.E4M3_ONE] * 3)
        self.assertEqual(q["data"].reshape(-1).tolist(), [0] * 16)

    def test_hand_computed_gaussian_block(self):
        # +-1 alternating with x[0] = 1.625: sigma ~ 1.025, scale = 0.487 sigma ~ 0.499 -> X = -2 (code 125); the
        # elements times 4: +-4 (codes 6 / 14, trusted) and 6.5, clipped to 6 (code 7) and not trusted
        x = np.array([[1.0, -1.0] * 16], F32)
        x[0, 0] = 1.625
        q = ref.quantize(x, "mxfp4", data_t=False, gaussian=True)
        self.assertEqual(q["scale_inv"].tolist(), [125, 127, 127, 127])
        self.assertEqual(q["data"].reshape(-1).tolist(), [0xE7] + [0xE6] * 15)
        self.assertEqual(q["trust_mask"].view("<u4").tolist(), [0xFFFFFFFE])
        # a zero block: sigma 0, scale 1e-8 -> X = floor(log2 1e-8) = -27; zero codes, all trusted
        q = ref.quantize(np.zeros((1, 32), F32), "mxfp4", data_t=False, gaussian=True)
        self.assertEqual(int(q["scale_inv"][0]), 127 - 27)
        self.assertEqual(q["trust_mask"].view("<u4").tolist(), [0xFFFFFFFF])
        # a non-finite element: NaN scale, zero codes, nothing trusted
        x[0, 3] = np.inf
        q = ref.quantize(x, "mxfp4", data_t=False, gaussian=True)
        self.assertEqual(int(q["scale_inv"][0]), ref.E8M0_NAN)
        self.assertEqual(q["trust_mask"].view("<u4").tolist(), [0])
        with self.assertRaises(ValueError):  # whole blocks only
            ref.quantize(np.ones((1, 48), F32), "mxfp4", data_t=False, gaussian=True)

    def test_hand_computed_range_matched_block(self):
        # amax 1.9921875 -> X = floor(log2) - 2 = -2 (code 125); elements x 3/4 x 4 = x 3: 1.9921875 -> 5.98 (code 7,
        # 6: the amax lands in [3, 6), never clipped), 1.0 -> 3 (code 5), -0.5 -> -1.5 (code 11), 0.875 -> 2.625
        # (code 5: above the 2.5 tie), 0.25 -> 0.75 (tie between 0.5 and 1: the even mantissa, 1.0, code 2)
        x = np.zeros((1, 32), F32)
        x[0, :5] = [1.9921875, 1.0, -0.5, 0.875, 0.25]
        q = ref.quantize(x, "mxfp4", data_t=False, range_matched=True)
        self.assertEqual(q["scale_inv"].tolist(), [125, 127, 127, 127])
        self.assertEqual(q["data"].reshape(-1).tolist()[:3], [0x57, 0x5B, 0x02])
        # the OCP rule on the same block: x 4, 1.9921875 -> 7.97 saturates at 6, -0.5 -> -2 (code 12), 0.875 -> 3.5 (tie -> 4, code 6)
        q = ref.quantize(x, "mxfp4", data_t=False)
        self.assertEqual(q["data"].reshape(-1).tolist()[:3], [0x67, 0x6C, 0x02])

    def test_dense_hadamard_is_orthogonal(self):
        for n in (16, 32):
            h = ref.hadamard_matrix(n)
            np.testing.assert_allclose(h @ h.T, np.eye(n), atol=1e-12)


@unittest.skipIf(dump_tool() is None, "fp4_ref_dump is not built (cmake --build build --target fp4_ref_dump)")
class CppAgainstNumpy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.xs = inputs()
        cls.cases = cases()
        cls.cpp = run_cpp(dump_tool(), cls.cases, cls.xs)

    def test_every_case_bit_for_bit(self):
        self.assertEqual(len(self.cpp), len(self.cases))
        exact_rotated = total_rotated = 0
        for (name, enc, xname, opts), got in zip(self.cases, self.cpp):
            x = self.xs[xname]
            with self.subTest(case=name):
                rotated = {}
                h = opts.get("hadamard")
                for copy, src in (("data", x), ("data_t", x.T)):
                    key = "rotated" + copy[4:]
                    if key not in got:
                        continue
                    cpp_values = got[key].reshape(src.shape)
                    dense = ref.hadamard_rows(np.ascontiguousarray(src), h[0], h[1])
                    finite = np.isfinite(dense)
                    np.testing.assert_array_equal(np.isfinite(cpp_values), finite, f"{key}: non-finite positions")
                    err = np.abs(cpp_values[finite].astype(np.float64) - dense[finite])
                    bound = ref.hadamard_error_bound(np.ascontiguousarray(src), h[0])[finite]
                    self.assertTrue(np.all(err <= bound), f"{key}: Hadamard error {err.max()} above the bound")
                    exact_rotated += int(np.sum(bits(cpp_values[finite]) == bits(dense[finite])))
                    total_rotated += int(finite.sum())
                    rotated[copy] = cpp_values
                quest = enc == "mxfp4_quest"
                matched = enc == "mxfp4_matched"
                want = ref.quantize(x, "mxfp4" if quest or matched else enc, amax=opts.get("amax"),
                                    sr=opts.get("sr"), hadamard=h, data=opts.get("data", True),
                                    data_t=opts.get("data_t", True), rotated=rotated, gaussian=quest,
                                    range_matched=matched)
                for key, w in want.items():
                    self.assertIn(key, got)
                    g = got[key]
                    if key.startswith("tensor_scale_inv"):
                        self.assertEqual(int(bits(g)[0]), int(bits(w)), f"{key}: C++ {g[0]!r}, NumPy {w!r}")
                    elif not np.array_equal(g, np.asarray(w).reshape(-1)):
                        self.fail(describe_mismatch(key, g, w))
                self.assertEqual(set(got) - {"rotated", "rotated_t"}, set(want))
        print(f"test_fp4_numpy: {len(self.cases)} cases; Hadamard: {exact_rotated} of {total_rotated} rotated values "
              f"bit-identical between the FP32 butterflies and the dense float64 product, the rest within the bound")


if __name__ == "__main__":
    unittest.main()
