#!/usr/bin/env python3
"""Kimi-K3 reference: a pure-Python (float64, no numpy/torch) forward pass of the Kimi-Linear /
Kimi-K3 text model over the tensors of a GGUF we generate, plus the tiny seeded K3 configs, their
GGUF files (llama.cpp `kimi-k3` names and keys) and teacher-forced reference logits.

transformers 5.17 has no Kimi-K3 (only Kimi-Linear), and the project's GPU machine is the only one
with torch; so this reference is our own code. Its Kimi-Linear half is checked against
transformers: `--check-kimi-linear` runs it with every K3 feature off on the committed Kimi-Linear
goldens (tests/data/kimi_linear, made by transformers) and reports max|dlogit|. The K3 additions
follow llama.cpp `src/models/kimi-k3.cpp` as documented in docs/models/kimi-k3.md (each with its
source there):

  SiTU        act(g, u) = b·tanh(g/b)·σ(g) · lb·tanh(u/lb)         (dense, shared and routed experts)
  decay       g = lower_bound · σ(exp(A_log) · (f_b(f_a x) + dt_bias))  (replaces −exp(A_log)·softplus)
  KDA gate    σ(W_g x) with a full-rank W_g [D → Di]                 (replaces g_b(g_a x))
  MLA gate    attention output ⊙ σ(W_gate · x_normed) before o_proj
  latent MoE  router on x; experts on routed_down(x); Σ w·expert; rms_norm ⊙ routed_norm; routed_up
  AttnRes     residual replaced by softmax mixes over banked block sums (see attn_res_mix)

    python3 tests/oracle/kimi_k3_ref.py --out DIR            # K3 goldens (NAME.gguf/.json/.logits.f32)
    python3 tests/oracle/kimi_k3_ref.py --check-kimi-linear  # the reference vs transformers
    python3 tests/oracle/kimi_k3_ref.py --check-goldens      # committed K3 goldens reproducible
"""
import argparse
import hashlib
import json
import math
import os
import random
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import golden_check  # noqa: E402
import ggml_py_quants as q  # noqa: E402
import kimi_linear_gen as klg  # noqa: E402
from ggml_py_gguf import GGUF_UINT32, GGUF_FLOAT32  # noqa: E402
from oracle_gen import TensorGen, model_gguf  # noqa: E402

KDA, MLA = klg.KDA, klg.MLA
DATA = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "data")

CONFIGS = {
    "k3_a": dict(
        seed=5000, n_tokens=40, vocab=67, hidden=64, layer_types=[KDA, KDA, MLA, KDA, MLA], n_dense=1,
        heads=4, q_lora=24, kv_lora=32, qk_nope=16, qk_rope=8, v_head=12,
        kda_heads=3, kda_head_dim=16, conv=4, ff=64,
        experts=8, top_k=2, moe_ff=32, n_shared=2, routed_scale=1.7, norm_topk=True,
        rms_eps=1e-5, latent=32, attn_res_block=2, situ_beta=1.5, situ_linear_beta=2.0, gate_lower_bound=-5.0,
        types=dict(embed=q.BF16, output=q.F16, attn=q.F16, kda=q.F16, small=q.F32, dense=q.Q8_0,
                   shexp=q.Q8_0, exp_gate_up=q.MXFP4, exp_down=q.MXFP4),
    ),
}


# ---- pure-Python linear algebra (float64) ---------------------------------------------------
def matvec(W, x):
    """W: list of rows (out) of len(x)."""
    return [math.fsum(a * b for a, b in zip(row, x)) for row in W]


def rms_norm(x, w, eps):
    inv = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * inv * (w[i] if w is not None else 1.0) for i, v in enumerate(x)]


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def silu(x):
    return x * sigmoid(x)


def softplus20(x):
    return x if x > 20.0 else math.log1p(math.exp(x))


def act(c, g, u):
    if c.get("situ_beta"):
        b, lb = c["situ_beta"], c["situ_linear_beta"]
        return b * math.tanh(g / b) * sigmoid(g) * (lb * math.tanh(u / lb) if lb > 0 else u)
    return silu(g) * u


def glu(c, Wg, Wu, Wd, x):
    return matvec(Wd, [act(c, a, b) for a, b in zip(matvec(Wg, x), matvec(Wu, x))])


