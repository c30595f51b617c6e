// TextStream: stop strings across token boundaries, hold-back of possible stop prefixes and of
// unfinished UTF-8, hidden ids. Tokens here are a table of byte strings so each case is exact.
#include <catch2/catch.hpp>

#include <map>

#include "router/text_stream.h"

using namespace k3;
using namespace k3::router;

namespace {

struct Run {
  std::string text;      // everything emitted, deltas concatenated
  std::vector<std::string> deltas;
  bool stopped = false;
};

Run run(const std::map<int32_t, std::string>& vocab, const std::vector<int32_t>& ids, std::vector<std::string> stops,
        std::vector<int32_t> hidden = {}) {
  TextStream ts([&](int32_t id) -> Result<std::string> {
                  auto it = vocab.find(id);
                  if (it == vocab.end()) return invalid_argument("unknown id");
                  return it->second;
                },
                std::move(stops), [hidden](int32_t id) { return std::find(hidden.begin(), hidden.end(), id) != hidden.end(); });
  Run r;
  for (int32_t id : ids) {
    auto d = ts.push(id);
    REQUIRE(d.is_ok());
    r.deltas.push_back(*d);
    r.text += *d;
    if (ts.stopped()) break;
  }
  r.stopped = ts.stopped();
  if (!r.stopped) r.text += ts.flush();
  return r;
}

}  // namespace

TEST_CASE("no stop strings: text passes through token by token") {
  auto r = run({{1, "Hel"}, {2, "lo"}, {3, " world"}}, {1, 2, 3}, {});
  CHECK(r.text == "Hello world");
  CHECK(r.deltas == std::vector<std::string>{"Hel", "lo", " world"});
  CHECK_FALSE(r.stopped);
}

TEST_CASE("a stop string split over tokens is held back and never emitted") {
  auto r = run({{1, "abc"}, {2, "<e"}, {3, "nd>"}, {4, "tail"}}, {1, 2, 3, 4}, {"<end>"});
  CHECK(r.stopped);
  CHECK(r.text == "abc");
  CHECK(r.deltas == std::vector<std::string>{"abc", "", ""});
}

TEST_CASE("held-back prefix is released when it turns out not to be a stop string") {
  auto r = run({{1, "x<e"}, {2, "x"}}, {1, 2}, {"<end>"});
  CHECK_FALSE(r.stopped);
  CHECK(r.deltas[0] == "x");
  CHECK(r.deltas[1] == "<ex");
  CHECK(r.text == "x<ex");
}

TEST_CASE("the earliest of several stop strings wins, inside one token too") {
  auto r = run({{1, "one two three"}}, {1}, {"three", "two"});
  CHECK(r.stopped);
  CHECK(r.text == "one ");
}

TEST_CASE("held prefix left at the end is flushed when generation ends") {
  auto r = run({{1, "ab"}, {2, "<"}}, {1, 2}, {"<stop>"});
  CHECK_FALSE(r.stopped);
  CHECK(r.text == "ab<");
}

TEST_CASE("a UTF-8 character split over tokens is emitted whole") {
  // U+00E9 = C3 A9; U+1F600 = F0 9F 98 80
  auto r = run({{1, "caf\xC3"}, {2, "\xA9 "}, {3, "\xF0\x9F"}, {4, "\x98"}, {5, "\x80!"}}, {1, 2, 3, 4, 5}, {});
  CHECK(r.deltas == std::vector<std::string>{"caf", "\xC3\xA9 ", "", "", "\xF0\x9F\x98\x80!"});
}

TEST_CASE("invalid bytes never reach the client as invalid UTF-8") {
  auto r = run({{1, "a\xFF"}, {2, "b\xC3"}}, {1, 2}, {});
  CHECK(r.text == "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

TEST_CASE("hidden ids (EOS, stop ids) add no text") {
  auto r = run({{1, "hi"}, {9, "<|im_end|>"}}, {1, 9}, {}, {9});
  CHECK(r.text == "hi");
}

TEST_CASE("helpers: held_stop_prefix and incomplete_utf8_tail") {
  CHECK(held_stop_prefix("abc<en", {"<end>"}) == 3);
  CHECK(held_stop_prefix("abc", {"<end>"}) == 0);
  CHECK(held_stop_prefix("aa", {"aab"}) == 2);
  CHECK(held_stop_prefix("xa", {"ab", "xab"}) == 2);
  CHECK(incomplete_utf8_tail("abc") == 0);
  CHECK(incomplete_utf8_tail("ab\xC3") == 1);
  CHECK(incomplete_utf8_tail("\xC3\xA9") == 0);
  CHECK(incomplete_utf8_tail("\xF0\x9F\x98") == 3);
  CHECK(incomplete_utf8_tail("\xF0\x9F\x98\x80") == 0);
}
