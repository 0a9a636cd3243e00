#!/usr/bin/env python3
"""Self-test of the pure-Python ggml helpers (no numpy/torch): python3 tests/oracle/ggml_py_selftest.py"""
import os
import random
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ggml_py_quants as q  # noqa: E402
from ggml_py_gguf import GgufWriter, GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32  # noqa: E402


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")


def main():
    # bf16 / f16 rounding (nearest even)
    check(q.bf16_round(1.0 + 2 ** -8) == 1.0, "bf16 tie to even down")
    check(q.bf16_round(1.0 + 3 * 2 ** -8) == 1.0 + 2 ** -6, "bf16 tie to even up")
    check(q.f16_round(1.0 + 2 ** -11) == 1.0, "f16 tie")
    check(q.e8m0_to_fp32_half(128) == 1.0 and q.e8m0_to_fp32_half(0) == 2.0 ** -128 and q.e8m0_to_fp32_half(1) == 2.0 ** -127,
          "e8m0 half")
    # MXFP4: byte j holds element j (low nibble) and j+16 (high nibble)
    blk = bytes([129]) + bytes([0x71] + [0x00] * 14 + [0xF9])
    y = q.dequant(q.MXFP4, blk)
    check(len(y) == 32 and y[0] == 2.0 and y[16] == 24.0 and y[15] == -2.0 and y[31] == -24.0 and y[1] == 0.0, f"mxfp4 {y}")
    # Q2_K: scales[is] low nibble = scale, high nibble = min; order (half, j, part)
    scales = bytes([0x21] + [0x00] * 15)
    qs = bytes([0b11100111] + [0] * 63)
    blk = scales + qs + struct.pack("<H", q.f16_bits(1.0)) + struct.pack("<H", q.f16_bits(0.5))
    y = q.dequant(q.Q2_K, blk)
    check(len(y) == 256, "q2k len")
    check(y[0] == 1 * 3 - 0.5 * 2, f"q2k y0 {y[0]}")   # scale 1, min 2, code 3
    check(y[1] == -1.0, f"q2k y1 {y[1]}")              # code 0 → -dmin*m
    check(y[16] == 0.0, "q2k y16")                     # second group uses scales[1] = 0
    check(y[32] == 0.0, "q2k y32")                     # j=1 group uses scales[2] = 0
    # a second block: j=1 (shift 2) of qs[0] with scales[2]
    scales = bytes([0, 0, 0x13] + [0] * 13)
    blk = scales + qs + struct.pack("<H", q.f16_bits(2.0)) + struct.pack("<H", q.f16_bits(0.25))
    y = q.dequant(q.Q2_K, blk)
    check(y[32] == 2.0 * 3 * ((0b11100111 >> 2) & 3) - 0.25 * 1, f"q2k y32 {y[32]}")
    check(y[64 + 32 * 2] == 0 - 0.0, "q2k j3")
    # Q8_0 round trip is within one step
    rng = random.Random(1)
    v = [rng.gauss(0, 1) for _ in range(64)]
    back = q.dequant(q.Q8_0, q.encode(q.Q8_0, v))
    check(max(abs(a - b) for a, b in zip(v, back)) < max(abs(x) for x in v) / 127 * 0.51 + 1e-3, "q8_0 round trip")
    # random blocks have sane magnitudes
    m = q.dequant(q.MXFP4, q.random_mxfp4(rng, 32 * 64))
    check(max(abs(x) for x in m) <= 0.375 and any(x != 0 for x in m), "mxfp4 magnitudes")
    k = q.dequant(q.Q2_K, q.random_q2_k(rng, 256 * 4))
    check(max(abs(x) for x in k) < 0.3, "q2k magnitudes")
    # GGUF: header, kv, tensor infos, alignment
    w = GgufWriter()
    w.add("a.u", 7, GGUF_UINT32)
    w.add("a.arr", [0, 4, 8], elem_type=GGUF_INT32)
    w.add("a.f", 0.5, GGUF_FLOAT32)
    w.add_tensor("t0", [3, 2], q.F32, q.encode(q.F32, [1, 2, 3, 4, 5, 6]))
    w.add_tensor("t1", [32, 1], q.MXFP4, bytes(17))
    b = w.to_bytes()
    check(b[:4] == b"GGUF" and struct.unpack_from("<Iqq", b, 4) == (3, 2, 3), "gguf header")
    off = 24
    for key in ("a.u", "a.arr", "a.f"):
        n = struct.unpack_from("<Q", b, off)[0]
        check(b[off + 8:off + 8 + n].decode() == key, f"key {key}")
        off += 8 + n
        t = struct.unpack_from("<i", b, off)[0]
        off += 4
        if t == 9:
            et, cnt = struct.unpack_from("<iQ", b, off)
            check(et == GGUF_INT32 and cnt == 3, "array")
            check(struct.unpack_from("<3i", b, off + 12) == (0, 4, 8), "array values")
            off += 12 + 12
        else:
            off += 4
    infos = []
    for _ in range(2):
        n = struct.unpack_from("<Q", b, off)[0]
        name = b[off + 8:off + 8 + n].decode()
        off += 8 + n
        nd = struct.unpack_from("<I", b, off)[0]
        ne = struct.unpack_from(f"<{nd}q", b, off + 4)
        off += 4 + 8 * nd
        t, o = struct.unpack_from("<iQ", b, off)
        off += 12
        infos.append((name, ne, t, o))
    check(infos[0] == ("t0", (3, 2), 0, 0) and infos[1] == ("t1", (32, 1), 39, 32), f"infos {infos}")
    data = off + (-off) % 32
    check(struct.unpack_from("<6f", b, data) == (1, 2, 3, 4, 5, 6), "tensor data")
    check(len(b) == data + 32 + 32, "file length")
    print("ggml_py_selftest: OK")


if __name__ == "__main__":
    main()
