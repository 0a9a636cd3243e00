#!/usr/bin/env python3
"""Deterministic tokenizer test corpus (standard library only).

The corpus is a list of strings that exercise the byte-level BPE tokenizer: many scripts, emoji
sequences, code, digit runs, every kind of whitespace, special tokens inside text, very long words,
punctuation clusters, combining marks and seeded random Unicode.  It is fully determined by SEED and
by the list of added tokens read from tokenizer.json.

    python3 tests/oracle/tokenizer_corpus.py \
        --tokenizer build/tests/data/tokenizer/deepseek-v3/tokenizer.json \
        --out tests/data/tokenizer/corpus.jsonl

writes one JSON object {"text": ...} per line (UTF-8, ensure_ascii=False).  The committed
tests/data/tokenizer/corpus.jsonl is what the C++ tests and tokenizer_goldens.py read.
"""
import argparse
import json
import random
import sys

SEED = 20261129

CHINESE = ("我们今天去公园散步天气很好人工智能正在改变世界北京上海广州深圳中华人民共和国"
           "学习编程需要耐心和坚持这是一个测试句子汉字繁體中文與簡體中文的區別龍鳳龜")
HIRAGANA = "".join(chr(c) for c in range(0x3041, 0x3097))
KATAKANA = "".join(chr(c) for c in range(0x30A1, 0x30FB)) + "ー"
JAPANESE_WORDS = ["こんにちは", "ありがとう", "カタカナ", "東京タワー", "ひらがな", "日本語の文章です",
                  "コンピューター", "ラーメン", "さようなら", "お元気ですか"]
KOREAN_WORDS = ["안녕하세요", "감사합니다", "한국어", "서울특별시", "컴퓨터", "사랑해요", "대한민국", "프로그래밍"]
ARABIC_WORDS = ["مرحبا", "بالعالم", "السلام", "عليكم", "اللغة", "العربية", "كتاب", "مدرسة", "الذكاء", "الاصطناعي",
                "مُحَمَّد", "٣٤٥٦", "شكرًا"]
HEBREW_WORDS = ["שלום", "עולם", "עברית", "ספר", "תודה", "ירושלים", "בְּרֵאשִׁית"]
DEVANAGARI_WORDS = ["नमस्ते", "दुनिया", "हिन्दी", "भारत", "कृत्रिम", "बुद्धिमत्ता", "संस्कृतम्", "१२३४५"]
THAI_WORDS = ["สวัสดี", "ภาษาไทย", "กรุงเทพมหานคร", "ขอบคุณครับ", "คอมพิวเตอร์", "๑๒๓"]
CYRILLIC_WORDS = ["Привет", "мир", "Москва", "программирование", "ёжик", "Україна", "щастя", "Съешь", "же", "ещё",
                  "этих", "мягких", "французских", "булок"]
GREEK_WORDS = ["Γειά", "σου", "Κόσμε", "φιλοσοφία", "Ἀθῆναι", "λόγος", "ΑΒΓΔ", "ψυχή"]
LATIN_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "World", "naïve", "café",
               "résumé", "Straße", "Ångström", "don't", "it's", "I'm", "we're", "they've", "ISN'T", "x", "A",
               "tokenizer", "BPE", "McDonald's", "e.g.", "U.S.A.", "o'clock", "rock'n'roll"]

EMOJI = ["😀", "😂", "🥲", "❤️", "👍", "🔥", "🎉", "🙏", "🤖", "🦄", "🍕", "🚀", "✨", "💯", "🇺🇸", "🇯🇵",
         "🇩🇪", "🇨🇳", "🇧🇷", "🏳️‍🌈", "🏴‍☠️", "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏽‍🚀", "👋🏻", "👋🏼", "👋🏽", "👋🏾",
         "👋🏿", "🤝🏾", "❤️‍🔥", "🫶🏻", "1️⃣", "#️⃣", "©️", "™️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👁️‍🗨️", "🧔‍♀️", "🐈‍⬛"]

