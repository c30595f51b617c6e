// The production-shaped cluster on CPU: deploy/cluster-k3-tiny-93.json (k3-tiny-93, two prefill
// instances of 16 PP stages on the production partition 7,5,...,7,5,6,3, two decode DP ranks; prefill
// instance i feeds decode rank i) started by k3-cluster. Several concurrent greedy requests equal
// `k3-generate` token for token, and the router placed requests on both decode ranks.
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
#include "tests/support/run_command.h"
#include "tests/transfer/process_guard.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;
using k3::test::HttpReply;
using k3::test::ProcessGuard;

namespace {

const std::string kBin = K3_BIN_DIR;

}  // namespace

TEST_CASE("k3-cluster: k3-tiny-93, 16 prefill stages on the production partition, 2 decode ranks == k3-generate",
          "[cluster_e2e]") {
  std::ifstream in(std::string(K3_SOURCE_DIR) + "/deploy/cluster-k3-tiny-93.json");
  json spec = json::parse(in);
  REQUIRE(spec.at("prefill").size() == 2);
  for (const auto& p : spec.at("prefill")) {
    CHECK(p.at("stages") == 16);
    CHECK(p.at("partition") == json::array({7, 5, 7, 5, 7, 5, 7, 5, 7, 5, 7, 5, 7, 5, 6, 3}));
  }
  CHECK(spec.at("decode").at(0).at("ranks") == 2);
  // A temp model dir (generated on first use by the launcher) and a free port.
  k3::test::TempDir dir("cluster-93");
  const std::string model = dir.path() + "/k3-tiny-93";
  spec["model"] = model;
  spec["router"]["port"] = 0;
  spec["router"]["served_model_name"] = "k3-tiny-93";
  std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(dir.path() + "/spec.json");
  ProcessGuard& proc = *cluster.proc;
  const int port = cluster.port;
  const int started = static_cast<int>(cluster.pids.size());
  CHECK(started == 1 + 2 + 32);  // router, 2 decode ranks, 2 x 16 prefill stages

  // Short prompts (chunk 16: some split in two), few tokens; all at once.
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 99}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19},
                                                     {300, 7}, {42, 43, 44, 45, 46, 47, 48, 49, 50}};
  constexpr int kMax = 4;
  std::vector<std::future<HttpReply>> replies;
  for (const auto& p : prompts) {
    const json body = {{"model", "k3-tiny-93"}, {"prompt", p},          {"max_tokens", kMax},
                       {"temperature", 0},      {"ignore_eos", true}, {"return_token_ids", true}};
    // post_json, no Catch macro, on the request threads; the reply is checked here on the main thread.
    replies.push_back(std::async(std::launch::async, [port, body] {
      return k3::test::post_json(port, "/v1/completions", body, 180s);
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const HttpReply r = replies[i].get();
    INFO("request " << i << ": " << r.body);
    CHECK(k3::test::token_ids_of(r) == k3::test::k3_generate_tokens(model, prompts[i], kMax));
  }
  // Both decode ranks served requests.
  HttpConnection m(port);
  m.send_request("GET", "/metrics");
  const std::string metrics = m.read_reply().body;
  INFO(metrics);
  for (const char* node : {"decode/d-0", "decode/d-1"}) {
    std::smatch hit;
    REQUIRE(std::regex_search(metrics, hit, std::regex(std::string("k3_cluster_placements_total\\{node=\"") + node + "\"\\} ([0-9]+)")));
    CHECK(std::stoi(hit[1]) >= 1);
  }
  ::kill(proc.pid(), SIGTERM);
  CHECK(proc.wait_exit(30s) == 0);
}
