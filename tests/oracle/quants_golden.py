#!/usr/bin/env python3
"""Writes a GGUF of ggml blocks and their values computed by the pure-Python ggml_py_quants.py,
for a C++ test that dequantizes the same blocks and compares bit for bit:

    python3 tests/oracle/quants_golden.py OUT.gguf

For each type, tensor "<type>" holds the blocks (a 1-D row) and "<type>.values" (f32) the values.
The blocks are seeded random bytes with their f16 scales replaced by extremes (the largest half
of each sign, the smallest subnormal, zero) and moderate random values, plus an all-zero and an
all-ones block (every sign bit, every high bit, every scale field at its maximum).
"""
import os
import random
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ggml_py_quants as q  # noqa: E402
from ggml_py_gguf import GgufWriter  # noqa: E402

# byte offsets of the f16 scales in each block (IQ1_M keeps its scale in the scale words' top nibbles)
HALVES = {q.Q4_0: (0,), q.Q4_1: (0, 2), q.Q5_0: (0,), q.Q5_1: (0, 2), q.IQ4_NL: (0,), q.IQ4_XS: (0,),
          q.IQ2_XXS: (0,), q.IQ2_XS: (0,), q.IQ2_S: (0,), q.IQ3_XXS: (0,), q.IQ3_S: (0,), q.IQ1_S: (0,), q.IQ1_M: ()}
EXTREMES = (0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0000, 0x3C00)  # ±65504, ±2^-24, 0, 1


def blocks_of(gtype, rng, n_random=10):
    size = q.BLOCK[gtype][1]
    out = [bytes(size), bytes([0xFF]) * size]
    if HALVES[gtype]:  # all ones but finite scales: NaN scales would not compare
        b = bytearray(out[1])
        for at in HALVES[gtype]:
            b[at:at + 2] = struct.pack("<H", 0x7BFF)
        out[1] = bytes(b)
    else:
        b = bytearray(out[1])
        for k in range(4):  # top nibbles 0xB, 0xF, 0xF, 0x7: the half 0x7BFF again
            b[48 + 2 * k + 1] = (b[48 + 2 * k + 1] & 0x0F) | ((0x7BFF >> (4 * k)) & 0xF) << 4
        out[1] = bytes(b)
    for i in range(n_random):
        b = bytearray(rng.getrandbits(8) for _ in range(size))
        for at in HALVES[gtype]:
            h = EXTREMES[i] if i < len(EXTREMES) else q.f16_bits(rng.uniform(-0.1, 0.1))
            b[at:at + 2] = struct.pack("<H", h)
        if gtype == q.IQ1_M:
            h = EXTREMES[i] if i < len(EXTREMES) else q.f16_bits(rng.uniform(-0.1, 0.1))
            for k in range(4):
                b[48 + 2 * k + 1] = (b[48 + 2 * k + 1] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)
        out.append(bytes(b))
    return b"".join(out)


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    rng = random.Random(20261201)
    w = GgufWriter()
    w.add("general.architecture", "ggml-quants-oracle")
    for gtype in sorted(HALVES):
        raw = blocks_of(gtype, rng)
        n = len(raw) // q.BLOCK[gtype][1] * q.BLOCK[gtype][0]
        values = q.dequant(gtype, raw)
        if len(values) != n:
            raise SystemExit(f"{q.TYPE_NAMES[gtype]}: {len(values)} values for {n}")
        w.add_tensor(q.TYPE_NAMES[gtype], [n], gtype, raw)
        w.add_tensor(q.TYPE_NAMES[gtype] + ".values", [n], q.F32, struct.pack(f"<{n}f", *values))
    w.write(argv[0])
    print(f"quants_golden: {len(HALVES)} types written to {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
