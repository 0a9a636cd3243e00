"""The torch half shared by the transformers oracles (deepseek_v4.py, kimi_linear.py): per-layer
output hooks, transformers' own cached-decode check, the save_pretrained() manifest, writing a
golden's files, and the command line. Imports torch lazily: `--gguf-only` runs without it.
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import traceback


def record_layer_outputs(model, n_tokens, debug, hooks):
    """Hooks that append (name, [S, -1] float tensor) to `debug` for every decoder layer's
    attention output, MLP output and layer output; the handles go to `hooks`."""
    def rec(name):
        def hook(mod, inp, out):
            o = out[0] if isinstance(out, tuple) else out
            debug.append((name, o.detach().float().reshape(n_tokens, -1).clone()))
        return hook
    for il, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.register_forward_hook(rec(f"layer{il}.attn_out")))
        hooks.append(layer.mlp.register_forward_hook(rec(f"layer{il}.mlp_out")))
        hooks.append(layer.register_forward_hook(rec(f"layer{il}.out")))


def hf_decode_diff(model, tokens, full_logits, n_decode=8, attention_mask=False):
    """transformers' own cached path: prefill S − n_decode tokens, then decode one by one; returns
    the largest |logit| difference from the full no-cache forward. attention_mask: pass an all-ones
    mask (models whose cache path needs one)."""
    import torch
    ids = torch.tensor([tokens], dtype=torch.long)
    S = len(tokens)

    def mask(n):
        return dict(attention_mask=torch.ones_like(ids[:, :n])) if attention_mask else {}
    with torch.no_grad():
        out = model(input_ids=ids[:, :S - n_decode], use_cache=True, **mask(S - n_decode))
        pkv = out.past_key_values
        diffs = [float((out.logits[0] - full_logits[:S - n_decode]).abs().max())]
        for t in range(S - n_decode, S):
            o = model(input_ids=ids[:, t:t + 1], past_key_values=pkv, use_cache=True,
                      position_ids=torch.tensor([[t]]), **mask(t + 1))
            pkv = o.past_key_values
            diffs.append(float((o.logits[0, -1] - full_logits[t]).abs().max()))
    return max(diffs)


def saved_manifest(model, fingerprint=None):
    """What save_pretrained() writes: (config.json, every tensor's name/file/shape/dtype [and
    fingerprint(tensor) as "fp"], the file names)."""
    from safetensors import safe_open
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        with open(os.path.join(d, "config.json")) as f:
            config_json = json.load(f)
        tensors = []
        for fn in sorted(os.listdir(d)):
            if not fn.endswith(".safetensors"):
                continue
            with safe_open(os.path.join(d, fn), "pt") as sf:
                for k in sorted(sf.keys()):
                    t = sf.get_tensor(k)
                    row = dict(name=k, file=fn, shape=list(t.shape), dtype=str(t.dtype).replace("torch.", ""))
                    if fingerprint:
                        row["fp"] = fingerprint(t)
                    tensors.append(row)
        files = sorted(os.listdir(d))
    return config_json, tensors, files


def add_hf_checks(result, model, tokens, logits, fingerprint=None, attention_mask=False):
    """Adds transformers' cached-decode difference, the state_dict list and the save_pretrained()
    manifest to `result` (a failure of either check is recorded, not raised)."""
    try:
        result["hf_decode_max_diff"] = hf_decode_diff(model, tokens, logits, attention_mask=attention_mask)
    except Exception:  # noqa: BLE001
        result["hf_decode_error"] = traceback.format_exc()
    result["state_dict"] = [dict(name=k, shape=list(v.shape), dtype=str(v.dtype).replace("torch.", ""))
                            for k, v in model.state_dict().items()]
    try:
        result["hf_config_json"], result["saved_tensors"], result["saved_files"] = saved_manifest(model, fingerprint)
    except Exception:  # noqa: BLE001
        result["save_error"] = traceback.format_exc()


def write_golden(out_dir, name, result, gguf, logits, debug, t0, note=""):
    """Writes NAME.gguf, NAME.logits.f32 (little-endian f32), NAME.debug.f32 (+ its index in the
    json) and NAME.json (result + file names + sha256 + seconds), and prints one line."""
    with open(os.path.join(out_dir, f"{name}.gguf"), "wb") as f:
        f.write(gguf)
    result["gguf_file"] = f"{name}.gguf"
    result["gguf_sha256"] = hashlib.sha256(gguf).hexdigest()
    with open(os.path.join(out_dir, f"{name}.logits.f32"), "wb") as f:
        f.write(logits.contiguous().numpy().astype("<f4").tobytes())
    index, off = [], 0
    with open(os.path.join(out_dir, f"{name}.debug.f32"), "wb") as f:
        for dname, t in debug:
            b = t.contiguous().numpy().astype("<f4").tobytes()
            f.write(b)
            index.append(dict(name=dname, shape=list(t.shape), offset=off))
            off += len(b)
    result["debug_index"] = index
    result["seconds"] = time.time() - t0
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"[{name}] ok: seed {result['seed']}, max|logit| {result['max_abs_logit']:.4g}, deterministic "
          f"{result['deterministic']}, hf decode diff {result.get('hf_decode_max_diff')}{note}, "
          f"{result['seconds']:.1f}s", flush=True)


def main(gen, run_config, max_attempts, deterministic_algorithms=False):
    """The oracles' command line: --out DIR [--configs a,b] [--gguf-only] [--max-attempts N].
    run_config(name, out_dir, max_attempts) makes one golden; a failing config leaves
    NAME.error.txt and makes the exit status 1."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default=",".join(gen.CONFIGS))
    ap.add_argument("--gguf-only", action="store_true", help="write only the GGUF files (no torch)")
    ap.add_argument("--max-attempts", type=int, default=max_attempts)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    names = [n for n in a.configs.split(",") if n]
    if a.gguf_only:
        for n in names:
            c, g, tokens = gen.generate(n, gen.CONFIGS[n]["seed"])
            with open(os.path.join(a.out, f"{n}.gguf"), "wb") as f:
                f.write(gen.gguf_bytes(c, g))
            print(n, "tokens", tokens)
        return 0
    import torch
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    if deterministic_algorithms:
        torch.use_deterministic_algorithms(True)
    rc = 0
    for n in names:
        try:
            run_config(n, a.out, a.max_attempts)
        except Exception:  # noqa: BLE001
            rc = 1
            tb = traceback.format_exc()
            print(tb, file=sys.stderr, flush=True)
            with open(os.path.join(a.out, f"{n}.error.txt"), "w") as f:
                f.write(tb)
    return rc
