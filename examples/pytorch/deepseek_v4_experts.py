#!/usr/bin/env python3
"""transformers' DeepseekV4ForCausalLM with its routed experts served by libexpertpack's expert store.

The model (an ep-synth DeepSeek-V4 GGUF: full-width structure at reduced shapes, MXFP4 experts) is
loaded into transformers on the GPU with every expert resident, exactly as ggml dequantizes it
(tests/oracle/full_width.py), and runs a prompt: the reference logits. Then each layer's routed
experts module is replaced by StoreExperts, which keeps no weights: per forward it acquires the
picked experts from an expertpack.Experts store (on torch's current stream; a cache a fifth of the
experts' size), views each role as a uint8 tensor over its slot (DLPack, no copy), dequantizes it on
the GPU (tests/oracle/ggml_torch.py) and computes the clamped SwiGLU in torch; the lease is released on
the same stream. The same prompt again: the logits must equal the reference within 1e-3 of
max |logit|. Reads, hits and misses are printed.

  cmake --build build --target expertpack ep-synth
  build/tools/ep-synth/ep-synth --preset flash-reduced --layers 4 --experts mxfp4 --route-samples 0 \\
      --out /tmp/ds4r_mxfp4.gguf
  EXPERTPACK_LIB_DIR=build python3 examples/pytorch/deepseek_v4_experts.py /tmp/ds4r_mxfp4.gguf

Needs torch with CUDA and transformers 5.17 (DeepseekV4ForCausalLM). Exit status 0 when the logits
agree, 1 when they do not.
"""
import argparse
import functools
import math
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))

import torch  # noqa: E402

import expertpack as ep  # noqa: E402
import full_width  # noqa: E402  (the transformers config and weights of a deepseek4 GGUF)
import ggml_torch as gt  # noqa: E402  (ggml's dequantization in torch, bit-exact with the engine's)


