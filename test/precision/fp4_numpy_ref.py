"""test/precision/fp4_numpy_ref.py: an independent NumPy reference of the FP4 quantisers of llmc/precision/fp4_quant.h,
written from the published definitions, not from the C++ (test/reference/fp4_ref.cpp) or the kernels. Every rounding
step is an ml_dtypes cast (float4_e2m1fn for the elements, float8_e4m3fn for NVFP4 block scales, float8_e8m0fnu for
MXFP4 scales); block maxima are NumPy reductions over reshaped blocks; the Hadamard transform is a dense matrix
product. test/precision/test_fp4_numpy.py compares it with the C++ reference.

Definitions (reference doc /work/shared/reference/fp4_recipes.md):
  E2M1 (OCP Microscaling Formats v1.0, §5.3.3): +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no inf or NaN; conversions round to
    nearest even and saturate at +-6.
  NVFP4 (NVIDIA arXiv 2509.25149 App. B; Transformer Engine's NVFP4 reference quantiser), FP32 arithmetic:
    s_enc = 6 * 448 / A for the tensor amax A (1 when A is 0 or not finite; at most FLT_MAX); tensor decode scale
    1 / s_enc; block decode scale s_b = e4m3_RN((a_b / 6) * s_enc), saturating at 448; element code
    e2m1(x * m_b) with the encode multiplier m_b = min(s_enc / s_b, FLT_MAX) (Transformer Engine's
    compute_scaling_coefficient clamps it as it clamps s_enc: for a tensor amax below 6 * 448 * 2^9 / FLT_MAX an
    unclamped s_enc / s_b overflows and 0 * inf is NaN). Blocks of 1x16 along the rows (and, for the transposed
    copy, along the columns), or 16x16 tiles (weights) whose transposed copy holds the same codes transposed with the
    same tile scales.
  MXFP4 (OCP Microscaling Formats v1.0, §6.3): blocks of 32 along the quantisation direction; shared exponent
    X = floor(log2(a_b)) - 2 (2 = emax of E2M1), clamped to the E8M0 range [-127, 127], stored as E8M0 (code X + 127);
    element code e2m1(x / 2^X).
  QuEST's Gaussian MXFP4 scales (Quartet's forward; reference doc fp4_recipes.md §1-2): per block of 32 (after the
    Hadamard transform) sigma = sqrt(E[v^2] - E[v]^2) (the moments as FP32 sums in element order; 1 where the
    difference is negative), scale = (2.92247856 / 6) * sigma + 1e-8, X = floor(log2(scale)) (254 as the code where
    scale is not finite), element code e2m1(x / 2^X) saturating at 6; the trust mask marks the elements with
    |x / 2^X| < 6, the ones not clipped.
  Quartet's range-matched MXFP4 scales (its backward; arXiv 2505.14669 Alg. 1, reference doc fp4_recipes.md §1): the
    OCP shared exponent X = floor(log2(a_b)) - 2 as above, element code e2m1(x * 3/4 / 2^X) (the exact real product
    rounded once to FP32, then to E2M1), so the block amax lands in [3, 6) and nothing clips; the codes decode to
    e2m1 * 2^X, 3/4 of the values they stand for.
  llm8's conventions for the blocks the papers leave open (fp4_quant.h, fp4_codec.cuh): an all-zero block has scale
    1.0; a block with an inf or NaN element gets the scale format's NaN code and zero element codes; an NVFP4 block
    whose scale rounds to 0 gets zero element codes; a copy rotated by a Hadamard transform takes its NVFP4 tensor
    amax from its rotated values.
  Stochastic rounding (reference doc §0): up with probability (|y| - lo) / (hi - lo), lo <= |y| < hi neighbours on
    the E2M1 grid, |y| >= 6 -> 6; llm8 draws it as "up when u < floor(f * 2^16)" from 16 random bits u (the
    rounding of adding u * 2^-16 of a step and truncating: P(up) is f rounded down to a multiple of 2^-16).
  Random bits: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11;
    Random123's known-answer vectors in PHILOX_KAT), keyed as fp4_rng.cuh documents: key (seed low, seed high),
    counter (index / 8 low, (index / 8 high) | copy << 31, step, tensor), word (index % 8) / 2, its low 16 bits for
    an even index and its high 16 for an odd one; index = the element's row-major index in its copy (copy 0 = data,
    1 = data_t; 16x16 tiles use data's index and copy 0 for both).
  Hadamard (reference doc §0): v <- H_N diag(s) v per N consecutive values along the quantisation direction, H_N the
    normalised Sylvester matrix, s_i = -1 where bit i of the sign word is set.
Layouts (llmc/precision/tensor.h): codes two per byte, the even element in the low nibble, every row starting on a
byte; 1xN scales at [kb * round_up(rows, 4) + r]; 16x16 tile scales at [rb * round_up(ceil(cols / 16), 4) + cb],
the transposed copy's at [cb * round_up(ceil(rows / 16), 4) + rb]; padding entries are the code of 1.0.
"""

