"""Pure-Python half of the Kimi-Linear oracle: the tiny configs, the seeded random parameters,
the GGUF file (`kimi-linear` names, keys and shapes, see docs/models/kimi-linear.md) and the
dequantized values that the transformers model (KimiLinearForCausalLM, transformers 5.17) is
loaded with. No numpy/torch, so it can be run and checked anywhere.

Every tensor is generated once, as raw GGUF bytes of its chosen ggml type; the transformers model
receives exactly the values ggml dequantizes from those bytes. Parameters that transformers
initialises to 0 or 1 (norm weights, the router's correction bias, dt_bias, A_log, the gated norm)
are random here too.
"""
import math
import random

import ggml_py_quants as q
from ggml_py_gguf import GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL
from oracle_gen import TensorGen, model_gguf

KDA, MLA = "linear_attention", "full_attention"

# Two tiny configs that together cover: KDA and MLA layers, a dense first layer and MoE layers,
# MLA with and without a low-rank query, with and without the (un-rotated) shared "rope" key
# dims, renormalised and plain top-k weights, MXFP4 / Q8_0 experts, sequences longer than the
# transformers chunk size (64) so that the chunked KDA path crosses a chunk boundary.
CONFIGS = {
    "kimi_a": dict(
        seed=3000, n_tokens=80, vocab=101, hidden=64, layer_types=[KDA, MLA, KDA, MLA], n_dense=1,
        heads=4, q_lora=24, kv_lora=32, qk_nope=16, qk_rope=8, v_head=12,
        kda_heads=3, kda_head_dim=16, conv=4, ff=64,
        experts=8, top_k=2, moe_ff=32, n_shared=2, routed_scale=2.446, norm_topk=True,
        rms_eps=1e-5,
        types=dict(embed=q.BF16, output=q.F16, attn=q.F16, kda=q.F16, small=q.F32, dense=q.Q8_0,
                   shexp=q.Q8_0, exp_gate_up=q.MXFP4, exp_down=q.MXFP4),
    ),
    "kimi_b": dict(
        seed=4000, n_tokens=72, vocab=89, hidden=96, layer_types=[KDA, KDA, MLA], n_dense=0,
        heads=3, q_lora=None, kv_lora=24, qk_nope=20, qk_rope=0, v_head=16,
        kda_heads=2, kda_head_dim=24, conv=3, ff=64,
        experts=6, top_k=3, moe_ff=32, n_shared=1, routed_scale=1.5, norm_topk=False,
        rms_eps=1e-6,
        types=dict(embed=q.F16, output=q.BF16, attn=q.BF16, kda=q.F16, small=q.F16, dense=q.Q8_0,
                   shexp=q.F16, exp_gate_up=q.Q8_0, exp_down=q.MXFP4),
    ),
}


def derived(c):
    c = dict(c)
    c["layers"] = len(c["layer_types"])
    c["mlp_layer_types"] = ["dense" if i < c["n_dense"] else "sparse" for i in range(c["layers"])]
    c["head_count_kv"] = [1 if t == MLA else 0 for t in c["layer_types"]]
    c["kda_layers"] = [i + 1 for i, t in enumerate(c["layer_types"]) if t == KDA]
    c["full_attn_layers"] = [i + 1 for i, t in enumerate(c["layer_types"]) if t == MLA]
    return c


