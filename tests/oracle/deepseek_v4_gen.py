"""Pure-Python half of the DeepSeek-V4 oracle: the tiny configs, the seeded random parameters,
the GGUF file (llama.cpp `deepseek4` names, keys and shapes) and the dequantized values that the
transformers model is loaded with. No numpy/torch, so it can be unit-tested anywhere.

Every tensor is generated once, as raw GGUF bytes of its chosen ggml type; the transformers
model receives exactly the values ggml dequantizes from those bytes.
"""
import math
import random
import struct

import ggml_py_quants as q
from ggml_py_gguf import GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL, GGUF_STRING
from oracle_gen import TensorGen, model_gguf

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

# Two tiny configs that together cover every layer type. Dims that the model allows to be
# non-powers-of-two are. D must be a multiple of 32 (MXFP4 rows of gate/up), F a multiple of
# 32 (MXFP4 down) or 256 (Q2_K down).
CONFIGS = {
    "deepseek_v4_a": dict(
        # seed 1000 was rejected by the oracle (indexer top-k gap 1.6e-4 < 2e-4)
        seed=1001, n_tokens=64, vocab=97, hidden=96, layer_types=[SLIDING, CSA, HCA, CSA],
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"], csa_rate=4, hca_rate=8,
        heads=4, head_dim=40, rope_dim=8, q_lora=32, o_groups=2, o_lora=16,
        experts=6, top_k=2, moe_ff=32, index_heads=8, index_head_dim=24, index_topk=5, window=12,
        hc_mult=4, sinkhorn=20, hc_eps=1e-6, rms_eps=1e-6, swiglu_limit=10.0, routed_scale=1.5,
        rope_theta=10000.0, compress_rope_theta=160000.0,
        yarn=dict(factor=16.0, original_max_position_embeddings=65536, beta_fast=32.0, beta_slow=1.0),
        types=dict(embed=q.BF16, output=q.F16, attn=q.F16, compressor=q.BF16, hc_fn=q.F32,
                   shexp=q.Q8_0, gate=q.F32, exp_gate_up=q.MXFP4, exp_down=q.MXFP4),
    ),
    "deepseek_v4_b": dict(
        seed=2000, n_tokens=72, vocab=83, hidden=96, layer_types=[HCA, CSA],
        mlp_layer_types=["hash_moe", "moe"], csa_rate=4, hca_rate=16,
        heads=3, head_dim=48, rope_dim=12, q_lora=40, o_groups=3, o_lora=12,
        experts=4, top_k=2, moe_ff=256, index_heads=8, index_head_dim=16, index_topk=3, window=10,
        hc_mult=4, sinkhorn=13, hc_eps=1e-6, rms_eps=1e-5, swiglu_limit=1.5, routed_scale=2.5,
        rope_theta=20000.0, compress_rope_theta=80000.0,
        yarn=dict(factor=4.0, original_max_position_embeddings=4096, beta_fast=16.0, beta_slow=2.0),
        types=dict(embed=q.F16, output=q.BF16, attn=q.F16, compressor=q.F16, hc_fn=q.F16,
                   shexp=q.Q8_0, gate=q.F16, exp_gate_up=q.MXFP4, exp_down=q.Q2_K),
    ),
}


def derived(c):
    c = dict(c)
    c["layers"] = len(c["layer_types"])
    c["n_hash"] = sum(1 for t in c["mlp_layer_types"] if t == "hash_moe")
    assert c["mlp_layer_types"] == ["hash_moe"] * c["n_hash"] + ["moe"] * (c["layers"] - c["n_hash"])
    c["ratios"] = [0 if t == SLIDING else (c["csa_rate"] if t == CSA else c["hca_rate"]) for t in c["layer_types"]]
    c["partial_rotary_factor"] = c["rope_dim"] / c["head_dim"]
    assert int(c["head_dim"] * c["partial_rotary_factor"]) == c["rope_dim"]
    c["max_positions"] = int(c["yarn"]["factor"] * c["yarn"]["original_max_position_embeddings"])
    return c


