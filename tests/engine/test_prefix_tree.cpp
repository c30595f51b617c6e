// The prefix cache's radix tree alone: matching at checkpoints, splits at branch points, what insert
// adopts, the checkpoints on a path, pinning, and the eviction order (leaves first, recency weighted by compute saved per byte,
// branch points kept longer).
#include <catch2/catch.hpp>

#include <numeric>

#include "engine/prefix_tree.h"

using namespace k3;

namespace {
constexpr int B = 4, PS = 2;   // 4-token blocks, 2-token pages: small enough to read

PrefixTreeOptions opts(double alpha = 0.0) {
  return {.block_tokens = B, .page_size = PS, .slot_bytes = 100, .page_bytes = 10, .alpha = alpha,
          .branch_bonus = 1.0, .prefill_cost = [](int64_t n) { return double(n * n); }};
}
std::vector<int32_t> seq(int from, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}
std::vector<int32_t> pages_for(int first, int tokens) { return seq(first, tokens / PS); }
std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
}  // namespace

TEST_CASE("a match resumes at the deepest checkpoint at or below the limit", "[prefix]") {
  PrefixTree t(opts());
  auto toks = seq(0, 12);
  auto a = t.insert(toks, pages_for(100, 12), {{4, 1}, {12, 2}});
  REQUIRE(a.pages == pages_for(100, 12));
  REQUIRE(a.slots == std::vector<int>{1, 2});
  REQUIRE(t.num_checkpoints() == 2);
  REQUIRE(t.num_nodes() == 2);   // the edge was cut at the checkpoint at 4

  auto m = t.match(concat(toks, seq(50, 3)), 14);
  REQUIRE(m.tokens == 12);
  REQUIRE(m.slot == 2);
  REQUIRE(m.pages == pages_for(100, 12));
  REQUIRE(m.matched == 12);

  // The limit (prompt length - 1) excludes the checkpoint at 12 for a 12-token prompt.
  m = t.match(toks, 11);
  REQUIRE(m.tokens == 4);
  REQUIRE(m.slot == 1);
  REQUIRE(m.pages == pages_for(100, 4));

  // Divergence inside the second block of the edge: only whole matched blocks count.
  auto other = toks;
  other[9] = 999;
  m = t.match(other, 100);
  REQUIRE(m.matched == 8);
  REQUIRE(m.tokens == 4);

  // No block in common: a miss.
  m = t.match(seq(500, 8), 100);
  REQUIRE(m.node == nullptr);
  REQUIRE(m.tokens == 0);
  REQUIRE(m.pages.empty());
}

TEST_CASE("insert splits at a branch point and adopts only what is new", "[prefix]") {
  PrefixTree t(opts());
  auto base = seq(0, 8);
  t.insert(base, pages_for(100, 8), {{8, 1}});
  // A branch sharing the first block, with its own pages (the first block's pages are the tree's).
  auto branch = concat(seq(0, 4), seq(40, 8));
  auto branch_pages = concat(pages_for(100, 4), pages_for(200, 8));
  auto a = t.insert(branch, branch_pages, {{4, 7}, {12, 8}});
  REQUIRE(a.pages == pages_for(200, 8));
  REQUIRE(a.slots == std::vector<int>{7, 8});   // the branch point at 4 got the new checkpoint
  REQUIRE(t.num_nodes() == 3);
  REQUIRE(t.num_pages() == 8);

  // Same prefix again: nothing adopted (the caller keeps and frees its own copies).
  a = t.insert(branch, concat(pages_for(100, 4), pages_for(300, 8)), {{12, 9}});
  REQUIRE(a.pages.empty());
  REQUIRE(a.slots.empty());
  REQUIRE(t.match(branch, 100).slot == 8);
  REQUIRE(t.match(base, 100).slot == 1);
  REQUIRE(t.bytes() == 3 * 100 + 8 * 10);
}

TEST_CASE("checkpoints_on lists the checkpoints on a prompt's cached path, nothing past a divergence", "[prefix]") {
  PrefixTree t(opts());
  t.insert(seq(0, 16), pages_for(100, 16), {{4, 1}, {12, 2}});
  CHECK(t.checkpoints_on(seq(0, 16)) == std::vector<int64_t>{4, 12});
  CHECK(t.checkpoints_on(concat(seq(0, 16), seq(90, 3))) == std::vector<int64_t>{4, 12});
  CHECK(t.checkpoints_on(seq(0, 13)) == std::vector<int64_t>{4, 12});
  CHECK(t.checkpoints_on(seq(0, 11)) == std::vector<int64_t>{4});        // the edge to 12 is not whole
  CHECK(t.checkpoints_on(concat(seq(0, 8), seq(50, 8))).size() == 1);   // diverges after block 2
  CHECK(t.checkpoints_on(seq(50, 8)).empty());
}

