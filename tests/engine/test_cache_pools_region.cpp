// The engine's cache pools in a tight unified region: a page that needs the bytes of slot holes moves
// slots; the moved sequences and a checkpoint-style holder keep their slot ids and contents, and decoding
// across the compaction gives the bits an engine with roomy pools gives. A transfer-style writer that pins
// slots and writes their rows from another thread while pages compact the region never writes into a moved
// slot. And the free bytes come back when everything is closed.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "model_fixture.h"
#include "region_churn.h"
#include "separate_pools.h"

using namespace k3;
using namespace k3::test;

namespace {

struct Rig {
  ModelConfig cfg = tiny_config("k3-tiny");
  WeightStore weights = random_weights(cfg, 11, DType::F32);
  std::unique_ptr<Backend> backend = make_cpu_backend({.threads = 2});

  std::unique_ptr<Engine> engine(uint64_t region_bytes) {
    EngineOptions o = engine_options(0, 4);
    o.cache.region_bytes = region_bytes;
    return Engine::create(*backend, cfg, weights, o).value();
  }
};

std::vector<float> feed_one(Engine& e, SeqCache& s, int32_t tok) {
  SeqCache* sp = &s;
  std::vector<std::vector<int32_t>> t{{tok}};
  Tensor l = e.feed(std::span<SeqCache* const>(&sp, 1), t).value();
  return {l.f32(), l.f32() + l.numel()};
}

}  // namespace

TEST_CASE("pages that need slot holes move slots; decoding across the move is bitwise the roomy engine's",
          "[engine][region]") {
  Rig rig;
  auto roomy = rig.engine(0);
  const UnifiedRegionLayout& u = roomy->caches().region()->layout();
  // Four slots and 14 pages of bytes: the pages below need the two closed sequences' slot bytes.
  auto tight = rig.engine(4 * u.slot_block_bytes + 14 * u.page_block_bytes);
  CachePools& pools = tight->caches();
  const uint64_t start_free = pools.region()->free_bytes();
  std::mt19937 rng(9);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(random_tokens(rng, 16, rig.cfg.vocab_size));
  auto cont = random_tokens(rng, 6 * 16, rig.cfg.vocab_size);

  // Tight: A, B, D take slots 0..2 in order; a checkpoint-style holder takes the last slot, with A's state.
  SeqCache a = tight->open().value(), b = tight->open().value(), d = tight->open().value();
  (void)tight->prefill(a, prompts[0]).value();
  (void)tight->prefill(b, prompts[1]).value();
  (void)tight->prefill(d, prompts[2]).value();
  const int holder = *pools.alloc_slot();
  pools.copy_slot(a.slot, holder);
  const auto holder_image = slot_image(pools, rig.cfg, holder);
  const int d_slot = d.slot;
  const int32_t d_row = pools.state_row(d.slot), holder_row = pools.state_row(holder);
  tight->close(b);   // a hole below D and the holder
  REQUIRE(pools.fragmentation()->extents >= 2);

  // Roomy: the same sequences (no B needed: its slot only made the hole).
  SeqCache ra = roomy->open().value(), rd = roomy->open().value();
  (void)roomy->prefill(ra, prompts[0]).value();
  (void)roomy->prefill(rd, prompts[2]).value();

  for (size_t i = 0; i < cont.size(); ++i) {
    INFO("token " << i);
    REQUIRE(feed_one(*tight, a, cont[i]) == feed_one(*roomy, ra, cont[i]));
    REQUIRE(feed_one(*tight, d, cont[i]) == feed_one(*roomy, rd, cont[i]));
  }
  INFO("slot moves " << pools.slot_moves());
  REQUIRE(pools.slot_moves() >= 1);
  REQUIRE(d.slot == d_slot);                                      // ids never change ...
  REQUIRE((pools.state_row(d.slot) != d_row || pools.state_row(holder) != holder_row));   // ... rows did
  REQUIRE(slot_image(pools, rig.cfg, holder) == holder_image);   // the holder's contents moved with it
  REQUIRE(pools.fragmentation()->extents == 1);                  // the slot hole was closed

  tight->close(a);
  tight->close(d);
  pools.free_slot(holder);
  roomy->close(ra);
  roomy->close(rd);
  REQUIRE(pools.region()->free_bytes() == start_free);
  REQUIRE(pools.free_slots() == pools.total_slots());
}

