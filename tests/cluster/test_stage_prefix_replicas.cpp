// The prefix caches of a prefill pipeline's stages stay in step (prefill_node/stage_prefix.h): stage 0
// and stage 1 hold different layers (different bytes per slot and page), yet with the same calls in the
// same order -- stage 0's lookups, its page-pressure evictions replayed from the chunk sync, every
// commit -- stage 1 resumes every request where stage 0 does, plans the same checkpoints, and ends with
// the same cached prefixes, over random prompts with shared prefixes, branches and a pool tight enough
// to evict. A replica that misses one of stage 0's moves is caught by name.
#include <catch2/catch.hpp>

#include <random>

#include "engine/kv_cache.h"
#include "kernels/backend_select.h"
#include "prefill_node/stage_prefix.h"
#include "tests/engine/model_fixture.h"

using namespace k3;
using namespace k3::prefill;
using namespace k3::test;

namespace {

struct Stage {
  std::unique_ptr<CachePools> pools;
  std::unique_ptr<StagePrefixCache> cache;
  Stage(Backend& be, const ModelConfig& cfg, int begin, int end, const PrefixCacheOptions& po) {
    const CacheOptions co{.max_seqs = 2, .page_size = 16, .num_pages = 60, .checkpoint_slots = 5};
    pools = std::make_unique<CachePools>(be, cfg, begin, end, co);
    const CacheLayout layout = cache_layout(cfg, be).value();
    cache = StagePrefixCache::create(*pools, cfg, layout, po, 64, be).value();
  }
};

// What a stage's pass does to the caches, without the model: pages for each chunk, tokens advance.
void run_chunks(Stage& s, SeqCache& seq, int64_t n, std::vector<uint32_t>& evictions, bool first) {
  size_t i = 0;
  while (seq.num_tokens < n) {
    const int64_t end = std::min<int64_t>(n, (seq.num_tokens / 64 + 1) * 64);
    if (first) {
      uint32_t ev = 0;
      REQUIRE(s.cache->reserve_first(seq, end - seq.num_tokens, ev).is_ok());
      evictions.push_back(ev);
    } else {
      REQUIRE(s.cache->reserve_replica(seq, end - seq.num_tokens, evictions.at(i++)).is_ok());
    }
    seq.num_tokens = end;
  }
}

std::vector<uint64_t> sorted_hashes(const Stage& s) {
  auto h = s.cache->cache().tree().checkpoint_hashes();
  std::sort(h.begin(), h.end());
  return h;
}

}  // namespace

TEST_CASE("the stages' prefix caches make the same moves and stay in step", "[prefix_cache]") {
  const ModelConfig cfg = tiny_config();
  auto be = make_backend({.kind = "cpu", .threads = 1}).value();
  const int split = 1;   // uneven stages: their own bytes per slot and page differ
  PrefixCacheOptions po{.enabled = true, .block_tokens = 64, .checkpoint_every = 1};
  Stage s0(*be, cfg, 0, split, po), s1(*be, cfg, split, cfg.num_hidden_layers, po);
  REQUIRE((s0.pools->slot_bytes() != s1.pools->slot_bytes() || s0.pools->page_bytes() != s1.pools->page_bytes()));

  std::mt19937 rng(4);
  std::vector<std::vector<int32_t>> systems;
  for (int i = 0; i < 3; ++i) systems.push_back(random_tokens(rng, 64 + int(rng() % 200), cfg.vocab_size));
  int hits = 0;
  for (int r = 0; r < 60; ++r) {
    const auto& sys = systems[rng() % systems.size()];
    std::vector<int32_t> prompt(sys.begin(), sys.begin() + 1 + rng() % sys.size());
    const auto tail = random_tokens(rng, 1 + int(rng() % 180), cfg.vocab_size);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    INFO("request " << r << ", " << prompt.size() << " tokens");
    SeqCache q0, q1;
    ChunkCacheSync sync;
    PrefixLease l0 = s0.cache->open_first(prompt, q0, sync).value();
    auto l1 = s1.cache->open_replica(sync.prompt, q1, uint64_t(l0.cached_tokens), sync.plan, 1);
    REQUIRE(l1.is_ok());
    hits += l0.cached_tokens > 0;
    std::vector<uint32_t> evictions;
    run_chunks(s0, q0, int64_t(prompt.size()), evictions, true);
    run_chunks(s1, q1, int64_t(prompt.size()), evictions, false);
    s0.cache->commit(l0, prompt, q0);
    s1.cache->commit(*l1, prompt, q1);
    s0.cache->release(l0);
    s1.cache->release(*l1);
    s0.pools->close(q0);
    s1.pools->close(q1);
    REQUIRE(sorted_hashes(s0) == sorted_hashes(s1));
    REQUIRE(s0.cache->cache().tree().bytes() == s1.cache->cache().tree().bytes());
  }
  CHECK(hits > 10);
  CHECK(s0.cache->cache().stats().evictions > 0);   // the pool was tight enough to evict
  CHECK(s0.cache->cache().stats().evictions == s1.cache->cache().stats().evictions);

  // A replica that missed stage 0's lookup of a request goes out of step: the next request that
  // stage 0 resumes where the replica cannot is refused by name (the caller fails the request).
  const auto& sys = systems[0];
  std::vector<int32_t> prompt(sys.begin(), sys.end());
  prompt.push_back(1);
  SeqCache q0, q1;
  ChunkCacheSync sync;
  PrefixLease l0 = s0.cache->open_first(prompt, q0, sync).value();
  auto bad = s1.cache->open_replica(sync.prompt, q1, uint64_t(l0.cached_tokens) + 64, sync.plan, 1);
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message().find("stage 1 is out of step with stage 0") != std::string::npos);
  CHECK(s1.pools->free_slots() == s1.pools->total_slots() - s1.cache->cache().tree().num_checkpoints());
  s0.cache->release(l0);
  s0.pools->close(q0);
}