TEST_CASE("eviction takes the least recently used leaf first and keeps pinned paths", "[prefix]") {
  PrefixTree t(opts());
  t.insert(seq(0, 8), pages_for(100, 8), {{8, 1}});     // A
  t.insert(seq(20, 8), pages_for(200, 8), {{8, 2}});    // B
  t.insert(seq(40, 8), pages_for(300, 8), {{8, 3}});    // C
  t.match(seq(0, 8), 8);                                 // A used again: B is now the oldest
  auto m = t.match(seq(20, 9), 8);                       // ...then B, pinned by a running request
  t.lock(m.node);
  auto v = t.evict_one();
  REQUIRE(v);
  REQUIRE(v->slot == 3);                                 // C: oldest unpinned
  REQUIRE(v->leaf);
  REQUIRE(v->pages == pages_for(300, 8));
  v = t.evict_one();
  REQUIRE(v->slot == 1);                                 // A; B stays while pinned
  REQUIRE_FALSE(t.evict_one());
  t.unlock(m.node);
  v = t.evict_one();
  REQUIRE(v->slot == 2);
  REQUIRE(t.num_nodes() == 0);
  REQUIRE(t.bytes() == 0);
}

TEST_CASE("eviction weighs compute saved per byte against recency", "[prefix]") {
  // Two leaves of equal recency rank spread: with alpha large, the one that saves less compute per
  // byte goes first even though it is more recent.
  PrefixTree t(opts(/*alpha=*/10.0));
  t.insert(seq(0, 32), pages_for(100, 32), {{32, 1}});   // long: saves 32^2 for 100 + 160 bytes
  t.insert(seq(90, 4), pages_for(300, 4), {{4, 2}});     // short: saves 16 for 100 + 20 bytes
  auto v = t.evict_one();
  REQUIRE(v->slot == 2);

  PrefixTree r(opts(/*alpha=*/0.0));                      // recency only: the older one goes
  r.insert(seq(0, 32), pages_for(100, 32), {{32, 1}});
  r.insert(seq(90, 4), pages_for(300, 4), {{4, 2}});
  REQUIRE(r.evict_one()->slot == 1);
}

TEST_CASE("a branch point's checkpoint outlives an inner one of equal worth", "[prefix]") {
  // Path 0..8 with checkpoints at 4 (inner) and 8 (branch point of A = ..12 and B = ..48). A runs
  // (pinned); B is deep, so worth more per byte than either inner checkpoint. Linear cost: the two inner
  // checkpoints save 4 tokens each per 100 bytes; only the branch bonus tells them apart.
  auto run = [](double bonus) {
    PrefixTreeOptions o = opts(/*alpha=*/1.0);
    o.branch_bonus = bonus;
    o.prefill_cost = [](int64_t n) { return double(n); };
    PrefixTree t(o);
    auto a = seq(0, 12);
    t.insert(a, pages_for(100, 12), {{4, 1}, {8, 2}, {12, 3}});
    auto m = t.match(concat(a, seq(90, 1)), 100);
    t.lock(m.node);
    t.insert(concat(seq(0, 8), seq(40, 40)), concat(pages_for(100, 8), pages_for(200, 40)), {{48, 4}});
    std::vector<int> order;
    while (auto v = t.evict_one()) order.push_back(v->slot);
    t.unlock(m.node);
    while (auto v = t.evict_one()) order.push_back(v->slot);
    REQUIRE(t.num_nodes() == 0);
    return order;
  };
  auto with_bonus = run(1.0);
  REQUIRE(with_bonus.size() == 4);
  REQUIRE(with_bonus[0] == 1);   // the inner checkpoint at 4 goes first; the pinned leaf A (3) last
  REQUIRE(with_bonus.back() == 3);
  auto without = run(0.0);
  REQUIRE(without[0] == 2);      // no bonus: the tie goes to the deeper node, the branch point
}

TEST_CASE("clear gives back every page and slot once", "[prefix]") {
  PrefixTree t(opts());
  t.insert(seq(0, 8), pages_for(100, 8), {{4, 1}, {8, 2}});
  t.insert(concat(seq(0, 4), seq(60, 4)), concat(pages_for(100, 4), pages_for(500, 4)), {{8, 3}});
  std::vector<int32_t> pages;
  std::vector<int> slots;
  for (auto& v : t.clear()) {
    pages.insert(pages.end(), v.pages.begin(), v.pages.end());
    if (v.slot >= 0) slots.push_back(v.slot);
  }
  std::sort(pages.begin(), pages.end());
  std::sort(slots.begin(), slots.end());
  REQUIRE(pages == concat(pages_for(100, 8), pages_for(500, 4)));
  REQUIRE(slots == std::vector<int>{1, 2, 3});
  REQUIRE(t.num_nodes() == 0);
}

TEST_CASE("bad inserts are refused with the reason", "[prefix]") {
  PrefixTree t(opts());
  REQUIRE_THROWS_WITH(t.insert(seq(0, 6), pages_for(0, 6), {}), Catch::Contains("not whole blocks"));
  REQUIRE_THROWS_WITH(t.insert(seq(0, 8), pages_for(0, 6), {}), Catch::Contains("pages for"));
  REQUIRE_THROWS_WITH(t.insert(seq(0, 8), pages_for(0, 8), {{6, 1}}), Catch::Contains("not a block end"));
}
