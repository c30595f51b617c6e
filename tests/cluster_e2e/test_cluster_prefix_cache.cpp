// The prefix cache on the disaggregated prefill node: k3-cluster with a two-stage prefill instance whose
// stages run the cache (chunk 64, block 64) and one decode rank. Requests share prefixes of random
// lengths, branch, repeat, run one after another and several at once, greedy and seeded: every output
// equals k3-generate's at the same prefill chunk (the cache-off reference every topology reproduces),
// while the prefill node reports cache hits on the router's /metrics (so prefills really were cut short
// and decode still got the whole prompt's KV/state).
//
// A second case restarts stage 1 (SIGKILL; k3-cluster starts it again with an empty cache) while stage
// 0 keeps its cache: requests that stage 0 resumes from state stage 1 lacks are computed again, never
// failed, give k3-generate's tokens, and the two stages' caches converge.
//
// K3_TEST_BACKEND=cuda runs every node and the reference on the GPU (default cpu).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <future>
#include <random>
#include <signal.h>
#include <thread>

#include "common/config/unified_region_layout.h"
#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/plain_completion.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/router/http_client.h"
#include "tests/support/generate_reference.h"
#include "tests/support/scratch_dir.h"

using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr int kChunk = 64;

std::string test_backend() {
  const char* b = std::getenv("K3_TEST_BACKEND");
  const std::string kind = b && *b ? b : "cpu";
  REQUIRE((kind == "cpu" || kind == "cuda"));
  return kind;
}

json body_of(const std::vector<int32_t>& prompt, int max_tokens, int seed) {
  json b = {{"model", "k3-tiny"}, {"prompt", prompt},   {"max_tokens", max_tokens},
            {"temperature", 0},  {"ignore_eos", true}, {"return_token_ids", true}};
  if (seed >= 0) {
    b["temperature"] = 0.8;
    b["seed"] = seed;
  }
  return b;
}

// Main thread only (it asserts): requests sent at once go through k3::test::post_json on their threads.
std::vector<int32_t> complete(int port, const json& body) {
  return k3::test::token_ids_of(k3::test::post_json(port, "/v1/completions", body));
}

// Served tokens, or empty while the cluster refuses (a node restarting).
std::vector<int32_t> try_complete(int port, const json& body) {
  try {
    k3::test::HttpConnection c(port);
    c.send_request("POST", "/v1/completions", body.dump());
    const k3::test::HttpReply r = c.read_reply(60s);
    if (r.status != 200) return {};
    return json::parse(r.body).at("choices").at(0).at("token_ids").get<std::vector<int32_t>>();
  } catch (const std::exception&) {
    return {};
  }
}

json cluster_spec(const std::string& dir, double cache_region_mib = 0) {
  json spec = {{"model", dir + "/model"},
          {"generate", {{"preset", "k3-tiny"}, {"seed", 5}}},
          {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"served_model_name", "k3-tiny"}, {"placement", "prefix-affinity"}}},
          {"prefill", json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", kChunk}, {"max_requests", 4},
                                    {"prefix_cache", {{"slots", 6}, {"block_tokens", 64}, {"checkpoint_every", 1}}}}})},
          {"decode", json::array({{{"id", "d"}, {"ranks", 1}, {"max_requests", 8}}})},
          {"threads", 1},
          {"backend", test_backend()},
          {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 10}, {"startup_s", 240}}}};
  if (cache_region_mib > 0) spec["prefill"][0]["cache_region_mib"] = cache_region_mib;
  return spec;
}

// MiB of a region that holds `slots` KDA slots and `pages` MLA pages of stage 0 (layers [0, 4) of k3-tiny's
// 8, the even split) in the backend's cache dtypes.
double stage0_region_mib(uint64_t slots, uint64_t pages) {
  k3::ModelConfig cfg = k3::preset_config("k3-tiny").value();
  const k3::DType act = test_backend() == "cuda" ? k3::DType::BF16 : k3::DType::F32;
  const k3::CacheLayout c = k3::CacheLayout::from_config(cfg, {.kv = act, .conv = act, .state = k3::DType::F32}).value();
  const auto u = k3::UnifiedRegionLayout::make(c, 0, 4, 16, uint64_t(1) << 40).value();
  return double(slots * u.slot_block_bytes + pages * u.page_block_bytes) / (1 << 20);
}

