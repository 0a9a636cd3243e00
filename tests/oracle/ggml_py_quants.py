"""Pure-Python ggml block formats for the oracles (no numpy/torch needed).

Random raw blocks are generated from a `random.Random`, and dequantized exactly the way
ggml-quants.c does it (llama.cpp ggml/src/ggml-quants.c, dequantize_row_*), so that the oracle can
load the very same values into a transformers model that the engine reads from the GGUF.
Every value produced here is exactly representable in float32 and is computed exactly in
Python floats (doubles), so the result equals ggml's float32 arithmetic bit for bit.

Types: F32 (0), F16 (1), Q8_0 (8), Q2_K (10), BF16 (30), MXFP4 (39); and, dequantization only,
Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (their
codebooks from ggml_py_grids.py). Float32 arithmetic is emulated by rounding every product and sum
to float32 (f32_round) in ggml's order of operations; double rounding through binary64 is exact
for one operation on float32 operands.
"""
import math
import struct

import ggml_py_grids

F32, F16, Q8_0, Q2_K, I32, BF16, MXFP4 = 0, 1, 8, 10, 26, 30, 39
Q4_0, Q4_1, Q5_0, Q5_1 = 2, 3, 6, 7
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M = 16, 17, 18, 19, 20, 21, 22, 23, 29
TYPE_NAMES = {F32: "f32", F16: "f16", Q8_0: "q8_0", Q2_K: "q2_K", I32: "i32", BF16: "bf16", MXFP4: "mxfp4",
              Q4_0: "q4_0", Q4_1: "q4_1", Q5_0: "q5_0", Q5_1: "q5_1", IQ4_NL: "iq4_nl", IQ4_XS: "iq4_xs",
              IQ2_XXS: "iq2_xxs", IQ2_XS: "iq2_xs", IQ2_S: "iq2_s", IQ3_XXS: "iq3_xxs", IQ3_S: "iq3_s", IQ1_S: "iq1_s", IQ1_M: "iq1_m"}
# (values per block, bytes per block)
BLOCK = {F32: (1, 4), I32: (1, 4), F16: (1, 2), BF16: (1, 2), Q8_0: (32, 34), Q2_K: (256, 84), MXFP4: (32, 17),
         Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), IQ4_NL: (32, 18), IQ4_XS: (256, 136),
         IQ2_XXS: (256, 66), IQ2_XS: (256, 74), IQ2_S: (256, 82), IQ3_XXS: (256, 98), IQ3_S: (256, 110), IQ1_S: (256, 50),
         IQ1_M: (256, 56)}
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def row_bytes(gtype, n):
    be, bb = BLOCK[gtype]
    if n % be:
        raise ValueError(f"row of {n} values is not a whole number of {TYPE_NAMES[gtype]} blocks ({be})")
    return n // be * bb


# ---- scalar conversions -------------------------------------------------------------------
def f32_round(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16_bits(x):
    return struct.unpack("<H", struct.pack("<e", x))[0]  # round to nearest even


def f16_from_bits(h):
    return struct.unpack("<e", struct.pack("<H", h))[0]


def f16_round(x):
    return f16_from_bits(f16_bits(x))


def bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16) & 0xFFFF


