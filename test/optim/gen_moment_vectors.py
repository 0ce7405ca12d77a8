#!/usr/bin/env python3
"""test/optim/gen_moment_vectors.py: an independent NumPy reference of the FP8 optimizer-state formats (COAT,
arXiv 2410.19313, reference/fp8_recipes.md section 1.1) and of the fused AdamW step over them, written from the
algorithm as llmc/optim/moment_storage.cuh specifies it (groups of 128; fp8: s = (max|x| + 1e-20) / 448; fp8_expand:
Dynamic Range Expansion with k = clamp(floor(E log2(T) / log2(M / m)) / E, 1/2, 8), centre c = sqrt(M) sqrt(m), scale
s = (M / c)^k / 448), every operation in float32 with round to nearest even, E4M3 rounding by ml_dtypes (saturated
first), the powers by the same explicit log2 / exp2 series the C++ side writes out.

Run it to rewrite test/optim/data/moment_vectors.txt; test/optim/test_moment_vectors.py checks the committed file is
what this produces, and test/optim/test_moment_vectors.cpp checks the C++ host codecs (encode_moment / decode_moment)
and the CPU reference of the update (test/reference/optim_ref.h) against every case, bit for bit.

File format: a case starts with "@ encode <format> <name> <n>" or "@ update <format> <name> <n> <steps>"; the lines
after it are "<field> <hex>..." (float32 bits as 8 hex digits, E4M3 codes as 2), fields in the order written below.
"""

import os
import sys

import ml_dtypes
import numpy as np

F = np.float32
G = 128
E4M3_MAX = F(448.0)


def f32(x):
    return np.asarray(x, dtype=np.float32)


def bits(x):
    return f32(x).view(np.uint32)