# ---- tensors -----------------------------------------------------------------------------------
class Tensors:
    """GGUF tensors (name, ne, type, raw) → float64 values; matrices as lists of rows of ne[0]."""

    def __init__(self, gguf_list):
        self.t = {name: (ne, t, raw) for name, ne, t, raw in gguf_list}

    def has(self, name):
        return name in self.t

    def vec(self, name):
        ne, t, raw = self.t[name]
        return q.dequant(t, raw)

    def mat(self, name):
        ne, t, raw = self.t[name]
        v = q.dequant(t, raw)
        n0 = ne[0]
        return [v[i:i + n0] for i in range(0, len(v), n0)]

    def experts(self, name):
        ne, t, raw = self.t[name]
        v = q.dequant(t, raw)
        n0, n1 = ne[0], ne[1]
        return [[v[(e * n1 + r) * n0:(e * n1 + r + 1) * n0] for r in range(n1)] for e in range(ne[2])]


# ---- the model -------------------------------------------------------------------------------
def attn_res_mix(banked, cur, w, eps):
    srcs = banked + [cur]
    sc = [math.fsum(a * b for a, b in zip(rms_norm(s, None, eps), w)) for s in srcs]
    m = max(sc)
    p = [math.exp(s - m) for s in sc]
    z = sum(p)
    return [math.fsum(p[i] / z * srcs[i][d] for i in range(len(srcs))) for d in range(len(cur))]


def forward(c, T, tokens):
    """Teacher-forced logits [S][V] of config c (klg-style dict, K3 keys optional) over tensors T."""
    S, eps = len(tokens), c["rms_eps"]
    K3res = c.get("attn_res_block", 0)
    emb = T.mat("token_embd.weight")
    hs = [list(emb[t]) for t in tokens]          # per token: the residual stream ("prefix")
    banked = [[] for _ in range(S)]
    for il, lt in enumerate(c["layer_types"]):
        b = f"blk.{il}."
        an, fn = T.vec(b + "attn_norm.weight"), T.vec(b + "ffn_norm.weight")
        if K3res:
            w = T.vec(b + "attn_res_score.weight")
            h_in = [attn_res_mix(banked[t], hs[t], w, eps) for t in range(S)]
        else:
            h_in = hs
        xn = [rms_norm(h, an, eps) for h in h_in]
        out = kda_layer(c, T, b, xn) if lt == KDA else mla_layer(c, T, b, xn)
        if K3res and il % K3res == 0:
            for t in range(S):
                banked[t] = banked[t] + [hs[t]]
            hs = out
        else:
            hs = [[a + o for a, o in zip(h, ot)] for h, ot in zip(hs, out)]
        if K3res:
            w = T.vec(b + "ffn_res_score.weight")
            h2 = [attn_res_mix(banked[t], hs[t], w, eps) for t in range(S)]
        else:
            h2 = hs
        xn = [rms_norm(h, fn, eps) for h in h2]
        out = ffn_layer(c, T, b, il, xn)
        hs = [[a + o for a, o in zip(h, ot)] for h, ot in zip(hs, out)]
    if K3res:
        w = T.vec("output_res_score.weight")
        hs = [attn_res_mix(banked[t], hs[t], w, eps) for t in range(S)]
    on, out_w = T.vec("output_norm.weight"), T.mat("output.weight")
    return [matvec(out_w, rms_norm(h, on, eps)) for h in hs]