def bf16_from_bits(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def bf16_round(x):
    return bf16_from_bits(bf16_bits(x))


def e8m0_to_fp32_half(e):
    """ggml GGML_E8M0_TO_FP32_HALF: 2^(e-128); for e < 2 the bits are 0x00200000 << e."""
    if e < 2:
        return struct.unpack("<f", struct.pack("<I", 0x00200000 << e))[0]
    return math.ldexp(1.0, e - 128)


# ---- dequantization (one row / a whole buffer of blocks) -----------------------------------
def dequant_mxfp4(buf):
    out = []
    for b in range(0, len(buf), 17):
        d = e8m0_to_fp32_half(buf[b])
        qs = buf[b + 1:b + 17]
        lo = [KVALUES_MXFP4[q & 0xF] * d for q in qs]
        hi = [KVALUES_MXFP4[q >> 4] * d for q in qs]
        out.extend(lo)
        out.extend(hi)
    return out


def dequant_q8_0(buf):
    out = []
    for b in range(0, len(buf), 34):
        d = f16_from_bits(buf[b] | (buf[b + 1] << 8))
        for q in struct.unpack("<32b", bytes(buf[b + 2:b + 34])):
            out.append(f32_round(d * q))
    return out


def dequant_q2_k(buf):
    out = []
    for b in range(0, len(buf), 84):
        scales = buf[b:b + 16]
        qs = buf[b + 16:b + 80]
        d = f16_from_bits(buf[b + 80] | (buf[b + 81] << 8))
        dmin = f16_from_bits(buf[b + 82] | (buf[b + 83] << 8))
        is_ = 0
        for half in range(2):
            q = qs[32 * half:32 * half + 32]
            for j in range(4):
                shift = 2 * j
                for part in range(2):
                    sc = scales[is_]
                    is_ += 1
                    dl = f32_round(d * (sc & 0xF))
                    ml = f32_round(dmin * (sc >> 4))
                    for l in range(16):
                        out.append(f32_round(dl * ((q[l + 16 * part] >> shift) & 3) - ml))
    return out


# ---- the types read only (no encoder): every value computed in ggml's order, rounded to f32 --
def _u16(b, at):
    return b[at] | (b[at + 1] << 8)


def _u32(b, at):
    return b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (b[at + 3] << 24)


def _half(b, at):
    return f16_from_bits(_u16(b, at))


def _blocks(buf, gtype):
    size = BLOCK[gtype][1]
    if len(buf) % size:
        raise ValueError(f"{TYPE_NAMES[gtype]}: {len(buf)} bytes are not whole blocks of {size}")
    return [buf[i:i + size] for i in range(0, len(buf), size)]


def _nibbles(qs):
    """Byte j holds element j (low nibble) and element j + len(qs) (high nibble)."""
    return [q & 0xF for q in qs] + [q >> 4 for q in qs]


def _dequant_q4_0(buf):
    out = []
    for b in _blocks(buf, Q4_0):
        d = _half(b, 0)
        out += [f32_round((q - 8) * d) for q in _nibbles(b[2:18])]
    return out


def _dequant_q4_1(buf):
    out = []
    for b in _blocks(buf, Q4_1):
        d, m = _half(b, 0), _half(b, 2)
        out += [f32_round(f32_round(q * d) + m) for q in _nibbles(b[4:20])]
    return out


def _q5_codes(qh, qs):
    # element j: low nibble of qs[j] (j < 16) or high nibble of qs[j - 16], fifth bit = bit j of qh
    return [c | (((qh >> j) & 1) << 4) for j, c in enumerate(_nibbles(qs))]


def _dequant_q5_0(buf):
    out = []
    for b in _blocks(buf, Q5_0):
        d = _half(b, 0)
        out += [f32_round((c - 16) * d) for c in _q5_codes(_u32(b, 2), b[6:22])]
    return out


def _dequant_q5_1(buf):
    out = []
    for b in _blocks(buf, Q5_1):
        d, m = _half(b, 0), _half(b, 2)
        out += [f32_round(f32_round(c * d) + m) for c in _q5_codes(_u32(b, 4), b[8:24])]
    return out


def _dequant_iq4_nl(buf):
    kv = ggml_py_grids.IQ4NL_VALUES
    out = []
    for b in _blocks(buf, IQ4_NL):
        d = _half(b, 0)
        out += [f32_round(d * kv[c]) for c in _nibbles(b[2:18])]
    return out


def _dequant_iq4_xs(buf):
    kv = ggml_py_grids.IQ4NL_VALUES
    out = []
    for b in _blocks(buf, IQ4_XS):
        d, sh = _half(b, 0), _u16(b, 2)
        for ib in range(8):
            ls = ((b[4 + ib // 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)
            dl = f32_round(d * (ls - 32))
            out += [f32_round(dl * kv[c]) for c in _nibbles(b[8 + 16 * ib:24 + 16 * ib])]
    return out


def _signed(db, grid_row, sign_bits):
    """db·g·(±1) for each value g of a grid row; bit j of sign_bits makes value j negative."""
    return [f32_round(f32_round(db * g) * (-1.0 if (sign_bits >> j) & 1 else 1.0)) for j, g in enumerate(grid_row)]


def _db_iq2(d, nibble):
    return f32_round(f32_round(d * (0.5 + nibble)) * 0.25)


def _dequant_iq2_xxs(buf):
    """block_iq2_xxs {d, qs[32] u16}: per 32 values two u32, the first 4 grid indices, the second
    4 x 7 sign bits and the 4-bit scale on top."""
    grid = ggml_py_grids.grid("iq2xxs")
    out = []
    for b in _blocks(buf, IQ2_XXS):
        d = _half(b, 0)
        for ib in range(8):
            idx = b[2 + 8 * ib:6 + 8 * ib]
            aux = _u32(b, 6 + 8 * ib)
            db = _db_iq2(d, aux >> 28)
            for l in range(4):
                out += _signed(db, grid[idx[l]], ggml_py_grids.KSIGNS[(aux >> (7 * l)) & 127])
    return out


def _dequant_iq2_xs(buf):
    grid = ggml_py_grids.grid("iq2xs")
    out = []
    for b in _blocks(buf, IQ2_XS):
        d = _half(b, 0)
        for ib in range(8):
            sc = b[66 + ib]
            for l in range(4):
                q = _u16(b, 2 + 2 * (4 * ib + l))
                db = _db_iq2(d, sc & 0xF if l < 2 else sc >> 4)
                out += _signed(db, grid[q & 511], ggml_py_grids.KSIGNS[q >> 9])
    return out


def _dequant_iq2_s(buf):
    grid = ggml_py_grids.grid("iq2s")
    out = []
    for b in _blocks(buf, IQ2_S):
        d = _half(b, 0)
        for ib in range(8):
            sc, qh = b[74 + ib], b[66 + ib]
            for l in range(4):
                index = b[2 + 4 * ib + l] | (((qh >> (2 * l)) & 3) << 8)
                db = _db_iq2(d, sc & 0xF if l < 2 else sc >> 4)
                out += _signed(db, grid[index], b[34 + 4 * ib + l])
    return out


def _dequant_iq3_xxs(buf):
    grid = ggml_py_grids.grid("iq3xxs")
    out = []
    for b in _blocks(buf, IQ3_XXS):
        d = _half(b, 0)
        for ib in range(8):
            aux = _u32(b, 66 + 4 * ib)
            db = f32_round(f32_round(d * (0.5 + (aux >> 28))) * 0.5)
            for l in range(4):
                signs = ggml_py_grids.KSIGNS[(aux >> (7 * l)) & 127]
                row = grid[b[2 + 8 * ib + 2 * l]] + grid[b[2 + 8 * ib + 2 * l + 1]]
                out += _signed(db, row, signs)
    return out


def _dequant_iq3_s(buf):
    grid = ggml_py_grids.grid("iq3s")
    out = []
    for b in _blocks(buf, IQ3_S):
        d = _half(b, 0)
        for ib in range(8):
            db = f32_round(d * (1 + 2 * ((b[106 + ib // 2] >> (4 * (ib % 2))) & 0xF)))
            qh = b[66 + ib]
            for l in range(4):
                i0 = b[2 + 8 * ib + 2 * l] | (((qh >> (2 * l)) & 1) << 8)
                i1 = b[2 + 8 * ib + 2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8)
                out += _signed(db, grid[i0] + grid[i1], b[74 + 4 * ib + l])
    return out


def _dequant_iq1_s(buf):
    grid = ggml_py_grids.grid("iq1s")
    out = []
    for b in _blocks(buf, IQ1_S):
        d = _half(b, 0)
        for ib in range(8):
            qh = _u16(b, 34 + 2 * ib)
            dl = f32_round(d * (2 * ((qh >> 12) & 7) + 1))
            delta = -0.125 if qh & 0x8000 else 0.125
            for l in range(4):
                row = grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)]
                out += [f32_round(dl * (g + delta)) for g in row]
    return out


def _dequant_iq1_m(buf):
    grid = ggml_py_grids.grid("iq1s")
    out = []
    for b in _blocks(buf, IQ1_M):
        sc = [_u16(b, 48 + 2 * k) for k in range(4)]
        d = f16_from_bits((sc[0] >> 12) | (((sc[1] >> 12) & 0xF) << 4) | (((sc[2] >> 12) & 0xF) << 8) | (sc[3] & 0xF000))
        for ib in range(8):
            for l in range(4):
                scale = (sc[ib // 2] >> (6 * (ib % 2) + 3 * (l // 2))) & 7
                dl = f32_round(d * (2 * scale + 1))
                h = (b[32 + 2 * ib + l // 2] >> (4 * (l % 2))) & 0xF
                delta = -0.125 if h & 8 else 0.125
                out += [f32_round(dl * (g + delta)) for g in grid[b[4 * ib + l] | ((h & 7) << 8)]]
    return out


_READ_ONLY = {Q4_0: _dequant_q4_0, Q4_1: _dequant_q4_1, Q5_0: _dequant_q5_0, Q5_1: _dequant_q5_1,
              IQ4_NL: _dequant_iq4_nl, IQ4_XS: _dequant_iq4_xs, IQ2_XXS: _dequant_iq2_xxs, IQ2_XS: _dequant_iq2_xs, IQ2_S: _dequant_iq2_s,
              IQ3_XXS: _dequant_iq3_xxs, IQ3_S: _dequant_iq3_s, IQ1_S: _dequant_iq1_s, IQ1_M: _dequant_iq1_m}


def dequant(gtype, buf):
    """Dequantizes a whole buffer (rows back to back) to a list of floats."""
    buf = bytes(buf)
    if gtype == F32:
        return list(struct.unpack(f"<{len(buf) // 4}f", buf))
    if gtype == F16:
        return list(struct.unpack(f"<{len(buf) // 2}e", buf))
    if gtype == BF16:
        return [bf16_from_bits(h) for h in struct.unpack(f"<{len(buf) // 2}H", buf)]
    if gtype == Q8_0:
        return dequant_q8_0(buf)
    if gtype == Q2_K:
        return dequant_q2_k(buf)
    if gtype == MXFP4:
        return dequant_mxfp4(buf)
    if gtype in _READ_ONLY:
        return _READ_ONLY[gtype](buf)
    raise ValueError(f"unsupported type {gtype}")


# ---- encoding of plain values / quantization from floats ----------------------------------
def encode(gtype, values):
    """Encodes floats as F32/F16/BF16 bytes, or quantizes them to Q8_0 (ggml's reference rule)."""
    if gtype == F32:
        return struct.pack(f"<{len(values)}f", *values)
    if gtype == F16:
        return struct.pack(f"<{len(values)}e", *values)
    if gtype == BF16:
        return struct.pack(f"<{len(values)}H", *[bf16_bits(v) for v in values])
    if gtype == Q8_0:
        out = bytearray()
        for b in range(0, len(values), 32):
            blk = values[b:b + 32]
            amax = max(abs(v) for v in blk)
            d = amax / 127.0
            idf = 1.0 / d if d else 0.0
            out += struct.pack("<H", f16_bits(d))
            out += struct.pack("<32b", *[max(-127, min(127, int(round(v * idf)))) for v in blk])
        return bytes(out)
    raise ValueError(f"encode: unsupported type {gtype}")


# ---- random raw blocks -------------------------------------------------------------------
def random_mxfp4(rng, n, e_lo=121, e_hi=123):
    """n values (multiple of 32) of random MXFP4 blocks: exponent byte in [e_lo, e_hi]
    (2^(e-128) per kvalue step; 121..123 gives |w| <= 12*2^-5 = 0.375), random nibbles."""
    if n % 32:
        raise ValueError("mxfp4: n must be a multiple of 32")
    out = bytearray()
    for _ in range(n // 32):
        out.append(rng.randint(e_lo, e_hi))
        out += bytes(rng.getrandbits(8) for _ in range(16))
    return bytes(out)


def random_q2_k(rng, n, d_lo=0.002, d_hi=0.006):
    """n values (multiple of 256) of random Q2_K blocks: random 4-bit scales and mins, random
    2-bit codes, d and dmin uniform in [d_lo, d_hi] (rounded to f16), so |w| <~ 0.27."""
    if n % 256:
        raise ValueError("q2_K: n must be a multiple of 256")
    out = bytearray()
    for _ in range(n // 256):
        out += bytes(rng.getrandbits(8) for _ in range(16))
        out += bytes(rng.getrandbits(8) for _ in range(64))
        out += struct.pack("<H", f16_bits(rng.uniform(d_lo, d_hi)))
        out += struct.pack("<H", f16_bits(rng.uniform(d_lo, d_hi)))
    return bytes(out)