// (No ": " in test names: Catch 2.13 wraps a long name at its colon and loops printing the header.)
TEST_CASE("a transfer writing pinned slots of the engine's pools while pages compact them never writes a moved slot",
          "[engine][region]") {
  Rig rig;
  auto roomy = rig.engine(0);
  const UnifiedRegionLayout& u = roomy->caches().region()->layout();
  auto engine = rig.engine(4 * u.slot_block_bytes + 8 * u.page_block_bytes);
  CachePools& pools = engine->caches();
  const auto kda = pools.layout().layer_ids(LayerCache::Kda);
  auto fill = [&](int32_t srow, int32_t crow, uint8_t tag) {
    for (uint32_t l : kda) {
      std::memset(pools.kda_state(int(l)).slice_rows(srow, srow + 1).data(), tag, u.state_bytes);
      std::memset(pools.kda_conv(int(l)).slice_rows(crow, crow + 1).data(), tag, u.conv_bytes);
    }
  };
  SlotChurn churn;
  std::thread transfer([&] {
    std::mt19937 rng(3);
    std::unique_lock lk(churn.mu);
    for (;;) {
      churn.changed.wait(lk, [&] { return churn.stop || !churn.live.empty(); });
      if (churn.stop) return;
      const auto [slot, tag] = churn.live[rng() % churn.live.size()];
      {
        auto pin = pools.pin_slot(slot);   // taken while the slot is known held
        churn.writing = slot;
        lk.unlock();
        fill(pin->state_row(), pin->conv_row(), tag);
        lk.lock();
      }
      churn.writing.reset();
      ++churn.writes;
      churn.wrote.notify_all();
    }
  });
  churn.run(pools, 80, [&](int s, uint8_t tag) { fill(pools.state_row(s), pools.conv_row(s), tag); });
  transfer.join();
  INFO("writes " << churn.writes << ", slot moves " << pools.slot_moves());
  REQUIRE(pools.slot_moves() > 10);
  REQUIRE(churn.writes >= 50);
  REQUIRE(churn.all_hold(pools, rig.cfg));
  for (const auto& [slot, tag] : churn.live) pools.free_slot(slot);
  REQUIRE(pools.free_slots() == pools.total_slots());
  REQUIRE(pools.region()->free_bytes() == pools.region()->layout().region_bytes);
}

namespace {

std::vector<std::vector<int32_t>> greedy_tokens(Engine& e, const std::vector<GenerateRequest>& reqs) {
  const auto results = e.generate(reqs).value();
  std::vector<std::vector<int32_t>> out;
  for (const GenerateResult& r : results) out.push_back(r.tokens);
  return out;
}

}  // namespace

// Greedy decoding of `prompts` in one running batch, as a server runs it: a request that has its
// max_tokens leaves the batch and closes its caches at once (Engine::generate keeps them to the end).
std::vector<std::vector<int32_t>> greedy_batch(Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                                               const std::vector<int>& max_tokens) {
  const int64_t vocab = e.config().vocab_size;
  auto argmax = [&](const float* row) { return top_logits(row, vocab, 1).at(0).first; };
  std::vector<SeqCache> seqs(prompts.size());
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs[i] = e.open().value();
    Tensor l = e.prefill(seqs[i], prompts[i]).value();
    out[i].push_back(argmax(l.f32()));
  }
  for (;;) {
    std::vector<SeqCache*> live;
    std::vector<std::vector<int32_t>> toks;
    std::vector<size_t> which;
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (seqs[i].slot < 0) continue;
      if (static_cast<int>(out[i].size()) >= max_tokens[i]) {
        e.close(seqs[i]);
        continue;
      }
      live.push_back(&seqs[i]);
      toks.push_back({out[i].back()});
      which.push_back(i);
    }
    if (live.empty()) break;
    Tensor l = e.feed(live, toks).value();
    for (size_t j = 0; j < which.size(); ++j) out[which[j]].push_back(argmax(l.f32() + j * vocab));
  }
  return out;
}

