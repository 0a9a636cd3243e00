#!/usr/bin/env python3
"""DeepSeek-V4 oracle: tiny seeded models, their GGUF files and transformers' reference logits.

Runs on the GPU machine (python 3.12, torch, transformers 5.17, safetensors; no `gguf`):

    python3 tests/oracle/deepseek_v4.py --out $OUT            # both configs
    python3 tests/oracle/deepseek_v4.py --out DIR --gguf-only # pure Python, no torch

Per config NAME (see deepseek_v4_gen.CONFIGS) it writes:
  NAME.gguf         llama.cpp `deepseek4` names/keys/shapes; dense weights F32/F16/BF16/Q8_0,
                    routed experts as random raw MXFP4 / Q2_K blocks
  NAME.logits.f32   teacher-forced logits at every position, little-endian f32 [n_tokens, vocab]
  NAME.json         config, token ids, seed used, selection margins, rope inv_freq, versions, the
                    transformers config.json, and the manifest of the checkpoint save_pretrained()
                    writes (names, shapes, dtypes, fingerprints) so the engine's safetensors path
                    can be checked without committing the (large, f32) checkpoint
  NAME.debug.f32    per-layer intermediates for debugging (not committed); index in NAME.json

The transformers model is loaded with exactly the values ggml dequantizes from the GGUF bytes
(deepseek_v4_gen), runs in float32 on the CPU (deterministic), and seeds whose router or
indexer top-k selection is within 2e-4 of its cut-off are rejected (next seed is tried).
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import deepseek_v4_gen as gen  # noqa: E402
import oracle_run  # noqa: E402

GAP_MIN = 2e-4
FP_MOD = 251


def hf_config(c):
    from transformers import DeepseekV4Config
    kw = dict(
        vocab_size=c["vocab"], hidden_size=c["hidden"], moe_intermediate_size=c["moe_ff"],
        num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=1,
        head_dim=c["head_dim"], q_lora_rank=c["q_lora"], num_experts_per_tok=c["top_k"],
        n_routed_experts=c["experts"], n_shared_experts=1, scoring_func="sqrtsoftplus",
        norm_topk_prob=True, routed_scaling_factor=c["routed_scale"],
        max_position_embeddings=c["max_positions"], rope_theta=c["rope_theta"],
        layer_types=list(c["layer_types"]),
        compress_rates={"compressed_sparse_attention": c["csa_rate"], "heavily_compressed_attention": c["hca_rate"]},
        compress_rope_theta=c["compress_rope_theta"], hc_mult=c["hc_mult"], hc_sinkhorn_iters=c["sinkhorn"],
        hc_eps=c["hc_eps"], mlp_layer_types=list(c["mlp_layer_types"]), swiglu_limit=c["swiglu_limit"],
        sliding_window=c["window"], o_groups=c["o_groups"], o_lora_rank=c["o_lora"],
        index_n_heads=c["index_heads"], index_head_dim=c["index_head_dim"], index_topk=c["index_topk"],
        num_nextn_predict_layers=0, rms_norm_eps=c["rms_eps"], partial_rotary_factor=c["partial_rotary_factor"],
        pad_token_id=None, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )
    y = c["yarn"]
    errors = []
    for variant in ("rope_scaling", "rope_parameters"):
        try:
            if variant == "rope_scaling":
                cfg = DeepseekV4Config(**kw, rope_scaling={"type": "yarn", **y})
            else:
                cfg = DeepseekV4Config(**kw, rope_parameters={"rope_type": "yarn", **y})
            comp = cfg.rope_parameters["compress"]
            if comp.get("rope_type") != "yarn":
                raise ValueError(f"compress rope is {comp}")
            break
        except Exception as e:  # noqa: BLE001
            errors.append(f"{variant}: {e!r}")
    else:
        raise RuntimeError("cannot build a yarn config: " + " | ".join(errors))
    cfg._attn_implementation = "eager"
    try:
        cfg._experts_implementation = "eager"
    except Exception:  # noqa: BLE001
        pass
    return cfg


def fingerprint(t):
    import torch
    x = t.detach().to(torch.float64).flatten().cpu()
    w = (torch.arange(x.numel(), dtype=torch.float64) % FP_MOD + 1) / FP_MOD
    return [float(x.sum()), float((x * w).sum())]


def build_model(c, g):
    import torch
    from transformers import DeepseekV4ForCausalLM
    cfg = hf_config(c)
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    sd = model.state_dict()
    missing = sorted(set(sd) - set(g.hf))
    extra = sorted(set(g.hf) - set(sd))
    if missing or extra:
        raise RuntimeError(f"state_dict names differ: missing {missing}, unexpected {extra}")
    new = {}
    bad = []
    for k, ref in sd.items():
        shape, vals = g.hf[k]
        t = torch.tensor(vals, dtype=ref.dtype).reshape(shape)
        if tuple(t.shape) != tuple(ref.shape):
            bad.append(f"{k}: {list(ref.shape)} vs {shape}")
        new[k] = t
    if bad:
        raise RuntimeError("shape mismatch: " + "; ".join(bad))
    model.load_state_dict(new, strict=True)
    return cfg, model


def forward_checked(c, model, tokens):
    """Full no-cache forward with hooks measuring router / indexer selection gaps and recording
    per-layer intermediates. Returns (logits [S,V], gaps, debug list)."""
    import torch
    import torch.nn.functional as F
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M
    gaps = {"router": float("inf"), "indexer": float("inf")}
    debug = []
    hooks = []
    S = len(tokens)

    def router_hook(mod, inp, out):
        hs = inp[0].reshape(-1, mod.hidden_dim)
        s = mod.score_fn(F.linear(hs, mod.weight)) + mod.e_score_correction_bias
        if s.shape[-1] > mod.top_k:
            srt = s.sort(dim=-1, descending=True).values
            gap = (srt[:, mod.top_k - 1] - srt[:, mod.top_k]) / srt[:, mod.top_k - 1].abs().clamp(min=1.0)
            gaps["router"] = min(gaps["router"], float(gap.min()))

    def scorer_hook_for(rate, topk):
        def hook(mod, inp, out):
            sc = out[0]  # [S, T]
            for t in range(S):
                nv = min((t + 1) // rate, sc.shape[-1])
                if nv > topk:
                    v = sc[t, :nv].sort(descending=True).values
                    gap = float((v[topk - 1] - v[topk]) / v[topk - 1].abs().clamp(min=1.0))
                    gaps["indexer"] = min(gaps["indexer"], gap)
        return hook

    for il, layer in enumerate(model.model.layers):
        gate = layer.mlp.gate
        if isinstance(gate, M.DeepseekV4TopKRouter):
            hooks.append(gate.register_forward_hook(router_hook))
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            hooks.append(comp.indexer.scorer.register_forward_hook(
                scorer_hook_for(comp.indexer.compress_rate, comp.indexer.index_topk)))

    oracle_run.record_layer_outputs(model, S, debug, hooks)
    try:
        ids = torch.tensor([tokens], dtype=torch.long)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].float(), gaps, debug


def run_config(name, out_dir, max_attempts):
    import torch
    import transformers
    c0 = gen.derived(gen.CONFIGS[name])
    t0 = time.time()
    tried = []
    for attempt in range(max_attempts):
        seed = c0["seed"] + attempt
        c, g, tokens = gen.generate(name, seed)
        cfg, model = build_model(c, g)
        logits, gaps, debug = forward_checked(c, model, tokens)
        tried.append(dict(seed=seed, **gaps))
        print(f"[{name}] seed {seed}: router gap {gaps['router']:.3g}, indexer gap {gaps['indexer']:.3g}", flush=True)
        if gaps["router"] > GAP_MIN and gaps["indexer"] > GAP_MIN:
            break
    else:
        raise RuntimeError(f"{name}: no seed with selection gaps > {GAP_MIN} in {max_attempts} attempts: {tried}")
    logits2, _, _ = forward_checked(c, model, tokens)
    deterministic = bool(torch.equal(logits, logits2))
    if not torch.isfinite(logits).all():
        raise RuntimeError(f"{name}: non-finite logits")
    result = dict(name=name, seed=seed, attempts=tried, config={k: v for k, v in c.items() if k != "types"},
                  gguf_types={k: v for k, v in c["types"].items()}, tokens=tokens,
                  logits_file=f"{name}.logits.f32", logits_shape=list(logits.shape),
                  max_abs_logit=float(logits.abs().max()), deterministic=deterministic,
                  versions=dict(torch=torch.__version__, transformers=transformers.__version__, python=sys.version))
    oracle_run.add_hf_checks(result, model, tokens, logits, fingerprint=fingerprint)
    re = model.model.rotary_emb
    result["rope"] = {lt: dict(inv_freq=[float(x) for x in getattr(re, f"{lt}_inv_freq")],
                               attention_scaling=float(getattr(re, f"{lt}_attention_scaling")))
                      for lt in re.layer_types}
    result["hf_rope_parameters"] = json.loads(json.dumps(cfg.rope_parameters, default=str))
    oracle_run.write_golden(out_dir, name, result, gen.gguf_bytes(c, g), logits, debug, t0)

if __name__ == "__main__":
    sys.exit(oracle_run.main(gen, run_config, max_attempts=30, deterministic_algorithms=True))
