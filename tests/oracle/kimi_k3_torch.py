"""The Kimi-K3 reference of kimi_k3_ref.py (same equations, same order of reductions where it
matters), vectorized in torch so that full-width models run on the GPU machine: float64 by
default, layer by layer, each dense matrix dequantized when its layer runs and each routed expert
when the tokens that picked it are computed, so memory stays far below the model's size.

    forward(torch, g, tokens, positions, device)  ->  {position: logits (float64 [vocab])}

`check_golden()` runs it on a committed golden: the tiny K3 one (tests/data/kimi_k3/k3_a,
kimi_k3_ref.py's pure-Python logits) and transformers' Kimi-Linear ones; full_width.py runs
those first.
"""
import math

import ggml_torch as gt


def config_from_gguf(g):
    """kimi_k3_ref's config dict from a kimi-k3 / kimi-linear GGUF's metadata."""
    a = g.key("general.architecture")
    k = lambda key, default=None: g.key(f"{a}.{key}", default)  # noqa: E731
    kv = k("attention.head_count_kv")
    n_layers = k("block_count")
    rope = k("rope.dimension_count", 0)
    c = dict(
        layers=n_layers, layer_types=["full_attention" if kv[i] else "linear_attention" for i in range(n_layers)],
        rms_eps=k("attention.layer_norm_rms_epsilon"), heads=k("attention.head_count"), q_lora=k("attention.q_lora_rank", 0),
        kv_lora=k("attention.kv_lora_rank"), qk_nope=k("attention.key_length_mla") - rope, qk_rope=rope,
        v_head=k("attention.value_length_mla"), conv=k("ssm.conv_kernel"), kda_head_dim=k("kda.head_dim"),
        n_dense=k("leading_dense_block_count", 1), experts=k("expert_count"), top_k=k("expert_used_count"),
        n_shared=k("expert_shared_count", 0), routed_scale=k("expert_weights_scale", 1.0),
        norm_topk=bool(k("expert_weights_norm", True)), latent=k("expert_latent_length", 0),
        attn_res_block=k("attn_res.block_size", 0),
    )
    c["kda_heads"] = k("kda.head_count", c["heads"])
    lb = k("kda.gate_lower_bound")
    c["gate_lower_bound"] = lb if lb is not None and math.isfinite(lb) else None
    if k("activation.situ_beta") is not None:
        c["situ_beta"], c["situ_linear_beta"] = k("activation.situ_beta"), k("activation.situ_linear_beta", 25.0)
    c["vocab"] = g.tensors["token_embd.weight"][0][1]
    c["hidden"] = g.tensors["token_embd.weight"][0][0]
    return c


class Model:
    def __init__(self, torch, g, device, dtype):
        self.torch, self.g, self.device, self.dtype = torch, g, device, dtype

    def t(self, name, shape=None):
        return gt.tensor(self.torch, self.g, name, self.device, shape).to(self.dtype)

    def expert(self, name, e):
        ne, t, _, _ = self.g.tensors[name]
        n = ne[0] * ne[1]
        return gt.dequant(self.torch, t, self.g.raw(name, e, 1), n, self.device).reshape(ne[1], ne[0]).to(self.dtype)


def forward(torch, g, tokens, positions, device="cuda", dtype=None, c=None, gaps=None):
    """{position: logits}; @p gaps (a dict), when given, receives "router": per-token smallest
    relative gap at the router's top-k cut-off over the MoE layers (a list of S floats)."""
    dtype = dtype or torch.float64
    c = c or config_from_gguf(g)
    m = Model(torch, g, device, dtype)
    F = torch.nn.functional
    eps = c["rms_eps"]
    S = len(tokens)
    ids = torch.tensor(tokens, device=device)

    def rms(x, w=None):
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
        return y * w if w is not None else y

    def act(gv, u):
        if c.get("situ_beta"):
            b, lb = c["situ_beta"], c["situ_linear_beta"]
            return b * torch.tanh(gv / b) * torch.sigmoid(gv) * (lb * torch.tanh(u / lb) if lb > 0 else u)
        return F.silu(gv) * u

    def glu(wg, wu, wd, x):
        return act(x @ wg.T, x @ wu.T) @ wd.T

    def mix(banked, cur, w):
        srcs = banked + [cur]
        sc = torch.stack([(rms(s) * w).sum(-1) for s in srcs], dim=0)  # [n, S]
        p = torch.softmax(sc, dim=0)
        return sum(p[i][:, None] * srcs[i] for i in range(len(srcs)))

    hs = m.t("token_embd.weight")[ids]
    K3res = c.get("attn_res_block", 0)
    banked = []
    for il, lt in enumerate(c["layer_types"]):
        b = f"blk.{il}."
        an, fn = m.t(b + "attn_norm.weight"), m.t(b + "ffn_norm.weight")
        h_in = mix(banked, hs, m.t(b + "attn_res_score.weight")) if K3res else hs
        xn = rms(h_in, an)
        out = kda(torch, c, m, b, xn) if lt == "linear_attention" else mla(torch, c, m, b, xn)
        if K3res and il % K3res == 0:
            banked = banked + [hs]
            hs = out
        else:
            hs = hs + out
        h2 = mix(banked, hs, m.t(b + "ffn_res_score.weight")) if K3res else hs
        hs = hs + ffn(torch, c, m, b, il, rms(h2, fn), glu, rms, gaps)
    if K3res:
        hs = mix(banked, hs, m.t("output_res_score.weight"))
    pos = sorted(set(positions))
    h = rms(hs[pos], m.t("output_norm.weight"))
    logits = h @ m.t("output.weight").T
    return {p: logits[i] for i, p in enumerate(pos)}


