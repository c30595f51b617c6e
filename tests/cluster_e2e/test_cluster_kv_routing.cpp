// KV-aware placement across two prefill instances (real processes through k3-cluster): each instance's
// stage reports the block hashes of its cached prefixes with its heartbeats, and the router sends a
// prompt that shares a cached prefix to the instance holding it. The sticky hash covers whole prompts
// here (affinity_tokens beyond every prompt), so without the reports every new prompt would go to the
// less loaded instance, and between two idle ones to the first: the prompt sharing the second
// instance's prefix shows the reports at work.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <fstream>
#include <future>
#include <random>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/plain_completion.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/router/http_client.h"
#include "tests/support/generate_reference.h"
#include "tests/support/scratch_dir.h"

using namespace std::chrono_literals;
using nlohmann::json;

namespace {

json body_of(const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  return {{"model", "k3-tiny"}, {"prompt", prompt},         {"max_tokens", max_tokens}, {"temperature", 0},
          {"ignore_eos", true}, {"return_token_ids", true}, {"stream", stream}};
}

// Also runs on std::async threads: no Catch macro here; the main thread checks the reply with token_ids_of.
k3::test::HttpReply complete(int port, const std::vector<int32_t>& prompt, int max_tokens) {
  return k3::test::post_json(port, "/v1/completions", body_of(prompt, max_tokens, false));
}

double lookups(const std::map<std::string, double>& m, const std::string& instance) {
  return k3::test::metric_or(m, "k3_prefill_prefix_cache_lookup_tokens_total{node=\"prefill/" + instance + "/0\"}");
}

}  // namespace

TEST_CASE("the router sends a prompt to the prefill instance whose cache holds its prefix", "[cluster_e2e][prefix_cache]") {
  k3::testing::ScratchDir dir("kv-routing");
  const json cache = {{"slots", 6}, {"block_tokens", 64}};
  const json spec = {
      {"model", dir.str() + "/model"},
      {"generate", {{"preset", "k3-tiny"}, {"seed", 7}}},
      {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"served_model_name", "k3-tiny"}, {"placement", "prefix-affinity"},
                  {"affinity_tokens", 100000}}},
      {"prefill", json::array({{{"id", "pa"}, {"stages", 1}, {"chunk_size", 64}, {"prefix_cache", cache}},
                               {{"id", "pb"}, {"stages", 1}, {"chunk_size", 64}, {"prefix_cache", cache}}})},
      {"decode", json::array({{{"id", "d"}, {"ranks", 1}, {"max_requests", 8}}})},
      {"threads", 1},
      {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 10}, {"startup_s", 240}}}};
  dir.write("spec.json", spec.dump(2));
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(dir.file("spec.json"));
  const std::string model = dir.str() + "/model";
  const int vocab = k3::test::model_vocab(model);
  std::mt19937 rng(99);
  auto tokens = [&](int n) { return k3::test::random_tokens(rng, vocab, n); };
  auto join = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  auto settled = [&](double seen) {   // the metrics once new lookups show (they come with heartbeats)
    auto mm = k3::test::read_metrics(cluster.port);
    for (auto deadline = std::chrono::steady_clock::now() + 20s; lookups(mm, "pa") + lookups(mm, "pb") < seen;
         mm = k3::test::read_metrics(cluster.port)) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(100ms);
    }
    return mm;
  };
  auto cached_prefixes = [](const std::map<std::string, double>& mm, const std::string& instance) {
    return k3::test::metric_or(mm, "k3_prefill_prefix_cache_cached_prefixes{node=\"prefill/" + instance + "/0\"}", -1);
  };

  // 1. Two prompts with different system prefixes at once: the first is placed on one instance, the
  //    second sees it in flight there and goes to the other. Each instance now caches one prefix.
  const std::vector<std::vector<int32_t>> systems = {tokens(150), tokens(140)};
  const std::vector<std::vector<int32_t>> firsts = {join(systems[0], tokens(9)), join(systems[1], tokens(11))};
  {
    auto a = std::async(std::launch::async, [&] { return complete(cluster.port, firsts[0], 24); });
    auto b = std::async(std::launch::async, [&] { return complete(cluster.port, firsts[1], 24); });
    k3::test::token_ids_of(a.get());
    k3::test::token_ids_of(b.get());
  }
  auto m = settled(double(firsts[0].size() + firsts[1].size()));
  // Which instance holds which prefix: its lookups are that prompt's length.
  REQUIRE(lookups(m, "pa") > 0);
  REQUIRE(lookups(m, "pb") > 0);
  const int on_b = lookups(m, "pb") == double(firsts[0].size()) ? 0 : 1;   // the system prefix pb holds
  REQUIRE(lookups(m, "pb") == double(firsts[on_b].size()));
  INFO("prefill instance pb holds system prefix " << on_b);
  // 2. The reports reach the router: each stage names the two checkpoints (64, 128) of its prefix.
  for (auto deadline = std::chrono::steady_clock::now() + 20s; cached_prefixes(m, "pa") < 2 || cached_prefixes(m, "pb") < 2;
       m = k3::test::read_metrics(cluster.port)) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(100ms);
  }

  // 3. Both idle: a prompt sharing pb's prefix goes to pb and resumes from its cache (load and the
  //    instance order alone would pick pa), with the tokens of a cold prefill.
  const auto shared = join(systems[on_b], tokens(12));
  const double a_before = lookups(m, "pa"), b_hits = k3::test::metric_or(m, "k3_prefill_prefix_cache_hit_tokens_total{node=\"prefill/pb/0\"}");
  const auto got = k3::test::token_ids_of(complete(cluster.port, shared, 4));
  m = settled(lookups(m, "pa") + lookups(m, "pb") + double(shared.size()));
  CHECK(lookups(m, "pa") == a_before);
  CHECK(k3::test::metric_or(m, "k3_prefill_prefix_cache_hit_tokens_total{node=\"prefill/pb/0\"}") == b_hits + 128);
  CHECK(got == k3::test::k3_generate_tokens(model, shared, 4, "--prefill-chunk 64"));
  // 4. The control: an unrelated prompt, both idle, goes to pa (the first instance).
  const double b_before = lookups(m, "pb");
  const auto unrelated = tokens(30);
  k3::test::token_ids_of(complete(cluster.port, unrelated, 2));
  m = settled(lookups(m, "pa") + lookups(m, "pb") + double(unrelated.size()));
  CHECK(lookups(m, "pb") == b_before);
  // 5. And a prompt sharing pa's prefix goes to pa.
  const auto shared_a = join(systems[1 - on_b], tokens(5));
  k3::test::token_ids_of(complete(cluster.port, shared_a, 2));
  m = settled(lookups(m, "pa") + lookups(m, "pb") + double(shared_a.size()));
  CHECK(lookups(m, "pb") == b_before);
  CHECK(k3::test::metric_or(m, "k3_prefill_prefix_cache_hit_tokens_total{node=\"prefill/pa/0\"}") == 128);
}
