// Preemption in a decode rank's batch (decode_node/decode_batch.h) with the real Engine on k3-tiny:
// three requests whose caches together outgrow a small decode cache mid-decode. The newest running
// request is paused (caches copied out, freed), resumed later, and every request produces exactly the
// greedy tokens of an unconstrained run (a cache large enough for all of them, no preemption).
#include <catch2/catch.hpp>

#include <map>
#include <random>

#include "engine/cache_io.h"
#include "decode_node/decode_batch.h"
#include "tests/engine/model_fixture.h"

using namespace k3;
using namespace k3::test;
using k3::decode::DecodeBatch;

namespace {

struct Prefilled {
  std::vector<uint8_t> image;
  int64_t num_tokens = 0;
  int32_t first = 0;
};

// Prefill on a roomy engine: the packed cache image and the greedy first token (what a prefill node sends).
Prefilled prefill(Engine& e, Backend& be, const std::vector<int32_t>& prompt) {
  SeqCache seq = e.open().value();
  Tensor logits = e.prefill(seq, prompt).value();
  std::vector<int32_t> next;
  be.sample({.logits = logits, .rows = {ops::SamplingRow{}}, .out = &next});
  Prefilled p{.num_tokens = static_cast<int64_t>(prompt.size()), .first = next.at(0)};
  export_caches(be, e.caches(), seq, 0, e.config().num_hidden_layers, p.image);
  e.close(seq);
  return p;
}

struct Run {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  uint64_t preemptions = 0;
  size_t max_paused = 0;
};

// Decodes every request to `max_tokens` generated tokens (the first included) through a DecodeBatch.
Run decode_all(Engine& e, Backend& be, const std::map<uint64_t, Prefilled>& reqs, int max_tokens) {
  DecodeBatch batch(e, be);
  Run run;
  for (const auto& [id, p] : reqs) {
    run.tokens[id] = {p.first};
    batch.add(id, p.image, p.num_tokens, p.first, ops::SamplingRow{}, 1);
  }
  for (int guard = 0; batch.size() > 0; ++guard) {
    REQUIRE(guard < 10 * max_tokens * static_cast<int>(reqs.size()));
    auto step = batch.step();
    REQUIRE(step.failed.empty());
    run.max_paused = std::max(run.max_paused, batch.num_paused());
    for (const auto& [id, tok] : step.tokens) {
      auto& out = run.tokens[id];
      out.push_back(tok);
      if (static_cast<int>(out.size()) >= max_tokens) batch.remove(id);
    }
  }
  run.preemptions = batch.preemptions();
  return run;
}

// The model every case decodes: tiny k3, fixed random weights, one CPU thread.
struct Setup {
  ModelConfig cfg = tiny_config();
  WeightStore w = random_weights(cfg, 5, DType::F32);
  std::unique_ptr<Backend> be = make_cpu_backend({.threads = 1});
  // Prompts of `lens` random tokens (ids first_id, first_id + 1, ...), prefilled on a roomy engine.
  std::map<uint64_t, Prefilled> prefill_all(uint32_t seed, const std::vector<int>& lens, uint64_t first_id) {
    std::mt19937 rng(seed);
    auto prefiller = Engine::create(*be, cfg, w, engine_options(0, static_cast<int>(lens.size()) + 1)).value();
    std::map<uint64_t, Prefilled> reqs;
    uint64_t id = first_id;
    for (int len : lens) reqs[id++] = prefill(*prefiller, *be, random_tokens(rng, len, cfg.vocab_size));
    return reqs;
  }
};

}  // namespace