std::vector<int32_t> reference(const std::string& model, const std::vector<int32_t>& prompt, int max_tokens, int seed) {
  std::string flags = "--backend " + test_backend() + " --prefill-chunk " + std::to_string(kChunk);
  if (seed >= 0) flags += " --temperature 0.8 --seed " + std::to_string(seed);
  return k3::test::k3_generate_tokens(model, prompt, max_tokens, flags);
}

}  // namespace

TEST_CASE("prefill stages with the prefix cache serve the same tokens as without it, and report hits",
          "[cluster_e2e][prefix_cache]") {
  k3::testing::ScratchDir dir("prefix-e2e");
  const json spec = cluster_spec(dir.str());
  dir.write("spec.json", spec.dump(2));
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(dir.file("spec.json"));
  const std::string model = dir.str() + "/model";
  const int vocab = k3::test::model_vocab(model);
  std::mt19937 rng(15);
  auto tokens = [&](int n) { return k3::test::random_tokens(rng, vocab, n); };
  auto join = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  constexpr int kMax = 6;
  const std::vector<int32_t> system = tokens(150);   // two whole blocks and a part
  struct Case {
    std::vector<int32_t> prompt;
    int seed;   // -1: greedy
  };
  // One after another: a miss that fills the cache, then hits at 128 (greedy and seeded), a branch
  // inside the first block's successor (hit at 64), an exact repeat, a prompt ending on a block
  // boundary, and a long one that extends the cached path.
  const std::vector<int32_t> first = join(system, tokens(10));
  std::vector<Case> serial = {{first, -1},
                              {join(system, tokens(20)), -1},
                              {join(system, tokens(7)), 11},
                              {join(std::vector<int32_t>(system.begin(), system.begin() + 100), tokens(30)), -1},
                              {first, 12},
                              {join(system, tokens(42)), -1},   // 192 tokens: ends on a block
                              {join(system, tokens(190)), 13}};
  for (size_t i = 0; i < serial.size(); ++i) {
    INFO("serial request " << i << " (" << serial[i].prompt.size() << " tokens, seed " << serial[i].seed << ")");
    CHECK(complete(cluster.port, body_of(serial[i].prompt, kMax, serial[i].seed)) ==
          reference(model, serial[i].prompt, kMax, serial[i].seed));
  }
  // Several at once over the same prefix: stages interleave chunks of different requests.
  std::vector<Case> together;
  for (int i = 0; i < 5; ++i) together.push_back({join(system, tokens(5 + 37 * i)), i % 2 ? 20 + i : -1});
  std::vector<std::future<k3::test::HttpReply>> replies;
  for (const Case& c : together)
    replies.push_back(std::async(std::launch::async, [&cluster, c] {
      return k3::test::post_json(cluster.port, "/v1/completions", body_of(c.prompt, kMax, c.seed));
    }));
  for (size_t i = 0; i < together.size(); ++i) {
    INFO("concurrent request " << i << " (seed " << together[i].seed << ")");
    CHECK(k3::test::token_ids_of(replies[i].get()) == reference(model, together[i].prompt, kMax, together[i].seed));
  }
  // The prefill node's cache metrics (its stages report them with their heartbeats).
  double hit = 0, lookup = 0, stored = 0;
  for (auto deadline = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < deadline;) {
    const auto m = k3::test::read_metrics(cluster.port);
    hit = k3::test::metric_or(m, "k3_prefill_prefix_cache_hit_tokens_total{node=\"prefill/p/0\"}");
    lookup = k3::test::metric_or(m, "k3_prefill_prefix_cache_lookup_tokens_total{node=\"prefill/p/0\"}");
    stored = k3::test::metric_or(m, "k3_prefill_prefix_cache_checkpoints_stored_total{node=\"prefill/p/0\"}");
    // Stage 1's replica made the same lookups and hits as stage 0.
    if (lookup > 0 && hit >= 128 * 9 && k3::test::metric_or(m, "k3_prefill_prefix_cache_hit_tokens_total{node=\"prefill/p/1\"}") == hit)
      break;
    std::this_thread::sleep_for(200ms);
  }
  double total = 0;
  for (const auto& c : serial) total += c.prompt.size();
  for (const auto& c : together) total += c.prompt.size();
  CHECK(lookup == total);
  // At least: five serial hits of 128 (the branch: 64) and five concurrent ones of 128.
  CHECK(hit >= 128 * 9 + 64);
  CHECK(stored > 0);
  const auto m1 = k3::test::read_metrics(cluster.port);
  CHECK(k3::test::metric_or(m1, "k3_prefill_prefix_cache_hit_tokens_total{node=\"prefill/p/1\"}") == hit);
  CHECK(k3::test::metric_or(m1, "k3_prefill_prefix_cache_lookup_tokens_total{node=\"prefill/p/1\"}") == lookup);
  // The cluster's totals (the families the local engine reports too) count each instance once.
  const auto m = k3::test::read_metrics(cluster.port);
  CHECK(k3::test::metric_or(m, "k3_prefix_cache_lookup_tokens_total") == lookup);
  CHECK(k3::test::metric_or(m, "k3_prefix_cache_hit_tokens_total") == hit);
}

