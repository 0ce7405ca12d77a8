#!/usr/bin/env python3
"""dev/tools/group_scale_error.py: the error of the FP8 1x16 group copies (llmc/kernels/fp8_groups.h) under three scale
rules, on synthetic activations, as a Markdown table: FP32 scales (the build's: d = amax / 448, so each group's
largest value codes exactly as 448), two-byte BF16 dequant scales (the cast still multiplies by the FP32 q = 448 /
amax, so the largest value codes as 448, and the stored d is amax / 448 rounded to nearest BF16: every value of the
group is off by the same factor, within 2^-8 of 1) and one-byte power-of-two scales (E8M0, the smallest 2^k with
amax / 2^k <= 448, so the largest value lands anywhere in (224, 448] and is rounded like the others).

Per distribution: the energy-weighted relative error ||dequant(x) - x|| / ||x|| (what a reduction over channels, such
as the LayerNorm backward's sum of g * xhat, sees), the median per-element relative error (what a typical element
sees), and the mean error (bias). The inputs are rounded to BF16 first, as the producers read them; E4M3 rounding is
ml_dtypes' float8_e4m3fn cast (round to nearest even).

  usage: python3 dev/tools/group_scale_error.py [--elements N] [--seed S]
"""
import argparse
import sys

try:
    import ml_dtypes
    import numpy as np
except ImportError as e:
    sys.exit(f"group_scale_error.py: {e} (pip install numpy ml_dtypes)")

GROUP = 16
E4M3_MAX = 448.0


def dequantised(x, rule):
    """x (n,) float64 of BF16 values, n a multiple of 16, finite -> the group copy's values under `rule`."""
    g = x.reshape(-1, GROUP)
    amax = np.abs(g).max(axis=1, keepdims=True)
    safe = np.where(amax > 0, amax, 1.0)
    if rule in ("fp32", "bf16"):
        d = (safe.astype(np.float32) / np.float32(E4M3_MAX)).astype(np.float64)
        q = (np.float32(E4M3_MAX) / safe.astype(np.float32)).astype(np.float64)
        if rule == "bf16":
            d = d.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    else:  # e8m0
        k = np.ceil(np.log2(safe / E4M3_MAX))
        k = np.where(safe * 2.0 ** -k > E4M3_MAX, k + 1, k)
        k = np.where(safe * 2.0 ** -(k - 1) <= E4M3_MAX, k - 1, k)
        d, q = 2.0 ** k, 2.0 ** -k
    scaled = (g * q).astype(np.float32)
    codes = np.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return (codes * d).reshape(x.shape)


def distributions(n, rng):
    outlier = np.where(np.arange(n) % GROUP == 3, 100.0, 1.0)
    return [
        ("Gaussian", rng.normal(size=n)),
        ("Student t, 3 degrees of freedom", rng.standard_t(3, size=n)),
        ("Gaussian, one channel in 16 at 100x (an outlier channel)", rng.normal(size=n) * outlier),
        ("log-normal magnitudes (sigma 2), random signs", rng.lognormal(0, 2, size=n) * np.sign(rng.normal(size=n))),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=1 << 22, help="elements per distribution (a multiple of 16)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.elements <= 0 or args.elements % GROUP:
        ap.error(f"--elements must be a positive multiple of {GROUP}")
    rng = np.random.default_rng(args.seed)
    print(f"FP8 1x16 group copies, {args.elements:,} elements per input, seed {args.seed}")
    print()
    print("| input | scales | energy-weighted relative error | median per-element relative error | mean error |")
    print("| --- | --- | --- | --- | --- |")
    for name, raw in distributions(args.elements, rng):
        x = raw.astype(ml_dtypes.bfloat16).astype(np.float64)
        nonzero = x != 0
        for rule, label in (("fp32", "FP32 (amax / 448)"), ("bf16", "BF16 (amax / 448, rounded)"),
                            ("e8m0", "E8M0 (power of two)")):
            err = dequantised(x, rule) - x
            energy = np.sqrt((err ** 2).sum() / (x ** 2).sum())
            median = np.median(np.abs(err[nonzero]) / np.abs(x[nonzero]))
            print(f"| {name} | {label} | {energy:.5f} | {median:.5f} | {err.mean():+.2e} |")


if __name__ == "__main__":
    main()