class StoreExperts(torch.nn.Module):
    """A DeepseekV4Experts with its weights in the expert store: forward(hidden_states [T, H],
    top_k_index [T, K], top_k_weights [T, K]) -> [T, H], computed expert by expert in ascending id as
    transformers' eager experts do, the experts fetched at most max_experts_per_acquire at a time."""

    def __init__(self, original, store, layer):
        super().__init__()
        self.store, self.layer = store, layer
        self.num_experts = original.num_experts
        # transformers' own gate (clamp, SiLU, product) bound to this module: it reads limit and act_fn.
        self.limit, self.act_fn = original.limit, original.act_fn
        self._apply_gate = functools.partial(type(original)._apply_gate, self)
        self.max_group = store.info().max_experts_per_acquire
        self.layout = store.layout(layer)

    def _matrix(self, lease, i, role):
        r = self.layout.roles[role]
        raw = lease.tensor(i, role)  # uint8 [rows, row_bytes] over the slot, on the acquire's stream
        return gt.dequant(torch, r.ggml_type, raw, r.ne[0] * r.ne[1], raw.device).reshape(r.ne[1], r.ne[0])

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        # The store decides hits and misses on the host: the ids come over once per layer.
        hit = sorted(set(top_k_index.flatten().tolist()))
        for g0 in range(0, len(hit), self.max_group):
            group = hit[g0:g0 + self.max_group]
            with self.store.acquire(self.layer, group) as lease:
                for i, e in enumerate(lease.ids):
                    tok, pos = torch.where(top_k_index == e)
                    w_gate_up = torch.cat([self._matrix(lease, i, ep.Role.GATE), self._matrix(lease, i, ep.Role.UP)])
                    w_down = self._matrix(lease, i, ep.Role.DOWN)
                    x = hidden_states[tok]
                    h = self._apply_gate(x @ w_gate_up.t().to(x.dtype)) @ w_down.t().to(x.dtype)
                    final.index_add_(0, tok, (h * top_k_weights[tok, pos, None]).to(final.dtype))
            # leaving the block released the experts on torch's current stream, after the kernels above
        return final


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", help="a deepseek4 GGUF with MXFP4 experts (ep-synth --preset flash-reduced --experts mxfp4)")
    ap.add_argument("--tokens", type=int, default=64, help="prompt length (default 64)")
    ap.add_argument("--seed", type=int, default=5, help="prompt seed (default 5)")
    ap.add_argument("--cache-fraction", type=float, default=0.2, help="cache size over all experts (default 0.2)")
    ap.add_argument("--pack-dir", default=None, help="where the Expert Pack is built (default: the library's)")
    ap.add_argument("--no-pack", action="store_true", help="read the experts from the GGUF itself (a source index)")
    ap.add_argument("--tolerance", type=float, default=1e-3, help="max |diff| over max |logit| allowed (default 1e-3)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("deepseek_v4_experts: no CUDA device for torch")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda", 0)

    g = gt.Gguf(a.gguf)
    cfg = full_width.ds4_config(g)
    t0 = time.time()
    model = full_width.ds4_load(torch, g, cfg, dev)
    print(f"model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.n_routed_experts} experts "
          f"(top {cfg.num_experts_per_tok}), loaded in {time.time() - t0:.1f} s")
    rng = random.Random(a.seed)
    tokens = [rng.randrange(2, cfg.vocab_size) for _ in range(a.tokens)]
    ids = torch.tensor([tokens], dtype=torch.long, device=dev)

    def logits():
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0].float()

    reference = logits()

    # The store: the same experts, bytes from the pack (or the GGUF), a fifth of them resident.
    probe = ep.Experts(a.gguf, device=ep.Device.CUDA, pack_dir=a.pack_dir, no_pack=a.no_pack)
    info = probe.info()
    probe.close()
    total = info.num_layers * info.num_experts
    slots = max(info.top_k, math.ceil(total * a.cache_fraction))
    store = ep.Experts(a.gguf, device=ep.Device.CUDA, pack_dir=a.pack_dir, no_pack=a.no_pack,
                       cache_budget_bytes=slots * info.slot_bytes, tokens_per_acquire=0)
    info = store.info()
    print(f"store: {store.pack_path}; {info.cache_slots} of {total} experts cached "
          f"({info.cache_slots / total:.0%}, {info.cache_slots * info.slot_bytes / 2**20:.1f} MiB), "
          f"{info.max_experts_per_acquire} per acquire")
    for il, layer in enumerate(model.model.layers):
        lay = store.layout(il - info.first_layer)
        want = {ep.Role.GATE: [cfg.hidden_size, cfg.moe_intermediate_size],
                ep.Role.UP: [cfg.hidden_size, cfg.moe_intermediate_size],
                ep.Role.DOWN: [cfg.moe_intermediate_size, cfg.hidden_size]}
        for role, ne in want.items():
            if lay.roles[role].ne != ne:
                sys.exit(f"layer {il} {role.name}: the store has ne {lay.roles[role].ne}, the model {ne}")
        layer.mlp.experts = StoreExperts(layer.mlp.experts, store, il - info.first_layer)
    torch.cuda.empty_cache()  # the resident experts are gone

    t0 = time.time()
    served = logits()
    torch.cuda.synchronize()
    seconds = time.time() - t0
    scale = float(reference.abs().max())
    diff = float((served - reference).abs().max())
    s = store.stats()
    unique = s.cache_hits + s.cache_misses
    print(f"store pass: {seconds:.2f} s; {s.acquires} acquires, {unique} experts asked for, hit rate "
          f"{s.cache_hits / max(unique, 1):.1%}, {s.pack_reads} reads ({s.pack_read_bytes / 2**20:.1f} MiB), "
          f"{s.cache_evictions} evictions")
    print(f"max |logit| {scale:.4f}, max |diff| {diff:.3e} = {diff / scale:.3e} of it (tolerance {a.tolerance:g})")
    store.close()
    if not diff <= a.tolerance * scale:
        print("deepseek_v4_experts: FAIL: the store-served logits differ from the resident model's")
        return 1
    print("deepseek_v4_experts: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