def generate(name, seed):
    """Returns (config, TensorGen, tokens) for config `name` with parameters from `seed`."""
    c = derived(CONFIGS[name])
    rng = random.Random(seed)
    g = TensorGen(rng)
    D, V, T = c["hidden"], c["vocab"], c["types"]
    H, R, KVL, NOPE, ROPE, VH = c["heads"], c["q_lora"], c["kv_lora"], c["qk_nope"], c["qk_rope"], c["v_head"]
    KH, KD, C = c["kda_heads"], c["kda_head_dim"], c["conv"]
    Di = KH * KD
    E, F, S, FF = c["experts"], c["moe_ff"], c["n_shared"], c["ff"]
    g.dense("token_embd.weight", "model.embed_tokens.weight", [V, D], T["embed"], 1.0)
    for il in range(c["layers"]):
        b, p = f"blk.{il}.", f"model.layers.{il}."
        g.dense(b + "attn_norm.weight", p + "input_layernorm.weight", [D], q.F32, 0.2, 1.0)
        g.dense(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", [D], q.F32, 0.2, 1.0)
        a = p + "self_attn."
        if c["layer_types"][il] == KDA:
            for x in "qkv":
                g.dense(b + f"attn_{x}.weight", a + f"{x}_proj.weight", [Di, D], T["kda"], 1.0 / math.sqrt(D))
            conv = []
            for x in "qkv":
                conv += g.dense(b + f"ssm_conv1d_{x}.weight", None, [Di, C], q.F32, 0.5, gguf_ne=[C, 1, Di])
            g.hf[a + "conv1d.weight"] = ([3 * Di, 1, C], conv)
            g.dense(b + "ssm_f_a.weight", a + "forget_gate.f_a_proj.weight", [KD, D], T["kda"], 1.0 / math.sqrt(D))
            g.dense(b + "ssm_f_b.weight", a + "forget_gate.f_b_proj.weight", [Di, KD], T["kda"], 1.0 / math.sqrt(KD))
            g.dense(b + "ssm_dt.bias", a + "forget_gate.dt_bias", [Di], q.F32, 1.0, -0.5)
            # A_log: decay rates exp(A_log) in [0.05, 2]; the GGUF holds -exp(A_log) (llama.cpp's fold)
            a_log = [q.f32_round(math.log(rng.uniform(0.05, 2.0))) for _ in range(KH)]
            g.hf[a + "forget_gate.A_log"] = ([1, 1, KH, 1], a_log)
            g.values(b + "ssm_a", None, [KH], [-math.exp(v) for v in a_log])
            g.dense(b + "ssm_beta.weight", a + "b_proj.weight", [KH, D], T["small"], 1.5 / math.sqrt(D))
            g.dense(b + "ssm_g_a.weight", a + "g_a_proj.weight", [KD, D], T["kda"], 1.0 / math.sqrt(D))
            g.dense(b + "ssm_g_b.weight", a + "g_b_proj.weight", [Di, KD], T["kda"], 1.5 / math.sqrt(KD))
            g.dense(b + "ssm_norm.weight", a + "o_norm.weight", [KD], q.F32, 0.2, 1.0)
            g.dense(b + "attn_output.weight", a + "o_proj.weight", [D, Di], T["kda"], 1.0 / math.sqrt(Di))
        else:
            QK = NOPE + ROPE
            if R:
                g.dense(b + "attn_q_a.weight", a + "q_a_proj.weight", [R, D], T["attn"], 1.0 / math.sqrt(D))
                g.dense(b + "attn_q_a_norm.weight", a + "q_a_layernorm.weight", [R], q.F32, 0.2, 1.0)
                g.dense(b + "attn_q_b.weight", a + "q_b_proj.weight", [H * QK, R], T["attn"], 1.0 / math.sqrt(R))
            else:
                g.dense(b + "attn_q.weight", a + "q_proj.weight", [H * QK, D], T["attn"], 1.0 / math.sqrt(D))
            g.dense(b + "attn_kv_a_mqa.weight", a + "kv_a_proj_with_mqa.weight", [KVL + ROPE, D], T["attn"],
                    1.0 / math.sqrt(D))
            g.dense(b + "attn_kv_a_norm.weight", a + "kv_a_layernorm.weight", [KVL], q.F32, 0.2, 1.0)
            g.dense(b + "attn_kv_b.weight", a + "kv_b_proj.weight", [H * (NOPE + VH), KVL], T["attn"],
                    1.0 / math.sqrt(KVL))
            g.dense(b + "attn_output.weight", a + "o_proj.weight", [D, H * VH], T["attn"], 1.0 / math.sqrt(H * VH))
        m = p + "mlp."
        if c["mlp_layer_types"][il] == "dense":
            g.dense(b + "ffn_gate.weight", m + "gate_proj.weight", [FF, D], T["dense"], 1.5 / math.sqrt(D))
            g.dense(b + "ffn_up.weight", m + "up_proj.weight", [FF, D], T["dense"], 1.5 / math.sqrt(D))
            g.dense(b + "ffn_down.weight", m + "down_proj.weight", [D, FF], T["dense"], 1.0 / math.sqrt(FF))
            continue
        g.dense(b + "ffn_gate_inp.weight", m + "gate.weight", [E, D], q.F32, 2.0 / math.sqrt(D))
        g.dense(b + "exp_probs_b.bias", m + "gate.e_score_correction_bias", [E], q.F32, 0.1)
        def expert(t, rows, cols):
            if t == q.MXFP4:
                raw = q.random_mxfp4(rng, rows * cols)
                return raw, q.dequant(t, raw)
            return g.plain(t, rows * cols, 1.5 / math.sqrt(cols))
        g.routed_experts(b, m, D, F, E, T["exp_gate_up"], T["exp_down"], expert)
        sh = m + "shared_experts."
        g.dense(b + "ffn_gate_shexp.weight", sh + "gate_proj.weight", [F * S, D], T["shexp"], 1.5 / math.sqrt(D))
        g.dense(b + "ffn_up_shexp.weight", sh + "up_proj.weight", [F * S, D], T["shexp"], 1.5 / math.sqrt(D))
        g.dense(b + "ffn_down_shexp.weight", sh + "down_proj.weight", [D, F * S], T["shexp"], 1.0 / math.sqrt(F * S))
    g.dense("output_norm.weight", "model.norm.weight", [D], q.F32, 0.2, 1.0)
    g.dense("output.weight", "lm_head.weight", [V, D], T["output"], 1.0 / math.sqrt(D))
    tokens = [rng.randrange(V) for _ in range(c["n_tokens"])]
    return c, g, tokens


def gguf_keys(c):
    """The kimi-linear.* metadata keys (docs/models/kimi-linear.md), in the order they are written."""
    keys = [
        ("context_length", 4096, GGUF_UINT32),
        ("embedding_length", c["hidden"], GGUF_UINT32),
        ("block_count", c["layers"], GGUF_UINT32),
        ("vocab_size", c["vocab"], GGUF_UINT32),
        ("feed_forward_length", c["ff"], GGUF_UINT32),
        ("attention.head_count", c["heads"], GGUF_UINT32),
        ("attention.head_count_kv", c["head_count_kv"], None, GGUF_INT32),
        ("attention.layer_norm_rms_epsilon", c["rms_eps"], GGUF_FLOAT32),
    ]
    if c["q_lora"]:
        keys.append(("attention.q_lora_rank", c["q_lora"], GGUF_UINT32))
    keys += [
        ("attention.kv_lora_rank", c["kv_lora"], GGUF_UINT32),
        ("attention.key_length", c["kv_lora"] + c["qk_rope"], GGUF_UINT32),
        ("attention.value_length", c["kv_lora"], GGUF_UINT32),
        ("attention.key_length_mla", c["qk_nope"] + c["qk_rope"], GGUF_UINT32),
        ("attention.value_length_mla", c["v_head"], GGUF_UINT32),
        ("rope.dimension_count", c["qk_rope"], GGUF_UINT32),
        ("ssm.conv_kernel", c["conv"], GGUF_UINT32),
        ("kda.head_dim", c["kda_head_dim"], GGUF_UINT32),
        ("kda.head_count", c["kda_heads"], GGUF_UINT32),
        ("expert_count", c["experts"], GGUF_UINT32),
        ("expert_used_count", c["top_k"], GGUF_UINT32),
        ("expert_group_count", 1, GGUF_UINT32),
        ("expert_group_used_count", 1, GGUF_UINT32),
        ("expert_feed_forward_length", c["moe_ff"], GGUF_UINT32),
        ("expert_shared_count", c["n_shared"], GGUF_UINT32),
        ("leading_dense_block_count", c["n_dense"], GGUF_UINT32),
        ("expert_weights_scale", c["routed_scale"], GGUF_FLOAT32),
        ("expert_weights_norm", c["norm_topk"], GGUF_BOOL),
        ("expert_gating_func", 2, GGUF_UINT32),
    ]
    return keys


def gguf_bytes(c, g):
    return model_gguf("kimi-linear", "expertpack tiny Kimi-Linear oracle", gguf_keys(c), g)
