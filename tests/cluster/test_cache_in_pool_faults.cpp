// The lazy-alloc fault cases with the decode pools' ids shared with real engine cache pools
// (decode_node/cache_in_pool.h: RankPool::share_ids + CachePoolIds), as k3-decode --cache-in-pool runs
// them: an ABORT at every state of the protocol, and a prefill peer dying at every state (with the stages
// writing after the whole prompt, and streaming chunk by chunk), leave both the
// transfer pools and the engine's pools exactly as they started, also when the engine had adopted the
// request (it was decoding) and lets go after the transfer did; and once the engine took a decoding
// request over (hand_over), what it frees (a preemption closing the request's cache) is free in the pool at
// once, not when the request ends.
#include <catch2/catch.hpp>

#include "decode_node/cache_in_pool.h"
#include "tests/engine/model_fixture.h"
#include "tests/engine/separate_pools.h"
#include "tests/transfer/lazy_alloc_harness.h"

using namespace k3;
using namespace k3::transfer;
using namespace k3::transfer::lazy_alloc_test;

namespace {

// One engine cache per decode rank of the harness, with its id space (8 pages of 4 tokens, 2 slots). As
// under --cache-in-pool, the pools are another owner's arrays (no unified region), so page ids are the
// transfer pool's 0..7.
struct EngineCaches {
  std::unique_ptr<Backend> be = make_cpu_backend({.threads = 1});
  ModelConfig cfg = test::tiny_config("k3-tiny", 512);
  CacheOptions opts{.max_seqs = 2, .page_size = 4, .num_pages = 8};
  std::vector<std::unique_ptr<test::SeparatePools>> memory;
  std::vector<std::unique_ptr<CachePools>> caches;
  std::vector<SeqCache> adopted;
  EngineCaches() {
    for (int i = 0; i < 2; ++i) {
      memory.push_back(std::make_unique<test::SeparatePools>(cfg, *be, opts));
      caches.push_back(std::make_unique<CachePools>(*be, cfg, 0, cfg.num_hidden_layers, test::SeparatePools::on(opts, *memory.back())));
    }
  }
  std::function<std::shared_ptr<PoolIds>(uint32_t)> share() {
    return [this](uint32_t i) { return std::make_shared<decode::CachePoolIds>(*caches.at(i)); };
  }
  // What the rank does when the request is ready: its engine takes references on every rank's pages and slot.
  void adopt(const Harness& h) {
    const auto* alloc = h.decode->allocation(kId);
    REQUIRE(alloc);
    REQUIRE(alloc->size() == 2);
    for (size_t i = 0; i < 2; ++i) {
      const auto& a = (*alloc)[i];
      const auto& ids = a.pages.page_ids();
      adopted.push_back(caches[i]->adopt(static_cast<int>(*a.slot.slot()), std::vector<int32_t>(ids.begin(), ids.end()), 0).value());
    }
  }
  void close_all() {
    for (size_t i = 0; i < adopted.size(); ++i) caches[i]->close(adopted[i]);
    adopted.clear();
  }
  void check_full() const {
    for (const auto& c : caches) {
      CHECK(c->free_pages() == 8);
      CHECK(c->free_slots() == 2);
    }
  }
};

}  // namespace