TEST_CASE("greedy decoding on a tight region gives the tokens of separate pools, with slots moved by the pages of a "
          "running batch", "[engine][region]") {
  Rig rig;
  EngineOptions sep_opts = engine_options(/*chunk=*/0, /*max_seqs=*/4);
  SeparatePools sep_mem(rig.cfg, *rig.backend, sep_opts.cache);
  sep_opts.cache.memory = sep_mem.memory;
  auto separate = Engine::create(*rig.backend, rig.cfg, rig.weights, sep_opts).value();
  REQUIRE(separate->caches().region() == nullptr);
  REQUIRE(separate->caches().fragmentation() == std::nullopt);

  // Four requests of 64 prompt tokens open slots 0..3; the first ends after 2 tokens (a hole below the
  // other three), the rest run to 100 tokens (11 pages each). The region holds the four slots with their
  // first 5 pages each, and three slots with 33 pages, but not four slots' extent with 33 pages: the last
  // pages are only there once the hole's bytes are taken, by moving a running request's slot.
  auto probe = rig.engine(0);
  const uint64_t slot = probe->caches().region()->layout().slot_block_bytes;
  const uint64_t page = probe->caches().region()->layout().page_block_bytes;
  EngineOptions tight_opts = engine_options(/*chunk=*/0, /*max_seqs=*/4);
  // One page more: the layout rounds the bytes down to whole one-layer pages.
  tight_opts.cache.region_bytes = std::max(4 * slot + 20 * page, 3 * slot + 33 * page) + page;
  REQUIRE(4 * slot + 33 * page > tight_opts.cache.region_bytes);
  auto tight = Engine::create(*rig.backend, rig.cfg, rig.weights, tight_opts).value();
  CachePools& pools = tight->caches();
  const uint64_t start_free = pools.region()->free_bytes();
  REQUIRE(start_free == pools.region()->layout().region_bytes);

  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_tokens(rng, 64, rig.cfg.vocab_size));
  const std::vector<int> max_tokens{2, 100, 100, 100};
  const auto want = greedy_batch(*separate, prompts, max_tokens);
  REQUIRE(greedy_batch(*tight, prompts, max_tokens) == want);
  INFO("slot moves " << pools.slot_moves());
  REQUIRE(pools.slot_moves() >= 1);
  REQUIRE(pools.region()->free_bytes() == start_free);   // every request closed: all bytes back
  REQUIRE(pools.free_slots() == pools.total_slots());

  // Again, now that the region has moved slots once: the same tokens.
  REQUIRE(greedy_batch(*tight, prompts, max_tokens) == want);
}

TEST_CASE("the prefix cache on a tight region gives the greedy tokens of separate pools without it, and a flush "
          "gives every free byte back", "[engine][region]") {
  Rig rig;
  EngineOptions sep_opts = engine_options(/*chunk=*/64, /*max_seqs=*/4);
  sep_opts.top_logits = 0;
  SeparatePools sep_mem(rig.cfg, *rig.backend, sep_opts.cache);
  sep_opts.cache.memory = sep_mem.memory;
  auto separate = Engine::create(*rig.backend, rig.cfg, rig.weights, sep_opts).value();

  auto probe = rig.engine(0);
  const uint64_t slot = probe->caches().region()->layout().slot_block_bytes;
  const uint64_t page = probe->caches().region()->layout().page_block_bytes;
  EngineOptions on = engine_options(/*chunk=*/64, /*max_seqs=*/4);
  on.top_logits = 0;
  on.cache.checkpoint_slots = 6;
  on.cache.region_bytes = 10 * slot + 110 * page;   // less than 10 slots and 512 pages: the kinds share
  // The budget keeps the tree from holding the pages the running requests reserve as they decode.
  on.prefix_cache = {.enabled = true, .block_tokens = 64, .checkpoint_every = 1, .budget_bytes = 4 * slot + 36 * page};
  auto cached = Engine::create(*rig.backend, rig.cfg, rig.weights, on).value();
  CachePools& pools = cached->caches();
  const uint64_t start_free = pools.region()->free_bytes();

  std::mt19937 rng(6);
  const auto system = random_tokens(rng, 128, rig.cfg.vocab_size);
  auto prompt = [&](int extra) {
    auto p = system;
    auto tail = random_tokens(rng, extra, rig.cfg.vocab_size);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  for (int round = 0; round < 4; ++round) {
    INFO("round " << round);
    std::vector<GenerateRequest> reqs;
    for (int i = 0; i < 3; ++i) reqs.push_back({.prompt = prompt(10 + 70 * i + 20 * round), .max_tokens = 3 + 5 * i});
    REQUIRE(greedy_tokens(*cached, reqs) == greedy_tokens(*separate, reqs));
  }
  const PrefixCacheStats& st = cached->prefix_cache()->stats();
  INFO("hit " << st.hit_tokens << " of " << st.lookup_tokens << ", slot moves " << pools.slot_moves());
  REQUIRE(st.hit_tokens > 0);
  REQUIRE(pools.region()->free_bytes() < start_free);   // the cache holds checkpoints and pages
  cached->prefix_cache()->flush();
  REQUIRE(pools.region()->free_bytes() == start_free);
  REQUIRE(pools.fragmentation()->extents <= 1);
  REQUIRE(pools.free_slots() == pools.total_slots());
}
