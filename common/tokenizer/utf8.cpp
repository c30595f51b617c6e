#include "common/tokenizer/utf8.h"

#include <string>

#include "common/tokenizer/tokenizer.h"

namespace k3 {
namespace utf8 {

Decoded decode_at(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {b0, 1, true};
  int need;          // continuation bytes that follow the lead byte
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  uint32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return {b0, 1, false};  // continuation byte, C0/C1 overlong lead, or F5..FF
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return {b0, k, false};
    const auto b = static_cast<uint8_t>(s[i + k]);
    const uint8_t first = k == 1 ? lo : 0x80, last = k == 1 ? hi : 0xBF;
    if (b < first || b > last) return {b0, k, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, true};
}

}  // namespace utf8

std::string sanitize_utf8(std::string_view s, int* bad) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(s.size());
  int replaced = 0;
  size_t i = 0;
  while (i < s.size()) {
    const utf8::Decoded d = utf8::decode_at(s, i);
    if (d.valid) {
      out.append(s.substr(i, d.len));
    } else {
      out.append(kReplacement);
      ++replaced;
    }
    i += d.len;
  }
  if (bad) *bad = replaced;
  return out;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const utf8::Decoded d = utf8::decode_at(s, i);
    if (!d.valid) return false;
    i += d.len;
  }
  return true;
}

}  // namespace k3
