#!/usr/bin/env python3
"""Full-width goldens: reference top-k logits of ep-synth's seeded DeepSeek-V4-Flash-shaped and
Kimi-K3-shaped GGUFs (and of their reduced-width twins, which CI runs), for
tests/model/full_width_test.cpp.

  DeepSeek-V4: transformers 5.17 DeepseekV4ForCausalLM in float32 on CUDA (TF32 off), loaded with
               exactly the values ggml dequantizes from the GGUF (ggml_torch.py, bit-exact with
               the engine's CPU dequantization), one no-cache pass over a 2,100-token prompt.
  Kimi-K3:     kimi_k3_torch.py (the project's K3 reference, kimi_k3_ref.py vectorized) in float64.

The prompt is seeded random token ids. Prompt 1 is its first 1,200 tokens, prompt 2 all 2,100: the
models are causal, so one pass gives both; 2,100 tokens close 525 CSA windows (ratio 4), so from
position 2,051 on the indexer picks 512 of more than 512 entries, and 16 HCA windows (ratio 128).
Recorded per position: the top-40 token ids and logits, and the smallest router top-k and indexer
top-512 selection gaps of that token over the layers (near ties make a position fragile).

On the GPU machine (H200; about 5 minutes; needs ~110 GB of GPU memory for the float32 DeepSeek
model), from the repository root with ep-synth built (cmake --build build --target ep-synth):

  G=/tmp/fw && mkdir -p $G && S=build/tools/ep-synth/ep-synth && \\
  $S --preset flash-ds4 --layers 4 --experts iq2_xxs --down-experts q2_K --route-samples 0 --out $G/ds4_iq2.gguf && \\
  $S --preset flash --layers 4 --experts mxfp4 --route-samples 0 --out $G/ds4_mxfp4.gguf && \\
  $S --preset k3 --layers 2 --experts mxfp4 --route-samples 0 --out $G/k3_mxfp4.gguf && \\
  $S --preset flash-reduced --layers 4 --experts iq2_xxs --down-experts q2_K --route-samples 0 --out $G/ds4r_iq2.gguf && \\
  $S --preset flash-reduced --layers 4 --experts mxfp4 --route-samples 0 --out $G/ds4r_mxfp4.gguf && \\
  $S --preset k3-reduced --layers 3 --experts mxfp4 --route-samples 0 --out $G/k3r_mxfp4.gguf && \\
  python3 tests/oracle/full_width.py --out tests/data/full_width \\
    ds4_iq2=$G/ds4_iq2.gguf ds4_mxfp4=$G/ds4_mxfp4.gguf k3_mxfp4=$G/k3_mxfp4.gguf \\
    ds4r_iq2=$G/ds4r_iq2.gguf ds4r_mxfp4=$G/ds4r_mxfp4.gguf k3r_mxfp4=$G/k3r_mxfp4.gguf

`ds4_iq2` is in the layout antirez/ds4 validates (f16 embedding and mixers), so the same file runs
through ds4. `--probes FILE.json` ({"name": [token ids], ...}) also runs each short sequence through
every DeepSeek-V4 model given (one pass, no cache) and writes NAME.probes.json: per position the
top-40 logits and, per data-routed layer, the router's selection gap (k-th minus (k+1)-th biased
score, relative) and the two expert ids either side of the cut; then the same pass again with the
last position's k-th expert of the last data-routed layer swapped for the (k+1)-th (the choice a
near tie could tip the other way), to compare against another engine's logits there.

(each NAME=PATH writes NAME.json; the NAME says which ep-synth command made the file, see SYNTH
below, and the JSON records it, with the file's size and sampled digest, for the C++ test to
regenerate and check). `python3 tests/oracle/full_width.py --selftest` runs only the checks that
precede every run: ggml_torch's dequantizers against the pure-Python ones, bit for bit, and
kimi_k3_torch against the committed tiny K3 golden and transformers' Kimi-Linear goldens.
"""
import argparse
import hashlib
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import ggml_torch as gt  # noqa: E402
import kimi_k3_torch as k3t  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "data")
PROMPT_SEED = 20261201
PROMPT_TOKENS = 2100
PROMPTS = [  # (length, positions recorded)
    (1200, [0, 127, 128, 255, 511, 1023, 1199]),
    (2100, [1200, 2047, 2050, 2051, 2052, 2099]),
]
TOP_K = 40
# ep-synth arguments per golden name (the C++ test rebuilds the spec from them)
SYNTH = {
    "ds4_iq2": dict(preset="flash-ds4", layers=4, experts="iq2_xxs", down_experts="q2_K", seed=1),
    "ds4_mxfp4": dict(preset="flash", layers=4, experts="mxfp4", down_experts="mxfp4", seed=1),
    "k3_mxfp4": dict(preset="k3", layers=2, experts="mxfp4", down_experts="mxfp4", seed=1),
    "ds4r_iq2": dict(preset="flash-reduced", layers=4, experts="iq2_xxs", down_experts="q2_K", seed=1),
    "ds4r_mxfp4": dict(preset="flash-reduced", layers=4, experts="mxfp4", down_experts="mxfp4", seed=1),
    "k3r_mxfp4": dict(preset="k3-reduced", layers=3, experts="mxfp4", down_experts="mxfp4", seed=1),
}


