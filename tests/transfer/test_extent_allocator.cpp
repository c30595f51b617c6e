// The extent allocator a source arena is carved with, against a slow reference (a byte map of what is
// taken) under random take / give: every extent is aligned, inside the range and disjoint from the others,
// take fails only when no free run of that length exists, and free bytes and extents match the map.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <vector>

#include "common/core/status.h"
#include "transfer/extent_allocator.h"

using k3::transfer::ExtentAllocator;

namespace {
// The longest run of free units in the reference map.
uint64_t longest_free_run(const std::vector<bool>& taken) {
  uint64_t best = 0, run = 0;
  for (bool t : taken) {
    run = t ? 0 : run + 1;
    best = std::max(best, run);
  }
  return best;
}
size_t free_runs(const std::vector<bool>& taken) {
  size_t n = 0;
  for (size_t i = 0; i < taken.size(); ++i) n += !taken[i] && (i == 0 || taken[i - 1]);
  return n;
}
}  // namespace

TEST_CASE("extent allocator: first fit, aligned, merged on give; matches a byte-map reference", "[transfer][arena]") {
  const uint64_t align = 16, units = 200;
  ExtentAllocator a(units * align + 7, align);   // a tail shorter than one unit is not handed out
  CHECK(a.size() == units * align);
  CHECK(a.free_bytes() == units * align);
  std::vector<bool> taken(units, false);
  std::map<uint64_t, uint64_t> held;             // offset -> units
  std::mt19937 rng(11);
  for (int step = 0; step < 5000; ++step) {
    const bool give = !held.empty() && (rng() % 2 == 0 || held.size() > 40);
    if (give) {
      auto it = std::next(held.begin(), static_cast<long>(rng() % held.size()));
      a.give(it->first);
      for (uint64_t u = 0; u < it->second; ++u) taken[it->first / align + u] = false;
      held.erase(it);
    } else {
      const uint64_t bytes = rng() % (align * 24);   // 0 still takes one unit
      const uint64_t need = std::max<uint64_t>(1, (bytes + align - 1) / align);
      const auto at = a.take(bytes);
      if (!at) {
        CHECK(longest_free_run(taken) < need);
        continue;
      }
      REQUIRE(*at % align == 0);
      REQUIRE(*at / align + need <= units);
      // First fit: no free run of `need` units starts below it.
      uint64_t run = 0;
      for (uint64_t u = 0; u < *at / align; ++u) {
        run = taken[u] ? 0 : run + 1;
        REQUIRE(run < need);
      }
      for (uint64_t u = 0; u < need; ++u) {
        REQUIRE_FALSE(taken[*at / align + u]);
        taken[*at / align + u] = true;
      }
      held[*at] = need;
    }
    uint64_t free_units = 0;
    for (bool t : taken) free_units += !t;
    REQUIRE(a.free_bytes() == free_units * align);
    REQUIRE(a.free_extents() == free_runs(taken));
    REQUIRE(a.largest_free() == longest_free_run(taken) * align);
  }
  for (const auto& [at, n] : held) a.give(at);
  CHECK(a.free_bytes() == a.size());
  CHECK(a.free_extents() == 1);
}

TEST_CASE("extent allocator: giving an offset it did not hand out is an error naming it", "[transfer][arena]") {
  ExtentAllocator a(1024, 256);
  const auto at = a.take(300).value();   // two units, at 0
  REQUIRE(at == 0);
  CHECK_THROWS_WITH(a.give(256), Catch::Contains("offset 256") && Catch::Contains("not taken"));
  a.give(at);
  CHECK_THROWS_WITH(a.give(at), Catch::Contains("not taken"));
  CHECK_THROWS_WITH(ExtentAllocator(1024, 100), Catch::Contains("power of two"));
}
