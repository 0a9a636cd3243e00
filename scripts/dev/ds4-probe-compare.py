#!/usr/bin/env python3
"""Compares engines' logits at the last prompt position of short token sequences (the probes of
tests/oracle/full_width.py --probes): the reference (transformers in float32, NAME.probes.json),
ours (`ep-run --score --dump-topk`), antirez/ds4 (`ds4 --dump-logprobs`, its step 0 is the last
prompt position), and the reference with the last position's k-th expert of the last
data-routed layer swapped for the (k+1)-th (what a routing near tie tipped the other way gives).

  ds4-probe-compare.py --probes ds4_iq2.probes.json --dir RUN_DIR

RUN_DIR holds, per probe name P: ours-P.json, and ds4-MODE-P.json for any MODE (cuda, quality,
cpu). Prints, per probe and engine, max |dlogit| over the reference's top-40 ids against the
reference and against the swapped reference, whether the top-1 agrees with each, and the
router's selection gap at the last position in each data-routed layer (relative: k-th minus
(k+1)-th biased score). An engine closer to the swapped reference than to the reference at a
position with a small gap took the other expert there."""
import argparse
import glob
import json
import os
import sys


def ours_last(path, pos):
    d = json.load(open(path))
    for s in d["steps"]:
        if s["pos"] == pos:
            return {int(i): float(v) for i, v in s["topk"]}
    sys.exit(f"{path}: no position {pos}")


def ds4_first_step(path):
    """ds4's logits at the last prompt position, or None (with a line saying why) for a run that wrote none."""
    try:
        with open(path) as f:
            steps = json.load(f).get("steps") or []
    except (OSError, ValueError) as e:
        print(f"   {path}: not read ({e})")
        return None
    if not steps:
        print(f"   {path}: no steps")
        return None
    return {int(t["token"]["id"]): float(t["logit"]) for t in steps[0]["top_logprobs"]}


def compare(got, ids, ref):
    common = [i for i in ids if i in got]
    if not common:
        return None, 0
    return max(abs(got[i] - ref[i]) for i in common), len(ids) - len(common)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    probes = json.load(open(a.probes))["probes"]
    for name, p in probes.items():
        last = len(p["tokens"]) - 1
        ref_row = p["positions"][last]
        ref = dict(zip(ref_row["top_ids"], ref_row["top_logits"]))
        ids = ref_row["top_ids"]
        sw = p["swapped_last"]
        swapped = dict(zip(sw["top_ids"], sw["top_logits"]))
        print(f"== {name}: {len(p['tokens'])} tokens, last position {last}, max|logit| {ref_row['max_abs']:.3f}")
        for il in p["routed_layers"]:
            g = p["layers"][str(il)]
            print(f"   layer {il} router gap at the last position {g['gap'][last]:.3g} (k-th expert {g['kth'][last]}, "
                  f"next {g['next'][last]}); smallest over the sequence {min(g['gap']):.3g}")
        print(f"   swapping layer {sw['layer']}'s k-th expert at the last position moves the logits by up to "
              f"{p['swap_max_dlogit']:.3f}; reference top-1 {ids[0]}, swapped top-1 {sw['top_ids'][0]}")
        engines = []
        ours = os.path.join(a.dir, f"ours-{name}.json")
        if os.path.exists(ours):
            engines.append(("ours", ours_last(ours, last)))
        for f in sorted(glob.glob(os.path.join(a.dir, f"ds4-*-{name}.json"))):
            mode = os.path.basename(f)[len("ds4-"):-len(f"-{name}.json")]
            got = ds4_first_step(f)
            if got is not None:
                engines.append((f"ds4 {mode}", got))
        for label, got in engines:
            d_ref, miss = compare(got, ids, ref)
            d_sw, _ = compare(got, sw["top_ids"], swapped)
            top = max(got, key=got.get)
            print(f"   {label:12s} vs reference {d_ref:.4f} ({miss} of its top-40 ids absent), vs swapped {d_sw:.4f}; "
                  f"top-1 {top} ({'=' if top == ids[0] else '!='} reference, {'=' if top == sw['top_ids'][0] else '!='} swapped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
