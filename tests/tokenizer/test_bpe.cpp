#include <catch2/catch.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/tokenizer/base64.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/bpe_train.h"
#include "common/tokenizer/tiny_tokenizer_corpus.h"

using namespace k3;
using namespace std::string_literals;

namespace {

// 256 single bytes (ids 0..255) plus `extra` tokens with ids 256, 257, ... in order.
TokenTable byte_table(const std::vector<std::string>& extra) {
  TokenTable t;
  for (int b = 0; b < 256; ++b) REQUIRE(t.insert(std::string(1, char(b)), b));
  int32_t id = 256;
  for (const std::string& s : extra) REQUIRE(t.insert(s, id++));
  return t;
}

std::vector<int32_t> fast(const TokenTable& t, std::string_view piece) {
  std::vector<int32_t> out;
  BpeScratch scratch;
  bpe_encode(t, piece, out, scratch);
  return out;
}

std::vector<int32_t> reference(const TokenTable& t, std::string_view piece) {
  std::vector<int32_t> out;
  bpe_encode_reference(t, piece, out);
  return out;
}

using Ids = std::vector<int32_t>;

}  // namespace

TEST_CASE("base64 round trips and rejects malformed text") {
  REQUIRE(base64::encode("") == "");
  REQUIRE(base64::encode("f") == "Zg==");
  REQUIRE(base64::encode("fo") == "Zm8=");
  REQUIRE(base64::encode("foo") == "Zm9v");
  REQUIRE(base64::encode("\xFF\x00\x10"s) == "/wAQ");
  REQUIRE(base64::decode("Zm9vYg==") == std::optional<std::string>("foob"));
  REQUIRE(base64::decode("IQ==") == std::optional<std::string>("!"));
  REQUIRE_FALSE(base64::decode("Zm9"));       // length not a multiple of 4
  REQUIRE_FALSE(base64::decode("Zm!v"));      // bad character
  REQUIRE_FALSE(base64::decode("Z==="));      // padding too early
  REQUIRE_FALSE(base64::decode("Zg==Zg=="));  // padding in the middle
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    std::string s(rng() % 20, '\0');
    for (char& c : s) c = char(rng());
    REQUIRE(base64::decode(base64::encode(s)) == std::optional<std::string>(s));
  }
}

TEST_CASE("token table finds bytes and ids") {
  TokenTable t = byte_table({"ab", "abc"});
  REQUIRE(t.size() == 258);
  REQUIRE(t.find("ab") == std::optional<int32_t>(256));
  REQUIRE(t.find("abc") == std::optional<int32_t>(257));
  REQUIRE_FALSE(t.find("abcd"));
  REQUIRE(t.bytes_of(257) == std::optional<std::string_view>("abc"));
  REQUIRE_FALSE(t.bytes_of(258));
  REQUIRE_FALSE(t.bytes_of(-1));
  REQUIRE_FALSE(t.insert("ab", 999));  // duplicate bytes
}

TEST_CASE("the lowest-ranked pair merges first") {
  {
    const TokenTable t = byte_table({"bc", "ab"});  // bc=256 outranks ab=257
    REQUIRE(fast(t, "abc") == Ids{'a', 256});
    REQUIRE(reference(t, "abc") == Ids{'a', 256});
  }
  {
    const TokenTable t = byte_table({"ab", "bc"});  // ab=256 outranks bc=257
    REQUIRE(fast(t, "abc") == Ids{256, 'c'});
    REQUIRE(reference(t, "abc") == Ids{256, 'c'});
  }
  {
    // A merge can enable a later one: bc first, then a+bc.
    const TokenTable t = byte_table({"bc", "ab", "abc"});
    REQUIRE(fast(t, "abcd") == Ids{258, 'd'});
    REQUIRE(reference(t, "abcd") == Ids{258, 'd'});
  }
}

TEST_CASE("equal ranks merge leftmost first") {
  const TokenTable t = byte_table({"aa", "aaaa"});
  REQUIRE(fast(t, "aaa") == Ids{256, 'a'});
  REQUIRE(reference(t, "aaa") == Ids{256, 'a'});
  REQUIRE(fast(t, "aaaaa") == Ids{257, 'a'});
  REQUIRE(reference(t, "aaaaa") == Ids{257, 'a'});
}

TEST_CASE("a piece that is itself a token is emitted whole, as tiktoken does") {
  const TokenTable t = byte_table({"abc"});  // no "ab" or "bc": merging alone could never reach it
  REQUIRE(fast(t, "abc") == Ids{256});
  REQUIRE(reference(t, "abc") == Ids{256});
  REQUIRE(fast(t, "abcd") == Ids{'a', 'b', 'c', 'd'});
  REQUIRE(fast(t, "") == Ids{});
  REQUIRE(fast(t, "\xFF") == Ids{255});
}

TEST_CASE("heap BPE matches the reference loop on random vocabularies and pieces") {
  std::mt19937 rng(5);
  for (int vocab_trial = 0; vocab_trial < 40; ++vocab_trial) {
    // Random tokens over a 3-letter alphabet, so many pairs and ties occur.
    std::vector<std::string> extra;
    TokenTable probe = byte_table({});
    while (extra.size() < 60) {
      std::string s(2 + rng() % 4, 'a');
      for (char& c : s) c = char('a' + rng() % 3);
      if (!probe.find(s)) {
        REQUIRE(probe.insert(s, int32_t(256 + extra.size())));
        extra.push_back(s);
      }
    }
    const TokenTable t = byte_table(extra);
    for (int trial = 0; trial < 100; ++trial) {
      std::string piece(1 + rng() % 40, 'a');
      for (char& c : piece) c = char('a' + rng() % 3);
      INFO("piece " << piece);
      REQUIRE(fast(t, piece) == reference(t, piece));
    }
  }
}

TEST_CASE("heap BPE matches the reference on the learned tiny vocabulary") {
  const std::vector<std::string> merges = learn_bpe_merges(tiny_tokenizer_corpus(), 239);
  const TokenTable t = byte_table(merges);
  const std::string corpus(tiny_tokenizer_corpus());
  std::mt19937 rng(9);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t start = rng() % corpus.size();
    const std::string piece = corpus.substr(start, 1 + rng() % 64);
    REQUIRE(fast(t, piece) == reference(t, piece));
  }
}

TEST_CASE("heap BPE handles a megabyte-long piece") {
  const TokenTable t = byte_table({"aa", "aaaa", "aaaaaaaa"});
  const std::string piece(1 << 20, 'a');
  const Ids ids = fast(t, piece);
  REQUIRE(ids.size() == (1u << 20) / 8);
  for (int32_t id : ids) REQUIRE(id == 258);
}

TEST_CASE("merge learning is deterministic and produces new distinct tokens") {
  const auto a = learn_bpe_merges(tiny_tokenizer_corpus(), 239);
  const auto b = learn_bpe_merges(tiny_tokenizer_corpus(), 239);
  REQUIRE(a == b);
  REQUIRE(a.size() == 239);
  std::set<std::string> seen;
  for (const std::string& m : a) {
    REQUIRE(m.size() >= 2);
    REQUIRE(seen.insert(m).second);
  }
  // The most frequent pair of a tiny corpus is learned first.
  REQUIRE(learn_bpe_merges("abab abab abab xy", 1) == std::vector<std::string>{"ab"});
}
