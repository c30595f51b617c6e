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

// The tight region: 4 slot blocks and 30 (or 20) page blocks, below the 7 slots (3 requests + 4
// checkpoints) and 99 pages the server would take at full size. Small enough that the workload below
// moves slots; at 20 pages the three requests' prompts do not fit at once, so requests wait for pages at
// admission (before they did not, and one failed with "out of KV pages" whenever the threads' timing
// admitted three together). Before the prefix cache counted running requests by live slot ids, 30 pages
// crashed the server ("slot accounting is off").
constexpr uint64_t kTightSlots = 4;

// Six requests sharing a 150-token system prompt (odd ones seeded), against the monolithic engine
// without the cache; returns /metrics after the worker published the counters.
std::string serve_shared_prefix(test::TinyServer& s, int chunk) {
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

  const uint64_t lookup_before = metric(s.get("/metrics").body, "k3_prefix_cache_lookup_tokens_total");
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
  // Counters reach /metrics once the worker publishes them (after its next step). They are cumulative:
  // a round on a server that served rounds before checks its own lookups.
  uint64_t lookup = 0;
  for (const auto& g : reqs) lookup += g.prompt.size();
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text = s.get("/metrics").body;
    if (metric(text, "k3_prefix_cache_lookup_tokens_total") >= lookup_before + lookup) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(metric(text, "k3_prefix_cache_lookup_tokens_total") == lookup_before + lookup);
  return text;
}

}  // namespace

TEST_CASE("local engine with the prefix cache gives the cache-off tokens and counts hits on /metrics") {
  const int chunk = 64;
  test::TinyServer s({.max_running = 3, .max_queue = 16, .prefill_chunk = chunk, .prefix_checkpoint_slots = 4,
                      .prefix_block_tokens = 64},
                     "", /*context=*/512);
  const std::string text = serve_shared_prefix(s, chunk);
  CHECK(metric(text, "k3_prefix_cache_hit_tokens_total") == 5 * 128);
  CHECK(metric(text, "k3_prefix_cache_checkpoints_stored_total") >= 2);
  // Room for every slot and page at once: the boundary never has to move.
  CHECK(metric(text, "k3_cache_pool_slot_moves_total") == 0);
}

// The same workload in a region smaller than every slot and page at once (--cache-region-mib): KDA slots
// (requests and checkpoints) and MLA pages share the bytes, so the boundary moves with demand and
// compaction moves slots, and the tokens stay the cache-off ones.
TEST_CASE("local engine in a tight cache region moves slots and still gives the cache-off tokens") {
  const int chunk = 64;
  ModelConfig cfg = preset_config("k3-tiny").value();
  auto cpu = make_cpu_backend({.threads = 1});
  const CacheLayout layout = cache_layout(cfg, *cpu).value();
  const auto u = UnifiedRegionLayout::make(layout, 0, cfg.num_hidden_layers, 16, uint64_t(1) << 40).value();
  const uint64_t pages = GENERATE(30, 20);
  INFO(pages << " page blocks");
  const uint64_t tight = kTightSlots * u.slot_block_bytes + pages * u.page_block_bytes;
  test::TinyServer s({.max_running = 3, .max_queue = 16, .prefill_chunk = chunk, .prefix_checkpoint_slots = 4,
                      .prefix_block_tokens = 64, .cache_region_bytes = tight},
                     "", /*context=*/512);
  std::string text = serve_shared_prefix(s, chunk);
  CHECK(metric(text, "k3_prefix_cache_hit_tokens_total") > 0);
  if (pages == 30) {
    // Slots move when pages need the bytes of slot holes, which only requests running together leave;
    // since admission waits for pages, one round of the workload does that about 9 times in 10. It runs
    // again (each round checking every token) until a slot has moved, 5 rounds at most.
    for (int round = 1; round < 5 && metric(text, "k3_cache_pool_slot_moves_total") == 0; ++round)
      text = serve_shared_prefix(s, chunk);
    CHECK(metric(text, "k3_cache_pool_slot_moves_total") > 0);
  }
}

TEST_CASE("local engine refuses a cache region that holds no slot or page, naming the flag") {
  ModelConfig cfg = preset_config("k3-tiny").value();
  test::TempDir tok_dir;
  const int vocab = write_tiny_tokenizer(tok_dir.path).value();
  cfg.vocab_size = vocab;
  auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(tok_dir.path).value());
  auto made = LocalEngineService::create(cfg, random_weights(cfg, 7, DType::F32), tok,
                                         {.backend = {.threads = 1}, .cache_region_bytes = 1000});
  REQUIRE_FALSE(made.is_ok());
  CHECK(made.status().code() == Code::InvalidArgument);
  CHECK_THAT(made.status().message(), Catch::Contains("--cache-region-mib") && Catch::Contains("holds no"));
}