def sampled_digest(path):
    """SHA-256 of the file's size (u64 LE), its first 16 MiB, then 1 MiB every 64 MiB after that:
    cheap for 15 GB files, and the C++ test computes the same (tests/model/full_width_test.cpp)."""
    size = os.path.getsize(path)
    h = hashlib.sha256(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        h.update(f.read(16 << 20))
        off = 16 << 20
        while off < size:
            f.seek(off)
            h.update(f.read(1 << 20))
            off += 64 << 20
    return size, h.hexdigest()


def prompt_tokens(vocab):
    rng = random.Random(PROMPT_SEED)
    return [rng.randrange(vocab) for _ in range(PROMPT_TOKENS)]


# ---- DeepSeek-V4 through transformers ----------------------------------------------------------
def ds4_config(g):
    """transformers' DeepseekV4Config of a deepseek4 GGUF, through deepseek_v4.py's hf_config()."""
    import deepseek_v4
    k = lambda key, default=None: g.key("deepseek4." + key, default)  # noqa: E731
    L = k("block_count")
    ratios = list(k("attention.compress_ratios"))[:L]
    types = ["sliding_attention" if r == 0 else ("compressed_sparse_attention" if g.has(f"blk.{il}.indexer.proj.weight")
                                                 else "heavily_compressed_attention") for il, r in enumerate(ratios)]
    n_hash = k("hash_layer_count")
    clamp = k("swiglu_clamp_exp")
    head_dim, rope = k("attention.key_length"), k("rope.dimension_count")
    if k("expert_shared_count", 1) != 1:
        raise SystemExit(f"{g.path}: {k('expert_shared_count')} shared experts (deepseek_v4.hf_config builds 1)")
    c = dict(
        vocab=g.tensors["token_embd.weight"][0][1], hidden=k("embedding_length"), moe_ff=k("expert_feed_forward_length"),
        layers=L, heads=k("attention.head_count"), head_dim=head_dim, q_lora=k("attention.q_lora_rank"),
        top_k=k("expert_used_count"), experts=k("expert_count"), routed_scale=k("expert_weights_scale"),
        max_positions=k("context_length"), rope_theta=k("rope.freq_base"), layer_types=types,
        csa_rate=next((r for r, t in zip(ratios, types) if t == "compressed_sparse_attention"), 4),
        hca_rate=next((r for r, t in zip(ratios, types) if t == "heavily_compressed_attention"), 128),
        compress_rope_theta=k("attention.compress_rope_freq_base"), hc_mult=k("hyper_connection.count"),
        sinkhorn=k("hyper_connection.sinkhorn_iterations"), hc_eps=k("hyper_connection.epsilon"),
        mlp_layer_types=["hash_moe"] * n_hash + ["moe"] * (L - n_hash),
        swiglu_limit=clamp[0] if isinstance(clamp, list) else clamp, window=k("attention.sliding_window"),
        o_groups=k("attention.output_group_count"), o_lora=k("attention.output_lora_rank"),
        index_heads=k("attention.indexer.head_count"), index_head_dim=k("attention.indexer.key_length"),
        index_topk=k("attention.indexer.top_k"), rms_eps=k("attention.layer_norm_rms_epsilon"),
        partial_rotary_factor=rope / head_dim,
        yarn=dict(factor=k("rope.scaling.factor"), original_max_position_embeddings=k("rope.scaling.original_context_length"),
                  beta_fast=k("rope.scaling.yarn_beta_fast", 32.0), beta_slow=k("rope.scaling.yarn_beta_slow", 1.0)),
    )
    if int(head_dim * c["partial_rotary_factor"]) != rope:
        raise SystemExit(f"{g.path}: rope dims {rope} of head_dim {head_dim}")
    return deepseek_v4.hf_config(c)


def ds4_names(L):
    """transformers parameter name -> GGUF tensor name (deepseek_v4_gen.py's pairs)."""
    m = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
         "lm_head.weight": "output.weight", "model.hc_head.hc_fn": "output_hc_fn.weight",
         "model.hc_head.hc_base": "output_hc_base.weight", "model.hc_head.hc_scale": "output_hc_scale.weight"}
    for il in range(L):
        b, p = f"blk.{il}.", f"model.layers.{il}."
        for site, hcn in (("attn", "attn_hc"), ("ffn", "ffn_hc")):
            for x in ("fn", "base", "scale"):
                m[p + f"{hcn}.{x}"] = b + f"hc_{site}_{x}.weight"
        a, cp = p + "self_attn.", p + "self_attn.compressor."
        ip = cp + "indexer."
        m.update({
            p + "input_layernorm.weight": b + "attn_norm.weight", p + "post_attention_layernorm.weight": b + "ffn_norm.weight",
            a + "q_a_proj.weight": b + "attn_q_a.weight", a + "q_a_norm.weight": b + "attn_q_a_norm.weight",
            a + "q_b_proj.weight": b + "attn_q_b.weight", a + "kv_proj.weight": b + "attn_kv.weight",
            a + "kv_norm.weight": b + "attn_kv_a_norm.weight", a + "o_a_proj.weight": b + "attn_output_a.weight",
            a + "o_b_proj.weight": b + "attn_output_b.weight", a + "sinks": b + "attn_sinks.weight",
            cp + "kv_proj.weight": b + "attn_compressor_kv.weight", cp + "gate_proj.weight": b + "attn_compressor_gate.weight",
            cp + "position_bias": b + "attn_compressor_ape.weight", cp + "kv_norm.weight": b + "attn_compressor_norm.weight",
            ip + "scorer.weights_proj.weight": b + "indexer.proj.weight", ip + "q_b_proj.weight": b + "indexer.attn_q_b.weight",
            ip + "kv_proj.weight": b + "indexer_compressor_kv.weight", ip + "gate_proj.weight": b + "indexer_compressor_gate.weight",
            ip + "position_bias": b + "indexer_compressor_ape.weight", ip + "kv_norm.weight": b + "indexer_compressor_norm.weight",
            p + "mlp.gate.weight": b + "ffn_gate_inp.weight", p + "mlp.gate.tid2eid": b + "ffn_gate_tid2eid.weight",
            p + "mlp.gate.e_score_correction_bias": b + "exp_probs_b.bias",
            p + "mlp.shared_experts.gate_proj.weight": b + "ffn_gate_shexp.weight",
            p + "mlp.shared_experts.up_proj.weight": b + "ffn_up_shexp.weight",
            p + "mlp.shared_experts.down_proj.weight": b + "ffn_down_shexp.weight",
        })
    return m