def from_bits(u):
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def e4m3_code(x):
    """E4M3 codes of float32 x: saturate to +-448, then round to nearest even (ml_dtypes)."""
    x = np.clip(f32(x), -E4M3_MAX, E4M3_MAX)
    return x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def e4m3_value(code):
    return np.asarray(code, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def log2_series(x):
    """log2 of float32 x > 0: x = 2^e f, f in [sqrt(1/2), sqrt(2)], t = (f-1)/(f+1), (2/ln2)(t + t^3/3 + ... + t^11/11)."""
    x = f32(x).copy()
    e = np.zeros(x.shape, dtype=np.int64)
    sub = (bits(x) & 0x7F800000) == 0
    x[sub] = x[sub] * F(8388608.0)
    e[sub] = -23
    u = bits(x)
    e += ((u >> 23) & 0xFF).astype(np.int64) - 127
    f = from_bits((u & 0x007FFFFF) | 0x3F800000).copy()
    big = f > F(1.41421356)
    f[big] = f[big] * F(0.5)
    e[big] += 1
    t = (f - F(1.0)) / (f + F(1.0))
    t2 = t * t
    p = np.full(x.shape, F(1.0) / F(11.0), dtype=np.float32)
    for c in (F(1.0) / F(9.0), F(1.0) / F(7.0), F(1.0) / F(5.0), F(1.0) / F(3.0), F(1.0)):
        p = p * t2 + c
    return e.astype(np.float32) + (p * t) * F(2.88539008)


def exp2_series(y):
    """2^y in float32: n = floor(y + 1/2), r = y - n, e^(r ln2) by its Taylor series to degree 7, times 2^n."""
    y = f32(y)
    n = np.floor(y + F(0.5))
    r = y - n
    a = r * F(0.693147182)
    p = np.full(y.shape, F(1.0) / F(5040.0), dtype=np.float32)
    for c in (F(1.0) / F(720.0), F(1.0) / F(120.0), F(1.0) / F(24.0), F(1.0) / F(6.0), F(0.5), F(1.0), F(1.0)):
        p = p * a + c
    ni = np.clip(n, -200, 200).astype(np.int64)
    out = np.empty(y.shape, dtype=np.float32)
    for i in range(y.size):
        k = int(ni.flat[i])
        if y.flat[i] >= 128.0:
            out.flat[i] = np.inf
        elif y.flat[i] < -151.0:
            out.flat[i] = 0.0
        elif k > 127:
            out.flat[i] = (p.flat[i] * F(2.0**127)) * F(2.0)
        elif k >= -126:
            out.flat[i] = p.flat[i] * F(2.0**k)
        else:
            out.flat[i] = (p.flat[i] * F(2.0 ** (k + 64))) * F(2.0**-64)
    return out


def stats(x):
    a = np.abs(f32(x))
    nz = a[a > 0]
    return F(a.max()), (F(nz.min()) if nz.size else F(np.inf))


# fp8: one scale per group ---------------------------------------------------------------------------------------
def fit_fp8(x):
    M, _ = stats(x)
    return [(M + F(1e-20)) / E4M3_MAX]


def encode_fp8(x, meta):
    return e4m3_code(f32(x) / meta[0])


def decode_fp8(codes, meta):
    return e4m3_value(codes) * meta[0]


# fp8_expand: Dynamic Range Expansion ------------------------------------------------------------------------------
E_STEPS = 16
EXPAND_NUMERATOR = F(265.835358)  # E * log2(448^2 / 2)


def fit_expand(x):
    mx, mn = stats(x)
    M = mx + F(1e-30)
    m = M if mn > mx else mn + F(1e-30)
    log2_M = log2_series(np.array([M]))[0]
    log2_m = log2_series(np.array([m]))[0]
    rng = log2_M - log2_m
    steps = 128
    if rng > 0:
        r = EXPAND_NUMERATOR / rng
        if r < F(128.0):
            steps = int(np.floor(r))
        steps = max(steps, 8)
    k = F(steps) / F(E_STEPS)
    c = np.sqrt(M) * np.sqrt(m)
    log2_c = log2_series(np.array([c]))[0]
    s = exp2_series(np.array([k * (log2_M - log2_c)]))[0] / E4M3_MAX
    return [F(s), F(k), F(c)]


def encode_expand(x, meta):
    s, k, c = meta
    x = f32(x)
    log2_c = log2_series(np.array([c]))[0]
    out = np.zeros(x.shape, dtype=np.float32)
    nz = x != 0
    y = exp2_series(k * (log2_series(np.abs(x[nz])) - log2_c))
    out[nz] = np.where(x[nz] < 0, -y, y) / s
    return e4m3_code(out)


def decode_expand(codes, meta):
    s, k, c = meta
    q = e4m3_value(codes)
    a = np.abs(q) * s
    out = np.copysign(np.zeros(q.shape, dtype=np.float32), q)
    nz = a != 0
    x = exp2_series(log2_series(a[nz]) / k) * c
    out[nz] = np.where(q[nz] < 0, -x, x)
    return out


FORMATS = {"fp8": (fit_fp8, encode_fp8, decode_fp8), "fp8_expand": (fit_expand, encode_expand, decode_expand)}


def encode(fmt, x):
    fit, enc, _ = FORMATS[fmt]
    codes, metas = [], []
    for b in range(0, len(x), G):
        meta = fit(x[b:b + G])
        metas += meta
        codes.append(enc(x[b:b + G], meta))
    return np.concatenate(codes), f32(metas)


def decode(fmt, codes, metas):
    _, _, dec = FORMATS[fmt]
    per = len(metas) // ((len(codes) + G - 1) // G)
    return np.concatenate([dec(codes[b:b + G], metas[b // G * per:(b // G + 1) * per]) for b in range(0, len(codes), G)])


# The AdamW step, element by element as the paper's kernel does it, in float32 (bias corrections in float64) --------
def adamw_group_step(fmt, master, grads, m_codes, m_meta, v_codes, v_meta, hp, t):
    lr, b1, b2, eps, wd, gs = (F(v) for v in hp)
    bc1, bc2 = F(1.0 - float(b1) ** t), F(1.0 - float(b2) ** t)
    per = len(m_meta) // ((len(master) + G - 1) // G)
    fit, enc, dec = FORMATS[fmt]
    master, m_codes, v_codes = master.copy(), m_codes.copy(), v_codes.copy()
    m_meta, v_meta = m_meta.copy(), v_meta.copy()
    for b in range(0, len(master), G):
        sl, ms = slice(b, b + G), slice(b // G * per, (b // G + 1) * per)
        m = dec(m_codes[sl], m_meta[ms])
        v = dec(v_codes[sl], v_meta[ms])
        g = grads[sl] * gs
        m = b1 * m + (F(1.0) - b1) * g
        v = b2 * v + ((F(1.0) - b2) * g) * g
        update = (m / bc1) / (np.sqrt(v / bc2) + eps) + wd * master[sl]
        w = master[sl] - lr * update
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(m)) and np.all(np.isfinite(v))):
            continue
        master[sl] = w
        mm, vm = fit(m), fit(v)
        m_meta[ms], v_meta[ms] = mm, vm
        m_codes[sl], v_codes[sl] = enc(m, mm), enc(v, vm)
    params = master.astype(ml_dtypes.bfloat16).astype(np.float32)
    return master, params, m_codes, m_meta, v_codes, v_meta


def hexf(x):
    return " ".join("%08x" % u for u in bits(x).ravel())


def hexc(c):
    return " ".join("%02x" % u for u in np.asarray(c, dtype=np.uint8).ravel())


def encode_cases(rng):
    log_uniform = lambda n, lo, hi: f32(np.exp(rng.uniform(np.log(lo), np.log(hi), n)))
    mixed = f32(rng.standard_normal(128) * 1e-3)
    mixed[::7] = 0
    return [
        ("random_m", f32(rng.standard_normal(256) * 1e-3)),
        ("random_v", f32(rng.standard_normal(256) * 1e-3) ** 2),
        ("all_zero", f32(np.zeros(128))),
        ("constant", f32(np.full(128, 0.37))),
        ("denormal_range", f32(log_uniform(128, 1e-44, 1e-38))),
        ("huge_range", f32(log_uniform(128, 1e-30, 1e30) * np.where(rng.random(128) < 0.5, -1, 1))),
        ("near_float_max", f32(np.concatenate([[3.3e38, -3.0e38], rng.standard_normal(126)]))),
        ("mixed_signs_and_zeros", mixed),
        ("partial_last_group", f32(rng.standard_normal(300) * 1e-2)),
    ]


def generate():
    rng = np.random.default_rng(20241025)
    lines = ["# Generated by test/optim/gen_moment_vectors.py: do not edit."]
    cases = encode_cases(rng)
    for fmt in FORMATS:
        for name, x in cases:
            codes, meta = encode(fmt, x)
            lines += [f"@ encode {fmt} {name} {len(x)}", "values " + hexf(x), "groups " + hexf(meta),
                      "codes " + hexc(codes), "decoded " + hexf(decode(fmt, codes, meta))]
    hp = (3e-4, 0.9, 0.95, 1e-8, 0.1, 0.7)  # lr, beta1, beta2, eps, weight_decay, grad_scale
    for fmt in FORMATS:
        for name, n, steps in (("one_group", 128, 3), ("partial_last_group", 300, 4)):
            master = f32(rng.uniform(-1, 1, n))
            m0 = f32(rng.standard_normal(n) * 1e-3)
            v0 = f32(rng.standard_normal(n) * 1e-3) ** 2
            m_codes, m_meta = encode(fmt, m0)
            v_codes, v_meta = encode(fmt, v0)
            grads = [f32(rng.standard_normal(n) * 1e-2) for _ in range(steps)]
            lines += [f"@ update {fmt} {name} {n} {steps}", "hyper " + hexf(hp), "master " + hexf(master),
                      "m_groups " + hexf(m_meta), "m_codes " + hexc(m_codes), "v_groups " + hexf(v_meta),
                      "v_codes " + hexc(v_codes)]
            for t in range(1, steps + 1):
                master, params, m_codes, m_meta, v_codes, v_meta = adamw_group_step(
                    fmt, master, grads[t - 1], m_codes, m_meta, v_codes, v_meta, hp, t)
                lines += [f"step {t}", "grads " + hexf(grads[t - 1]), "master " + hexf(master),
                          "params " + hexf(params), "m_groups " + hexf(m_meta), "m_codes " + hexc(m_codes),
                          "v_groups " + hexf(v_meta), "v_codes " + hexc(v_codes)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "moment_vectors.txt")
    with open(out, "w") as f:
        f.write(generate())
    print(f"wrote {out}", file=sys.stderr)