TEST_CASE("decode batch: a cache that runs out mid-decode preempts the newest request; tokens unchanged",
          "[cluster][preemption]") {
  Setup m;
  auto& [cfg, w, be] = m;
  const int max_tokens = 40;
  const std::map<uint64_t, Prefilled> reqs = m.prefill_all(17, {40, 30, 20}, 100);

  // Unconstrained: 512 pages, nothing is ever paused.
  auto roomy = Engine::create(*be, cfg, w, engine_options(0, 4)).value();
  const Run ref = decode_all(*roomy, *be, reqs, max_tokens);
  CHECK(ref.preemptions == 0);

  // 8 pages of 16 tokens: the three requests need 5 + 5 + 4 pages at the end, any one alone fits.
  EngineOptions small = engine_options(0, 3);
  small.cache.num_pages = 8;
  auto tight = Engine::create(*be, cfg, w, small).value();
  const Run got = decode_all(*tight, *be, reqs, max_tokens);
  CHECK(got.preemptions >= 1);
  CHECK(got.max_paused >= 1);
  for (const auto& [id, toks] : ref.tokens) {
    INFO("request " << id);
    REQUIRE(toks.size() == static_cast<size_t>(max_tokens));
    CHECK(got.tokens.at(id) == toks);
  }
  // Every page came back.
  CHECK(tight->caches().free_pages() == 8);
  CHECK(tight->caches().free_slots() == 3);
}

TEST_CASE("decode batch: a request that can never fit the cache fails instead of stalling", "[cluster][preemption]") {
  Setup m;
  auto& [cfg, w, be] = m;
  const Prefilled big = m.prefill_all(3, {40}, 7).at(7);
  EngineOptions small = engine_options(0, 2);
  small.cache.num_pages = 2;  // 32 tokens: the 40-token prompt never fits
  auto tight = Engine::create(*be, cfg, w, small).value();
  DecodeBatch batch(*tight, *be);
  batch.add(7, big.image, big.num_tokens, big.first, ops::SamplingRow{}, 1);
  auto step = batch.step();
  REQUIRE(step.failed.size() == 1);
  CHECK(step.failed[0].first == 7);
  CHECK_THAT(step.failed[0].second, Catch::Contains("cannot hold"));
  CHECK(batch.size() == 0);
  CHECK(tight->caches().free_pages() == 2);
}

TEST_CASE("decode batch: a lone request short of pages others hold waits paused, then resumes; tokens unchanged",
          "[cluster][preemption]") {
  // As when the cache is the transfer pool: requests still transferring hold pages the running one needs.
  // They give them back (done or ended by a deadline), so the lone request pauses instead of failing.
  Setup m;
  auto& [cfg, w, be] = m;
  const int max_tokens = 40;
  const std::map<uint64_t, Prefilled> reqs = m.prefill_all(29, {40}, 5);
  auto roomy = Engine::create(*be, cfg, w, engine_options(0, 2)).value();
  const Run ref = decode_all(*roomy, *be, reqs, max_tokens);

  // 8 pages of 16 tokens; another owner holds 4, so the request (40 + 40 tokens: 5 pages) runs out at 64.
  EngineOptions small = engine_options(0, 2);
  small.cache.num_pages = 8;
  auto tight = Engine::create(*be, cfg, w, small).value();
  CachePools& pools = tight->caches();
  std::optional<std::vector<int32_t>> held = pools.alloc_pages(4);
  REQUIRE(held);
  DecodeBatch batch(*tight, *be);
  const Prefilled& p = reqs.at(5);
  std::vector<int32_t> got{p.first};
  batch.add(5, p.image, p.num_tokens, p.first, ops::SamplingRow{}, 1);
  int paused_steps = 0;
  for (int guard = 0; batch.size() > 0; ++guard) {
    REQUIRE(guard < 200);
    auto step = batch.step();
    REQUIRE(step.failed.empty());
    if (step.tokens.empty()) {
      CHECK(batch.num_paused() == 1);
      CHECK(pools.free_pages() == 4);  // paused: its pages are back, the other owner's are not
      if (++paused_steps == 3) {       // it stays paused, without failing, until the owner lets go
        for (int32_t page : *held) pools.release_page(page);
        held.reset();
      }
      continue;
    }
    got.push_back(step.tokens.at(0).second);
    if (static_cast<int>(got.size()) >= max_tokens) batch.remove(5);
  }
  CHECK(paused_steps == 3);
  CHECK(batch.preemptions() == 1);
  CHECK(got == ref.tokens.at(5));
  CHECK(pools.free_pages() == 8);
}
