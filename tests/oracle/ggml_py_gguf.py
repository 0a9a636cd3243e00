"""A small GGUF v3 writer in pure Python (models.md section 4), for test fixtures.

    w = GgufWriter()
    w.add("general.architecture", "deepseek4")                  # str -> STRING
    w.add("deepseek4.block_count", 4, GGUF_UINT32)              # explicit type
    w.add("deepseek4.attention.compress_ratios", [0, 4], GGUF_INT32)  # array of INT32
    w.add_tensor("token_embd.weight", [n_embd, n_vocab], ggml_type, raw_bytes)  # ne in ggml order
    w.write(path)
"""
import struct

from ggml_py_quants import row_bytes

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
(GGUF_UINT8, GGUF_INT8, GGUF_UINT16, GGUF_INT16, GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL,
 GGUF_STRING, GGUF_ARRAY, GGUF_UINT64, GGUF_INT64, GGUF_FLOAT64) = range(13)
_SCALAR_FMT = {GGUF_UINT8: "<B", GGUF_INT8: "<b", GGUF_UINT16: "<H", GGUF_INT16: "<h", GGUF_UINT32: "<I",
               GGUF_INT32: "<i", GGUF_FLOAT32: "<f", GGUF_BOOL: "<?", GGUF_UINT64: "<Q", GGUF_INT64: "<q",
               GGUF_FLOAT64: "<d"}


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _infer_type(v):
    if isinstance(v, bool):
        return GGUF_BOOL
    if isinstance(v, int):
        return GGUF_INT32 if v < 0 else GGUF_UINT32
    if isinstance(v, float):
        return GGUF_FLOAT32
    if isinstance(v, str):
        return GGUF_STRING
    raise TypeError(f"cannot infer a GGUF type for {v!r}")


def _value(t, v):
    if t == GGUF_STRING:
        return _str(v)
    return struct.pack(_SCALAR_FMT[t], v)


class GgufWriter:
    def __init__(self, alignment=32):
        self.alignment = alignment
        self.kv = []       # (key, bytes)
        self.tensors = []  # (name, ne, type, data)
        self.keys = set()

    def add(self, key, value, vtype=None, elem_type=None):
        """Scalar (vtype optional) or list (elem_type = the element type; vtype ignored)."""
        if key in self.keys:
            raise ValueError(f"duplicate key {key}")
        self.keys.add(key)
        if isinstance(value, (list, tuple)):
            et = elem_type if elem_type is not None else (vtype if vtype is not None else _infer_type(value[0]))
            body = struct.pack("<iiQ", GGUF_ARRAY, et, len(value)) + b"".join(_value(et, x) for x in value)
        else:
            t = vtype if vtype is not None else _infer_type(value)
            body = struct.pack("<i", t) + _value(t, value)
        self.kv.append((key, _str(key) + body))

    def add_tensor(self, name, ne, gtype, data):
        if any(n == name for n, _, _, _ in self.tensors):
            raise ValueError(f"duplicate tensor {name}")
        if not 1 <= len(ne) <= 4:
            raise ValueError(f"{name}: {len(ne)} dims")
        rows = 1
        for n in ne[1:]:
            rows *= n
        want = row_bytes(gtype, ne[0]) * rows
        if len(data) != want:
            raise ValueError(f"{name}: {len(data)} bytes, expected {want} for ne {ne} type {gtype}")
        self.tensors.append((name, list(ne), gtype, bytes(data)))

    def _pad(self, n):
        return (-n) % self.alignment

    def to_bytes(self):
        out = bytearray(GGUF_MAGIC + struct.pack("<Iqq", GGUF_VERSION, len(self.tensors), len(self.kv)))
        for _, b in self.kv:
            out += b
        offset = 0
        offsets = []
        for name, ne, gtype, data in self.tensors:
            offsets.append(offset)
            out += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", n) for n in ne)
            out += struct.pack("<iQ", gtype, offset)
            offset += len(data) + self._pad(len(data))
        out += b"\0" * self._pad(len(out))
        for (_, _, _, data), off in zip(self.tensors, offsets):
            out += data + b"\0" * self._pad(len(data))
        return bytes(out)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.to_bytes())
