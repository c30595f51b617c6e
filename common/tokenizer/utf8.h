// UTF-8 decoding that never fails: an ill-formed sequence is reported, not thrown.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace k3::utf8 {

struct Decoded {
  uint32_t cp;  // the code point; for an ill-formed sequence, the first byte's value
  int len;      // bytes consumed: 1..4 when valid; the maximal ill-formed subpart length otherwise
  bool valid;
};

// Decodes the sequence starting at s[i] (i < s.size()). Follows the Unicode "maximal subpart"
// rule: surrogates, overlongs and values above U+10FFFF are ill-formed, and `len` of an
// ill-formed result covers the longest prefix that could have begun a valid sequence.
Decoded decode_at(std::string_view s, size_t i);

}  // namespace k3::utf8