TEST_CASE("a restarted prefill stage's empty prefix cache costs recomputes, never a failed request or a wrong token",
          "[cluster_e2e][prefix_cache][drift]") {
  k3::testing::ScratchDir dir("prefix-drift");
  dir.write("spec.json", cluster_spec(dir.str()).dump(2));
  // The nodes' log lines (info) go to a file: the stages say when a recompute repairs a drift.
  const std::string log = dir.file("nodes.log");
  k3::test::LaunchedCluster cluster =
      k3::test::launch_cluster(dir.file("spec.json"), std::chrono::seconds(300), {"--log-level", "info", "--verbose"}, log);
  const std::string model = dir.str() + "/model";
  const int vocab = k3::test::model_vocab(model);
  std::mt19937 rng(16);
  auto tokens = [&](int n) { return k3::test::random_tokens(rng, vocab, n); };
  auto join = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  constexpr int kMax = 4;
  // Two system prompts of three whole blocks and a part, both cached on both stages.
  const std::vector<int32_t> sys_a = tokens(200), sys_b = tokens(200);
  for (const auto& sys : {sys_a, sys_b}) {
    const std::vector<int32_t> warm = join(sys, tokens(9));
    CHECK(complete(cluster.port, body_of(warm, kMax, -1)) == reference(model, warm, kMax, -1));
  }

  // Stage 1 restarts with an empty cache; stage 0 keeps its checkpoints of both system prompts.
  const pid_t pid = cluster.pids.at("prefill/p/1");
  REQUIRE(pid > 0);
  REQUIRE(::kill(pid, SIGKILL) == 0);
  REQUIRE(cluster.proc->wait_for("RESTARTED prefill/p/1 pid", 60s));

  // Served again (requests sent while the router still counted the dead stage may fail: not drift).
  const std::vector<int32_t> after = join(sys_a, tokens(30));
  std::vector<int32_t> got;
  for (auto deadline = std::chrono::steady_clock::now() + 120s; got.empty(); std::this_thread::sleep_for(200ms)) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    got = try_complete(cluster.port, body_of(after, kMax, -1));
  }
  CHECK(got == reference(model, after, kMax, -1));
  // Nothing has touched system prompt B since the restart: stage 0 resumes it at 192, stage 1 lacks
  // it, and the request is computed again, not failed, with the right tokens.
  const std::vector<int32_t> on_b = join(sys_b, tokens(25));
  CHECK(complete(cluster.port, body_of(on_b, kMax, 41)) == reference(model, on_b, kMax, 41));
  // Repaired: the next requests on both prefixes hit on both stages, with the right tokens.
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t> p = join(i % 2 ? sys_b : sys_a, tokens(11 + 20 * i));
    const int seed = i == 1 ? 31 : -1;
    INFO("request " << i << " after the repair");
    CHECK(complete(cluster.port, body_of(p, kMax, seed)) == reference(model, p, kMax, seed));
  }
  // The caches converged: the same bytes on both stages (whole-model units), and stage 1 hit 192 tokens
  // for each of the four requests.
  double b0 = -1, b1 = -2, hit1 = 0;
  for (auto deadline = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < deadline;) {
    const auto m = k3::test::read_metrics(cluster.port);
    b0 = k3::test::metric_or(m, "k3_prefill_prefix_cache_bytes{node=\"prefill/p/0\"}");
    b1 = k3::test::metric_or(m, "k3_prefill_prefix_cache_bytes{node=\"prefill/p/1\"}");
    hit1 = k3::test::metric_or(m, "k3_prefill_prefix_cache_hit_tokens_total{node=\"prefill/p/1\"}");
    if (b0 == b1 && hit1 >= 4 * 192) break;
    std::this_thread::sleep_for(200ms);
  }
  CHECK(b0 > 0);
  CHECK(b0 == b1);
  CHECK(hit1 >= 4 * 192);
  // The drift was met and repaired, not failed: stage 1 asked, stage 0 computed again.
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("asking stage 0 to compute it again") != std::string::npos);
  CHECK(text.find("is computed again from token 0") != std::string::npos);
  CHECK(text.find("failed: prefix cache") == std::string::npos);   // a stage failing a request over its cache
}

