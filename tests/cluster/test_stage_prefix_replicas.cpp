// The prefix caches of a prefill pipeline's stages stay in step (prefill_node/stage_prefix.h): stage 0
// and stage 1 hold different layers (different bytes per slot and page), yet with the same calls in the
// same order -- stage 0's lookups, its page-pressure evictions replayed from the chunk sync, every
// commit -- stage 1 resumes every request where stage 0 does, takes the same checkpoints, and ends with
// the same cached prefixes, over random prompts with shared prefixes, branches and a pool tight enough
// to evict. A replica that drifted (a request that ended on it before it committed, a restart with an
// empty cache) lacks what stage 0 resumes from: the lookup says so by name, the request is computed
// again from token 0 on both stages instead of failing, and that recompute repairs the replica.
#include <catch2/catch.hpp>

#include <algorithm>
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
  Stage(Backend& be, const ModelConfig& cfg, int begin, int end, const PrefixCacheOptions& po, int num_pages = 60,
        int checkpoint_slots = 5) {
    const CacheOptions co{.max_seqs = 2, .page_size = 16, .num_pages = num_pages, .checkpoint_slots = checkpoint_slots};
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

// One request through both stages as the prefill stages run it (prefill_stage.cpp): when stage 1's
// replica lacks the state stage 0 resumes from, stage 0 drops its try and computes the request again
// with a forced miss. `finish1` false: the request ends on stage 1 before it computed (an abort that
// reached stage 1 first), after stage 0 committed it. Returns whether a recompute was needed.
bool serve(Stage& s0, Stage& s1, const std::vector<int32_t>& prompt, bool finish1 = true) {
  SeqCache q0, q1;
  ChunkCacheSync sync;
  PrefixLease l0 = s0.cache->open_first(prompt, q0, sync).value();
  auto l1 = s1.cache->open_replica(sync.prompt, q1, uint64_t(l0.cached_tokens), sync.plan, 1);
  const bool again = !l1.is_ok();
  if (again) {
    INFO(l1.status().to_string());
    REQUIRE(l1.status().code() == Code::NotFound);
    CHECK(l1.status().message().find("stage 1 lacks the checkpoint at " + std::to_string(l0.cached_tokens)) !=
          std::string::npos);
    CHECK(q1.slot < 0);   // nothing held by the refused lookup
    s0.cache->release(l0);
    s0.pools->close(q0);
    l0 = s0.cache->open_first(prompt, q0, sync, /*recompute=*/true).value();
    REQUIRE(l0.cached_tokens == 0);
    l1 = s1.cache->open_replica(sync.prompt, q1, 0, sync.plan, 1);
    REQUIRE(l1.is_ok());
  }
  std::vector<uint32_t> evictions;
  run_chunks(s0, q0, int64_t(prompt.size()), evictions, true);
  s0.cache->commit(l0, prompt, q0);
  if (finish1) {
    run_chunks(s1, q1, int64_t(prompt.size()), evictions, false);
    s1.cache->commit(*l1, prompt, q1);
  } else {
    for (uint32_t e : evictions) s1.cache->replay_evictions(e);   // the dropped chunks' evictions
  }
  s0.cache->release(l0);
  s1.cache->release(*l1);
  s0.pools->close(q0);
  s1.pools->close(q1);
  return again;
}

bool subset(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  return std::includes(b.begin(), b.end(), a.begin(), a.end());
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


  // A request that ends on stage 1 before it computed (after stage 0 committed it) leaves the replica
  // without that prefix; the next request resuming there is computed again and repairs it.
  const auto& sys = systems[0];
  std::vector<int32_t> prompt(sys.begin(), sys.end());
  const auto fresh_tail = random_tokens(rng, 200, cfg.vocab_size);
  prompt.insert(prompt.end(), fresh_tail.begin(), fresh_tail.end());
  CHECK_FALSE(serve(s0, s1, prompt, /*finish1=*/false));
  CHECK(sorted_hashes(s0) != sorted_hashes(s1));
  prompt.push_back(1);
  CHECK(serve(s0, s1, prompt));                 // drift found, computed again: not failed
  CHECK(sorted_hashes(s0) == sorted_hashes(s1));   // and the trees converged
  prompt.push_back(2);
  CHECK_FALSE(serve(s0, s1, prompt));           // the next one hits on both stages
  CHECK(sorted_hashes(s0) == sorted_hashes(s1));
  CHECK(s1.pools->free_slots() == s1.pools->total_slots() - s1.cache->cache().tree().num_checkpoints());
}

TEST_CASE("a restarted stage's empty replica is repaired by recomputes, never failing a request", "[prefix_cache]") {
  const ModelConfig cfg = tiny_config();
  auto be = make_backend({.kind = "cpu", .threads = 1}).value();
  PrefixCacheOptions po{.enabled = true, .block_tokens = 64, .checkpoint_every = 2};   // sparse checkpoints
  // A pool large enough to keep every prefix: what stage 0 holds is exactly what the prompts left.
  Stage s0(*be, cfg, 0, 1, po, 400, 40);
  auto s1 = std::make_unique<Stage>(*be, cfg, 1, cfg.num_hidden_layers, po, 400, 40);
  std::mt19937 rng(9);
  std::vector<std::vector<int32_t>> systems, prompts;
  for (int i = 0; i < 3; ++i) systems.push_back(random_tokens(rng, 130 + int(rng() % 200), cfg.vocab_size));
  auto draw = [&] {
    const auto& sys = systems[rng() % systems.size()];
    std::vector<int32_t> p(sys.begin(), sys.begin() + 64 + rng() % (sys.size() - 64));
    const auto tail = random_tokens(rng, 1 + int(rng() % 150), cfg.vocab_size);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  for (int r = 0; r < 12; ++r) {
    prompts.push_back(draw());
    CHECK_FALSE(serve(s0, *s1, prompts.back()));
  }
  REQUIRE(sorted_hashes(s0) == sorted_hashes(*s1));
  REQUIRE(s0.cache->cache().tree().num_checkpoints() > 6);

  s1 = std::make_unique<Stage>(*be, cfg, 1, cfg.num_hidden_layers, po, 400, 40);   // stage 1 restarted: empty
  int recomputes = 0;
  for (int r = 0; r < 12; ++r) {
    INFO("request " << r << " after the restart");
    prompts.push_back(draw());
    recomputes += serve(s0, *s1, prompts.back());
    CHECK(subset(sorted_hashes(*s1), sorted_hashes(s0)));   // the replica never holds what stage 0 does not
  }
  CHECK(recomputes > 0);
  // Every prefix stage 0 caches came from these prompts: sending each again repairs its path, after
  // which the replicas are equal and no request needs a recompute any more.
  for (const auto& p : prompts) serve(s0, *s1, p);
  CHECK(sorted_hashes(s0) == sorted_hashes(*s1));
  for (const auto& p : prompts) CHECK_FALSE(serve(s0, *s1, p));
}