def kda(torch, c, m, b, xn):
    F = torch.nn.functional
    H, dk, K, eps = c["kda_heads"], c["kda_head_dim"], c["conv"], c["rms_eps"]
    S, Di = xn.shape[0], H * dk
    cv = {}
    for x in "qkv":
        proj = xn @ m.t(b + f"attn_{x}.weight").T                     # [S, Di]
        w = m.t(b + f"ssm_conv1d_{x}.weight", [Di, K])                 # channel -> K taps
        pad = torch.cat([torch.zeros(K - 1, Di, dtype=proj.dtype, device=proj.device), proj], dim=0)
        acc = sum(w[:, j] * pad[j:j + S] for j in range(K))            # tap j sees token t-(K-1)+j
        cv[x] = F.silu(acc)
    f = (xn @ m.t(b + "ssm_f_a.weight").T) @ m.t(b + "ssm_f_b.weight").T
    dt, ssm_a = m.t(b + "ssm_dt.bias"), m.t(b + "ssm_a")
    a_ch = ssm_a.repeat_interleave(dk)                                  # per channel
    lb = c.get("gate_lower_bound")
    if lb:
        gdec = lb * torch.sigmoid(-a_ch * (f + dt))
    else:
        gdec = a_ch * torch.where(f + dt > 20.0, f + dt, torch.log1p(torch.exp(f + dt)))
    beta = torch.sigmoid(xn @ m.t(b + "ssm_beta.weight").T)             # [S, H]
    if m.g.has(b + "ssm_g.weight"):
        gate = xn @ m.t(b + "ssm_g.weight").T
    else:
        gate = (xn @ m.t(b + "ssm_g_a.weight").T) @ m.t(b + "ssm_g_b.weight").T
    onorm = m.t(b + "ssm_norm.weight")
    q = cv["q"].reshape(S, H, dk)
    k = cv["k"].reshape(S, H, dk)
    v = cv["v"].reshape(S, H, dk)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    decay = torch.exp(gdec).reshape(S, H, dk)
    st = torch.zeros(H, dk, dk, dtype=xn.dtype, device=xn.device)     # [h, i (key), j (value)]
    outs = []
    for t in range(S):
        st = st * decay[t][:, :, None]
        mem = torch.einsum("hij,hi->hj", st, k[t])
        delta = (v[t] - mem) * beta[t][:, None]
        st = st + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hij,hi->hj", st, q[t]))
    o = torch.stack(outs, dim=0)                                        # [S, H, dk]
    on = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + eps) * onorm
    normed = (on * torch.sigmoid(gate.reshape(S, H, dk))).reshape(S, Di)
    return normed @ m.t(b + "attn_output.weight").T