C_SNIPPETS = [
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf(\"Hello, %s!\\n\", argv[0]);\n    return 0;\n}\n",
    "static inline uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }",
    "for (size_t i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}",
    "struct node { struct node *next; void *data; };\ntypedef struct node node_t;",
    "#define MAX(a, b) ((a) > (b) ? (a) : (b))\n#if defined(__GNUC__) && __GNUC__ >= 4\n#endif",
    "if (ptr == NULL) { fprintf(stderr, \"oom\\n\"); abort(); } /* unreachable */",
    "x->y->z[0] &= ~0xFFu; y <<= 3; z ^= (w | 0x1p-3);",
]
PY_SNIPPETS = [
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "class Foo(Bar):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, *args, **kwargs) -> None:\n        super().__init__(*args, **kwargs)\n",
    "import numpy as np\nx = np.arange(10)[::-1]\nprint(f\"{x.sum():>10.3f}\")",
    "lambda x: [y ** 2 for y in x if y % 2 == 0]",
    "    if __name__ == '__main__':\n        main()\n",
    "with open('data.json', encoding='utf-8') as f:\n\tdata = json.load(f)  # noqa: E501",
    "@dataclass(frozen=True)\nclass P:\n    x: int = 0\n    y: 'list[str]' = field(default_factory=list)",
]
JSON_SNIPPETS = [
    '{"name": "expertpack", "version": "0.1.0", "tags": ["moe", "gpu"], "ok": true, "n": null}',
    '[1, 2.5, -3e10, {"a": {"b": {"c": []}}}]',
    '{\n  "key": "value",\n  "nested": {\n    "arr": [\n      1,\n      2\n    ]\n  }\n}',
    '{"emoji": "\\ud83d\\ude00", "esc": "line\\nbreak\\t\\"quoted\\""}',
]
SHELL_SNIPPETS = [
    "#!/bin/sh\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done",
    "cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build -j$(nproc)",
    "grep -rn 'TODO' src/ | awk -F: '{print $1}' | sort -u > todo.txt 2>&1",
    "export PATH=\"$HOME/.local/bin:$PATH\"; cd ~ && ls -la | tail -n +2",
    "curl -fsSL https://example.com/install.sh | bash -s -- --prefix=/opt/x",
]

WHITESPACE = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n",
              "\r", "\u00a0", "\u2009", "\u3000", "\u200b", "\u2002", "\u2003", "\u202f", "\u205f", "\u1680",
              "\u2028", "\u2029", "\u0085", "\u000b", "\u000c", " \n", "\n ", " \t \n", "\u00a0\u00a0",
              "\ufeff", "\u200c", "\u200d", "\u180e"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "…", "—", "–", "«", "»", "“", "”", "‘", "’",
                                                      "¿", "¡", "。", "、", "！", "？", "「", "」", "【", "】",
                                                      "《", "》", "・", "§", "¶", "•", "‰", "€", "£", "¥",
                                                      "©", "®", "°", "±", "×", "÷", "→", "⇒", "∀", "∑", "√",
                                                      "∞", "≠", "≤", "≥", "★", "☆", "♥", "♪", "⌘"]
COMBINING = [chr(c) for c in list(range(0x0300, 0x0370)) + [0x1AB0, 0x1DC0, 0x20D0, 0x20E3, 0xFE0F, 0xFE0E,
                                                             0x0E31, 0x093F, 0x0651, 0x05B0]]
DIGITS_ALL = "0123456789"
OTHER_DIGITS = "٠١٢٣٤٥٦٧٨٩" + "०१२३४५६७८९" + "０１２３４５６７８９" + "๐๑๒๓๔๕๖๗๘๙" + "²³¹¼½¾ⅠⅡⅢⅣ①②③"


