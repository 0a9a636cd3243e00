#!/usr/bin/env python3
"""Golden token ids from HF `tokenizers` for the committed tokenizer corpus.

Run from the repository root on a machine with `tokenizers` (and optionally `transformers` and
`tiktoken`) installed; no network is needed:

    python3 tests/oracle/tokenizer_goldens.py \
        --tokenizer .oracle-data/deepseek-v3/tokenizer.json \
        --out $OUT/deepseek_v3_goldens.jsonl

The output is JSON lines (UTF-8):
  * one {"text": ..., "ids": [...], "decoded": ...} per corpus string, in corpus order
    (Tokenizer.encode(text, add_special_tokens=False), Tokenizer.decode(ids, skip_special_tokens=False));
  * then records with a "kind" field:
      "meta"         versions, corpus size, hash of tokenizer.json;
      "decode"       {"ids": [...], "decoded": ...} for seeded random id sequences (partial UTF-8,
                     special tokens, single bytes) -- checks the lossy UTF-8 policy of the decoder;
      "probe"        what HF does on edge cases (lone surrogates, unknown ids);
      "add_special"  transformers AutoTokenizer(...)(text, add_special_tokens=True) ids;
      "tiktoken"     {"i": corpus index, "ids": [...]} from tiktoken with ranks = the byte-level vocab
                     of tokenizer.json and the cl100k split pattern (checks the tiktoken-format path);
      "tiktoken_kimi" the same with Kimi's split pattern (tokenization_kimi.py), every 3rd string from 1;
      "bench"        encode speed of HF tokenizers (and tiktoken) over the corpus in MB/s.
Speeds are also printed on stderr.
"""
import argparse
import hashlib
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import tokenizer_corpus  # noqa: E402

CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
                  r"""\s*[\r\n]|\s+(?!\S)|\s+""")