TEST_CASE("shared engine cache ids: ABORT at every state leaves pools and caches as they started",
          "[cluster][lazy_alloc][abort]") {
  const int k_stop = GENERATE(range(1, Harness::kSteps));  // up to DECODING (step 9 would finish it)
  const int where = GENERATE(0, 1, 2);
  // 0: router ABORT reaches decode first, then every stage; 1: stages first, then decode; 2: only decode.
  const bool streaming = GENERATE(false, true);   // the stages write after the whole prompt, or chunk by chunk
  EngineCaches engine;
  Harness h(engine.share());
  h.streaming = streaming;
  for (int k = 0; k < k_stop; ++k) h.step(k);
  INFO("abort after step " << k_stop - 1 << ", delivery " << where << (streaming ? ", streaming" : ""));
  const bool decoding = h.ready == 1;
  if (decoding) engine.adopt(h);
  const Abort abort{.request_id = kId, .reason = AbortReason::ClientCancelled, .origin_role = Role::Router};
  if (where == 0 || where == 2) h.deliver({Role::Decode, "decode-a", 0}, abort);
  if (where == 0 || where == 1)
    for (uint32_t s = 0; s < Harness::kStages; ++s) h.deliver({Role::Prefill, "prefill-a", s}, abort);
  if (where == 1) h.deliver({Role::Decode, "decode-a", 0}, abort);
  h.deliver_all();
  h.flush_all();
  h.deliver_all();
  CHECK(h.decode->state(kId) == RequestState::Aborted);
  if (decoding) {
    // The transfer let go first; the engine still holds the request: nothing is free yet.
    CHECK(h.free_bytes() < h.start_free);
    engine.close_all();
  }
  h.check_clean(h.pools[0]->stats().page_allocs > 0);
  engine.check_full();
}

TEST_CASE("shared engine cache ids: a prefill peer dying at every state leaves pools and caches as they started",
          "[cluster][lazy_alloc][peer]") {
  const int k_stop = GENERATE(range(1, Harness::kSteps));
  const bool streaming = GENERATE(false, true);
  EngineCaches engine;
  Harness h(engine.share());
  h.streaming = streaming;
  for (int k = 0; k < k_stop; ++k) h.step(k);
  INFO("peer death after step " << k_stop - 1 << (streaming ? ", streaming" : ""));
  const bool decoding = h.ready == 1;
  if (decoding) engine.adopt(h);
  h.take(h.decode->on_peer_dead(Peer{Role::Prefill, "prefill-a", 0}, h.now), true);
  h.deliver_all();
  h.now += milliseconds(5000);  // past the quarantine of writes a dead stage may still have posted
  h.take(h.decode->tick(h.now), true);
  if (decoding) {
    // Every byte had arrived: the request keeps decoding, then ends normally (engine, then transfer).
    CHECK(h.decode->state(kId) == RequestState::Decoding);
    engine.close_all();
    h.take(h.decode->on_finished(kId, h.now), true);
  }
  CHECK(h.free_bytes() == h.start_free);
  for (const auto& p : h.pools) CHECK(p->stats().page_allocs == p->stats().page_frees);
  engine.check_full();
}

TEST_CASE("shared engine cache ids: after the hand-over, the engine closing a request frees the pool at once",
          "[cluster][lazy_alloc][preemption]") {
  const bool streaming = GENERATE(false, true);
  EngineCaches engine;
  Harness h(engine.share());
  h.streaming = streaming;
  for (int k = 0; k < 8; ++k) h.step(k);
  // Before DECODING a stage may still write: the side keeps its hold and says why.
  const Status early = h.decode->hand_over(kId);
  CHECK(early.code() == Code::InvalidArgument);
  CHECK_THAT(early.message(), Catch::Contains("not DECODING"));
  CHECK(h.decode->holds_memory(kId));
  h.step(8);
  REQUIRE(h.ready == 1);
  engine.adopt(h);
  const uint64_t held = h.free_bytes();
  CHECK(held < h.start_free);
  REQUIRE(h.decode->hand_over(kId).is_ok());
  CHECK_FALSE(h.decode->holds_memory(kId));
  CHECK(h.decode->state(kId) == RequestState::Decoding);
  CHECK(h.free_bytes() == held);         // the engine's references keep every page and the slot
  engine.close_all();                    // a preemption: the engine lets go of the request's cache
  CHECK(h.free_bytes() == h.start_free);
  engine.check_full();
  // The request still ends normally; nothing is freed twice.
  h.take(h.decode->on_finished(kId, h.now), true);
  CHECK(h.decode->state(kId) == RequestState::Finished);
  CHECK(h.decode->num_live() == 0);
  for (const auto& p : h.pools) CHECK(p->stats().page_allocs == p->stats().page_frees);
  CHECK(h.decode->hand_over(kId).code() == Code::NotFound);
}