def random_codepoint(rng):
    """A valid Unicode scalar value (no surrogates), biased towards interesting planes."""
    r = rng.random()
    if r < 0.25:
        lo, hi = 0x20, 0x7E
    elif r < 0.40:
        lo, hi = 0x80, 0x7FF
    elif r < 0.70:
        lo, hi = 0x800, 0xD7FF
    elif r < 0.80:
        lo, hi = 0xE000, 0xFFFF
    elif r < 0.95:
        lo, hi = 0x10000, 0x1FFFF
    else:
        lo, hi = 0x20000, 0x10FFFF
    c = rng.randint(lo, hi)
    if 0xD800 <= c <= 0xDFFF:
        c = 0x41
    return chr(c)


def words_sentence(rng, words, n, sep=" "):
    return sep.join(rng.choice(words) for _ in range(n))


def load_added_tokens(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return [t["content"] for t in data.get("added_tokens", [])]


def generate(added_tokens):
    rng = random.Random(SEED)
    out = []

    def add(s):
        out.append(s)

    # Empty and tiny strings.
    for s in ["", " ", "a", "\n", "0", "é", "我", "😀", "<", "<｜", "｜>", "▁", "Ġ", "ĠĠ", "Ċ", "\x00", "\x7f", "'s",
              "'S", " 's", "'", "''", "'''"]:
        add(s)

    # Latin sentences with contractions and case variants.
    for _ in range(120):
        s = words_sentence(rng, LATIN_WORDS, rng.randint(1, 25))
        r = rng.random()
        if r < 0.2:
            s = s.upper()
        elif r < 0.4:
            s = s.capitalize() + rng.choice([".", "!", "?", "", "...", ";"])
        add(s)

    # CJK: Chinese, kana, Korean, mixtures with ASCII and digits.
    for _ in range(60):
        add("".join(rng.choice(CHINESE) for _ in range(rng.randint(1, 60))))
    for _ in range(30):
        add("".join(rng.choice(HIRAGANA + KATAKANA) for _ in range(rng.randint(1, 40))))
    for _ in range(30):
        add(words_sentence(rng, JAPANESE_WORDS + [c for c in CHINESE[:20]], rng.randint(1, 12), rng.choice(["", " ", "、", "。"])))
    for _ in range(40):
        add(words_sentence(rng, KOREAN_WORDS, rng.randint(1, 12), rng.choice([" ", "", ", "])))
    for _ in range(40):
        parts = [rng.choice(CHINESE) * rng.randint(1, 3), rng.choice(LATIN_WORDS), str(rng.randint(0, 99999)),
                 rng.choice(JAPANESE_WORDS), rng.choice(KOREAN_WORDS), rng.choice(PUNCT)]
        rng.shuffle(parts)
        add(rng.choice(["", " "]).join(parts))

    # Right-to-left and other scripts.
    for words in (ARABIC_WORDS, HEBREW_WORDS, DEVANAGARI_WORDS, THAI_WORDS, CYRILLIC_WORDS, GREEK_WORDS):
        for _ in range(40):
            sep = "" if words is THAI_WORDS and rng.random() < 0.5 else " "
            s = words_sentence(rng, words, rng.randint(1, 15), sep)
            if rng.random() < 0.3:
                s += rng.choice([".", "؟", "،", "!", "।", "?", " 123", "\n"])
            add(s)

    # Emoji: single, sequences, ZWJ families, skin tones, flags, tags, adjacent to text.
    for e in EMOJI:
        add(e)
    for _ in range(100):
        n = rng.randint(1, 12)
        seq = [rng.choice(EMOJI) for _ in range(n)]
        mode = rng.random()
        if mode < 0.3:
            add("".join(seq))
        elif mode < 0.6:
            add(" ".join(seq))
        else:
            add(" ".join(rng.choice(EMOJI) + rng.choice(LATIN_WORDS) if rng.random() < 0.5 else rng.choice(LATIN_WORDS)
                         for _ in range(n)))
    for base in ["👋", "👍", "🧑", "👩", "🤝"]:
        for tone in range(0x1F3FB, 0x1F400):
            add(base + chr(tone))
    for a in "USJPDEGBFRCNKRINBR":
        add(chr(0x1F1E6 + ord(a) - ord("A")) + chr(0x1F1E6 + (ord(a) * 7) % 26))

    # Code.
    for snippets in (C_SNIPPETS, PY_SNIPPETS, JSON_SNIPPETS, SHELL_SNIPPETS):
        for s in snippets:
            add(s)
        for _ in range(25):
            k = rng.randint(2, 4)
            add(rng.choice(["\n", "\n\n", "\r\n", " "]).join(rng.choice(snippets) for _ in range(k)))
    for _ in range(40):
        ident = "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789")
                        for _ in range(rng.randint(1, 30)))
        add(rng.choice(["{} = {}({});", "self.{}.{}[{}]", "fn {}<'a>(x: &'a {}) -> {} {{}}", "${{{}}}/{}/{}",
                        "<{} class=\"{}\">{}</div>", "{}::{}::{}", "#{}{}{}"]).format(ident, ident[::-1], rng.randint(0, 9999)))

    # Digit runs of every length 1..20, numbers with separators, other digit systems.
    for length in range(1, 21):
        for _ in range(4):
            add("".join(rng.choice(DIGITS_ALL) for _ in range(length)))
        add("x" + "7" * length + "y")
        add(" " + "".join(rng.choice(DIGITS_ALL) for _ in range(length)))
    for _ in range(60):
        v = rng.randint(0, 10 ** rng.randint(1, 15))
        fmt = rng.choice(["{:,}", "{:_}", "{:.2f}", "{:e}", "{}", "-{}", "+{:,}", "{:.3%}", "0x{:x}", "0b{:b}",
                          "{:08d}", "${:,.2f}", "{},{:03d}"])
        try:
            s = fmt.format(v, rng.randint(0, 999))
        except (ValueError, IndexError):
            s = str(v)
        add(s)
    for s in ["1,234,567.89", "1.234.567,89", "1 234 567", "1\u00a0234\u00a0567", "1\u2009234", "12'345'678",
              "3.14159265358979323846", "2024-01-15", "15/01/2024", "12:34:56.789", "192.168.0.1", "v1.2.3-rc.4",
              "+1 (555) 123-4567", "1e-10", "6.022e23", "١٢٣٬٤٥٦", "१,२३,४५६", "１２３４５", "½ + ¼ = ¾", "x²+y³",
              "Ⅻ", "①②③", "0.000000000000000000001"]:
        add(s)
    for _ in range(30):
        add("".join(rng.choice(OTHER_DIGITS + DIGITS_ALL) for _ in range(rng.randint(1, 25))))

    # Whitespace of every kind, alone, in runs, between words, leading and trailing.
    for ws in WHITESPACE:
        add(ws)
        add("a" + ws + "b")
        add(ws + "word")
        add("word" + ws)
        add(ws * 5)
    for _ in range(120):
        parts = []
        for _ in range(rng.randint(1, 10)):
            parts.append(rng.choice(LATIN_WORDS + CYRILLIC_WORDS + [rng.choice(CHINESE), "123", "!!"]))
            parts.append("".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 4))))
        if rng.random() < 0.5:
            parts.insert(0, rng.choice(WHITESPACE))
        add("".join(parts))
    for n in range(1, 34):
        add(" " * n)
        add("a" + " " * n + "b")
        add("\n" * n)
        add("\t" * (n % 9 + 1) + "x")

    # Special and added tokens embedded in text.
    specials = list(added_tokens)
    for t in specials:
        add(t)
    for _ in range(200):
        pieces = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.4:
                pieces.append(rng.choice(specials))
            elif r < 0.7:
                pieces.append(words_sentence(rng, LATIN_WORDS, rng.randint(1, 5)))
            elif r < 0.8:
                pieces.append(rng.choice(WHITESPACE))
            elif r < 0.9:
                pieces.append(rng.choice(CHINESE) * rng.randint(1, 3))
            else:
                pieces.append(rng.choice(EMOJI))
        add(rng.choice(["", " ", "\n"]).join(pieces))
    # Broken / partial special tokens.
    for t in specials[:40]:
        cut = rng.randint(1, max(1, len(t) - 1))
        add(t[:cut] + " " + t[cut:])
        add(t[:cut])
        add(t + t)
        add(t[:-1] + t)

    # Very long words and runs.
    for n in (1000, 1500, 2048, 3000, 4096):
        add("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)))
    add("a" * 1200)
    add("ab" * 700)
    add("我" * 1100)
    add("x" + "é" * 1000)
    add("😀" * 300)
    add("9" * 1100)
    add(" " * 1500)
    add("\n" * 1100)
    add("-" * 1200)
    add("Supercalifragilisticexpialidocious" * 40)
    add("".join(rng.choice(HIRAGANA) for _ in range(1200)))
    add("".join(rng.choice(KOREAN_WORDS) for _ in range(300)))
    add("https://example.com/" + "/".join("seg%d" % i for i in range(250)))
    add("".join(rng.choice(CYRILLIC_WORDS) for _ in range(150)))

    # Punctuation clusters.
    for _ in range(120):
        add("".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 20))))
    for _ in range(60):
        w = rng.choice(LATIN_WORDS)
        add(rng.choice(PUNCT) + w + rng.choice(PUNCT) * rng.randint(1, 3) + rng.choice(["", " ", "\n", "\r\n"]) +
            rng.choice(LATIN_WORDS))
    for s in ["...", "?!?!", "!!!!!!!!!!", "--", "---", "->", "=>", "::", "<<<>>>", "\"'\"", "(((", ")))", "[]{}()",
              "«»", "“quoted”", "‘single’", "¿Qué?", "¡Hola!", "。。。", "！？", "…\n", ".\n\n", " .", " ,\n"]:
        add(s)

    # Mixed scripts.
    all_words = (LATIN_WORDS + CYRILLIC_WORDS + GREEK_WORDS + ARABIC_WORDS + HEBREW_WORDS + DEVANAGARI_WORDS +
                 THAI_WORDS + KOREAN_WORDS + JAPANESE_WORDS + EMOJI)
    for _ in range(150):
        add(words_sentence(rng, all_words + [rng.choice(CHINESE) for _ in range(10)] + PUNCT + ["123", "4567"],
                           rng.randint(2, 25), rng.choice([" ", "", " ", "\n", "\t"])))

    # Combining marks (stacked, at the start, after spaces, after digits, Zalgo).
    for _ in range(80):
        base = rng.choice("aeiouAEIOUnc xyz1 " + CHINESE[:5] + "אب")
        add(base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 8))) + rng.choice(["", "b", " c", "9"]))
    for _ in range(10):
        add("".join(c + "".join(rng.choice(COMBINING) for _ in range(rng.randint(0, 5))) for c in "zalgo text here"))
    add("\u0301")
    add(" \u0301")
    add("e\u0301 \u0301e")
    add("Å Å Å")  # precomposed, decomposed, Angstrom sign

    # Random Unicode (valid scalar values).
    for _ in range(250):
        add("".join(random_codepoint(rng) for _ in range(rng.randint(1, 40))))

    # Random mixtures of everything above.
    pools = [LATIN_WORDS, CYRILLIC_WORDS, ARABIC_WORDS, EMOJI, PUNCT, WHITESPACE, specials, [str(i) for i in range(1000)],
             C_SNIPPETS, JAPANESE_WORDS, KOREAN_WORDS, COMBINING]
    for _ in range(200):
        add("".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 15))))

    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json (its added_tokens are embedded in the corpus)")
    ap.add_argument("--out", required=True, help="output corpus.jsonl")
    args = ap.parse_args(argv)
    corpus = generate(load_added_tokens(args.tokenizer))
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for s in corpus:
            f.write(json.dumps({"text": s}, ensure_ascii=False) + "\n")
    total = sum(len(s.encode("utf-8")) for s in corpus)
    print(f"{len(corpus)} strings, {total} UTF-8 bytes -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