def mla(torch, c, m, b, xn):
    H, KVL, NOPE, ROPE, VH, eps = c["heads"], c["kv_lora"], c["qk_nope"], c["qk_rope"], c["v_head"], c["rms_eps"]
    QK, S = NOPE + ROPE, xn.shape[0]

    def rms(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w

    if c["q_lora"]:
        qs = rms(xn @ m.t(b + "attn_q_a.weight").T, m.t(b + "attn_q_a_norm.weight")) @ m.t(b + "attn_q_b.weight").T
    else:
        qs = xn @ m.t(b + "attn_q.weight").T
    ckv = xn @ m.t(b + "attn_kv_a_mqa.weight").T                        # [S, KVL + ROPE]
    if m.g.has(b + "attn_kv_b.weight"):
        kvb = m.t(b + "attn_kv_b.weight")                                # [H (nope + v), KVL]
    else:  # llama.cpp's split: k_b {nope, KVL, H} (transposed), v_b {KVL, v, H}
        kb = m.t(b + "attn_k_b.weight", [H, KVL, NOPE])
        vb = m.t(b + "attn_v_b.weight", [H, VH, KVL])
        kvb = torch.cat([kb.transpose(1, 2), vb], dim=1).reshape(H * (NOPE + VH), KVL)
    kv = (rms(ckv[:, :KVL], m.t(b + "attn_kv_a_norm.weight")) @ kvb.T).reshape(S, H, NOPE + VH)
    keys = torch.cat([kv[:, :, :NOPE], ckv[:, None, KVL:].expand(S, H, ROPE)], dim=-1)  # [S, H, QK]
    vals = kv[:, :, NOPE:]
    q = qs.reshape(S, H, QK)
    sc = torch.einsum("thd,shd->hts", q, keys) / math.sqrt(QK)
    mask = torch.ones(S, S, dtype=torch.bool, device=xn.device).tril()
    p = torch.softmax(sc.masked_fill(~mask, float("-inf")), dim=-1)
    att = torch.einsum("hts,shd->thd", p, vals).reshape(S, H * VH)
    if m.g.has(b + "attn_gate.weight"):
        att = att * torch.sigmoid(xn @ m.t(b + "attn_gate.weight").T)
    return att @ m.t(b + "attn_output.weight").T


def ffn(torch, c, m, b, il, xn, glu, rms, gaps=None):
    if il < c["n_dense"]:
        return glu(m.t(b + "ffn_gate.weight"), m.t(b + "ffn_up.weight"), m.t(b + "ffn_down.weight"), xn)
    E, K = c["experts"], c["top_k"]
    s = torch.sigmoid(xn @ m.t(b + "ffn_gate_inp.weight").T)             # [S, E]
    sel = s + m.t(b + "exp_probs_b.bias")
    choice = torch.topk(sel, K, dim=-1).indices
    if gaps is not None and K < E:
        srt = sel.sort(dim=-1, descending=True).values
        gap = ((srt[:, K - 1] - srt[:, K]) / srt[:, K - 1].abs().clamp(min=1.0)).tolist()
        old = gaps.get("router")
        gaps["router"] = gap if old is None else [min(x, y) for x, y in zip(old, gap)]
    w = torch.gather(s, 1, choice)
    if c["norm_topk"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * c["routed_scale"]
    latent = c.get("latent", 0)
    xe = xn @ m.t(b + "ffn_routed_down.weight").T if latent else xn
    y = torch.zeros_like(xe)
    for e in torch.unique(choice).tolist():
        tok, slot = (choice == e).nonzero(as_tuple=True)
        ye = glu(m.expert(b + "ffn_gate_exps.weight", e), m.expert(b + "ffn_up_exps.weight", e),
                 m.expert(b + "ffn_down_exps.weight", e), xe[tok])
        y.index_add_(0, tok, w[tok, slot][:, None] * ye)
    if latent:
        rn = m.t(b + "ffn_routed_norm.weight") if m.g.has(b + "ffn_routed_norm.weight") else None
        y = rms(y, rn) @ m.t(b + "ffn_routed_up.weight").T
    if c["n_shared"]:
        y = y + glu(m.t(b + "ffn_gate_shexp.weight"), m.t(b + "ffn_up_shexp.weight"), m.t(b + "ffn_down_shexp.weight"), xn)
    return y


def check_golden(torch, base, device="cpu"):
    """This port against a committed golden (base.{gguf,json,logits.f32}: tests/data/kimi_k3/k3_a
    from kimi_k3_ref.py, tests/data/kimi_linear/kimi_* from transformers): (max|dlogit|, max|logit|)."""
    import json
    import struct
    with open(base + ".json") as f:
        meta = json.load(f)
    with open(base + ".logits.f32", "rb") as f:
        raw = f.read()
    V = meta["logits_shape"][1]
    ref = struct.unpack(f"<{len(raw) // 4}f", raw)
    got = forward(torch, gt.Gguf(base + ".gguf"), meta["tokens"], list(range(len(meta["tokens"]))), device)
    worst = max(abs(float(row[v]) - ref[p * V + v]) for p, row in got.items() for v in range(V))
    return worst, meta["max_abs_logit"]