def kda_layer(c, T, b, xn):
    H, dk, K, eps = c["kda_heads"], c["kda_head_dim"], c["conv"], c["rms_eps"]
    Di = H * dk
    S = len(xn)
    W = {x: T.mat(b + f"attn_{x}.weight") for x in "qkv"}
    conv = {x: T.mat(b + f"ssm_conv1d_{x}.weight") for x in "qkv"}  # rows: channel → K taps
    proj = {x: [matvec(W[x], v) for v in xn] for x in "qkv"}
    cv = {}
    for x in "qkv":
        rows = []
        for t in range(S):
            r = []
            for ch in range(Di):
                acc = 0.0
                for j in range(K):
                    s = t - (K - 1) + j
                    if s >= 0:
                        acc += conv[x][ch][j] * proj[x][s][ch]
                r.append(silu(acc))
            rows.append(r)
        cv[x] = rows
    fa, fb, dt = T.mat(b + "ssm_f_a.weight"), T.mat(b + "ssm_f_b.weight"), T.vec(b + "ssm_dt.bias")
    ssm_a = T.vec(b + "ssm_a")
    beta_w = T.mat(b + "ssm_beta.weight")
    onorm = T.vec(b + "ssm_norm.weight")
    lb = c.get("gate_lower_bound")
    if T.has(b + "ssm_g.weight"):
        gw = T.mat(b + "ssm_g.weight")
        gate_of = lambda x: matvec(gw, x)  # noqa: E731
    else:
        ga, gb = T.mat(b + "ssm_g_a.weight"), T.mat(b + "ssm_g_b.weight")
        gate_of = lambda x: matvec(gb, matvec(ga, x))  # noqa: E731
    wo = T.mat(b + "attn_output.weight")
    state = [[[0.0] * dk for _ in range(dk)] for _ in range(H)]
    outs = []
    for t in range(S):
        f = matvec(fb, matvec(fa, xn[t]))
        if lb:
            g = [lb * sigmoid(-ssm_a[ch // dk] * (f[ch] + dt[ch])) for ch in range(Di)]
        else:
            g = [ssm_a[ch // dk] * softplus20(f[ch] + dt[ch]) for ch in range(Di)]
        beta = [sigmoid(v) for v in matvec(beta_w, xn[t])]
        gate = gate_of(xn[t])
        normed = []
        for h in range(H):
            qh = cv["q"][t][h * dk:(h + 1) * dk]
            kh = cv["k"][t][h * dk:(h + 1) * dk]
            vh = cv["v"][t][h * dk:(h + 1) * dk]
            nq = math.sqrt(sum(v * v for v in qh) + 1e-6)
            nk = math.sqrt(sum(v * v for v in kh) + 1e-6)
            qh = [v / nq / math.sqrt(dk) for v in qh]
            kh = [v / nk for v in kh]
            St = state[h]
            for i in range(dk):
                e = math.exp(g[h * dk + i])
                St[i] = [v * e for v in St[i]]
            mem = [math.fsum(St[i][j] * kh[i] for i in range(dk)) for j in range(dk)]
            delta = [(vh[j] - mem[j]) * beta[h] for j in range(dk)]
            for i in range(dk):
                St[i] = [St[i][j] + kh[i] * delta[j] for j in range(dk)]
            o = [math.fsum(St[i][j] * qh[i] for i in range(dk)) for j in range(dk)]
            on = rms_norm(o, onorm, eps)
            normed += [on[j] * sigmoid(gate[h * dk + j]) for j in range(dk)]
        outs.append(matvec(wo, normed))
    return outs


def mla_layer(c, T, b, xn):
    H, KVL, NOPE, ROPE, VH, eps = c["heads"], c["kv_lora"], c["qk_nope"], c["qk_rope"], c["v_head"], c["rms_eps"]
    QK = NOPE + ROPE
    S = len(xn)
    if c["q_lora"]:
        qa, qan, qb = T.mat(b + "attn_q_a.weight"), T.vec(b + "attn_q_a_norm.weight"), T.mat(b + "attn_q_b.weight")
        qs = [matvec(qb, rms_norm(matvec(qa, x), qan, eps)) for x in xn]
    else:
        wq = T.mat(b + "attn_q.weight")
        qs = [matvec(wq, x) for x in xn]
    kva, kvn = T.mat(b + "attn_kv_a_mqa.weight"), T.vec(b + "attn_kv_a_norm.weight")
    if T.has(b + "attn_kv_b.weight"):
        kvb = T.mat(b + "attn_kv_b.weight")
    else:  # llama.cpp's split: k_b {nope, KVL, H} (transposed), v_b {KVL, v, H}
        kb, vb = T.vec(b + "attn_k_b.weight"), T.vec(b + "attn_v_b.weight")
        kvb = []
        for h in range(H):
            for i in range(NOPE):
                kvb.append([kb[(h * KVL + cc) * NOPE + i] for cc in range(KVL)])
            for j in range(VH):
                kvb.append(vb[(h * VH + j) * KVL:(h * VH + j + 1) * KVL])
    gate_w = T.mat(b + "attn_gate.weight") if T.has(b + "attn_gate.weight") else None
    wo = T.mat(b + "attn_output.weight")
    keys, vals = [], []
    for x in xn:
        ckv = matvec(kva, x)
        kv = matvec(kvb, rms_norm(ckv[:KVL], kvn, eps))
        keys.append([kv[h * (NOPE + VH):h * (NOPE + VH) + NOPE] + ckv[KVL:] for h in range(H)])
        vals.append([kv[h * (NOPE + VH) + NOPE:(h + 1) * (NOPE + VH)] for h in range(H)])
    scale = 1.0 / math.sqrt(QK)
    outs = []
    for t in range(S):
        att = []
        for h in range(H):
            qh = qs[t][h * QK:(h + 1) * QK]
            sc = [math.fsum(a * bb for a, bb in zip(qh, keys[j][h])) * scale for j in range(t + 1)]
            m = max(sc)
            p = [math.exp(s - m) for s in sc]
            z = sum(p)
            att += [math.fsum(p[j] / z * vals[j][h][i] for j in range(t + 1)) for i in range(VH)]
        if gate_w is not None:
            gt = matvec(gate_w, xn[t])
            att = [a * sigmoid(g) for a, g in zip(att, gt)]
        outs.append(matvec(wo, att))
    return outs


def ffn_layer(c, T, b, il, xn):
    if il < c["n_dense"]:
        Wg, Wu, Wd = T.mat(b + "ffn_gate.weight"), T.mat(b + "ffn_up.weight"), T.mat(b + "ffn_down.weight")
        return [glu(c, Wg, Wu, Wd, x) for x in xn]
    E, K, eps = c["experts"], c["top_k"], c["rms_eps"]
    router, bias = T.mat(b + "ffn_gate_inp.weight"), T.vec(b + "exp_probs_b.bias")
    eg, eu, ed = (T.experts(b + f"ffn_{x}_exps.weight") for x in ("gate", "up", "down"))
    latent = c.get("latent", 0)
    if latent:
        rd, ru = T.mat(b + "ffn_routed_down.weight"), T.mat(b + "ffn_routed_up.weight")
        rn = T.vec(b + "ffn_routed_norm.weight") if T.has(b + "ffn_routed_norm.weight") else None
    sh = None
    if c["n_shared"]:
        sh = (T.mat(b + "ffn_gate_shexp.weight"), T.mat(b + "ffn_up_shexp.weight"), T.mat(b + "ffn_down_shexp.weight"))
    outs = []
    for x in xn:
        s = [sigmoid(v) for v in matvec(router, x)]
        choice = sorted(range(E), key=lambda e: (-(s[e] + bias[e]), e))[:K]
        w = [s[e] for e in choice]
        if c["norm_topk"]:
            z = sum(w) + 1e-20
            w = [v / z for v in w]
        w = [v * c["routed_scale"] for v in w]
        xe = matvec(rd, x) if latent else x
        y = [0.0] * len(xe)
        for e, we in zip(choice, w):
            ye = glu(c, eg[e], eu[e], ed[e], xe)
            y = [a + we * v for a, v in zip(y, ye)]
        if latent:
            y = matvec(ru, rms_norm(y, rn, eps) if rn is not None else y)
        if sh:
            y = [a + v for a, v in zip(y, glu(c, *sh, x))]
        outs.append(y)
    return outs


def router_gap(c, T, tokens):
    """Not needed for correctness; the reference is deterministic. Kept minimal."""
    return None


# ---- K3 generator ------------------------------------------------------------------------------
def derived(c):
    c = klg.derived(c)
    return c


def generate(name, seed):
    c = derived(CONFIGS[name])
    rng = random.Random(seed)
    g = TensorGen(rng)
    D, V, T = c["hidden"], c["vocab"], c["types"]
    H, R, KVL, NOPE, ROPE, VH = c["heads"], c["q_lora"], c["kv_lora"], c["qk_nope"], c["qk_rope"], c["v_head"]
    KH, KD, C = c["kda_heads"], c["kda_head_dim"], c["conv"]
    Di = KH * KD
    E, F, S, FF, L = c["experts"], c["moe_ff"], c["n_shared"], c["ff"], c["latent"]
    g.dense("token_embd.weight", None, [V, D], T["embed"], 1.0)
    for il in range(c["layers"]):
        b = f"blk.{il}."
        g.dense(b + "attn_norm.weight", None, [D], q.F32, 0.2, 1.0)
        g.dense(b + "ffn_norm.weight", None, [D], q.F32, 0.2, 1.0)
        g.dense(b + "attn_res_score.weight", None, [D], q.F32, 1.0)
        g.dense(b + "ffn_res_score.weight", None, [D], q.F32, 1.0)
        if c["layer_types"][il] == KDA:
            for x in "qkv":
                g.dense(b + f"attn_{x}.weight", None, [Di, D], T["kda"], 1.0 / math.sqrt(D))
            for x in "qkv":
                g.dense(b + f"ssm_conv1d_{x}.weight", None, [Di, C], q.F32, 0.5, gguf_ne=[C, 1, Di])
            g.dense(b + "ssm_f_a.weight", None, [KD, D], T["kda"], 1.0 / math.sqrt(D))
            g.dense(b + "ssm_f_b.weight", None, [Di, KD], T["kda"], 1.0 / math.sqrt(KD))
            g.dense(b + "ssm_dt.bias", None, [Di], q.F32, 1.0, -0.5)
            g.values(b + "ssm_a", None, [KH], [-math.exp(math.log(rng.uniform(0.05, 2.0))) for _ in range(KH)])
            g.dense(b + "ssm_beta.weight", None, [KH, D], T["small"], 1.5 / math.sqrt(D))
            g.dense(b + "ssm_g.weight", None, [Di, D], T["kda"], 1.5 / math.sqrt(D))
            g.dense(b + "ssm_norm.weight", None, [KD], q.F32, 0.2, 1.0)
            g.dense(b + "attn_output.weight", None, [D, Di], T["kda"], 1.0 / math.sqrt(Di))
        else:
            QK = NOPE + ROPE
            g.dense(b + "attn_q_a.weight", None, [R, D], T["attn"], 1.0 / math.sqrt(D))
            g.dense(b + "attn_q_a_norm.weight", None, [R], q.F32, 0.2, 1.0)
            g.dense(b + "attn_q_b.weight", None, [H * QK, R], T["attn"], 1.0 / math.sqrt(R))
            g.dense(b + "attn_kv_a_mqa.weight", None, [KVL + ROPE, D], T["attn"], 1.0 / math.sqrt(D))
            g.dense(b + "attn_kv_a_norm.weight", None, [KVL], q.F32, 0.2, 1.0)
            # llama.cpp's split of kv_b: k_b {nope, KVL, H} (transposed per head), v_b {KVL, v, H}
            g.dense(b + "attn_k_b.weight", None, [H, KVL, NOPE], T["attn"], 1.0 / math.sqrt(KVL))
            g.dense(b + "attn_v_b.weight", None, [H, VH, KVL], T["attn"], 1.0 / math.sqrt(KVL))
            g.dense(b + "attn_gate.weight", None, [H * VH, D], T["attn"], 2.0 / math.sqrt(D))
            g.dense(b + "attn_output.weight", None, [D, H * VH], T["attn"], 1.0 / math.sqrt(H * VH))
        if c["mlp_layer_types"][il] == "dense":
            g.dense(b + "ffn_gate.weight", None, [FF, D], T["dense"], 1.5 / math.sqrt(D))
            g.dense(b + "ffn_up.weight", None, [FF, D], T["dense"], 1.5 / math.sqrt(D))
            g.dense(b + "ffn_down.weight", None, [D, FF], T["dense"], 1.0 / math.sqrt(FF))
            continue
        g.dense(b + "ffn_gate_inp.weight", None, [E, D], q.F32, 2.0 / math.sqrt(D))
        g.dense(b + "exp_probs_b.bias", None, [E], q.F32, 0.1)
        g.dense(b + "ffn_routed_down.weight", None, [L, D], T["attn"], 1.5 / math.sqrt(D))
        g.dense(b + "ffn_routed_up.weight", None, [D, L], T["attn"], 1.0 / math.sqrt(L))
        g.dense(b + "ffn_routed_norm.weight", None, [L], q.F32, 0.2, 1.0)
        for nm, rows, cols in (("gate", F, L), ("up", F, L), ("down", L, F)):
            raw = b"".join(q.random_mxfp4(rng, rows * cols, 122, 124) for _ in range(E))
            g.gguf.append((b + f"ffn_{nm}_exps.weight", [cols, rows, E], q.MXFP4, raw))
        g.dense(b + "ffn_gate_shexp.weight", None, [F * S, D], T["shexp"], 1.5 / math.sqrt(D))
        g.dense(b + "ffn_up_shexp.weight", None, [F * S, D], T["shexp"], 1.5 / math.sqrt(D))
        g.dense(b + "ffn_down_shexp.weight", None, [D, F * S], T["shexp"], 1.0 / math.sqrt(F * S))
    g.dense("output_res_score.weight", None, [D], q.F32, 1.0)
    g.dense("output_norm.weight", None, [D], q.F32, 0.2, 1.0)
    g.dense("output.weight", None, [V, D], T["output"], 1.0 / math.sqrt(D))
    tokens = [rng.randrange(V) for _ in range(c["n_tokens"])]
    return c, g, tokens


def gguf_keys(c):
    """The kimi-k3.* keys: Kimi-Linear's (no expert_group_count) plus the decay's lower bound, the
    latent width, the AttnRes block size and the SiTU constants (gguf-llamacpp.md §2.1)."""
    keys = [k for k in klg.gguf_keys(c) if k[0] != "expert_group_count"]
    at = [k[0] for k in keys].index("kda.head_count") + 1
    keys.insert(at, ("kda.gate_lower_bound", c["gate_lower_bound"], GGUF_FLOAT32))
    return keys + [
        ("expert_latent_length", c["latent"], GGUF_UINT32),
        ("attn_res.block_size", c["attn_res_block"], GGUF_UINT32),
        ("activation.situ_beta", c["situ_beta"], GGUF_FLOAT32),
        ("activation.situ_linear_beta", c["situ_linear_beta"], GGUF_FLOAT32),
    ]


def gguf_bytes(c, g):
    return model_gguf("kimi-k3", "expertpack tiny Kimi-K3 reference", gguf_keys(c), g)


def f32(values):
    return [q.f32_round(v) for v in values]


def write_golden(name, out_dir):
    t0 = time.time()
    c, g, tokens = generate(name, CONFIGS[name]["seed"])
    logits = forward(c, Tensors(g.gguf), tokens)
    blob = gguf_bytes(c, g)
    flat = [v for row in logits for v in row]
    with open(os.path.join(out_dir, f"{name}.gguf"), "wb") as f:
        f.write(blob)
    with open(os.path.join(out_dir, f"{name}.logits.f32"), "wb") as f:
        f.write(struct.pack(f"<{len(flat)}f", *f32(flat)))
    meta = dict(name=name, seed=CONFIGS[name]["seed"], config={k: v for k, v in c.items() if k != "types"},
                tokens=tokens, logits_file=f"{name}.logits.f32", logits_shape=[len(tokens), c["vocab"]],
                max_abs_logit=max(abs(v) for v in flat), gguf_sha256=hashlib.sha256(blob).hexdigest(),
                reference="tests/oracle/kimi_k3_ref.py (pure Python, float64)", python=sys.version)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"[{name}] {len(tokens)} tokens, max|logit| {meta['max_abs_logit']:.4g}, {time.time() - t0:.1f}s")


def check_kimi_linear(data_dir):
    """The reference (K3 features off) against transformers' Kimi-Linear goldens."""
    worst = 0.0
    for name in klg.CONFIGS:
        with open(os.path.join(data_dir, "kimi_linear", f"{name}.json")) as f:
            meta = json.load(f)
        c, g, tokens = klg.generate(name, meta["seed"])
        assert tokens == meta["tokens"]
        with open(os.path.join(data_dir, "kimi_linear", meta["logits_file"]), "rb") as f:
            raw = f.read()
        ref = struct.unpack(f"<{len(raw) // 4}f", raw)
        got = [v for row in forward(c, Tensors(g.gguf), tokens) for v in row]
        d = max(abs(a - b) for a, b in zip(got, ref))
        m = max(abs(v) for v in ref)
        worst = max(worst, d / m)
        print(f"kimi_k3_ref vs transformers {name}: max|dlogit| {d:.3g} of max|logit| {m:.4g} (ratio {d / m:.3g})")
    return 0 if worst <= 1e-4 else 1


def check_goldens(data_dir):
    return golden_check.check_reproducible(CONFIGS, generate, gguf_bytes, os.path.join(data_dir, "kimi_k3"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--check-kimi-linear", action="store_true")
    ap.add_argument("--check-goldens", action="store_true")
    a = ap.parse_args()
    rc = 0
    if a.check_kimi_linear:
        rc |= check_kimi_linear(a.data)
    if a.check_goldens:
        rc |= check_goldens(a.data)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        for n in CONFIGS:
            write_golden(n, a.out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