// The same cache in a region smaller than every slot and page at once (the prefill entry's
// cache_region_mib: room for 6 KDA slots and 20 MLA pages of stage 0, where the stage would otherwise take
// 10 slots and 256 pages): the stages' requests, checkpoints and pages share the bytes, and every token is
// still k3-generate's. (Whether compaction moves a slot here depends on how requests interleave; the local
// engine's tight-region test shows moves with a fixed schedule.)
TEST_CASE("prefill stages in a tight cache region serve the same tokens and report the region", "[cluster_e2e][prefix_cache]") {
  const double mib = stage0_region_mib(6, 20);
  k3::testing::ScratchDir dir("prefix-tight");
  dir.write("spec.json", cluster_spec(dir.str(), mib).dump(2));
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(dir.file("spec.json"));
  const std::string model = dir.str() + "/model";
  const int vocab = k3::test::model_vocab(model);
  std::mt19937 rng(25);
  auto tokens = [&](int n) { return k3::test::random_tokens(rng, vocab, n); };
  const std::vector<int32_t> system = tokens(150);
  constexpr int kMax = 4;
  std::vector<std::pair<std::vector<int32_t>, int>> cases;   // prompt, seed (-1: greedy)
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = i % 3 == 2 ? tokens(90 + 11 * i) : system;   // every third one shares nothing
    const auto tail = tokens(9 + 23 * i);
    p.insert(p.end(), tail.begin(), tail.end());
    cases.push_back({p, i % 2 ? 30 + i : -1});
  }
  CHECK(complete(cluster.port, body_of(cases[0].first, kMax, cases[0].second)) ==
        reference(model, cases[0].first, kMax, cases[0].second));
  for (size_t round = 0; round < 2; ++round) {   // the rest at once, twice: slots come and go while pages grow
    std::vector<std::future<k3::test::HttpReply>> replies;
    for (size_t i = 1; i < cases.size(); ++i)
      replies.push_back(std::async(std::launch::async, [&cluster, c = cases[i]] {
        return k3::test::post_json(cluster.port, "/v1/completions", body_of(c.first, kMax, c.second));
      }));
    for (size_t i = 1; i < cases.size(); ++i) {
      INFO("round " << round << ", request " << i << " (" << cases[i].first.size() << " tokens)");
      CHECK(k3::test::token_ids_of(replies[i - 1].get()) == reference(model, cases[i].first, kMax, cases[i].second));
    }
  }
  double hit = 0, free_bytes = 0;
  for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
    const auto m = k3::test::read_metrics(cluster.port);
    hit = k3::test::metric_or(m, "k3_prefill_prefix_cache_hit_tokens_total{node=\"prefill/p/0\"}");
    free_bytes = k3::test::metric_or(m, "k3_prefill_cache_region_free_bytes{node=\"prefill/p/0\"}");
    if (hit > 0 && free_bytes > 0) break;
    std::this_thread::sleep_for(200ms);
  }
  CHECK(hit > 0);
  // The stage's region is the size the spec gave (its free bytes never exceed it), not the full size.
  CHECK(free_bytes > 0);
  CHECK(free_bytes <= mib * (1 << 20));
}
