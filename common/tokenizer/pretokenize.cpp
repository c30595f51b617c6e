#include "common/tokenizer/pretokenize.h"

#include <cstdint>

#include "common/core/status.h"
#include "common/tokenizer/unicode_class.h"
#include "common/tokenizer/utf8.h"

namespace k3 {
namespace {

// Per-code-point property bits, named after the regex classes they stand for.
enum : uint8_t {
  kHan = 1 << 0,
  kUpperish = 1 << 1,  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
  kLowerish = 1 << 2,  // [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
  kLetter = 1 << 3,    // \p{L}
  kNumber = 1 << 4,    // \p{N}
  kSpace = 1 << 5,     // \s
  kNewline = 1 << 6,   // [\r\n]
};

struct CodePoint {
  uint32_t cp;
  uint32_t offset;  // byte offset in the text
  uint8_t props;
};

uint8_t properties_of(uint32_t cp) {
  using unicode::CharClass;
  uint8_t p = 0;
  const bool han = unicode::is_han(cp);
  if (han) p |= kHan;
  switch (unicode::char_class(cp)) {
    case CharClass::kLu:
    case CharClass::kLt: p |= kLetter | (han ? 0 : kUpperish); break;
    case CharClass::kLl: p |= kLetter | (han ? 0 : kLowerish); break;
    case CharClass::kLm:
    case CharClass::kLo: p |= kLetter | (han ? 0 : kUpperish | kLowerish); break;
    case CharClass::kMark: p |= han ? 0 : kUpperish | kLowerish; break;
    case CharClass::kNumber: p |= kNumber; break;
    case CharClass::kOther: break;
  }
  if (unicode::is_white_space(cp)) p |= kSpace;
  if (cp == '\r' || cp == '\n') p |= kNewline;
  return p;
}

uint8_t ascii_properties(uint32_t c) {
  if (c >= 'a' && c <= 'z') return kLetter | kLowerish;
  if (c >= 'A' && c <= 'Z') return kLetter | kUpperish;
  if (c >= '0' && c <= '9') return kNumber;
  if (c == '\r' || c == '\n') return kSpace | kNewline;
  if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return kSpace;
  return 0;
}

// Decodes the text once; a sentinel with no properties closes the array so matchers can look
// one past any run without a bounds check.
std::vector<CodePoint> decode_all(std::string_view text) {
  std::vector<CodePoint> cps;
  cps.reserve(text.size() + 1);
  size_t i = 0;
  while (i < text.size()) {
    const utf8::Decoded d = utf8::decode_at(text, i);
    if (d.valid) {
      cps.push_back({d.cp, uint32_t(i), d.cp < 128 ? ascii_properties(d.cp) : properties_of(d.cp)});
      i += d.len;
    } else {
      cps.push_back({d.cp, uint32_t(i), 0});  // one bad byte = one "other" code point
      i += 1;
    }
  }
  cps.push_back({0, uint32_t(text.size()), 0});
  return cps;
}

class Matcher {
 public:
  explicit Matcher(const std::vector<CodePoint>& cps) : c_(cps), n_(cps.size() - 1) {}

  // Index one past the piece that starts at code point i (i < n_).
  size_t match(size_t i) const {
    if (has(i, kHan)) return run_end(i, kHan);
    if (size_t e = with_optional_prefix(i, &Matcher::lower_word); e != kNone) return contraction(e);
    if (size_t e = with_optional_prefix(i, &Matcher::upper_word); e != kNone) return contraction(e);
    if (has(i, kNumber)) {
      size_t e = i;
      while (e < i + 3 && has(e, kNumber)) ++e;
      return e;
    }
    if (size_t e = punctuation(i); e != kNone) return e;
    const size_t space_end = run_end(i, kSpace);
    if (space_end == i) return i + 1;  // unreachable: every other code point matched above
    // \s*[\r\n]+ : the whitespace run up to and including its last newline.
    for (size_t k = space_end; k > i; --k) {
      if (has(k - 1, kNewline)) return k;
    }
    // \s+(?!\S) : leave the last space for the next word unless the run ends the text.
    if (space_end == n_ || space_end - i == 1) return space_end;
    return space_end - 1;
  }

 private:
  static constexpr size_t kNone = ~size_t{0};

  bool has(size_t i, uint8_t bits) const { return (c_[i].props & bits) != 0; }
  size_t run_end(size_t i, uint8_t bits) const {
    while (has(i, bits)) ++i;
    return i;
  }
  // [^\r\n\p{L}\p{N}]
  bool is_prefix(size_t i) const { return i < n_ && !has(i, kLetter | kNumber | kNewline); }

  // Tries `word` after a one-code-point prefix first (the `?` is greedy), then without.
  size_t with_optional_prefix(size_t i, size_t (Matcher::*word)(size_t) const) const {
    if (is_prefix(i)) {
      if (size_t e = (this->*word)(i + 1); e != kNone) return e;
    }
    return (this->*word)(i);
  }

  // Upperish* Lowerish+ . Lm/Lo/M are in both classes, so when the greedy Upperish* run is not
  // followed by a Lowerish code point the regex backs off into the run: the match ends after the
  // Lowerish run that starts at the last position in the run holding a Lowerish code point.
  size_t lower_word(size_t p) const {
    const size_t m = run_end(p, kUpperish);
    for (size_t k = m;; --k) {
      if (has(k, kLowerish)) return run_end(k, kLowerish);
      if (k == p) return kNone;
    }
  }

  // Upperish+ Lowerish*
  size_t upper_word(size_t p) const {
    if (!has(p, kUpperish)) return kNone;
    return run_end(run_end(p, kUpperish), kLowerish);
  }

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)? after a word ending at e.
  size_t contraction(size_t e) const {
    if (c_[e].cp != '\'') return e;
    const auto lower = [this](size_t k) -> uint32_t {
      if (k >= n_) return 0;
      const uint32_t cp = c_[k].cp;
      if (cp == 0x17F) return 's';  // LATIN SMALL LETTER LONG S case-folds to s
      return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    };
    const uint32_t a = lower(e + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return e + 2;
    const uint32_t b = lower(e + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return e + 3;
    return e;
  }

  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t punctuation(size_t i) const {
    const auto is_punct = [this](size_t k) { return k < n_ && !has(k, kSpace | kLetter | kNumber); };
    size_t j = i;
    if (c_[i].cp == ' ' && is_punct(i + 1)) j = i + 1;
    if (!is_punct(j)) return kNone;
    while (is_punct(j)) ++j;
    return run_end(j, kNewline);
  }

  const std::vector<CodePoint>& c_;
  size_t n_;
};

}  // namespace

std::vector<std::string_view> kimi_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  K3_CHECK(text.size() < UINT32_MAX, "pre-tokenizer input must be under 4 GiB (offsets are 32-bit)");
  const std::vector<CodePoint> cps = decode_all(text);
  const Matcher matcher(cps);
  const size_t n = cps.size() - 1;
  for (size_t i = 0; i < n;) {
    const size_t e = matcher.match(i);
    pieces.push_back(text.substr(cps[i].offset, cps[e].offset - cps[i].offset));
    i = e;
  }
  return pieces;
}

}  // namespace k3
