#!/usr/bin/env python3
"""Compares two logit dumps of `ep-run --score --dump-logits` (raw little-endian f32
[tokens][vocab]): the reference (CPU) and the candidate (CUDA), over the rows both have (the
reference may score a prefix of the same sequence: the model is causal).

Prints max|dlogit|, max|logit| (reference) and their ratio, and the top-1 agreement over the rows
whose reference top-1/top-2 margin exceeds --margin. Exit status 1 when the ratio exceeds
--limit or a top-1 differs on such a row."""
import argparse
import array
import sys


def load(path, vocab):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    if len(a) % vocab:
        sys.exit(f"{path}: {len(a)} floats is not a whole number of rows of {vocab}")
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("reference")
    ap.add_argument("candidate")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--limit", type=float, default=2e-2)
    ap.add_argument("--margin", type=float, default=0.1)
    a = ap.parse_args()
    ref, got = load(a.reference, a.vocab), load(a.candidate, a.vocab)
    rows = min(len(ref), len(got)) // a.vocab
    if rows == 0:
        sys.exit("no rows to compare")
    try:
        import numpy as np
    except ImportError:
        np = None
    max_d = max_r = 0.0
    checked = agree = 0
    nonfinite = 0
    for r in range(rows):
        lo, hi = r * a.vocab, (r + 1) * a.vocab
        if np is not None:
            x = np.frombuffer(ref, dtype=np.float32, count=a.vocab, offset=lo * 4).astype(np.float64)
            y = np.frombuffer(got, dtype=np.float32, count=a.vocab, offset=lo * 4).astype(np.float64)
            nonfinite += int((~np.isfinite(y)).sum())
            max_d = max(max_d, float(np.abs(x - y).max()))
            max_r = max(max_r, float(np.abs(x).max()))
            top = np.argsort(-x, kind="stable")[:2]
            t1, t2 = int(top[0]), int(top[1])
            g = int(np.argmax(y))
        else:
            x, y = ref[lo:hi], got[lo:hi]
            nonfinite += sum(1 for v in y if v != v or v in (float("inf"), float("-inf")))
            max_d = max(max_d, max(abs(p - q) for p, q in zip(x, y)))
            max_r = max(max_r, max(abs(p) for p in x))
            order = sorted(range(a.vocab), key=lambda i: (-x[i], i))
            t1, t2 = order[0], order[1]
            g = max(range(a.vocab), key=lambda i: (y[i], -i))
        if x[t1] - x[t2] > a.margin:
            checked += 1
            agree += g == t1
    ratio = max_d / max_r if max_r > 0 else float("inf")
    print(f"compare {rows} rows: max|dlogit| {max_d:.4g}, max|logit| {max_r:.4g}, ratio {ratio:.3g} (limit {a.limit:g}); "
          f"top-1 equal on {agree} of {checked} rows with margin > {a.margin:g}; non-finite {nonfinite}")
    ok = ratio <= a.limit and agree == checked and nonfinite == 0
    print("compare: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
