// Prefix-affinity placement with prefix-cache reports: the prompt goes to the pair whose cache resumes
// it deepest (ties to the less loaded pair), and to the sticky hash when no report covers it. The
// reports are real PrefixTree::checkpoint_hashes of trees holding the cached prompts.
#include <catch2/catch.hpp>

#include <numeric>

#include "engine/prefix_hash.h"
#include "engine/prefix_tree.h"
#include "router/cluster_placement.h"

using namespace k3;
using namespace k3::router;

namespace {
constexpr int B = 4;
std::vector<int32_t> seq(int from, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}
std::set<uint64_t> report(PrefixTree& t) {
  auto h = t.checkpoint_hashes();
  return {h.begin(), h.end()};
}
std::vector<int32_t> pages(int tokens) { return seq(0, tokens / 2); }
}  // namespace

TEST_CASE("prefix-affinity sends a prompt to the pair whose cache resumes it deepest", "[placement]") {
  PrefixTree a({.block_tokens = B, .page_size = 2}), b({.block_tokens = B, .page_size = 2});
  const auto system = seq(0, 8);
  a.insert(system, pages(8), {{4, 1}});              // a: only the first block
  auto longer = system;
  for (int32_t t : seq(100, 4)) longer.push_back(t);
  b.insert(longer, pages(12), {{8, 1}, {12, 2}});    // b: the whole system prompt and more
  const auto ra = report(a), rb = report(b);
  REQUIRE(ra.size() == 1);
  REQUIRE(rb.size() == 2);
  REQUIRE(rb.count(prefix_block_hashes(system, B).back()));

  std::vector<PairLoad> load(3);
  load[0] = {.in_flight = 0, .cached_blocks = &ra, .cached_block_tokens = B};
  load[1] = {.in_flight = 5, .cached_blocks = &rb, .cached_block_tokens = B};   // busier, but deeper
  const std::vector<int> ready{0, 1, 2};
  auto prompt = system;
  prompt.push_back(7);
  REQUIRE(deepest_cached_pair(ready, load, prompt) == 1);
  PlacementPolicy policy(Placement::PrefixAffinity, 16);
  REQUIRE(policy.pick(ready, load, prompt) == 1);
  // Pair 1 not ready: the next deepest.
  REQUIRE(policy.pick({0, 2}, load, prompt) == 0);
  // A prompt of exactly the cached 8 tokens can resume only at 4 (its last token is computed): only
  // pair 0 has a checkpoint there.
  REQUIRE(deepest_cached_pair(ready, load, system) == 0);
  // Nothing covered: no cached pick, the sticky hash decides (and keeps deciding).
  const auto other = seq(500, 9);
  REQUIRE(deepest_cached_pair(ready, load, other) == -1);
  const int first = policy.pick(ready, load, other);
  REQUIRE(policy.pick(ready, load, other) == first);
}

TEST_CASE("prefix block hashes chain whole blocks only", "[placement]") {
  auto h = prefix_block_hashes(seq(0, 10), 4);
  REQUIRE(h.size() == 2);
  auto same_start = seq(0, 8);
  same_start[6] = 99;   // differs in block 1 only
  auto g = prefix_block_hashes(same_start, 4);
  REQUIRE(g[0] == h[0]);
  REQUIRE(g[1] != h[1]);
  REQUIRE(prefix_block_hashes(seq(0, 3), 4).empty());
}
