"""Pure-Python pieces shared by the oracles' generators (deepseek_v4_gen.py, kimi_linear_gen.py,
kimi_k3_ref.py): seeded tensors as raw GGUF bytes of their ggml type together with the values
ggml dequantizes from them, the routed-expert blocks, and the GGUF file around them.
No numpy/torch, so it runs anywhere (the goldens' reproducibility check runs it in CI).
"""
import ggml_py_quants as q
from ggml_py_gguf import GgufWriter, GGUF_STRING, GGUF_UINT32


class TensorGen:
    """Collects tensors: GGUF (name, ne, type, bytes) and the transformers values
    (name -> (shape, flat list)) that the reference model is loaded with."""

    def __init__(self, rng):
        self.rng = rng
        self.gguf = []
        self.hf = {}

    def plain(self, gtype, n, std, mean=0.0):
        """n random values exactly representable in gtype (F32/F16/BF16), or quantized (Q8_0, ...):
        returns (raw bytes, the values ggml dequantizes from them)."""
        vals = [mean + std * self.rng.gauss(0.0, 1.0) for _ in range(n)]
        if gtype in (q.F16, q.BF16, q.F32):
            # flush tiny values so that F16 and BF16 are both exact for them
            vals = [0.0 if abs(v) < 2.0 ** -14 else v for v in vals]
            rnd = {q.F16: q.f16_round, q.BF16: q.bf16_round, q.F32: q.f32_round}[gtype]
            vals = [rnd(v) for v in vals]
            return q.encode(gtype, vals), vals
        raw = q.encode(gtype, vals)
        return raw, q.dequant(gtype, raw)

    def dense(self, gguf_name, hf_name, shape, gtype, std, mean=0.0, gguf_ne=None):
        """A random tensor of `shape` (row-major, outermost first); GGUF ne defaults to the reverse.
        hf_name None: GGUF only. Returns the values."""
        n = 1
        for s in shape:
            n *= s
        raw, vals = self.plain(gtype, n, std, mean)
        self.gguf.append((gguf_name, gguf_ne or list(reversed(shape)), gtype, raw))
        if hf_name:
            self.hf[hf_name] = (list(shape), vals)
        return vals

    def values(self, gguf_name, hf_name, shape, vals):
        """An F32 tensor with the given values (hf_name None: GGUF only). Returns the values."""
        vals = [q.f32_round(v) for v in vals]
        self.gguf.append((gguf_name, list(reversed(shape)), q.F32, q.encode(q.F32, vals)))
        if hf_name:
            self.hf[hf_name] = (list(shape), vals)
        return vals

    def routed_experts(self, blk, mlp, hidden, ff, n_experts, gate_up_type, down_type, make):
        """E experts' gate/up [ff, hidden] and down [hidden, ff] as llama.cpp stacks them
        (blk + ffn_{gate,up,down}_exps.weight) and as transformers holds them (mlp +
        experts.gate_up_proj [E, 2·ff, hidden], experts.down_proj [E, hidden, ff]).
        make(gtype, rows, cols) -> (raw, values) draws one expert's matrix."""
        raws = {"gate": [], "up": [], "down": []}
        vals = {"gate": [], "up": [], "down": []}
        for _ in range(n_experts):
            for role, rows, cols, t in (("gate", ff, hidden, gate_up_type), ("up", ff, hidden, gate_up_type),
                                        ("down", hidden, ff, down_type)):
                raw, v = make(t, rows, cols)
                raws[role].append(raw)
                vals[role].append(v)
        for role, ne, t in (("gate", [hidden, ff, n_experts], gate_up_type), ("up", [hidden, ff, n_experts], gate_up_type),
                            ("down", [ff, hidden, n_experts], down_type)):
            self.gguf.append((blk + f"ffn_{role}_exps.weight", ne, t, b"".join(raws[role])))
        gate_up = []
        for e in range(n_experts):
            gate_up.extend(vals["gate"][e])
            gate_up.extend(vals["up"][e])
        self.hf[mlp + "experts.gate_up_proj"] = ([n_experts, 2 * ff, hidden], gate_up)
        self.hf[mlp + "experts.down_proj"] = ([n_experts, hidden, ff], [v for e in range(n_experts) for v in vals["down"][e]])


def model_gguf(arch, title, keys, g):
    """The GGUF bytes of a generated model: general.architecture / general.name, then `keys`
    ((suffix, value, type) or (suffix, list, None, element type); each written as arch.suffix, in
    order), general.file_type, then g's tensors in the order they were generated."""
    w = GgufWriter()
    w.add("general.architecture", arch, GGUF_STRING)
    w.add("general.name", title, GGUF_STRING)
    for k in keys:
        w.add(f"{arch}.{k[0]}", *k[1:])
    w.add("general.file_type", 38, GGUF_UINT32)
    for name, ne, t, raw in g.gguf:
        w.add_tensor(name, ne, t, raw)
    return w.to_bytes()
