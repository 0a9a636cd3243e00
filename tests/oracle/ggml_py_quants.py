"""Pure-Python ggml block formats for the oracles (no numpy/torch needed).

Random raw blocks are generated from a `random.Random`, and dequantized exactly the way
ggml-quants.c does it (llama.cpp ggml/src/ggml-quants.c, dequantize_row_*), so that the oracle can
load the very same values into a transformers model that the engine reads from the GGUF.
Every value produced here is exactly representable in float32 and is computed exactly in
Python floats (doubles), so the result equals ggml's float32 arithmetic bit for bit.

Types: F32 (0), F16 (1), Q8_0 (8), Q2_K (10), BF16 (30), MXFP4 (39).
"""
import math
import struct

F32, F16, Q8_0, Q2_K, I32, BF16, MXFP4 = 0, 1, 8, 10, 26, 30, 39
TYPE_NAMES = {F32: "f32", F16: "f16", Q8_0: "q8_0", Q2_K: "q2_K", I32: "i32", BF16: "bf16", MXFP4: "mxfp4"}
# (values per block, bytes per block)
BLOCK = {F32: (1, 4), I32: (1, 4), F16: (1, 2), BF16: (1, 2), Q8_0: (32, 34), Q2_K: (256, 84), MXFP4: (32, 17)}
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
