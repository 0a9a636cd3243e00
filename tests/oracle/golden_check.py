#!/usr/bin/env python3
"""Checks that committed goldens are reproducible: regenerates each config's GGUF with a model's
pure-Python generator (no torch) from the seed recorded in NAME.json and compares it byte for byte
with the committed NAME.gguf (and its recorded SHA-256). Also checks the token ids and the logits
file size. One check for every model's goldens:

    python3 tests/oracle/golden_check.py deepseek_v4 [--data tests/data/deepseek_v4]
    python3 tests/oracle/golden_check.py kimi_linear [--data tests/data/kimi_linear]

kimi_k3_ref.py calls check_reproducible() for its own goldens.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["deepseek_v4", "kimi_linear"], help="whose generator (<model>_gen.py)")
    ap.add_argument("--data", help="goldens folder (default: tests/data/<model>)")
    a = ap.parse_args()
    gen = importlib.import_module(f"{a.model}_gen")
    return check_reproducible(gen.CONFIGS, gen.generate, gen.gguf_bytes, a.data or os.path.join(DATA, a.model))


if __name__ == "__main__":
    sys.exit(main())
