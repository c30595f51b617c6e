#include <catch2/catch.hpp>
#include <random>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

using namespace k3;

namespace {
const std::string kFffd = "\xEF\xBF\xBD";
}

TEST_CASE("decode_at reads valid sequences of every length") {
  const std::string s = "a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x91\x8B";  // a é 你 👋
  auto d = utf8::decode_at(s, 0);
  REQUIRE((d.valid && d.cp == 'a' && d.len == 1));
  d = utf8::decode_at(s, 1);
  REQUIRE((d.valid && d.cp == 0xE9 && d.len == 2));
  d = utf8::decode_at(s, 3);
  REQUIRE((d.valid && d.cp == 0x4F60 && d.len == 3));
  d = utf8::decode_at(s, 6);
  REQUIRE((d.valid && d.cp == 0x1F44B && d.len == 4));
}

TEST_CASE("decode_at rejects ill-formed sequences with their maximal subpart") {
  struct Case {
    std::string bytes;
    int len;
  };
  const Case cases[] = {
      {"\x80", 1},              // lone continuation
      {"\xFF", 1},              // never valid
      {"\xC0\xAF", 1},          // overlong lead
      {"\xE0\x80\xAF", 1},      // overlong 3-byte: second byte out of range
      {"\xED\xA0\x80", 1},      // surrogate
      {"\xF4\x90\x80\x80", 1},  // above U+10FFFF
      {"\xE4\xBD", 2},          // truncated at the end
      {"\xE4\xBDx", 2},         // truncated before ASCII
      {"\xF0\x9F\x91", 3},      // truncated 4-byte
  };
  for (const Case& c : cases) {
    INFO("bytes of length " << c.bytes.size());
    const auto d = utf8::decode_at(c.bytes, 0);
    REQUIRE_FALSE(d.valid);
    REQUIRE(d.len == c.len);
  }
}

TEST_CASE("sanitize_utf8 replaces each maximal ill-formed subpart with one U+FFFD") {
  int bad = -1;
  REQUIRE(sanitize_utf8("plain ascii", &bad) == "plain ascii");
  REQUIRE(bad == 0);
  REQUIRE(sanitize_utf8("\xE4\xBD\xA0\xE5\xA5\xBD", &bad) == "\xE4\xBD\xA0\xE5\xA5\xBD");
  REQUIRE(bad == 0);
  REQUIRE(sanitize_utf8("a\x80" "b", &bad) == "a" + kFffd + "b");
  REQUIRE(bad == 1);
  REQUIRE(sanitize_utf8("\xE4\xBD", &bad) == kFffd);  // truncated: one replacement, not two
  REQUIRE(bad == 1);
  REQUIRE(sanitize_utf8("\xC0\xAF", &bad) == kFffd + kFffd);  // overlong: each byte is bad
  REQUIRE(bad == 2);
  REQUIRE(sanitize_utf8("\xFF\xFE", &bad) == kFffd + kFffd);
  REQUIRE(bad == 2);
  REQUIRE(sanitize_utf8("\xED\xA0\x80", &bad) == kFffd + kFffd + kFffd);  // surrogate
  REQUIRE(bad == 3);
  REQUIRE(sanitize_utf8("x\xF0\x9F\x91y", &bad) == "x" + kFffd + "y");
  REQUIRE(bad == 1);
  REQUIRE(sanitize_utf8("") == "");
}

TEST_CASE("sanitize_utf8 output is always valid and keeps valid input unchanged") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = char(rng() % 4 == 0 ? rng() % 128 : 0x80 + rng() % 128);
    const std::string clean = sanitize_utf8(s);
    REQUIRE(is_valid_utf8(clean));
    if (is_valid_utf8(s)) REQUIRE(clean == s);
    REQUIRE(sanitize_utf8(clean) == clean);
  }
  REQUIRE(is_valid_utf8("\xF0\x9F\x91\x8B"));
  REQUIRE_FALSE(is_valid_utf8("\xF0\x9F\x91"));
  REQUIRE_FALSE(is_valid_utf8("\xC0\x80"));
}
