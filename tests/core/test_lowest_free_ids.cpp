// LowestFreeIds (common/core/lowest_free_ids.h): on a random run of takes and gives, every take returns
// the lowest free id, as an ordered reference set does, and the pool empties and refills exactly.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "common/core/lowest_free_ids.h"

TEST_CASE("LowestFreeIds hands out the lowest free id, whatever order ids come back in", "[core]") {
  constexpr uint32_t kCount = 200;
  k3::LowestFreeIds<uint32_t> ids(kCount);
  std::set<uint32_t> free_ref, taken;
  for (uint32_t i = 0; i < kCount; ++i) free_ref.insert(i);
  std::mt19937 rng(11);
  for (int step = 0; step < 20000; ++step) {
    REQUIRE(ids.size() == free_ref.size());
    if (taken.empty() || (rng() % 3 != 0 && !free_ref.empty())) {
      const auto got = ids.take();
      REQUIRE(got);
      REQUIRE(*got == *free_ref.begin());
      free_ref.erase(free_ref.begin());
      taken.insert(*got);
    } else {
      auto it = taken.begin();
      std::advance(it, rng() % taken.size());
      ids.give(*it);
      free_ref.insert(*it);
      taken.erase(it);
    }
  }
  while (ids.take()) {
  }
  CHECK(ids.empty());
  CHECK_FALSE(ids.take());
  ids.give(7);
  ids.give(3);
  CHECK(ids.take() == 3u);
  CHECK(ids.take() == 7u);
}
