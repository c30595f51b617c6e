// k3-cluster serving a Kimi Linear directory saved by transformers (plain residual: only the partial sum
// crosses the stage boundary; 6 layers, MLA first, 2 dense layers, q_lora_rank set, sharded weights):
// two prefill instances of PP2, decode DP2. Concurrent greedy requests return the same 32 tokens as
// `k3-generate` and as transformers' KimiLinearForCausalLM, and the router placed requests on both decode
// ranks.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <fstream>
#include <future>
#include <regex>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/plain_completion.h"
#include "tests/router/http_client.h"
#include "tests/support/generate_reference.h"
#include "tests/support/hf_kimi_linear.h"
#include "tests/transfer/process_guard.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;
using k3::test::HttpReply;

TEST_CASE("k3-cluster on a transformers-saved Kimi Linear model (PP2 + DP2) == k3-generate == transformers",
          "[cluster_e2e][kimi_linear]") {
  const k3::test::HfKimiLinearModels hf("qlora_dense2");
  if (!hf.available()) {
    WARN("skipped: " << hf.skip_reason());
    return;
  }
  const k3::test::HfKimiLinearModel& m = hf.models().at(0);
  k3::test::TempDir dir("cluster-kimi-linear");
  const json spec = {{"model", m.dir},
                     {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"served_model_name", "kimi-linear"}}},
                     // Prefill instance i feeds decode rank i (as deploy/cluster-k3-tiny-93.json).
                     {"prefill", json::array({{{"id", "a"}, {"stages", 2}, {"chunk_size", 8}},
                                              {{"id", "b"}, {"stages", 2}, {"chunk_size", 8}}})},
                     {"decode", json::array({{{"id", "d"}, {"ranks", 2}}})},
                     {"threads", 1},
                     {"timeouts", {{"heartbeat_ms", 500}, {"heartbeat_misses", 6}, {"claim_ms", 10000},
                                   {"startup_s", 300}, {"shutdown_ms", 5000}}}};
  std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(dir.path() + "/spec.json");
  CHECK(cluster.pids.size() == 1 + 2 + 4);  // router, 2 decode ranks, 2 x 2 prefill stages

  // The oracle's two prompts (16 and 5 tokens; chunk 8 splits the first) plus two more, all at once.
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : m.oracle.at("gen_prompts")) prompts.push_back(p.get<std::vector<int32_t>>());
  prompts.push_back({5, 17, 99});
  prompts.push_back({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  constexpr int kMax = 32;
  std::vector<std::future<HttpReply>> replies;
  for (const auto& p : prompts) {
    const json body = {{"model", "kimi-linear"}, {"prompt", p},          {"max_tokens", kMax},
                       {"temperature", 0},       {"ignore_eos", true}, {"return_token_ids", true}};
    // post_json, no Catch macro, on the request threads; the reply is checked here on the main thread.
    replies.push_back(std::async(std::launch::async, [port = cluster.port, body] {
      return k3::test::post_json(port, "/v1/completions", body, 180s);
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const HttpReply r = replies[i].get();
    INFO("request " << i << ": " << r.body);
    const std::vector<int32_t> got = k3::test::token_ids_of(r);
    CHECK(got == k3::test::k3_generate_tokens(m.dir, prompts[i], kMax));
    if (i < m.oracle.at("greedy").size()) CHECK(got == m.oracle.at("greedy").at(i).get<std::vector<int32_t>>());
  }
  HttpConnection metrics(cluster.port);
  metrics.send_request("GET", "/metrics");
  const std::string text = metrics.read_reply().body;
  INFO(text);
  for (const char* node : {"decode/d-0", "decode/d-1"}) {
    std::smatch hit;
    REQUIRE(std::regex_search(text, hit, std::regex(std::string("k3_cluster_placements_total\\{node=\"") + node +
                                                    "\"\\} ([0-9]+)")));
    CHECK(std::stoi(hit[1]) >= 1);
  }
  ::kill(cluster.proc->pid(), SIGTERM);
  CHECK(cluster.proc->wait_exit(30s) == 0);
}