# Kimi (tokenization_kimi.py) split pattern, in the fancy-regex/Rust syntax tiktoken uses
# (character-class intersection with &&).
KIMI_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
DECODE_SEED = 424242


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def bench(fn, texts, min_seconds=2.0):
    total_bytes = sum(len(t.encode("utf-8")) for t in texts)
    reps = 0
    t0 = time.perf_counter()
    while True:
        fn(texts)
        reps += 1
        dt = time.perf_counter() - t0
        if dt >= min_seconds:
            break
    return total_bytes * reps / dt / 1e6, reps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="path to tokenizer.json")
    ap.add_argument("--out", required=True, help="output goldens .jsonl")
    ap.add_argument("--corpus", default=os.path.join(REPO, "tests/data/tokenizer/corpus.jsonl"))
    ap.add_argument("--no-extras", action="store_true", help="only the corpus records")
    args = ap.parse_args(argv)

    import tokenizers
    from tokenizers import Tokenizer

    with open(args.corpus, encoding="utf-8") as f:
        corpus = [json.loads(line)["text"] for line in f]
    regenerated = tokenizer_corpus.generate(tokenizer_corpus.load_added_tokens(args.tokenizer))
    if regenerated != corpus:
        log(f"WARNING: {args.corpus} differs from tokenizer_corpus.generate() "
            f"({len(corpus)} vs {len(regenerated)} strings); using the committed file")
    with open(args.tokenizer, "rb") as f:
        tok_sha = hashlib.sha256(f.read()).hexdigest()

    tok = Tokenizer.from_file(args.tokenizer)
    records = []
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        records.append({"text": text, "ids": ids, "decoded": decoded})
    mismatched = sum(1 for r in records if r["decoded"] != r["text"])
    log(f"tokenizers {tokenizers.__version__}: {len(records)} strings encoded, "
        f"{sum(len(r['ids']) for r in records)} ids, {mismatched} decode(encode(x)) != x")

    extras = []
    if not args.no_extras:
        extras.append({"kind": "meta", "tokenizers": tokenizers.__version__, "python": sys.version.split()[0],
                       "corpus_strings": len(corpus), "tokenizer_sha256": tok_sha,
                       "corpus_matches_generator": regenerated == corpus})

        # Decode of random id sequences: lone bytes (incomplete UTF-8), specials, normal tokens.
        with open(args.tokenizer, encoding="utf-8") as f:
            tj = json.load(f)
        vocab = tj["model"]["vocab"]
        b2u = bytes_to_unicode()
        u2b = {v: k for k, v in b2u.items()}
        byte_ids = [vocab[b2u[b]] for b in range(256) if b2u[b] in vocab]
        high_byte_ids = [vocab[b2u[b]] for b in range(0x80, 0x100) if b2u[b] in vocab]
        added_ids = [t["id"] for t in tj["added_tokens"]]
        vocab_size = tok.get_vocab_size(with_added_tokens=True)
        rng = random.Random(DECODE_SEED)
        for _ in range(400):
            ids = []
            for _ in range(rng.randint(1, 12)):
                r = rng.random()
                if r < 0.45:
                    ids.append(rng.choice(high_byte_ids))
                elif r < 0.6:
                    ids.append(rng.choice(byte_ids))
                elif r < 0.75:
                    ids.append(rng.choice(added_ids))
                else:
                    ids.append(rng.randrange(0, len(vocab)))
            extras.append({"kind": "decode", "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
        for ids in ([0], [1, 0], [high_byte_ids[0]], [high_byte_ids[-1]] * 3, []):
            extras.append({"kind": "decode", "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
        # skip_special_tokens=True for a few sequences, for documentation.
        for ids in ([0, 100, 1], [128000, 300, 128001]):
            extras.append({"kind": "decode_skip_special", "ids": ids,
                           "decoded": tok.decode(ids, skip_special_tokens=True)})

        # Probes.
        def probe(name, fn):
            try:
                result = {"ok": fn()}
            except Exception as e:  # noqa: BLE001 - we record what happens
                result = {"error": f"{type(e).__name__}: {e}"}
            extras.append({"kind": "probe", "name": name, **result})
            log(f"probe {name}: {result}")

        probe("encode_lone_surrogate", lambda: tok.encode("a\ud800b", add_special_tokens=False).ids)
        probe("decode_unknown_id", lambda: tok.decode([vocab_size + 1000, 100], skip_special_tokens=False))
        probe("decode_negative_id", lambda: tok.decode([-1], skip_special_tokens=False))
        probe("encode_with_special_default", lambda: tok.encode("hi").ids)

        # transformers: BOS semantics of add_special_tokens=True from tokenizer_config.json.
        try:
            from transformers import AutoTokenizer
            hf = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.tokenizer)), local_files_only=True)
            for text in corpus[:40]:
                extras.append({"kind": "add_special", "text": text,
                               "ids": hf(text, add_special_tokens=True)["input_ids"]})
            log(f"transformers AutoTokenizer: {type(hf).__name__}, bos={hf.bos_token_id}")
        except Exception as e:  # noqa: BLE001
            log(f"transformers probe skipped: {type(e).__name__}: {e}")
            extras.append({"kind": "probe", "name": "transformers_add_special", "error": f"{type(e).__name__}: {e}"})

        # tiktoken with the byte-level vocab as ranks.
        tt_enc = None
        try:
            import tiktoken
            ranks = {}
            for s, i in vocab.items():
                try:
                    ranks[bytes(u2b[c] for c in s)] = i
                except KeyError:
                    pass  # tokens with characters outside the byte map are not byte-level tokens
            tt_enc = tiktoken.Encoding(name="deepseek_v3_ranks", pat_str=CL100K_PATTERN, mergeable_ranks=ranks,
                                       special_tokens={})
            extras.append({"kind": "tiktoken_meta", "tiktoken": getattr(tiktoken, "__version__", "?"),
                           "pattern": CL100K_PATTERN, "ranks": len(ranks)})
            for i, text in enumerate(corpus):
                if i % 3 == 0:
                    extras.append({"kind": "tiktoken", "i": i, "ids": tt_enc.encode_ordinary(text)})
            try:
                kimi_enc = tiktoken.Encoding(name="deepseek_v3_ranks_kimi_pattern", pat_str=KIMI_PATTERN,
                                             mergeable_ranks=ranks, special_tokens={})
                extras.append({"kind": "tiktoken_kimi_meta", "pattern": KIMI_PATTERN})
                for i, text in enumerate(corpus):
                    if i % 3 == 1:
                        extras.append({"kind": "tiktoken_kimi", "i": i, "ids": kimi_enc.encode_ordinary(text)})
            except Exception as e:  # noqa: BLE001
                log(f"tiktoken kimi-pattern goldens skipped: {type(e).__name__}: {e}")
                extras.append({"kind": "probe", "name": "tiktoken_kimi", "error": f"{type(e).__name__}: {e}"})
        except Exception as e:  # noqa: BLE001
            log(f"tiktoken goldens skipped: {type(e).__name__}: {e}")
            extras.append({"kind": "probe", "name": "tiktoken", "error": f"{type(e).__name__}: {e}"})

    # Speed.
    def hf_seq(texts):
        for t in texts:
            tok.encode(t, add_special_tokens=False)

    def hf_batch(texts):
        tok.encode_batch(texts, add_special_tokens=False)

    mbps_seq, reps_seq = bench(hf_seq, corpus)
    mbps_batch, reps_batch = bench(hf_batch, corpus)
    corpus_bytes = sum(len(t.encode("utf-8")) for t in corpus)
    log(f"HF tokenizers {tokenizers.__version__} encode, one call per string (1 thread): {mbps_seq:.2f} MB/s "
        f"({reps_seq} passes over {corpus_bytes} bytes)")
    log(f"HF tokenizers encode_batch (all {os.cpu_count()} cores): {mbps_batch:.2f} MB/s")
    bench_rec = {"kind": "bench", "corpus_bytes": corpus_bytes, "hf_encode_mb_s": round(mbps_seq, 3),
                 "hf_encode_batch_mb_s": round(mbps_batch, 3), "cpus": os.cpu_count()}
    if not args.no_extras and tt_enc is not None:
        mbps_tt, _ = bench(lambda texts: [tt_enc.encode_ordinary(t) for t in texts], corpus)
        log(f"tiktoken encode_ordinary (deepseek ranks, cl100k pattern, 1 thread): {mbps_tt:.2f} MB/s")
        bench_rec["tiktoken_encode_mb_s"] = round(mbps_tt, 3)
    if not args.no_extras:
        extras.append(bench_rec)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for r in records + extras:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    log(f"wrote {len(records)} goldens + {len(extras)} extra records -> {args.out} "
        f"({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
