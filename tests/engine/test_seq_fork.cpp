// CachePools::fork, the engine's primitive for n samples of one prompt: a forked sequence continues
// exactly as its source would (bitwise: same state, same rows), the two never see each other's new
// tokens (the shared pages are full; the partial last page is each one's own), and every slot and page
// goes back to the pools when both close.
#include <catch2/catch.hpp>

#include <cstring>

#include "model_fixture.h"

using namespace k3;
using namespace k3::test;

namespace {
struct Rig {
  ModelConfig cfg = tiny_config("k3-tiny");
  WeightStore weights = random_weights(cfg, 11, DType::F32);
  std::unique_ptr<Backend> backend = make_cpu_backend({.threads = 2});
  std::unique_ptr<Engine> engine = Engine::create(*backend, cfg, weights, engine_options(0, 4)).value();

  std::vector<float> feed_one(SeqCache& s, int32_t tok) {
    SeqCache* sp = &s;
    std::vector<std::vector<int32_t>> t{{tok}};
    Tensor l = engine->feed(std::span<SeqCache* const>(&sp, 1), t).value();
    return {l.f32(), l.f32() + l.numel()};
  }
};
bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

TEST_CASE("a forked sequence decodes bitwise as its source and independently of it", "[engine][fork]") {
  Rig rig;
  CachePools& pools = rig.engine->caches();
  const int free_pages = pools.free_pages(), free_slots = pools.free_slots();
  std::mt19937 rng(5);
  // Prompt lengths ending inside a page, on a page boundary, and in the first page.
  for (int T : {37, 32, 3}) {
    INFO("prompt length " << T);
    auto prompt = random_tokens(rng, T, rig.cfg.vocab_size);
    auto cont_a = random_tokens(rng, 20, rig.cfg.vocab_size);
    auto cont_b = random_tokens(rng, 20, rig.cfg.vocab_size);

    // Reference: each continuation from a prefill of its own.
    auto reference = [&](const std::vector<int32_t>& cont) {
      SeqCache s = rig.engine->open().value();
      (void)rig.engine->prefill(s, prompt).value();
      std::vector<std::vector<float>> out;
      for (int32_t t : cont) out.push_back(rig.feed_one(s, t));
      rig.engine->close(s);
      return out;
    };
    const auto ref_a = reference(cont_a), ref_b = reference(cont_b);

    SeqCache a = rig.engine->open().value();
    (void)rig.engine->prefill(a, prompt).value();
    SeqCache b = pools.fork(a).value();
    REQUIRE(b.num_tokens == a.num_tokens);
    REQUIRE(b.slot != a.slot);
    // Full pages shared, the partial one copied.
    const size_t full = static_cast<size_t>(T / 16);
    for (size_t i = 0; i < a.pages.size(); ++i) {
      if (i < full) {
        CHECK(b.pages[i] == a.pages[i]);
        CHECK(pools.page_refs(a.pages[i]) == 2);
      } else {
        CHECK(b.pages[i] != a.pages[i]);
      }
    }
    // Interleaved steps, b first: a write of one must not reach the other.
    for (size_t i = 0; i < cont_a.size(); ++i) {
      REQUIRE(same(rig.feed_one(b, cont_b[i]), ref_b[i]));
      REQUIRE(same(rig.feed_one(a, cont_a[i]), ref_a[i]));
    }
    rig.engine->close(a);
    rig.engine->close(b);
    REQUIRE(pools.free_pages() == free_pages);
    REQUIRE(pools.free_slots() == free_slots);
  }
}

TEST_CASE("fork fails without side effects when the pools are full", "[engine][fork]") {
  Rig rig;
  CachePools& pools = rig.engine->caches();
  std::mt19937 rng(6);
  SeqCache a = rig.engine->open().value();
  (void)rig.engine->prefill(a, random_tokens(rng, 20, rig.cfg.vocab_size)).value();
  std::vector<SeqCache> forks;
  while (pools.free_slots() > 0) forks.push_back(pools.fork(a).value());
  const int pages = pools.free_pages();
  auto none = pools.fork(a);
  REQUIRE_FALSE(none.is_ok());
  CHECK(none.status().code() == Code::ResourceExhausted);
  CHECK(none.status().to_string().find("slot") != std::string::npos);
  CHECK(pools.free_pages() == pages);
  for (auto& f : forks) rig.engine->close(f);
  rig.engine->close(a);
  CHECK(pools.free_slots() == pools.total_slots());
  CHECK(pools.free_pages() == pools.options().num_pages);
}