def ds4_load(torch, g, cfg, device):
    from transformers import DeepseekV4ForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        model = DeepseekV4ForCausalLM(cfg).eval()
    names = ds4_names(cfg.num_hidden_layers)
    sd = model.state_dict()
    done = set()
    with torch.no_grad():
        for k, ref in sd.items():
            if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
                il = int(k.split(".")[2])
                E, chunk = ref.shape[0], 8
                for e0 in range(0, E, chunk):
                    n = min(chunk, E - e0)
                    if k.endswith("gate_up_proj"):
                        F = ref.shape[1] // 2
                        for half, role in ((0, "gate"), (1, "up")):
                            name = f"blk.{il}.ffn_{role}_exps.weight"
                            ne, t, _, _ = g.tensors[name]
                            v = gt.dequant(torch, t, g.raw(name, e0, n), n * ne[0] * ne[1], device)
                            ref[e0:e0 + n, half * F:(half + 1) * F].copy_(v.reshape(n, ne[1], ne[0]))
                    else:
                        name = f"blk.{il}.ffn_down_exps.weight"
                        ne, t, _, _ = g.tensors[name]
                        v = gt.dequant(torch, t, g.raw(name, e0, n), n * ne[0] * ne[1], device)
                        ref[e0:e0 + n].copy_(v.reshape(n, ne[1], ne[0]))
                done.add(k)
                continue
            if k not in names:
                continue
            name = names[k]
            if not g.has(name):
                raise RuntimeError(f"{g.path}: no tensor {name} for {k}")
            v = gt.tensor(torch, g, name, device)
            if v.numel() != ref.numel():
                raise RuntimeError(f"{k}: model {list(ref.shape)} vs GGUF {name} {list(v.shape)}")
            ref.copy_(v.reshape(ref.shape).to(ref.dtype))
            done.add(k)
    missing = sorted(set(sd) - done)
    if missing:
        raise RuntimeError(f"no GGUF values for {missing}")
    return model


