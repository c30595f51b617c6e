// The leader's per-step command to the members of a decode rank group (decode_node/group_command.h):
// encode -> decode gives it back field for field, and truncated or padded bytes are refused by name.
#include <catch2/catch.hpp>

#include <random>

#include "decode_node/group_command.h"

using namespace k3;
using namespace k3::decode;

TEST_CASE("group command: round trip on random commands, truncation refused", "[ranks]") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    GroupCommand c;
    c.stop = rng() % 5 == 0;
    c.step = rng() % 2 == 0;
    for (int i = 0, n = static_cast<int>(rng() % 4); i < n; ++i) c.drops.push_back(rng());
    for (int i = 0, n = static_cast<int>(rng() % 3); i < n; ++i) {
      GroupAdmit a{.id = rng(), .position = static_cast<int64_t>(rng() % 5000)};
      a.image.resize(rng() % 300);
      for (auto& b : a.image) b = static_cast<uint8_t>(rng());
      a.from_region = rng() % 2 == 0;
      a.slot = static_cast<int64_t>(rng() % 9) - 1;
      for (int k = 0, m = static_cast<int>(rng() % 5); k < m; ++k) a.page_ids.push_back(static_cast<uint32_t>(rng()));
      c.admits.push_back(a);
    }
    for (int i = 0, n = static_cast<int>(rng() % 6); i < n; ++i)
      c.feeds.push_back({.id = rng(), .token = static_cast<int32_t>(rng() % 100000)});
    const auto bytes = encode_group_command(c);
    auto back = decode_group_command(bytes);
    REQUIRE(back.is_ok());
    CHECK(back->stop == c.stop);
    CHECK(back->step == c.step);
    CHECK(back->drops == c.drops);
    REQUIRE(back->admits.size() == c.admits.size());
    for (size_t i = 0; i < c.admits.size(); ++i) {
      CHECK(back->admits[i].id == c.admits[i].id);
      CHECK(back->admits[i].position == c.admits[i].position);
      CHECK(back->admits[i].image == c.admits[i].image);
      CHECK(back->admits[i].from_region == c.admits[i].from_region);
      CHECK(back->admits[i].slot == c.admits[i].slot);
      CHECK(back->admits[i].page_ids == c.admits[i].page_ids);
    }
    REQUIRE(back->feeds.size() == c.feeds.size());
    for (size_t i = 0; i < c.feeds.size(); ++i) {
      CHECK(back->feeds[i].id == c.feeds[i].id);
      CHECK(back->feeds[i].token == c.feeds[i].token);
    }
    // Every strict prefix is refused, and so is a trailing byte.
    for (size_t cut = 0; cut < bytes.size(); cut += 1 + bytes.size() / 17) {
      auto bad = decode_group_command(std::span(bytes).first(cut));
      CHECK_FALSE(bad.is_ok());
    }
    auto padded = bytes;
    padded.push_back(std::byte{0});
    auto bad = decode_group_command(padded);
    REQUIRE_FALSE(bad.is_ok());
    CHECK_THAT(bad.status().message(), Catch::Contains("trailing"));
  }
}
