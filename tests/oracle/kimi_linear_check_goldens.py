#!/usr/bin/env python3
"""Checks that the committed Kimi-Linear goldens are reproducible: regenerates each config's GGUF
with the pure-Python generator (kimi_linear_gen, no torch) from the seed recorded in NAME.json and
compares it byte for byte with the committed NAME.gguf (and its recorded SHA-256). Also checks the
token ids and the logits file size.

    python3 tests/oracle/kimi_linear_check_goldens.py [--data tests/data/kimi_linear]
"""
import argparse
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import kimi_linear_gen as gen  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "data", "kimi_linear"))
    a = ap.parse_args()
    failed = False
    for name in gen.CONFIGS:
        meta_path = os.path.join(a.data, f"{name}.json")
        if not os.path.exists(meta_path):
            print(f"FAIL {name}: {meta_path} missing")
            failed = True
            continue
        with open(meta_path) as f:
            meta = json.load(f)
        c, g, tokens = gen.generate(name, meta["seed"])
        blob = gen.gguf_bytes(c, g)
        with open(os.path.join(a.data, f"{name}.gguf"), "rb") as f:
            committed = f.read()
        ok = blob == committed and hashlib.sha256(blob).hexdigest() == meta["gguf_sha256"] and tokens == meta["tokens"]
        n = os.path.getsize(os.path.join(a.data, meta["logits_file"]))
        ok = ok and n == 4 * meta["logits_shape"][0] * meta["logits_shape"][1] and meta["logits_shape"][0] == len(tokens)
        print(f"{'ok' if ok else 'FAIL'} {name}: seed {meta['seed']}, {len(blob)} bytes, {len(tokens)} tokens")
        failed |= not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
