#!/usr/bin/env python3
"""Checks that committed goldens are reproducible: regenerates each config's GGUF with a model's
pure-Python generator (no torch) from the seed recorded in NAME.json and compares it byte for byte
with the committed NAME.gguf (and its recorded SHA-256). Also checks the token ids and the logits
file size. One check for every model's goldens:

    python3 tests/oracle/golden_check.py deepseek_v4 [--data tests/data/deepseek_v4]
    python3 tests/oracle/golden_check.py kimi_linear [--data tests/data/kimi_linear]

kimi_k3_ref.py calls check_reproducible() for its own goldens. With --against DIR (the output of
a fresh oracle run on the GPU machine, e.g. `deepseek_v4.py --out DIR`) it also checks that the
oracle itself still reproduces the committed logits (max |dlogit| <= 1e-5 * max|logit|):

    python3 tests/oracle/golden_check.py deepseek_v4 --against DIR
"""
import argparse
import hashlib
import importlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(HERE), "data")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)


def check_reproducible(names, generate, gguf_bytes, data_dir):
    """generate(name, seed) -> (config, tensors, tokens); gguf_bytes(config, tensors) -> bytes.
    Returns 0 when every config in names reproduces, 1 otherwise (and prints one line per config)."""
    failed = False
    for name in names:
        meta_path = os.path.join(data_dir, f"{name}.json")
        if not os.path.exists(meta_path):
            print(f"FAIL {name}: {meta_path} missing")
            failed = True
            continue
        with open(meta_path) as f:
            meta = json.load(f)
        c, g, tokens = generate(name, meta["seed"])
        blob = gguf_bytes(c, g)
        with open(os.path.join(data_dir, f"{name}.gguf"), "rb") as f:
            committed = f.read()
        ok = blob == committed and hashlib.sha256(blob).hexdigest() == meta["gguf_sha256"] and tokens == meta["tokens"]
        n = os.path.getsize(os.path.join(data_dir, meta["logits_file"]))
        ok = ok and n == 4 * meta["logits_shape"][0] * meta["logits_shape"][1] and meta["logits_shape"][0] == len(tokens)
        print(f"{'ok' if ok else 'FAIL'} {name}: seed {meta['seed']}, {len(blob)} bytes, {len(tokens)} tokens")
        failed |= not ok
    return 1 if failed else 0


def read_f32(path):
    """A little-endian f32 file as a tuple of floats."""
    import struct
    with open(path, "rb") as f:
        raw = f.read()
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def check_against(names, data_dir, fresh_dir):
    """Compares a fresh oracle run's NAME.gguf / NAME.logits.f32 in fresh_dir with the committed
    goldens. Returns 0 when all match, 1 otherwise (one line per config)."""
    failed = False
    for name in names:
        with open(os.path.join(data_dir, f"{name}.json")) as f:
            meta = json.load(f)
        paths = [os.path.join(d, f"{name}.logits.f32") for d in (data_dir, fresh_dir)]
        if not os.path.exists(paths[1]):
            print(f"FAIL {name}: {paths[1]} missing")
            failed = True
            continue
        ref, got = (read_f32(p) for p in paths)
        with open(os.path.join(fresh_dir, f"{name}.gguf"), "rb") as f:
            same_gguf = hashlib.sha256(f.read()).hexdigest() == meta["gguf_sha256"]
        d = max(abs(a - b) for a, b in zip(ref, got)) if len(ref) == len(got) else float("inf")
        m = max(abs(v) for v in ref)
        ok = same_gguf and d <= 1e-5 * m and all(v == v for v in got)
        print(f"{'ok' if ok else 'FAIL'} {name}: fresh oracle run, same GGUF {same_gguf}, max|dlogit| {d:.3g} "
              f"of max|logit| {m:.4g}")
        failed |= not ok
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["deepseek_v4", "kimi_linear"], help="whose generator (<model>_gen.py)")
    ap.add_argument("--data", help="goldens folder (default: tests/data/<model>)")
    ap.add_argument("--against", help="also compare with a fresh oracle run's output folder")
    a = ap.parse_args()
    gen = importlib.import_module(f"{a.model}_gen")
    data = a.data or os.path.join(DATA, a.model)
    rc = check_reproducible(gen.CONFIGS, gen.generate, gen.gguf_bytes, data)
    if a.against:
        rc |= check_against(gen.CONFIGS, data, a.against)
    return rc


if __name__ == "__main__":
    sys.exit(main())
