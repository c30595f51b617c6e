// The Kimi pre-tokenizer: splits text into the pieces that BPE encodes one by one. It is a
// hand-written matcher for the regex in Kimi's tokenization_kimi.py (alternatives tried in order,
// first match wins, backtracking reproduced where it changes the result):
//   1 [\p{Han}]+
//   2 [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   3 [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   4 \p{N}{1,3}
//   5  ?[^\s\p{L}\p{N}]+[\r\n]*
//   6 \s*[\r\n]+
//   7 \s+(?!\S)
//   8 \s+
// Approximations: categories come from Python's Unicode 14 database and Han from Unicode 15
// Scripts.txt (the Rust regex crate may be a version ahead, which only matters for code points
// assigned since); each byte of an ill-formed UTF-8 sequence is its own code point of class
// "other" (neither letter, number nor space), so every input splits and the pieces cover it exactly.
// tests/tokenizer/test_pretokenize.cpp checks this matcher against the real pattern (run by
// Python's `regex` module through kimi_regex_oracle.py) on thousands of random strings.
#pragma once
#include <string_view>
#include <vector>

namespace k3 {

// The pieces in order; concatenated they equal `text` byte for byte.
std::vector<std::string_view> kimi_pretokenize(std::string_view text);

}  // namespace k3
