// The prefix cache on the real engine and pools (k3-tiny, CPU): checkpoints taken inside the prefill
// pass are bitwise the state of a prefill that stops there; copy-on-write leaves the tree's checkpoint
// untouched; snapshot and donate; a hit gives the cache-off logits bitwise; flush gives every byte back.
#include <catch2/catch.hpp>

#include <cstring>

#include "model_fixture.h"

using namespace k3;
using namespace k3::test;

namespace {

struct Rig {
  ModelConfig cfg;
  WeightStore weights;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
  explicit Rig(bool cache_on, int chunk = 0) {
    cfg = tiny_config("k3-tiny");
    weights = random_weights(cfg, 7, DType::F32);
    backend = make_cpu_backend({.threads = 2});
    EngineOptions o = engine_options(chunk, 4);
    o.cache.checkpoint_slots = 12;
    o.prefix_cache.enabled = cache_on;
    o.prefix_cache.block_tokens = 64;
    engine = Engine::create(*backend, cfg, weights, o).value();
  }
  CachePools& pools() { return engine->caches(); }
  PrefixCache& cache() { return *engine->prefix_cache(); }
  // Bytes of slot `s` of every KDA layer's state and conv pools.
  std::vector<uint8_t> slot_image(int s) {
    std::vector<uint8_t> out;
    for (int l = 0; l < cfg.num_hidden_layers; ++l) {
      if (cfg.layer_kind(l) != LayerKind::Kda) continue;
      for (Tensor* t : {&pools().kda_state(l), &pools().kda_conv(l)}) {
        const int32_t r = t == &pools().kda_state(l) ? pools().state_row(s) : pools().conv_row(s);
        Tensor row = t->slice_rows(r, r + 1);
        const auto* p = static_cast<const uint8_t*>(row.data());
        out.insert(out.end(), p, p + row.nbytes());
      }
    }
    return out;
  }
  // Cache-off reference: logits of a plain prefill of `toks` on a fresh sequence.
  std::vector<float> plain_logits(const std::vector<int32_t>& toks) {
    SeqCache s = engine->open().value();
    Tensor l = engine->prefill(s, toks).value();
    engine->close(s);
    return {l.f32(), l.f32() + l.numel()};
  }
  // A cached request: acquire, prefill the rest with the plan, commit; returns last logits.
  std::vector<float> cached_logits(const std::vector<int32_t>& toks, int64_t* cached = nullptr, bool donate = false) {
    SeqCache s;
    PrefixLease lease = cache().acquire(toks, s, donate).value();
    if (cached) *cached = lease.cached_tokens;
    Tensor l = backend->to_host(engine->prefill_planned_on_backend(s, toks, lease.plan).value());
    cache().commit(lease, toks, s);
    cache().release(lease);
    engine->close(s);
    return {l.f32(), l.f32() + l.numel()};
  }
  uint64_t free_bytes() {
    return uint64_t(pools().free_slots()) * pools().slot_bytes() + uint64_t(pools().free_pages()) * pools().page_bytes();
  }
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("checkpoints taken inside the prefill pass are the state of a prefill that stops there", "[prefix]") {
  for (int chunk : {0, 128}) {
    Rig rig(/*cache_on=*/true, chunk);
    std::mt19937 rng(11);
    auto toks = random_tokens(rng, 200, rig.cfg.vocab_size);
    SeqCache s = rig.engine->open().value();
    std::vector<KdaCheckpoint> plan;
    for (int p : {64, 128, 192}) plan.push_back({.pos = p, .slot = *rig.pools().alloc_slot()});
    (void)rig.engine->prefill_planned_on_backend(s, toks, plan).value();
    for (const KdaCheckpoint& c : plan) {
      SeqCache r = rig.engine->open().value();
      (void)rig.engine->prefill(r, std::vector<int32_t>(toks.begin(), toks.begin() + c.pos)).value();
      INFO("chunk " << chunk << " checkpoint at " << c.pos);
      REQUIRE(rig.slot_image(c.slot) == rig.slot_image(r.slot));
      rig.engine->close(r);
      rig.pools().free_slot(c.slot);
    }
    rig.engine->close(s);
  }
}

TEST_CASE("a hit resumes by copy-on-write and gives the cache-off logits bitwise", "[prefix]") {
  Rig rig(true);
  std::mt19937 rng(12);
  auto system = random_tokens(rng, 150, rig.cfg.vocab_size);
  auto q1 = system, q2 = system;
  auto t1 = random_tokens(rng, 20, rig.cfg.vocab_size), t2 = random_tokens(rng, 37, rig.cfg.vocab_size);
  q1.insert(q1.end(), t1.begin(), t1.end());
  q2.insert(q2.end(), t2.begin(), t2.end());

  int64_t cached = -1;
  auto l1 = rig.cached_logits(q1, &cached);
  REQUIRE(cached == 0);
  REQUIRE(bitwise_equal(l1, rig.plain_logits(q1)));
  REQUIRE(rig.cache().tree().num_checkpoints() == 2);   // at 64 and 128 (the last whole block)

  // The second prompt shares 150 tokens: it resumes at 128 from the tree's checkpoint, which must stay
  // as it was while the request's own copy runs on.
  SeqCache s;
  PrefixLease lease = rig.cache().acquire(q2, s).value();
  REQUIRE(lease.cached_tokens == 128);
  const int tree_slot = rig.cache().tree().peek(q2, 128).slot;
  REQUIRE(tree_slot >= 0);
  REQUIRE(tree_slot != s.slot);
  const auto before = rig.slot_image(tree_slot);
  REQUIRE(rig.slot_image(s.slot) == before);   // the copy
  REQUIRE(rig.pools().page_refs(s.pages[0]) == 2); // the tree's page, shared
  Tensor l = rig.backend->to_host(rig.engine->prefill_planned_on_backend(s, q2, lease.plan).value());
  REQUIRE(rig.slot_image(tree_slot) == before);
  REQUIRE(rig.slot_image(s.slot) != before);
  rig.cache().commit(lease, q2, s);
  rig.cache().release(lease);
  rig.engine->close(s);
  REQUIRE(bitwise_equal({l.f32(), l.f32() + l.numel()}, rig.plain_logits(q2)));
  REQUIRE(rig.cache().stats().hit_tokens == 128);
  REQUIRE(rig.cache().stats().lookup_tokens == q1.size() + q2.size());
}

TEST_CASE("snapshot copies a running request's state into the tree", "[prefix]") {
  Rig rig(true);
  std::mt19937 rng(13);
  auto toks = random_tokens(rng, 64, rig.cfg.vocab_size);
  SeqCache s = rig.engine->open().value();
  (void)rig.engine->prefill(s, toks).value();
  const auto at64 = rig.slot_image(s.slot);
  REQUIRE(rig.cache().snapshot(toks, s));
  // The request runs on; the tree keeps the state as it was at 64.
  SeqCache* sp = &s;
  std::vector<std::vector<int32_t>> one{{5}};
  (void)rig.engine->feed(std::span<SeqCache* const>(&sp, 1), one).value();
  REQUIRE(rig.slot_image(s.slot) != at64);
  auto m = rig.cache().tree().peek(toks, 64);
  REQUIRE(m.tokens == 64);
  REQUIRE(rig.slot_image(m.slot) == at64);
  REQUIRE(rig.pools().page_refs(s.pages[0]) == 2);
  rig.engine->close(s);
  REQUIRE(rig.pools().page_refs(m.pages[0]) == 1);   // the tree's reference outlives the request
  // Not at a block end: refused.
  SeqCache t = rig.engine->open().value();
  (void)rig.engine->prefill(t, std::vector<int32_t>(toks.begin(), toks.begin() + 10)).value();
  REQUIRE_FALSE(rig.cache().snapshot(toks, t));
  rig.engine->close(t);
}

TEST_CASE("donate hands a finished prefill's slot to the tree without a copy", "[prefix]") {
  Rig rig(true);
  std::mt19937 rng(14);
  auto toks = random_tokens(rng, 128, rig.cfg.vocab_size);
  const int free_before = rig.pools().free_slots();
  SeqCache s;
  PrefixLease lease = rig.cache().acquire(toks, s, /*donate=*/true).value();
  REQUIRE(lease.donate_end);
  REQUIRE(lease.plan.size() == 1);             // 64 only: 128 comes by donation
  const int own = s.slot;
  (void)rig.engine->prefill_planned_on_backend(s, toks, lease.plan).value();
  const auto state = rig.slot_image(own);
  rig.cache().commit(lease, toks, s);
  REQUIRE(s.slot == -1);                        // the request no longer owns it
  rig.cache().release(lease);
  rig.engine->close(s);
  REQUIRE(rig.cache().stats().donations == 1);
  auto m = rig.cache().tree().peek(toks, 128);
  REQUIRE(m.tokens == 128);
  REQUIRE(m.slot == own);
  REQUIRE(rig.slot_image(own) == state);
  REQUIRE(rig.pools().free_slots() == free_before - 2);   // two checkpoints, no running slot

  // A longer prompt resumes at 128 and matches the cache-off logits bitwise.
  auto longer = toks;
  longer.push_back(3);
  longer.push_back(9);
  int64_t cached = 0;
  auto l = rig.cached_logits(longer, &cached);
  REQUIRE(cached == 128);
  REQUIRE(bitwise_equal(l, rig.plain_logits(longer)));
}

TEST_CASE("flush returns the pools' free bytes to where they started", "[prefix]") {
  Rig rig(true);
  const uint64_t start = rig.free_bytes();
  std::mt19937 rng(15);
  auto base = random_tokens(rng, 130, rig.cfg.vocab_size);
  for (int i = 0; i < 4; ++i) {
    auto p = base;
    auto tail = random_tokens(rng, 10 + 40 * i, rig.cfg.vocab_size);
    p.insert(p.end(), tail.begin(), tail.end());
    (void)rig.cached_logits(p);
  }
  REQUIRE(rig.cache().tree().num_checkpoints() > 0);
  REQUIRE(rig.free_bytes() < start);
  rig.cache().flush();
  REQUIRE(rig.cache().tree().num_nodes() == 0);
  REQUIRE(rig.free_bytes() == start);
}

TEST_CASE("prefix cache options are checked and the bad field named", "[prefix]") {
  CacheOptions c;
  c.page_size = 16;
  c.checkpoint_slots = 4;
  PrefixCacheOptions o;
  o.enabled = true;
  o.block_tokens = 96;
  REQUIRE_THAT(o.validate(c, 0).message(), Catch::Contains("block_tokens (96)"));
  o.block_tokens = 64;
  REQUIRE_THAT(o.validate(c, 100).message(), Catch::Contains("prefill_chunk (100)"));
  REQUIRE(o.validate(c, 128).is_ok());
  c.checkpoint_slots = 0;
  REQUIRE_THAT(o.validate(c, 0).message(), Catch::Contains("checkpoint_slots"));
}
