"""A GGUF v3 reader (memory-mapped, any size) and ggml dequantizers vectorized in torch, for the
full-width oracles (tests/oracle/full_width.py). Every value is computed with ggml's float32
operations in ggml's order (dequantize_row_* in ggml-quants.c: one rounding per operation, no
fused multiply-add), so the result equals the engine's CPU dequantization bit for bit;
`selftest()` checks that against the pure-Python ggml_py_quants on random blocks of every type.

Types: F32, F16, BF16, I32, Q8_0, Q2_K, MXFP4, IQ2_XXS.
"""
import mmap
import random
import struct

import ggml_py_grids
import ggml_py_quants as q

GGUF_TYPES = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Gguf:
    """Metadata (dict), tensor infos (name -> (ne, type, absolute offset, nbytes)) and raw bytes."""

    def __init__(self, path):
        self.path = path
        self.f = open(path, "rb")
        self.mm = mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ)
        b = self.mm
        if b[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", b, 4)
        if version != 3:
            raise ValueError(f"{path}: GGUF version {version}")
        at = 24
        self.meta = {}

        def string(at):
            (n,) = struct.unpack_from("<Q", b, at)
            return b[at + 8:at + 8 + n].decode("utf-8"), at + 8 + n

        def value(t, at):
            if t == 8:
                return string(at)
            if t == 9:
                et, n = struct.unpack_from("<iQ", b, at)
                at += 12
                out = []
                for _ in range(n):
                    v, at = value(et, at)
                    out.append(v)
                return out, at
            fmt = GGUF_TYPES[t]
            return struct.unpack_from(fmt, b, at)[0], at + struct.calcsize(fmt)

        for _ in range(n_kv):
            key, at = string(at)
            (t,) = struct.unpack_from("<i", b, at)
            self.meta[key], at = value(t, at + 4)
        infos = []
        for _ in range(n_tensors):
            name, at = string(at)
            (nd,) = struct.unpack_from("<I", b, at)
            ne = list(struct.unpack_from(f"<{nd}Q", b, at + 4))
            t, off = struct.unpack_from("<iQ", b, at + 4 + 8 * nd)
            at += 4 + 8 * nd + 12
            infos.append((name, ne, t, off))
        align = self.meta.get("general.alignment", 32)
        data = (at + align - 1) // align * align
        self.tensors = {}
        for name, ne, t, off in infos:
            n = 1
            for d in ne:
                n *= d
            nbytes = q.row_bytes(t, ne[0]) * (n // ne[0]) if t in q.BLOCK else n * {24: 1, 25: 2, 26: 4, 27: 8, 28: 8}[t]
            self.tensors[name] = (ne, t, data + off, nbytes)

    def has(self, name):
        return name in self.tensors

    def raw(self, name, first=0, count=None):
        """Bytes of tensor `name`, or of its slabs [first, first + count) along the last dim."""
        ne, t, off, nbytes = self.tensors[name]
        if count is None:
            return memoryview(self.mm)[off:off + nbytes]
        slab = nbytes // ne[-1]
        return memoryview(self.mm)[off + first * slab:off + (first + count) * slab]

    def key(self, k, default=None):
        return self.meta.get(k, default)


# ---- dequantization -------------------------------------------------------------------------
def _u8(torch, buf, device):
    if isinstance(buf, torch.Tensor):  # bytes already in a uint8 tensor (examples/pytorch: a store's slot)
        return buf.reshape(-1).to(device)
    return torch.frombuffer(bytearray(buf), dtype=torch.uint8).to(device)


def _half(torch, blocks, at):
    """The f16 at byte `at` of every block row, as float32."""
    return blocks[:, at:at + 2].contiguous().view(torch.float16).float().reshape(-1, 1)


_TABLES = {}


def _tables(torch, device):
    key = str(device)
    if key not in _TABLES:
        grid = torch.tensor(ggml_py_grids.grid("iq2xxs"), dtype=torch.float32, device=device)  # [256, 8]
        signs = torch.tensor([[-1.0 if (s >> j) & 1 else 1.0 for j in range(8)] for s in ggml_py_grids.KSIGNS],
                             dtype=torch.float32, device=device)  # [128, 8]
        kv = torch.tensor(q.KVALUES_MXFP4, dtype=torch.float32, device=device)
        _TABLES[key] = (grid, signs, kv)
    return _TABLES[key]


def dequant(torch, gtype, buf, n, device="cpu"):
    """float32 tensor [n] of the `n` values of ggml type `gtype` in bytes `buf`."""
    x = _u8(torch, buf, device)
    if gtype == q.F32:
        return x.view(torch.float32)[:n].clone()
    if gtype == q.F16:
        return x.view(torch.float16).float()[:n]
    if gtype == q.BF16:
        return (x.view(torch.int16).to(torch.int32) << 16).view(torch.float32)[:n]
    if gtype == q.I32:
        return x.view(torch.int32)[:n]
    be, bb = q.BLOCK[gtype]
    blocks = x.reshape(-1, bb)
    if gtype == q.Q8_0:
        d = _half(torch, blocks, 0)
        return (blocks[:, 2:].view(torch.int8).float() * d).reshape(-1)[:n]
    if gtype == q.MXFP4:
        grid, signs, kv = _tables(torch, device)
        e = blocks[:, 0].to(torch.int32)
        bits = torch.where(e < 2, torch.tensor(0x00200000, dtype=torch.int32, device=device) << e, (e - 1) << 23)
        d = bits.view(torch.float32).reshape(-1, 1)
        qs = blocks[:, 1:].to(torch.int64)
        y = torch.cat([kv[qs & 0xF] * d, kv[qs >> 4] * d], dim=1)
        return y.reshape(-1)[:n]
    if gtype == q.Q2_K:
        d, dmin = _half(torch, blocks, 80), _half(torch, blocks, 82)
        sc = blocks[:, :16].to(torch.int32)
        dl, ml = d * (sc & 0xF).float(), dmin * (sc >> 4).float()  # [nb, 16]: index half*8 + j*2 + part
        qs = blocks[:, 16:80].to(torch.int32).reshape(-1, 2, 32)      # [nb, half, byte]
        out = []
        for half in range(2):
            for j in range(4):
                codes = ((qs[:, half] >> (2 * j)) & 3).float()       # [nb, 32]
                for part in range(2):
                    k = half * 8 + j * 2 + part
                    out.append(dl[:, k:k + 1] * codes[:, 16 * part:16 * part + 16] - ml[:, k:k + 1])
        return torch.cat(out, dim=1).reshape(-1)[:n]
    if gtype == q.IQ2_XXS:
        grid, signs, kv = _tables(torch, device)
        d = _half(torch, blocks, 0)                                 # [nb, 1]
        g = blocks[:, 2:].reshape(-1, 8, 8)                          # [nb, ib, 8 bytes]
        idx = g[:, :, :4].to(torch.int64)                            # grid indices
        aux = g[:, :, 4:].contiguous().view(torch.int32).reshape(-1, 8).to(torch.int64) & 0xFFFFFFFF
        db = (d * (0.5 + (aux >> 28).float())) * 0.25                # [nb, 8]
        sgn = torch.stack([(aux >> (7 * l)) & 127 for l in range(4)], dim=2)  # [nb, 8, 4]
        vals = (db[:, :, None, None] * grid[idx]) * signs[sgn]       # [nb, 8, 4, 8]
        return vals.reshape(-1)[:n]
    raise ValueError(f"dequant: ggml type {gtype} not supported here")


def tensor(torch, g, name, device, shape=None):
    """Tensor `name` of GGUF `g` dequantized to float32 on `device`, shaped like torch (reverse ne)."""
    ne, t, _, _ = g.tensors[name]
    n = 1
    for d in ne:
        n *= d
    v = dequant(torch, t, g.raw(name), n, device)
    return v.reshape(shape if shape is not None else list(reversed(ne)))


def selftest(torch, device="cpu"):
    """torch dequantization == the pure-Python ggml_py_quants, bit for bit, on random blocks."""
    rng = random.Random(7)
    for gtype, nblk in ((q.Q8_0, 9), (q.MXFP4, 17), (q.Q2_K, 5), (q.IQ2_XXS, 5), (q.F16, 64), (q.BF16, 64)):
        be, bb = q.BLOCK[gtype]
        raw = bytearray(rng.getrandbits(8) for _ in range(nblk * bb))
        if gtype in (q.Q8_0, q.IQ2_XXS):
            for b in range(nblk):
                raw[b * bb:b * bb + 2] = struct.pack("<H", q.f16_bits(rng.uniform(-0.1, 0.1)))
        if gtype == q.Q2_K:
            for b in range(nblk):
                raw[b * bb + 80:b * bb + 84] = struct.pack("<2H", q.f16_bits(rng.uniform(0, 0.01)), q.f16_bits(rng.uniform(0, 0.01)))
        if gtype == q.F16:
            raw = bytearray(struct.pack(f"<{nblk}e", *[rng.uniform(-2, 2) for _ in range(nblk)]))
        if gtype == q.BF16:
            raw = bytearray(struct.pack(f"<{nblk}H", *[q.bf16_bits(rng.uniform(-2, 2)) for _ in range(nblk)]))
        n = nblk * be
        want = q.dequant(gtype, bytes(raw))
        got = dequant(torch, gtype, bytes(raw), n, device).cpu().tolist()
        bad = [i for i in range(n) if struct.pack("<f", want[i]) != struct.pack("<f", got[i])]
        if bad:
            raise SystemExit(f"ggml_torch selftest: {q.TYPE_NAMES[gtype]}: {len(bad)} of {n} values differ "
                             f"(first {bad[0]}: {got[bad[0]]} vs {want[bad[0]]})")
    return True