import numpy as np
import ml_dtypes

E2M1 = ml_dtypes.float4_e2m1fn
E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu
F32 = np.float32

E2M1_MAX = 6.0
E4M3_MAX = 448.0
FLT_MAX = float(np.finfo(F32).max)
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

ENCODINGS = {  # name -> (family, block rows, block cols)
    "nvfp4": ("nvfp4", 1, 16),
    "nvfp4_2d": ("nvfp4", 16, 16),
    "mxfp4": ("mxfp4", 1, 32),
}


def ceil_div(a, b):
    return -(-a // b)


def round_up(a, b):
    return ceil_div(a, b) * b


def code_of(values, dtype):
    """The ml_dtypes codes (uint8) of float values already representable in dtype."""
    return np.asarray(values).astype(dtype).view(np.uint8)


E4M3_ONE = int(code_of(np.float32(1.0), E4M3))
E4M3_NAN = int(code_of(np.float32(np.nan), E4M3))
E8M0_ONE = int(code_of(np.float32(1.0), E8M0))
E8M0_NAN = int(code_of(np.float32(np.nan), E8M0))


def e4m3_value(codes):
    return np.asarray(codes, np.uint8).view(E4M3).astype(F32)


# ---------------------------------------------------------------------------------------------------------------------
# Philox4x32-10 (Random123: philox4x32round, philox4x32bumpkey; constants PHILOX_M4x32_0/1, PHILOX_W32_0/1)
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_KAT = [  # Random123 kat_vectors, philox4x32_10: counter, key, expected output
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox4x32_10(counter, key):
    """counter: 4 arrays (broadcastable) of uint32 values, key: 2 of them -> 4 uint32 arrays."""
    mask = np.uint64(0xFFFFFFFF)
    c = [np.asarray(v, np.uint64) & mask for v in counter]
    k = [np.asarray(v, np.uint64) & mask for v in key]
    for r in range(10):
        if r > 0:
            k = [(k[0] + np.uint64(PHILOX_W[0])) & mask, (k[1] + np.uint64(PHILOX_W[1])) & mask]
        p0 = np.uint64(PHILOX_M[0]) * c[0]  # < 2^64: no wrap
        p1 = np.uint64(PHILOX_M[1]) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k[0], p1 & mask, (p0 >> np.uint64(32)) ^ c[3] ^ k[1], p0 & mask]
    return [v.astype(np.uint32) for v in c]


def random_bits16(index, copy, seed, step, tensor):
    """The 16 random bits (uint32 array, < 2^16) of each element index (uint64 array) of output copy `copy` under key
    (seed, step, tensor)."""
    index = np.asarray(index, np.uint64)
    group = index >> np.uint64(3)
    words = philox4x32_10((group & np.uint64(0xFFFFFFFF), (group >> np.uint64(32)) | np.uint64((copy & 1) << 31),
                           np.full(index.shape, step, np.uint64), np.full(index.shape, tensor, np.uint64)),
                          (seed & 0xFFFFFFFF, seed >> 32))
    word = np.choose(((index & np.uint64(7)) >> np.uint64(1)).astype(np.intp), words)
    half = (index & np.uint64(1)).astype(np.uint32) * np.uint32(16)
    return (word >> half) & np.uint32(0xFFFF)


def random_signs(seed, step, tensor, n):
    """The sign word of a random Hadamard transform of size n <= 32 (bit i set: element i negated), as fp4_rng.cuh's
    random_signs draws it: word 0 of Philox counter (0, 0x40000000, step, tensor), key (seed low, seed high), its low
    n bits. Quartet's backward draws one per (micro-step, rank, linear) through the stochastic key's tensor number."""
    w = int(philox4x32_10((0, 0x40000000, step, tensor), (seed & 0xFFFFFFFF, seed >> 32))[0])
    return w if n >= 32 else w & ((1 << n) - 1)


# ---------------------------------------------------------------------------------------------------------------------
# Element rounding (y: FP32 values already multiplied by their block's element scale)
def e2m1_rtn(y):
    """OCP E2M1 round to nearest even, saturating at +-6: the ml_dtypes cast of y clipped to the finite range."""
    y = np.asarray(y, F32)
    return code_of(np.clip(y, -E2M1_MAX, E2M1_MAX), E2M1) & 0xF


def e2m1_stochastic(y, bits):
    """Stochastic rounding of y with uniform 16-bit draws u (the low 16 bits of `bits`): up with probability
    f = (|y| - lo) / (hi - lo) rounded down to a multiple of 2^-16, drawn as u < floor(f * 2^16) (exact in float64:
    |y| - lo and the power-of-two step are exact)."""
    y = np.asarray(y, F32)
    a = np.abs(y).astype(np.float64)
    k = np.clip(np.searchsorted(E2M1_GRID, a, side="right") - 1, 0, len(E2M1_GRID) - 2)  # lo = grid[k] <= a
    lo, hi = E2M1_GRID[k], E2M1_GRID[k + 1]
    f = (a - lo) / (hi - lo)
    up = (np.asarray(bits, np.uint32) & np.uint32(0xFFFF)).astype(np.float64) < np.floor(f * 2.0**16)
    magnitude = np.where(a >= E2M1_MAX, E2M1_MAX, np.where(up, hi, lo))
    return e2m1_rtn(np.copysign(magnitude, y))  # exact grid values: the cast only encodes


# ---------------------------------------------------------------------------------------------------------------------
# Scales
def nvfp4_tensor_encode_scale(amax):
    amax = F32(amax)
    if not (np.isfinite(amax) and amax > 0):
        return F32(1.0)
    with np.errstate(over="ignore"):
        return F32(min(F32(E2M1_MAX * E4M3_MAX) / amax, F32(FLT_MAX)))


def nvfp4_block_scale_codes(block_amax, s_enc):
    """E4M3 codes of s_b = e4m3_RN((a_b / 6) * s_enc), saturating; the NaN code for a non-finite a_b."""
    a = np.asarray(block_amax, F32)
    with np.errstate(over="ignore", invalid="ignore"):
        s = (a / F32(E2M1_MAX)) * F32(s_enc)
    codes = code_of(np.clip(s, -E4M3_MAX, E4M3_MAX), E4M3)
    return np.where(np.isfinite(a), codes, np.uint8(E4M3_NAN)).astype(np.uint8)


def mxfp4_scale_codes(block_amax):
    """E8M0 codes of 2^X, X = floor(log2(a_b)) - 2 clamped to [-127, 127]; 1.0 for a zero block, NaN if not finite."""
    a = np.asarray(block_amax, F32)
    finite_nonzero = np.isfinite(a) & (a > 0)
    _, e = np.frexp(np.where(finite_nonzero, a, F32(1.0)))  # a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1
    x = np.clip(e.astype(np.int64) - 1 - 2, -127, 127)
    codes = code_of(np.ldexp(1.0, x), E8M0)
    codes = np.where(a == 0, np.uint8(E8M0_ONE), codes)
    return np.where(np.isfinite(a), codes, np.uint8(E8M0_NAN)).astype(np.uint8)


QUEST_CLIP_PER_SIGMA = F32(2.92247856) / F32(6.0)


def mxfp4_gaussian_scale_codes(blocks):
    """E8M0 codes of QuEST's scales for blocks (..., 32) float32; NaN for a block with an inf or NaN element."""
    v = np.asarray(blocks, F32)
    with np.errstate(all="ignore"):
        s1 = np.add.accumulate(v, axis=-1, dtype=F32)[..., -1]  # sequential FP32 sums, element order
        s2 = np.add.accumulate(v * v, axis=-1, dtype=F32)[..., -1]
        n = F32(v.shape[-1])
        mean, mean_square = s1 / n, s2 / n
        var = mean_square - mean * mean
        sigma = np.where(var >= 0, np.sqrt(np.where(var >= 0, var, F32(0))), F32(1.0)).astype(F32)
        scale = (QUEST_CLIP_PER_SIGMA * sigma + F32(1e-8)).astype(F32)
    finite = np.isfinite(scale)
    _, e = np.frexp(np.where(finite, scale, F32(1.0)))  # scale >= 1e-8 is normal: floor(log2) = e - 1
    codes = np.where(finite, e.astype(np.int64) - 1 + 127, 254).astype(np.uint8)
    with np.errstate(invalid="ignore"):
        nonfinite_block = ~np.all(np.isfinite(v), axis=-1)
    return np.where(nonfinite_block, np.uint8(E8M0_NAN), codes).astype(np.uint8)


# ---------------------------------------------------------------------------------------------------------------------
# Hadamard
def hadamard_matrix(n):
    i = np.arange(n)
    popcount = np.vectorize(lambda v: bin(v).count("1"))(i[:, None] & i[None, :])
    return np.where(popcount % 2 == 0, 1.0, -1.0) / np.sqrt(n)


def hadamard_rows(v, size, signs):
    """Every `size` consecutive values of each row of v (float32, (rows, cols), cols a multiple of size) <-
    H_size diag(s) v, in float64, rounded once to float32."""
    rows, cols = v.shape
    s = np.where((signs >> np.arange(size)) & 1, -1.0, 1.0)
    blocks = v.astype(np.float64).reshape(rows, cols // size, size) * s
    return (blocks @ hadamard_matrix(size).T).reshape(rows, cols).astype(F32)


def hadamard_error_bound(v, size):
    """A bound on |FP32 butterfly result - exact| per element of hadamard_rows(v): log2(size) levels of FP32 additions
    on partial sums bounded by sum |v_j| over the block, then one FP32 multiplication by the (rounded) 1/sqrt(size):
    (log2(size) + 3) * (2^-24 * sum_j |v_j| / sqrt(size) + 2^-149) (one more unit for the rounding of 1/sqrt(32),
    one for the float32 rounding of the float64 result; 2^-149 covers roundings among subnormals)."""
    rows, cols = v.shape
    sums = np.abs(v.astype(np.float64)).reshape(rows, cols // size, size).sum(axis=2, keepdims=True)
    bound = (np.log2(size) + 3) * (2.0**-24 * sums / np.sqrt(size) + 2.0**-149)
    return np.broadcast_to(bound, (rows, cols // size, size)).reshape(rows, cols)


# ---------------------------------------------------------------------------------------------------------------------
# Quantisers
def pack_codes(codes):
    """(rows, cols) codes -> (rows, ceil(cols / 2)) bytes, the even element in the low nibble, a missing odd one 0."""
    rows, cols = codes.shape
    padded = np.zeros((rows, cols + (cols & 1)), np.uint8)
    padded[:, :cols] = codes
    return (padded[:, 0::2] | (padded[:, 1::2] << 4)).astype(np.uint8)


def block_view(v, br, bc):
    """v (rows, cols) padded with zeros to whole blocks -> (rows_b, cols_b, br * bc) blocks."""
    rows, cols = v.shape
    rb, cb = ceil_div(rows, br), ceil_div(cols, bc)
    padded = np.zeros((rb * br, cb * bc), v.dtype)
    padded[:rows, :cols] = v
    return padded.reshape(rb, br, cb, bc).transpose(0, 2, 1, 3).reshape(rb, cb, br * bc)


def unblock(blocks, br, bc, rows, cols):
    rb, cb, _ = blocks.shape
    return blocks.reshape(rb, cb, br, bc).transpose(0, 2, 1, 3).reshape(rb * br, cb * bc)[:rows, :cols]


def block_codes_and_scales(v, family, br, bc, tensor_amax, sr, copy, gaussian=False, range_matched=False):
    """Codes (rows, cols), block scale codes (rows_b, cols_b) and the trust mask (rows, cols) bool of v (float32
    (rows, cols)); for NVFP4 also the FP32 tensor decode scale. sr: None (RTN) or (seed, step, tensor); element i of v
    (row-major) draws random word i of copy `copy`. gaussian: MXFP4 with QuEST's scales (whole blocks only);
    range_matched: MXFP4 with Quartet's backward scales (the OCP exponent, elements times 3/4)."""
    rows, cols = v.shape
    blocks = block_view(v, br, bc)
    with np.errstate(invalid="ignore"):
        block_amax = np.max(np.abs(blocks), axis=2)  # NaN when the block has one (padding zeros change nothing)
    if family == "nvfp4":
        s_enc = nvfp4_tensor_encode_scale(tensor_amax)
        scales = nvfp4_block_scale_codes(block_amax, s_enc)
        s_b = e4m3_value(scales)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # 0 where s_b is 0 or NaN
            multiplier = np.where(s_b > 0, np.minimum(F32(s_enc) / s_b, F32(FLT_MAX)), F32(0.0)).astype(F32)
        tensor_scale_inv = F32(1.0) / s_enc
    else:
        if gaussian:
            if v.shape[1] % bc:
                raise ValueError("Gaussian scales take whole blocks of 32")
            scales = mxfp4_gaussian_scale_codes(blocks)
        else:
            scales = mxfp4_scale_codes(block_amax)
        x = scales.astype(np.int64) - 127
        multiplier = np.where(scales == E8M0_NAN, 0.0, np.ldexp(1.0, -np.clip(x, -127, 127))).astype(F32)
        tensor_scale_inv = None
    with np.errstate(invalid="ignore", over="ignore"):
        if range_matched:  # the exact real product x * 3/4 * 2^-X in float64, rounded once to float32
            y64 = blocks.astype(np.float64) * (0.75 * multiplier.astype(np.float64))[:, :, None]
            y = unblock(y64, br, bc, rows, cols).astype(F32)
        else:
            y = unblock(blocks * multiplier[:, :, None], br, bc, rows, cols).astype(F32)  # FP32 products
    if sr is None:
        codes = e2m1_rtn(y)
    else:
        index = np.arange(rows * cols, dtype=np.uint64).reshape(rows, cols)
        codes = e2m1_stochastic(y, random_bits16(index, copy, *sr))
    zeroed = unblock(np.broadcast_to((multiplier == 0)[:, :, None], blocks.shape), br, bc, rows, cols)
    codes = np.where(zeroed, np.uint8(0), codes).astype(np.uint8)
    with np.errstate(invalid="ignore"):
        trusted = ~zeroed & (np.abs(y) < F32(E2M1_MAX))
    return codes, scales, tensor_scale_inv, trusted


def scale_layout(block_scales, ld_rows, one):
    """(rb, cb) block scales of a 1xN copy -> the flat [kb * round_up(rows, 4) + r] array, padding `one`."""
    rows, kb = block_scales.shape
    out = np.full((kb, round_up(ld_rows, 4)), one, np.uint8)
    out[:, :rows] = block_scales.T
    return out.reshape(-1)


def tile_layout(tile_scales, one):
    """(rb, cb) tile scales -> the flat [rb * round_up(cb, 4) + cb] array, padding `one`."""
    rb, cb = tile_scales.shape
    out = np.full((rb, round_up(cb, 4)), one, np.uint8)
    out[:, :cb] = tile_scales
    return out.reshape(-1)


def pack_trust_mask(trusted, block):
    """(rows, cols) bool, cols a multiple of `block` (32) -> the little-endian bytes of one uint32 word per block, bit i
    = element i of the block, blocks in row-major order."""
    rows, cols = trusted.shape
    bits = trusted.reshape(rows, cols // block, block).astype(np.uint64)
    words = np.sum(bits << np.arange(block, dtype=np.uint64), axis=-1).astype("<u4")
    return words.reshape(-1).view(np.uint8)


def quantize(x, encoding, amax=None, sr=None, hadamard=None, data=True, data_t=True, rotated=None, gaussian=False,
             range_matched=False):
    """The FP4 quantisation of x (float32 (rows, cols), values exactly representable in bf16) in `encoding` (a key of
    ENCODINGS), as fp4_quantize computes it.
      amax: the NVFP4 tensor amax of the unrotated copies (None: max |x|);
      sr: None (round to nearest even) or (seed, step, tensor), the stochastic rounding key;
      hadamard: None or (size, signs, rotate_data, rotate_data_t) (1xN encodings only);
      rotated: optional {'data': (rows, cols), 'data_t': (cols, rows)} float32 values of the rotated copies to use
        instead of hadamard_rows' (the test feeds the C++ transform's values in, so that the quantiser itself
        compares bit for bit where the FP32 butterflies and the dense product differ in the last bit).
      gaussian: MXFP4 only, QuEST's Gaussian block scales; the result then also holds 'trust_mask' (the data copy's).
      range_matched: MXFP4 only, Quartet's range-matched backward scales.
    Returns a dict with, per wanted copy, 'data' / 'data_t' (packed bytes), 'scale_inv' / 'scale_inv_t' (scale codes
    in tensor.h's layouts) and, for NVFP4, 'tensor_scale_inv' / 'tensor_scale_inv_t' (float32)."""
    family, br, bc = ENCODINGS[encoding]
    x = np.asarray(x, F32)
    rows, cols = x.shape
    with np.errstate(invalid="ignore"):
        source_amax = F32(np.max(np.abs(x))) if amax is None else F32(amax)
    one = E4M3_ONE if family == "nvfp4" else E8M0_ONE
    out = {}
    if br == 16:  # 16x16 tiles: one quantisation, the transposed copy is its transpose
        if hadamard is not None or family != "nvfp4":
            raise ValueError("16x16 tiles are NVFP4 only and take no Hadamard transform")
        codes, tiles, tsi, _ = block_codes_and_scales(x, family, 16, 16, source_amax, sr, 0)
        if data:
            out.update(data=pack_codes(codes), scale_inv=tile_layout(tiles, one), tensor_scale_inv=tsi)
        if data_t:
            out.update(data_t=pack_codes(codes.T), scale_inv_t=tile_layout(tiles.T, one), tensor_scale_inv_t=tsi)
        return out
    for name, src, copy, wanted in (("", x, 0, data), ("_t", x.T, 1, data_t)):
        if not wanted:
            continue
        src = np.ascontiguousarray(src)
        tensor_amax = source_amax
        if hadamard is not None and hadamard[2 + copy]:
            given = (rotated or {}).get("data" + name)
            src = hadamard_rows(src, hadamard[0], hadamard[1]) if given is None else np.asarray(given, F32)
            with np.errstate(invalid="ignore"):
                tensor_amax = F32(np.max(np.abs(src)))
        codes, scales, tsi, trusted = block_codes_and_scales(src, family, 1, bc, tensor_amax, sr, copy, gaussian,
                                                             range_matched)
        out["data" + name] = pack_codes(codes)
        if gaussian and copy == 0:
            out["trust_mask"] = pack_trust_mask(trusted, bc)
        out["scale_inv" + name] = scale_layout(scales, src.shape[0], one)
        if family == "nvfp4":
            out["tensor_scale_inv" + name] = tsi
    return out

