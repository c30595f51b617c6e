// The prefill stages' prefix-cache reports as the router keeps them: stage 0's hashes feed KV-aware
// placement (deepest_cached_pair picks the instance that resumes a prompt deepest), every stage's
// counters are on /metrics by node, the cluster totals count each instance once (its stage 0), and a
// node that goes down stops attracting placements.
#include <catch2/catch.hpp>

#include <numeric>

#include "engine/prefix_hash.h"
#include "router/cluster_placement.h"
#include "router/prefill_cache_reports.h"

using namespace k3;
using namespace k3::router;

namespace {

protocol::Heartbeat report(uint32_t stage, std::vector<uint64_t> hashes, uint64_t lookup, uint64_t hit) {
  return {.role = protocol::Role::Prefill, .instance_id = "p", .stage = stage,
          .prefix = {.block_tokens = 4, .block_hashes = std::move(hashes), .lookup_tokens = lookup, .hit_tokens = hit,
                     .checkpoints_stored = 3, .pool_pages = 64, .pool_free_pages = 60}};
}

}  // namespace

TEST_CASE("prefill cache reports drive KV-aware placement and /metrics", "[placement][prefix_cache]") {
  std::vector<int32_t> system(12);
  std::iota(system.begin(), system.end(), 100);
  const auto h = prefix_block_hashes(system, 4);   // 3 blocks
  PrefillCacheReports reports;
  reports.update("prefill/a/0", report(0, {h[0]}, 40, 8));
  reports.update("prefill/a/1", report(1, {h[0]}, 40, 8));
  reports.update("prefill/b/0", report(0, {h[0], h[1], h[2]}, 100, 64));
  reports.update("decode/d", {.role = protocol::Role::Decode});   // not a prefill stage: ignored

  std::vector<PairLoad> load(2);
  load[0].cached_blocks = reports.blocks("prefill/a/0", load[0].cached_block_tokens);
  load[1].cached_blocks = reports.blocks("prefill/b/0", load[1].cached_block_tokens);
  load[1].in_flight = 3;   // busier, but it resumes the prompt deepest
  REQUIRE(load[0].cached_blocks);
  REQUIRE(load[1].cached_block_tokens == 4);
  auto prompt = system;
  prompt.push_back(1);
  CHECK(deepest_cached_pair({0, 1}, load, prompt) == 1);
  PlacementPolicy policy(Placement::PrefixAffinity, 16);
  CHECK(policy.pick({0, 1}, load, prompt) == 1);

  const std::string text = reports.prometheus_text();
  CHECK(text.find("k3_prefill_prefix_cache_hit_tokens_total{node=\"prefill/b/0\"} 64\n") != std::string::npos);
  CHECK(text.find("k3_prefill_prefix_cache_lookup_tokens_total{node=\"prefill/a/1\"} 40\n") != std::string::npos);
  CHECK(text.find("k3_prefill_prefix_cache_cached_prefixes{node=\"prefill/b/0\"} 3\n") != std::string::npos);
  CHECK(text.find("k3_prefill_pool_free_pages{node=\"prefill/a/0\"} 60\n") != std::string::npos);
  CHECK(text.find("decode/d") == std::string::npos);
  const protocol::PrefixCacheReport totals = reports.instance_totals();
  CHECK(totals.lookup_tokens == 140);   // a/0 + b/0: a/1 looked the same prompts up again
  CHECK(totals.hit_tokens == 72);
  CHECK(totals.checkpoints_stored == 6);

  // b goes down: its hashes no longer attract the prompt; its counters stay (totals).
  reports.forget("prefill/b/0");
  load[1].cached_blocks = reports.blocks("prefill/b/0", load[1].cached_block_tokens);
  CHECK(deepest_cached_pair({0, 1}, load, prompt) == 0);
  CHECK(reports.instance_totals().hit_tokens == 72);
  // A stage whose cache is off reports block_tokens 0: nothing to score.
  reports.update("prefill/c/0", {.role = protocol::Role::Prefill});
  int bt = -1;
  CHECK(reports.blocks("prefill/c/0", bt) == nullptr);
}
