// The router's local engine with the prefix cache on: the same tokens as the monolithic engine without
// it (greedy and seeded, concurrent requests sharing a system prompt), and the cache's counters on
// /metrics.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "router/request_stream.h"
#include "router_fixture.h"

using namespace k3;
using namespace k3::router;

namespace {

// One request's stream: its tokens, or why it did not finish. Runs on the test's threads too, so it uses
// no Catch macro (Catch2 v2 is not thread-safe); the main thread checks `error` with finished_tokens.
struct Served {
  std::vector<int32_t> tokens;
  std::string error;  // empty: the stream finished
};

Served run(GenerationService& svc, const GenerateRequest& g) {
  GenerationParams p{.prompt = g.prompt, .max_tokens = g.max_tokens, .sampling = g.sampling};
  auto rs = RequestStream::start(svc, p);
  if (!rs.is_ok()) return {.error = "start: " + rs.status().to_string()};
  Served out;
  for (;;) {
    auto ev = (*rs)->next(std::chrono::milliseconds(60000));
    if (!ev) {
      out.error = "no event within 60 s";
      return out;
    }
    out.tokens.insert(out.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    if (ev->kind == GenerationEvent::Kind::Failed) out.error = "failed: " + ev->error.to_string();
    if (ev->kind != GenerationEvent::Kind::Tokens) return out;
  }
}

// Main thread only: the tokens of a stream that must have finished.
std::vector<int32_t> finished_tokens(const Served& s) {
  INFO(s.error);
  REQUIRE(s.error.empty());
  return s.tokens;
}

uint64_t metric(const std::string& text, const std::string& name) {
  const auto at = text.find("\n" + name + " ");
  REQUIRE(at != std::string::npos);
  return std::stoull(text.substr(at + name.size() + 2));
}

}  // namespace

TEST_CASE("local engine with the prefix cache gives the cache-off tokens and counts hits on /metrics") {
  const int chunk = 64;
  test::TinyServer s({.max_running = 3, .max_queue = 16, .prefill_chunk = chunk, .prefix_checkpoint_slots = 4,
                      .prefix_block_tokens = 64},
                     "", /*context=*/512);
  std::mt19937 rng(5);
  std::vector<int32_t> system;
  for (int k = 0; k < 150; ++k) system.push_back(static_cast<int32_t>(rng() % s.cfg.vocab_size));
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerateRequest g;
    g.prompt = system;
    for (int k = 0; k < 5 + 9 * i; ++k) g.prompt.push_back(static_cast<int32_t>(rng() % s.cfg.vocab_size));
    g.max_tokens = 4;
    if (i % 2) g.sampling = {.temperature = 0.9f, .top_k = 20, .top_p = 0.9f, .seed = 40u + i};
    reqs.push_back(g);
  }
  auto backend = make_cpu_backend({.threads = 2});
  WeightStore w = random_weights(s.cfg, 7, DType::F32);
  EngineOptions eo;
  eo.prefill_chunk = chunk;
  eo.cache.max_seqs = 8;
  eo.cache.num_pages = 512;
  auto engine = Engine::create(*backend, s.cfg, w, eo).value();
  auto expected = engine->generate(reqs).value();

  // The first request fills the cache; the rest run concurrently and resume from it.
  CHECK(finished_tokens(run(*s.service, reqs[0])) == expected[0].tokens);
  std::vector<std::thread> threads;
  std::vector<Served> got(reqs.size());
  for (size_t i = 1; i < reqs.size(); ++i) threads.emplace_back([&, i] { got[i] = run(*s.service, reqs[i]); });
  for (auto& t : threads) t.join();
  for (size_t i = 1; i < reqs.size(); ++i) {
    INFO("request " << i);
    CHECK(finished_tokens(got[i]) == expected[i].tokens);
  }
  // Counters reach /metrics once the worker publishes them (after its next step).
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text = s.get("/metrics").body;
    if (text.find("\nk3_prefix_cache_hit_tokens_total 0\n") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  uint64_t lookup = 0;
  for (const auto& g : reqs) lookup += g.prompt.size();
  CHECK(metric(text, "k3_prefix_cache_lookup_tokens_total") == lookup);
  CHECK(metric(text, "k3_prefix_cache_hit_tokens_total") == 5 * 128);
  CHECK(metric(text, "k3_prefix_cache_checkpoints_stored_total") >= 2);
}