def ds4_forward(torch, model, tokens):
    """Logits [S, V] and per-token selection gaps (router top-k, indexer top-k), min over layers."""
    import torch.nn.functional as F
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M
    S = len(tokens)
    router_gap = torch.full((S,), float("inf"), dtype=torch.float64)
    index_gap = torch.full((S,), float("inf"), dtype=torch.float64)
    hooks = []

    def router_hook(mod, inp, out):
        hs = inp[0].reshape(-1, mod.hidden_dim)
        s = (mod.score_fn(F.linear(hs, mod.weight)) + mod.e_score_correction_bias).double()
        srt = s.sort(dim=-1, descending=True).values
        gap = (srt[:, mod.top_k - 1] - srt[:, mod.top_k]) / srt[:, mod.top_k - 1].abs().clamp(min=1.0)
        router_gap.copy_(torch.minimum(router_gap, gap.cpu()))

    def scorer_hook_for(rate, topk):
        def hook(mod, inp, out):
            sc = out[0].double()  # [S, T]
            for t in range(S):
                nv = min((t + 1) // rate, sc.shape[-1])
                if nv > topk:
                    v = sc[t, :nv].topk(topk + 1).values
                    gap = float((v[topk - 1] - v[topk]) / v[topk - 1].abs().clamp(min=1.0))
                    index_gap[t] = min(float(index_gap[t]), gap)
        return hook

    for layer in model.model.layers:
        gate = layer.mlp.gate
        if isinstance(gate, M.DeepseekV4TopKRouter):
            hooks.append(gate.register_forward_hook(router_hook))
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            hooks.append(comp.indexer.scorer.register_forward_hook(scorer_hook_for(comp.indexer.compress_rate, comp.indexer.index_topk)))
    try:
        ids = torch.tensor([tokens], dtype=torch.long, device=model.device)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].float(), router_gap, index_gap


def ds4_probe(torch, model, tokens):
    """One no-cache pass over `tokens`, then the same with the last position's k-th expert of the
    last data-routed layer swapped for the (k+1)-th. Returns a JSON-ready dict (the module docstring says what it holds)."""
    import torch.nn.functional as F
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M
    S = len(tokens)
    routed = [il for il, layer in enumerate(model.model.layers) if isinstance(layer.mlp.gate, M.DeepseekV4TopKRouter)]
    if not routed:
        return dict(tokens=tokens, routed_layers=[])
    seen = {}
    swap = dict(on=False, layer=routed[-1])

    def hook_for(il):
        def hook(mod, inp, out):
            hs = inp[0].reshape(-1, mod.hidden_dim)
            s = mod.score_fn(F.linear(hs, mod.weight))
            biased = s + mod.e_score_correction_bias
            order = biased.sort(dim=-1, descending=True)
            k = mod.top_k
            vals = order.values.double()
            seen[il] = dict(gap=((vals[:, k - 1] - vals[:, k]) / vals[:, k - 1].abs().clamp(min=1.0)).cpu().tolist(),
                            kth=order.indices[:, k - 1].cpu().tolist(), next=order.indices[:, k].cpu().tolist())
            if not (swap["on"] and il == swap["layer"]):
                return None
            idx = order.indices[:, :k].clone()
            idx[-1, k - 1] = order.indices[-1, k]
            w = s.gather(1, idx)
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
            return out[0], w * mod.routed_scaling_factor, idx
        return hook

    hooks = [model.model.layers[il].mlp.gate.register_forward_hook(hook_for(il)) for il in routed]
    try:
        ids = torch.tensor([tokens], dtype=torch.long, device=model.device)
        with torch.no_grad():
            base = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0].float()
            layers = {str(il): seen[il] for il in routed}
            swap["on"] = True
            swapped = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0].float()
    finally:
        for h in hooks:
            h.remove()

    def top(row):
        t = row.topk(TOP_K)
        return dict(top_ids=[int(i) for i in t.indices], top_logits=[float(v) for v in t.values], max_abs=float(row.abs().max()))

    return dict(tokens=tokens, routed_layers=routed, layers=layers, positions=[top(base[p]) for p in range(S)],
                swapped_last=dict(layer=routed[-1], **top(swapped[S - 1])),
                swap_max_dlogit=float((swapped[S - 1] - base[S - 1]).abs().max()))


