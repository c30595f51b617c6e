#include <catch2/catch.hpp>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/pretokenize.h"
#include "common/tokenizer/unicode_class.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using k3::testing::read_all;
using k3::testing::ScratchDir;

namespace {

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : kimi_pretokenize(text)) out.emplace_back(p);
  return out;
}

struct SplitCase {
  std::string text;
  std::vector<std::string> pieces;  // derived by hand from the Kimi regex (see pretokenize.h)
};

}  // namespace

TEST_CASE("unicode classes of representative code points") {
  using unicode::CharClass;
  REQUIRE(unicode::char_class('A') == CharClass::kLu);
  REQUIRE(unicode::char_class('z') == CharClass::kLl);
  REQUIRE(unicode::char_class('7') == CharClass::kNumber);
  REQUIRE(unicode::char_class('!') == CharClass::kOther);
  REQUIRE(unicode::char_class(0x00E9) == CharClass::kLl);   // é
  REQUIRE(unicode::char_class(0x0416) == CharClass::kLu);   // Ж
  REQUIRE(unicode::char_class(0x03B1) == CharClass::kLl);   // α
  REQUIRE(unicode::char_class(0x01C5) == CharClass::kLt);   // ǅ
  REQUIRE(unicode::char_class(0x02B0) == CharClass::kLm);   // ʰ
  REQUIRE(unicode::char_class(0x4F60) == CharClass::kLo);   // 你
  REQUIRE(unicode::char_class(0x0308) == CharClass::kMark); // combining diaeresis
  REQUIRE(unicode::char_class(0x0663) == CharClass::kNumber);  // Arabic-Indic 3
  REQUIRE(unicode::char_class(0x2164) == CharClass::kNumber);  // Roman numeral five (Nl)
  REQUIRE(unicode::char_class(0x1F44B) == CharClass::kOther);  // 👋
  REQUIRE(unicode::char_class(0x10FFFF) == CharClass::kOther);
  REQUIRE(unicode::is_han(0x4F60));
  REQUIRE(unicode::is_han(0x3007));   // 〇
  REQUIRE(unicode::is_han(0x20000));  // CJK extension B
  REQUIRE_FALSE(unicode::is_han(0x3042));  // あ (Hiragana)
  REQUIRE_FALSE(unicode::is_han(0xFF0C));  // fullwidth comma
  REQUIRE(unicode::is_white_space(' '));
  REQUIRE(unicode::is_white_space('\n'));
  REQUIRE(unicode::is_white_space(0x3000));
  REQUIRE(unicode::is_white_space(0x00A0));
  REQUIRE_FALSE(unicode::is_white_space(0x1C));  // not White_Space, although Python's isspace says so
  REQUIRE_FALSE(unicode::is_white_space(0x200B));  // zero width space is not White_Space
}

TEST_CASE("kimi pre-tokenizer splits match the regex") {
  const std::vector<SplitCase> cases = {
      {"", {}},
      {"Hello world", {"Hello", " world"}},
      {"it's", {"it's"}},
      {"don't we'LL", {"don't", " we'LL"}},
      {"IT'S", {"IT'S"}},
      {"x'y", {"x", "'y"}},
      {"123456", {"123", "456"}},
      {"1234567", {"123", "456", "7"}},
      {"12abc", {"12", "abc"}},
      {"$100", {"$", "100"}},
      {"  x", {" ", " x"}},
      {"a  b", {"a", " ", " b"}},
      {"a\n\nb", {"a", "\n\n", "b"}},
      {"a\r\nb", {"a", "\r\n", "b"}},
      {"x  \n  y", {"x", "  \n", " ", " y"}},
      {"\n\n  x", {"\n\n", " ", " x"}},
      {"end   ", {"end", "   "}},
      {"  ", {"  "}},
      {" ", {" "}},
      {"Hello\n", {"Hello", "\n"}},
      {"HelloWorld", {"Hello", "World"}},
      {"HELLOworld", {"HELLOworld"}},
      {"ABC def", {"ABC", " def"}},
      {"hello, world!", {"hello", ",", " world", "!"}},
      {"foo.\n\nbar", {"foo", ".\n\n", "bar"}},
      {" ...hi", {" ...", "hi"}},
      {"\tindent", {"\tindent"}},
      {"f(x) = y;", {"f", "(x", ")", " =", " y", ";"}},
      {"你好世界", {"你好世界"}},
      {"你好world", {"你好", "world"}},
      {"hello你好", {"hello", "你好"}},
      {"你好，世界", {"你好", "，", "世界"}},
      {"Привет мир", {"Привет", " мир"}},
      {"ΑΒΓ αβγ", {"ΑΒΓ", " αβγ"}},
      {"na\xC3\xAFve", {"na\xC3\xAFve"}},   // precomposed ï
      {"nai\xCC\x88ve", {"nai\xCC\x88ve"}}, // i + combining diaeresis (a mark joins the word)
      {"hi \xF0\x9F\x91\x8B there", {"hi", " \xF0\x9F\x91\x8B", " there"}},
      {"a\xFF" "b", {"a", "\xFF" "b"}},   // a bad byte acts like punctuation: it prefixes a word
      {"\xFF\xFE", {"\xFF\xFE"}},
      {"\xE4\xBD" "a", {"\xE4\xBD", "a"}},  // truncated 你: two bad bytes (punctuation), then a word
  };
  for (const SplitCase& c : cases) {
    INFO("text: \"" << c.text << "\"");
    REQUIRE(split(c.text) == c.pieces);
  }
}

TEST_CASE("kimi pre-tokenizer pieces are non-empty and cover random input exactly") {
  std::mt19937 rng(11);
  const std::vector<std::string> atoms = {"a", "Z", " ", "  ", "\n", "\r\n", "\t", "'s", "'", "7", "42", ".",
                                          "!", "\xE4\xBD\xA0", "\xC3\xA9", "\xD0\x96", "\xCC\x88",
                                          "\xF0\x9F\x91\x8B", "\x80", "\xFF", "\xE4\xBD", "\xEF\xBC\x8C"};
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int n = int(rng() % 30);
    for (int k = 0; k < n; ++k) text += atoms[rng() % atoms.size()];
    std::string joined;
    for (std::string_view p : kimi_pretokenize(text)) {
      REQUIRE_FALSE(p.empty());
      joined += p;
    }
    REQUIRE(joined == text);
  }
}

TEST_CASE("kimi pre-tokenizer agrees with the real regex on random text") {
  // The oracle runs Kimi's pattern in Python's `regex` module (a backtracking engine, like the
  // fancy-regex that tiktoken uses). Skipped where python3 or that module is missing.
  ScratchDir dir("regex_oracle");
  const std::string out = dir.file("cases.json");
  const std::string cmd = "python3 " + std::string(K3_SOURCE_DIR) +
                          "/tests/tokenizer/kimi_regex_oracle.py 20260101 5000 " + out + " 2>/dev/null";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    WARN("skipped: python3 with the `regex` module is not available (exit status " << rc << ")");
    return;
  }
  const auto cases = nlohmann::json::parse(read_all(out));
  REQUIRE(cases.size() == 5000);
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    INFO("text: \"" << text << "\"");
    REQUIRE(split(text) == c["pieces"].get<std::vector<std::string>>());
  }
}
