#include "common/tokenizer/unicode_class.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace k3::unicode {
namespace {

struct ClassRun {
  uint32_t first;  // first code point of the run
  CharClass cls;
};

constexpr CharClass kOther = CharClass::kOther, kLu = CharClass::kLu, kLl = CharClass::kLl,
                    kLt = CharClass::kLt, kLm = CharClass::kLm, kLo = CharClass::kLo,
                    kMark = CharClass::kMark, kNumber = CharClass::kNumber;

constexpr ClassRun kRuns[] = {
#include "common/tokenizer/unicode_class_table.inc"
};

struct Range {
  uint32_t first, last;  // inclusive
};

// Script=Han (Unicode 15 Scripts.txt). Kept by hand: Python's unicodedata has no script data.
constexpr Range kHan[] = {
    {0x2E80, 0x2E99},   {0x2E9B, 0x2EF3},   {0x2F00, 0x2FD5},   {0x3005, 0x3005},
    {0x3007, 0x3007},   {0x3021, 0x3029},   {0x3038, 0x303B},   {0x3400, 0x4DBF},
    {0x4E00, 0x9FFF},   {0xF900, 0xFA6D},   {0xFA70, 0xFAD9},   {0x16FE2, 0x16FE3},
    {0x16FF0, 0x16FF1}, {0x20000, 0x2A6DF}, {0x2A700, 0x2B739}, {0x2B740, 0x2B81D},
    {0x2B820, 0x2CEA1}, {0x2CEB0, 0x2EBE0}, {0x2F800, 0x2FA1D}, {0x30000, 0x3134A},
    {0x31350, 0x323AF},
};

constexpr Range kWhiteSpace[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
    {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
    {0x205F, 0x205F}, {0x3000, 0x3000},
};

template <size_t N>
bool in_ranges(const Range (&ranges)[N], uint32_t cp) {
  auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                             [](uint32_t c, const Range& r) { return c < r.first; });
  return it != std::begin(ranges) && cp <= std::prev(it)->last;
}

// ASCII is most of real text; answer it from a table built once at compile time.
constexpr std::array<CharClass, 128> make_ascii_classes() {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    t[c] = c >= '0' && c <= '9'   ? kNumber
           : c >= 'A' && c <= 'Z' ? kLu
           : c >= 'a' && c <= 'z' ? kLl
                                  : kOther;
  }
  return t;
}
constexpr std::array<CharClass, 128> kAscii = make_ascii_classes();

}  // namespace

CharClass char_class(uint32_t cp) {
  if (cp < 128) return kAscii[cp];
  if (cp > 0x10FFFF) return kOther;
  auto it = std::upper_bound(std::begin(kRuns), std::end(kRuns), cp,
                             [](uint32_t c, const ClassRun& r) { return c < r.first; });
  return std::prev(it)->cls;  // kRuns[0].first == 0, so prev() is valid
}

bool is_han(uint32_t cp) { return cp >= 0x2E80 && in_ranges(kHan, cp); }

bool is_white_space(uint32_t cp) {
  if (cp < 128) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return in_ranges(kWhiteSpace, cp);
}

}  // namespace k3::unicode