def generate(name, seed):
    """Returns (config, TensorGen, tokens) for config `name` with parameters from `seed`."""
    c = derived(CONFIGS[name])
    rng = random.Random(seed)
    g = TensorGen(rng)
    D, V, H, hd, R = c["hidden"], c["vocab"], c["heads"], c["head_dim"], c["q_lora"]
    G, O, E, K, F = c["o_groups"], c["o_lora"], c["experts"], c["top_k"], c["moe_ff"]
    IH, I, hc = c["index_heads"], c["index_head_dim"], c["hc_mult"]
    T = c["types"]
    mix = (2 + hc) * hc
    g.dense("token_embd.weight", "model.embed_tokens.weight", [V, D], T["embed"], 1.0)
    for il in range(c["layers"]):
        b, p = f"blk.{il}.", f"model.layers.{il}."
        lt, ratio = c["layer_types"][il], c["ratios"][il]
        for site, hcn in (("attn", "attn_hc"), ("ffn", "ffn_hc")):
            g.dense(b + f"hc_{site}_fn.weight", p + f"{hcn}.fn", [mix, hc * D], T["hc_fn"], 1.0 / math.sqrt(hc * D))
            g.dense(b + f"hc_{site}_base.weight", p + f"{hcn}.base", [mix], q.F32, 0.5)
            g.values(b + f"hc_{site}_scale.weight", p + f"{hcn}.scale", [3], [rng.uniform(0.5, 1.5) for _ in range(3)])
        g.dense(b + "attn_norm.weight", p + "input_layernorm.weight", [D], q.F32, 0.2, 1.0)
        g.dense(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", [D], q.F32, 0.2, 1.0)
        a = p + "self_attn."
        g.dense(b + "attn_q_a.weight", a + "q_a_proj.weight", [R, D], T["attn"], 1.0 / math.sqrt(D))
        g.dense(b + "attn_q_a_norm.weight", a + "q_a_norm.weight", [R], q.F32, 0.2, 1.0)
        g.dense(b + "attn_q_b.weight", a + "q_b_proj.weight", [H * hd, R], T["attn"], 1.0 / math.sqrt(R))
        g.dense(b + "attn_kv.weight", a + "kv_proj.weight", [hd, D], T["attn"], 1.0 / math.sqrt(D))
        g.dense(b + "attn_kv_a_norm.weight", a + "kv_norm.weight", [hd], q.F32, 0.2, 1.0)
        g.dense(b + "attn_output_a.weight", a + "o_a_proj.weight", [G * O, H * hd // G], T["attn"],
                1.0 / math.sqrt(H * hd // G))
        g.dense(b + "attn_output_b.weight", a + "o_b_proj.weight", [D, G * O], T["attn"], 1.0 / math.sqrt(G * O))
        g.dense(b + "attn_sinks.weight", a + "sinks", [H], q.F32, 1.0)
        if ratio:
            cw = 2 if lt == CSA else 1
            cp = a + "compressor."
            g.dense(b + "attn_compressor_kv.weight", cp + "kv_proj.weight", [cw * hd, D], T["compressor"], 1.0 / math.sqrt(D))
            g.dense(b + "attn_compressor_gate.weight", cp + "gate_proj.weight", [cw * hd, D], T["compressor"], 1.0 / math.sqrt(D))
            g.dense(b + "attn_compressor_ape.weight", cp + "position_bias", [ratio, cw * hd], q.F32, 0.5)
            g.dense(b + "attn_compressor_norm.weight", cp + "kv_norm.weight", [hd], q.F32, 0.2, 1.0)
            if lt == CSA:
                ip = cp + "indexer."
                g.dense(b + "indexer.proj.weight", ip + "scorer.weights_proj.weight", [IH, D], q.F32, 1.0 / math.sqrt(D))
                g.dense(b + "indexer.attn_q_b.weight", ip + "q_b_proj.weight", [IH * I, R], T["compressor"], 1.0 / math.sqrt(R))
                g.dense(b + "indexer_compressor_kv.weight", ip + "kv_proj.weight", [2 * I, D], T["compressor"], 1.0 / math.sqrt(D))
                g.dense(b + "indexer_compressor_gate.weight", ip + "gate_proj.weight", [2 * I, D], T["compressor"], 1.0 / math.sqrt(D))
                g.dense(b + "indexer_compressor_ape.weight", ip + "position_bias", [ratio, 2 * I], q.F32, 0.5)
                g.dense(b + "indexer_compressor_norm.weight", ip + "kv_norm.weight", [I], q.F32, 0.2, 1.0)
        m = p + "mlp."
        g.dense(b + "ffn_gate_inp.weight", m + "gate.weight", [E, D], T["gate"], 2.0 / math.sqrt(D))
        if c["mlp_layer_types"][il] == "hash_moe":
            ids = []
            for _ in range(V):
                ids.extend(rng.sample(range(E), K))
            g.gguf.append((b + "ffn_gate_tid2eid.weight", [K, V], q.I32, struct.pack(f"<{len(ids)}i", *ids)))
            g.hf[m + "gate.tid2eid"] = ([V, K], ids)
        else:
            g.dense(b + "exp_probs_b.bias", m + "gate.e_score_correction_bias", [E], q.F32, 0.3)
        # routed experts: random raw blocks

        def expert(t, rows, cols):
            if t == q.MXFP4:
                raw = q.random_mxfp4(rng, rows * cols)
            elif t == q.Q2_K:
                raw = q.random_q2_k(rng, rows * cols)
            else:
                raise ValueError(t)
            return raw, q.dequant(t, raw)
        g.routed_experts(b, m, D, F, E, T["exp_gate_up"], T["exp_down"], expert)
        sh = m + "shared_experts."
        g.dense(b + "ffn_gate_shexp.weight", sh + "gate_proj.weight", [F, D], T["shexp"], 1.5 / math.sqrt(D))
        g.dense(b + "ffn_up_shexp.weight", sh + "up_proj.weight", [F, D], T["shexp"], 1.5 / math.sqrt(D))
        g.dense(b + "ffn_down_shexp.weight", sh + "down_proj.weight", [D, F], T["shexp"], 1.0 / math.sqrt(F))
    g.dense("output_hc_fn.weight", "model.hc_head.hc_fn", [hc, hc * D], T["hc_fn"], 1.0 / math.sqrt(hc * D))
    g.dense("output_hc_base.weight", "model.hc_head.hc_base", [hc], q.F32, 0.5)
    g.values("output_hc_scale.weight", "model.hc_head.hc_scale", [1], [rng.uniform(0.5, 1.5)])
    g.dense("output_norm.weight", "model.norm.weight", [D], q.F32, 0.2, 1.0)
    g.dense("output.weight", "lm_head.weight", [V, D], T["output"], 1.0 / math.sqrt(D))
    tokens = [rng.randrange(V) for _ in range(c["n_tokens"])]
    return c, g, tokens


def gguf_keys(c):
    """The deepseek4.* metadata keys, in the order llama.cpp's converter writes them."""
    return [
        ("context_length", c["max_positions"], GGUF_UINT32),
        ("embedding_length", c["hidden"], GGUF_UINT32),
        ("block_count", c["layers"], GGUF_UINT32),
        ("expert_count", c["experts"], GGUF_UINT32),
        ("expert_used_count", c["top_k"], GGUF_UINT32),
        ("attention.head_count", c["heads"], GGUF_UINT32),
        ("attention.head_count_kv", 1, GGUF_UINT32),
        ("attention.key_length", c["head_dim"], GGUF_UINT32),
        ("attention.value_length", c["head_dim"], GGUF_UINT32),
        ("rope.dimension_count", c["rope_dim"], GGUF_UINT32),
        ("rope.freq_base", c["rope_theta"], GGUF_FLOAT32),
        ("rope.scaling.type", "yarn", GGUF_STRING),
        ("rope.scaling.factor", c["yarn"]["factor"], GGUF_FLOAT32),
        ("rope.scaling.original_context_length", c["yarn"]["original_max_position_embeddings"], GGUF_UINT32),
        ("rope.scaling.yarn_beta_fast", c["yarn"]["beta_fast"], GGUF_FLOAT32),
        ("rope.scaling.yarn_beta_slow", c["yarn"]["beta_slow"], GGUF_FLOAT32),
        ("attention.layer_norm_rms_epsilon", c["rms_eps"], GGUF_FLOAT32),
        ("attention.q_lora_rank", c["q_lora"], GGUF_UINT32),
        ("attention.sliding_window", c["window"], GGUF_UINT32),
        ("expert_feed_forward_length", c["moe_ff"], GGUF_UINT32),
        ("expert_shared_count", 1, GGUF_UINT32),
        ("expert_weights_scale", c["routed_scale"], GGUF_FLOAT32),
        ("expert_weights_norm", True, GGUF_BOOL),
        ("swiglu_clamp_exp", [c["swiglu_limit"]] * c["layers"], None, GGUF_FLOAT32),
        ("swiglu_clamp_shexp", [c["swiglu_limit"]] * c["layers"], None, GGUF_FLOAT32),
        ("attention.indexer.head_count", c["index_heads"], GGUF_UINT32),
        ("attention.indexer.key_length", c["index_head_dim"], GGUF_UINT32),
        ("attention.indexer.top_k", c["index_topk"], GGUF_UINT32),
        ("attention.output_group_count", c["o_groups"], GGUF_UINT32),
        ("attention.output_lora_rank", c["o_lora"], GGUF_UINT32),
        ("attention.compress_rope_freq_base", c["compress_rope_theta"], GGUF_FLOAT32),
        ("attention.compress_ratios", c["ratios"], None, GGUF_INT32),
        ("hyper_connection.count", c["hc_mult"], GGUF_UINT32),
        ("hyper_connection.sinkhorn_iterations", c["sinkhorn"], GGUF_UINT32),
        ("hyper_connection.epsilon", c["hc_eps"], GGUF_FLOAT32),
        ("hash_layer_count", c["n_hash"], GGUF_UINT32),
        ("expert_gating_func", 4, GGUF_UINT32),
    ]


def gguf_bytes(c, g):
    return model_gguf("deepseek4", "expertpack tiny DeepSeek-V4 oracle", gguf_keys(c), g)
