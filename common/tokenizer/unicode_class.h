// The few Unicode properties the Kimi pre-tokenizer regex asks about: the letter categories
// (Lu/Ll/Lt/Lm/Lo), marks (M), numbers (N), the Han script and White_Space (regex \s).
#pragma once
#include <cstdint>

namespace k3::unicode {

enum class CharClass : uint8_t { kOther, kLu, kLl, kLt, kLm, kLo, kMark, kNumber };

// General-category class of a code point (Unicode data version: see unicode_class_table.inc).
CharClass char_class(uint32_t cp);
// Script=Han, including CJK radicals and the ideographic iteration/number marks.
bool is_han(uint32_t cp);
// The White_Space property, which is what \s means in the Rust regex engine tiktoken uses.
bool is_white_space(uint32_t cp);

}  // namespace k3::unicode
