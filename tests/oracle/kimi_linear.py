#!/usr/bin/env python3
"""Kimi-Linear oracle: tiny seeded models, their GGUF files and transformers' reference logits.

Runs on the GPU machine (CPU-only torch work; python 3.12, torch, transformers 5.17; no `gguf`,
no `fla` / `causal_conv1d` kernels, so transformers uses its pure-torch KDA fallback):

    python3 tests/oracle/kimi_linear.py --out $OUT            # both configs
    python3 tests/oracle/kimi_linear.py --out DIR --gguf-only # pure Python, no torch

Per config NAME (see kimi_linear_gen.CONFIGS) it writes:
  NAME.gguf         `kimi-linear` names/keys/shapes (docs/models/kimi-linear.md)
  NAME.logits.f32   teacher-forced logits at every position, little-endian f32 [n_tokens, vocab]
  NAME.json         config, token ids, seed used, router selection margins, versions, transformers'
                    cached-decode check, the config.json and the tensor list save_pretrained() writes
  NAME.debug.f32    per-layer outputs for debugging (not committed); index in NAME.json

KimiLinearForCausalLM is loaded with exactly the values ggml dequantizes from the GGUF bytes,
runs in float32 on the CPU, and seeds whose router top-k selection is within 2e-4 of its cut-off
are rejected (the next seed is tried).
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import kimi_linear_gen as gen  # noqa: E402
import oracle_run  # noqa: E402

GAP_MIN = 2e-4


def hf_config(c):
    from transformers import KimiConfig
    kw = dict(
        vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["ff"],
        moe_intermediate_size=c["moe_ff"], num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
        num_key_value_heads=c["heads"], n_shared_experts=c["n_shared"], routed_scaling_factor=c["routed_scale"],
        kv_lora_rank=c["kv_lora"], q_lora_rank=c["q_lora"], qk_rope_head_dim=c["qk_rope"], v_head_dim=c["v_head"],
        qk_nope_head_dim=c["qk_nope"], n_group=1, topk_group=1, num_experts_per_tok=c["top_k"],
        norm_topk_prob=c["norm_topk"], hidden_act="silu", rms_norm_eps=c["rms_eps"],
        pad_token_id=None, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False,
        num_local_experts=c["experts"], layer_types=list(c["layer_types"]), mlp_layer_types=list(c["mlp_layer_types"]),
        linear_head_dim=c["kda_head_dim"], linear_num_heads=c["kda_heads"], linear_conv_kernel_dim=c["conv"],
    )
    extra = dict(
        linear_attn_config=dict(num_heads=c["kda_heads"], head_dim=c["kda_head_dim"], short_conv_kernel_size=c["conv"],
                                kda_layers=c["kda_layers"], full_attn_layers=c["full_attn_layers"]),
        first_k_dense_replace=c["n_dense"],
    )
    try:
        cfg = KimiConfig(**kw, **extra)
    except Exception as e:  # noqa: BLE001
        print(f"KimiConfig with linear_attn_config failed ({e!r}); retrying without", flush=True)
        cfg = KimiConfig(**kw)
    cfg._attn_implementation = "eager"
    try:
        cfg._experts_implementation = "eager"
    except Exception:  # noqa: BLE001
        pass
    return cfg


def expected_values(c, g):
    """g.hf plus aliases for names a transformers version might use instead (split conv)."""
    vals = dict(g.hf)
    for il, lt in enumerate(c["layer_types"]):
        if lt != gen.KDA:
            continue
        a = f"model.layers.{il}.self_attn."
        shape, conv = g.hf[a + "conv1d.weight"]
        di = shape[0] // 3
        n = di * shape[2]
        for j, x in enumerate("qkv"):
            vals[a + f"{x}_conv1d.weight"] = ([di, 1, shape[2]], conv[j * n:(j + 1) * n])
    return vals


def build_model(c, g):
    import torch
    from transformers import KimiLinearForCausalLM
    cfg = hf_config(c)
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(cfg).float().eval()
    sd = model.state_dict()
    vals = expected_values(c, g)
    missing = sorted(k for k in sd if k not in vals)
    unused = sorted(k for k in g.hf if k not in sd and not k.endswith("conv1d.weight"))
    if missing or unused:
        raise RuntimeError(f"state_dict names differ: model has no values for {missing}; generated but unused {unused}; "
                           f"model keys {sorted(sd)}")
    new, bad = {}, []
    for k, ref in sd.items():
        shape, v = vals[k]
        t = torch.tensor(v, dtype=torch.float32)
        if t.numel() != ref.numel():
            bad.append(f"{k}: model {list(ref.shape)} vs generated {shape}")
            continue
        new[k] = t.reshape(ref.shape).to(ref.dtype)
    if bad:
        raise RuntimeError("shape mismatch: " + "; ".join(bad))
    model.load_state_dict(new, strict=True)
    # The router reads these from the config; make sure the aliases resolved as intended.
    checks = []
    for il, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(gate, "e_score_correction_bias"):
            continue
        for attr, want in (("top_k", c["top_k"]), ("norm_topk_prob", c["norm_topk"]), ("num_group", 1),
                           ("topk_group", 1), ("num_experts", c["experts"]),
                           ("routed_scaling_factor", c["routed_scale"])):
            got = getattr(gate, attr)
            if got != want:
                checks.append(f"layer {il} router {attr}: {got} -> forced to {want}")
                setattr(gate, attr, want)
    for il, layer in enumerate(model.model.layers):
        sa = layer.self_attn
        want_kda = c["layer_types"][il] == gen.KDA
        is_kda = hasattr(sa, "forget_gate")
        if is_kda != want_kda:
            raise RuntimeError(f"layer {il}: transformers built {'KDA' if is_kda else 'MLA'}")
        if is_kda and sa.o_norm.variance_epsilon != c["rms_eps"]:
            checks.append(f"layer {il} o_norm eps {sa.o_norm.variance_epsilon}")
    return cfg, model, checks


def forward_checked(c, model, tokens):
    """Full no-cache forward with hooks measuring router selection gaps and recording per-layer
    outputs. Returns (logits [S,V], gap, debug list)."""
    import torch
    import torch.nn.functional as F
    gap = [float("inf")]
    debug = []
    hooks = []
    S = len(tokens)

    def router_hook(mod, inp, out):
        hs = inp[0].reshape(-1, mod.hidden_dim).float()
        s = F.linear(hs, mod.weight.float()).sigmoid() + mod.e_score_correction_bias
        if s.shape[-1] > mod.top_k:
            srt = s.sort(dim=-1, descending=True).values
            g_ = (srt[:, mod.top_k - 1] - srt[:, mod.top_k]) / srt[:, mod.top_k - 1].abs().clamp(min=1.0)
            gap[0] = min(gap[0], float(g_.min()))

    for il, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "e_score_correction_bias"):
            hooks.append(gate.register_forward_hook(router_hook))

    oracle_run.record_layer_outputs(model, S, debug, hooks)
    try:
        ids = torch.tensor([tokens], dtype=torch.long)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].float(), gap[0], debug


def run_config(name, out_dir, max_attempts):
    import torch
    import transformers
    c0 = gen.derived(gen.CONFIGS[name])
    t0 = time.time()
    tried = []
    for attempt in range(max_attempts):
        seed = c0["seed"] + attempt
        c, g, tokens = gen.generate(name, seed)
        cfg, model, checks = build_model(c, g)
        logits, gap, debug = forward_checked(c, model, tokens)
        tried.append(dict(seed=seed, router=gap))
        print(f"[{name}] seed {seed}: router gap {gap:.3g}", flush=True)
        if gap > GAP_MIN:
            break
    else:
        raise RuntimeError(f"{name}: no seed with router gaps > {GAP_MIN} in {max_attempts} attempts: {tried}")
    logits2, _, _ = forward_checked(c, model, tokens)
    deterministic = bool(torch.equal(logits, logits2))
    if not torch.isfinite(logits).all():
        raise RuntimeError(f"{name}: non-finite logits")
    result = dict(name=name, seed=seed, attempts=tried, config={k: v for k, v in c.items() if k != "types"},
                  gguf_types=dict(c["types"]), tokens=tokens, config_checks=checks,
                  logits_file=f"{name}.logits.f32", logits_shape=list(logits.shape),
                  max_abs_logit=float(logits.abs().max()), deterministic=deterministic,
                  versions=dict(torch=torch.__version__, transformers=transformers.__version__, python=sys.version))
    oracle_run.add_hf_checks(result, model, tokens, logits, attention_mask=True)
    oracle_run.write_golden(out_dir, name, result, gen.gguf_bytes(c, g), logits, debug, t0, note=f", checks {checks}")

if __name__ == "__main__":
    sys.exit(oracle_run.main(gen, run_config, max_attempts=20))
