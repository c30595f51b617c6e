#!/usr/bin/env python3
"""Oracle for test_pretokenize: splits random text with Kimi's real pre-tokenizer regex.

Usage: kimi_regex_oracle.py SEED COUNT OUT.json  ->  [{"text": ..., "pieces": [...]}, ...]
Needs the third-party `regex` module (the pattern uses \\p{Han} and && class intersections, which
Python's `re` lacks); exits with status 3 when it is missing so the test can skip.
The pattern is the one in Kimi's tokenization_kimi.py, with each [A&&B] written in the `regex`
module's V1 syntax [[A]&&B].
"""
import json
import random
import sys
import unicodedata

try:
    import regex
except ImportError:
    sys.exit(3)

UPPERISH = r"[[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]&&[^\p{Han}]]"
LOWERISH = r"[[\p{Ll}\p{Lm}\p{Lo}\p{M}]&&[^\p{Han}]]"
CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?" + UPPERISH + "*" + LOWERISH + "+" + CONTRACTION,
    r"[^\r\n\p{L}\p{N}]?" + UPPERISH + "+" + LOWERISH + "*" + CONTRACTION,
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# Characters that exercise every branch: cases, marks, Han and its neighbours, digits of several
# scripts, the White_Space edge cases and contractions.
POOL = (list("aAzZ09 '\t\n\r.,!?$()-_/\\\"") +
        ["'s", "'S", "'ll", "'LL", "'re", "'ve", "'m", "'d", "'t", "\u017f"] +
        list("éÉßçÑüÖαβΓΔωΩПриветМИР你好世界〇々あいカナ한국어مرحباनमस्ते") +
        ["\u0308", "\u0301", "\u20dd", "ǅ", "ʰ", "ª", "º", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c",
         "\x85", "\u2009", "\u200b", "\x1c", "\x1f"] +
        list("٣٤५६½²Ⅻ") +
        ["👋", "🏽", "🇫🇷", "\U00020000", "\u2e80", "\u2f00", "\u3021", "\u303b", "\u4dc0", "\uff0c",
         "\uff21", "\uff41", "\uff11"])


def random_code_point(rng):
    while True:
        cp = rng.randrange(0x20, 0x30000)
        if 0xD800 <= cp < 0xE000:
            continue
        # Skip code points this Python does not know: the C++ tables and the regex module may be
        # different Unicode versions, and new assignments are not what this test is about.
        if unicodedata.category(chr(cp)) == "Cn":
            continue
        return chr(cp)


def main():
    seed, count, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rng = random.Random(seed)
    rx = regex.compile(PATTERN, regex.V1)
    cases = []
    for _ in range(count):
        n = rng.randrange(0, 25)
        text = "".join(rng.choice(POOL) if rng.random() < 0.85 else random_code_point(rng) for _ in range(n))
        cases.append({"text": text, "pieces": rx.findall(text)})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
