// curl, as the README shows it, against every endpoint of a real k3-cluster (router + prefill PP2 + decode
// DP1 on a generated k3-tiny): health, models, metrics, chat and completions (plain and streamed), and a
// bad request's OpenAI error.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/support/run_command.h"

using namespace std::chrono_literals;
using nlohmann::json;

TEST_CASE("curl reaches every endpoint of k3-cluster", "[cluster_e2e]") {
  k3::test::TempDir dir("curl");
  const json spec = {{"model", dir.path() + "/model"},
                     {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"served_model_name", "k3-tiny"}}},
                     {"prefill", json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", 8}}})},
                     {"decode", json::array({{{"id", "d"}, {"ranks", 1}}})},
                     {"threads", 1}};
  std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(dir.path() + "/spec.json");
  const std::string base = "http://127.0.0.1:" + std::to_string(cluster.port);
  // -w appends the status code on its own line after the body.
  auto curl = [&](const std::string& args) {
    auto r = k3::test::run_command("curl -s -w '\\n%{http_code}' " + args);
    REQUIRE(r.exit_code == 0);
    const auto nl = r.out.rfind('\n');
    return std::make_pair(std::stoi(r.out.substr(nl + 1)), r.out.substr(0, nl));
  };
  const std::string json_hdr = "-H 'Content-Type: application/json' ";

  auto [hs, hb] = curl(base + "/health");
  CHECK(hs == 200);
  CHECK(json::parse(hb)["status"] == "ok");

  auto [ms, mb] = curl(base + "/v1/models");
  CHECK(ms == 200);
  CHECK(json::parse(mb)["data"][0]["id"] == "k3-tiny");

  auto [xs, xb] = curl(base + "/metrics");
  CHECK(xs == 200);
  CHECK_THAT(xb, Catch::Contains("# TYPE k3_router_requests_total counter"));

  auto [cs, cb] = curl(json_hdr + base + "/v1/chat/completions -d '{\"model\":\"k3-tiny\",\"messages\":"
                       "[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":8}'");
  CHECK(cs == 200);
  const json chat = json::parse(cb);
  CHECK(chat["object"] == "chat.completion");
  CHECK(chat["usage"]["completion_tokens"].get<int>() >= 1);
  CHECK(chat["choices"][0]["message"]["role"] == "assistant");

  auto [ss, sb] = curl("-N " + json_hdr + base + "/v1/completions -d '{\"model\":\"k3-tiny\",\"prompt\":\"Once upon\","
                       "\"max_tokens\":6,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}'");
  CHECK(ss == 200);
  CHECK(sb.rfind("data: {", 0) == 0);
  CHECK_THAT(sb, Catch::Contains("\"completion_tokens\":6"));
  CHECK_THAT(sb, Catch::EndsWith("data: [DONE]\n\n"));

  auto [es, eb] = curl(json_hdr + base + "/v1/completions -d '{\"model\":\"k3-tiny\",\"prompt\":\"x\",\"n\":17}'");
  CHECK(es == 400);
  CHECK(json::parse(eb)["error"]["param"] == "n");

  ::kill(cluster.proc->pid(), SIGTERM);
  CHECK(cluster.proc->wait_exit(20s) == 0);
}