# ---- goldens -----------------------------------------------------------------------------------
def record(logits_at, tokens, router_gap=None, index_gap=None):
    prompts = []
    for length, positions in PROMPTS:
        rows = []
        for p in positions:
            row = logits_at(p)
            top = row.topk(TOP_K)
            r = dict(pos=p, top_ids=[int(i) for i in top.indices], top_logits=[float(v) for v in top.values],
                     max_abs=float(row.abs().max()))
            if router_gap is not None:
                r["router_gap"] = float(router_gap[p]) if math.isfinite(float(router_gap[p])) else None
                r["indexer_gap"] = float(index_gap[p]) if math.isfinite(float(index_gap[p])) else None
            rows.append(r)
        prompts.append(dict(length=length, positions=rows))
    return prompts


def run(name, path, out_dir, device, probes=None):
    import torch
    try:
        import transformers
        tv = transformers.__version__
    except ImportError:  # the Kimi reference is the project's own: transformers is not needed for it
        tv = None
    t0 = time.time()
    g = gt.Gguf(path)
    arch = g.key("general.architecture")
    size, digest = sampled_digest(path)
    tokens = prompt_tokens(g.tensors["token_embd.weight"][0][1])
    meta = dict(name=name, arch=arch, synth=SYNTH.get(name), gguf=dict(bytes=size, sampled_sha256=digest),
                prompt_seed=PROMPT_SEED, tokens=tokens, top_k=TOP_K,
                versions=dict(torch=torch.__version__, transformers=tv, python=sys.version,
                              device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"))
    if arch == "deepseek4":
        cfg = ds4_config(g)
        model = ds4_load(torch, g, cfg, device)
        t1 = time.time()
        logits, rg, ig = ds4_forward(torch, model, tokens)
        meta["reference"] = "transformers DeepseekV4ForCausalLM, float32, no cache, one pass"
        meta["prompts"] = record(lambda p: logits[p], tokens, rg, ig)
        del logits
        if probes:
            out = {k: ds4_probe(torch, model, v) for k, v in probes.items()}
            with open(os.path.join(out_dir, f"{name}.probes.json"), "w") as f:
                json.dump(dict(name=name, gguf=meta["gguf"], probes=out), f, separators=(",", ":"))
        del model
    elif arch in ("kimi-k3", "kimi-linear"):
        t1 = time.time()
        want = sorted({p for _, ps in PROMPTS for p in ps})
        gaps = {}
        rows = k3t.forward(torch, g, tokens, want, device, gaps=gaps)
        meta["reference"] = "tests/oracle/kimi_k3_torch.py, float64"
        rg = torch.tensor(gaps["router"], dtype=torch.float64)
        meta["prompts"] = record(lambda p: rows[p], tokens, rg, torch.full_like(rg, float("inf")))
        del rows
    else:
        raise SystemExit(f"{path}: architecture {arch}")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    meta["seconds"] = dict(load=t1 - t0, forward=time.time() - t1)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(meta, f, separators=(",", ":"))
    print(f"[{name}] {arch}: load {t1 - t0:.0f} s, forward {time.time() - t1:.0f} s", flush=True)


def selftest(device):
    import torch
    gt.selftest(torch, device)
    # kimi_k3_torch against the pure-Python K3 reference, and (K3 features off) transformers
    for d, name in (("kimi_k3", "k3_a"), ("kimi_linear", "kimi_a"), ("kimi_linear", "kimi_b")):
        worst, ref = k3t.check_golden(torch, os.path.join(DATA, d, name), device)
        if worst > (1e-5 if d == "kimi_k3" else 1e-4) * ref:
            raise SystemExit(f"kimi_k3_torch vs the {name} golden: max|dlogit| {worst:.3g} of {ref:.3g}")
    print("selftest: dequantizers bit-exact; kimi_k3_torch matches kimi_k3_ref (k3_a) and transformers (kimi_a, kimi_b)",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(DATA, "full_width"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--probes", help="JSON {name: [token ids]}: short sequences to probe on each DeepSeek-V4 model")
    ap.add_argument("models", nargs="*", help="NAME=PATH.gguf")
    a = ap.parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    selftest("cpu")
    if a.selftest:
        return 0
    os.makedirs(a.out, exist_ok=True)
    probes = None
    if a.probes:
        with open(a.probes) as f:
            probes = json.load(f)
    for spec in a.models:
        name, _, path = spec.partition("=")
        if name not in SYNTH or not path:
            raise SystemExit(f"{spec}: expected NAME=PATH with NAME one of {sorted(SYNTH)}")
        run(name, path, a.out, a.device, probes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
