// Client disconnect mid-stream frees decode AND prefill memory in a real k3-cluster (PP2, DP1): the
// launcher relays the nodes' memory lines (prefill "HELD <sources> <computing>", decode "IDLE <pool
// free> <capacity>"), and the decode rank's heartbeats put its pool free bytes on the router's
// /metrics. After the client leaves, within a few seconds decode's pool is back to its starting free
// bytes (the full pool), every prefill stage holds no sources and computes nothing, and the cluster
// serves the next request.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/router/http_client.h"
#include "tests/support/run_command.h"
#include "tests/transfer/process_guard.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;
using k3::test::HttpReply;
using k3::test::ProcessGuard;

namespace {

json completion_body(const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  return {{"model", "k3-tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
          {"ignore_eos", true}, {"return_token_ids", true}, {"stream", stream}};
}

// The launcher's relayed node lines, by node: the last HELD / IDLE fields seen.
struct NodeLines {
  std::map<std::string, std::pair<long, long>> held;  // prefill stage -> (sources, computing)
  std::map<std::string, std::pair<long, long>> idle;  // decode rank -> (pool free, capacity)
  int idle_count = 0;
  void take(const std::string& line) {
    std::smatch m;
    static const std::regex re("^NODE (\\S+) (HELD|IDLE) ([0-9]+) ([0-9]+)$");
    if (!std::regex_match(line, m, re)) return;
    auto& into = m[2] == "HELD" ? held : idle;
    into[m[1]] = {std::stol(m[3]), std::stol(m[4])};
    if (m[2] == "IDLE") ++idle_count;
  }
};

long metric(int port, const std::string& series) {
  HttpConnection m(port);
  m.send_request("GET", "/metrics");
  const std::string body = m.read_reply().body;
  const auto at = body.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::atol(body.c_str() + at + series.size() + 2);
}

}  // namespace

TEST_CASE("k3-cluster: a client that disconnects mid-stream frees decode and prefill memory", "[cluster_e2e]") {
  k3::test::TempDir dir("cluster-disconnect");
  const std::string model = dir.path() + "/model";
  const json spec = {{"model", model},
                     {"generate", {{"preset", "k3-tiny"}, {"seed", 4}}},
                     {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"served_model_name", "k3-tiny"}}},
                     {"prefill", json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", 4}}})},
                     {"decode", json::array({{{"id", "d"}, {"ranks", 1}}})},
                     {"threads", 1},
                     {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 5}, {"startup_s", 240}}}};
  std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(dir.path() + "/spec.json");
  ProcessGuard& proc = *cluster.proc;
  const int port = cluster.port;
  NodeLines nodes;
  const std::string free_series = "k3_cluster_node_pool_free_bytes{node=\"decode/d\"}";
  // The starting pool free bytes, from decode's heartbeats (the whole pool: nothing is in flight).
  long start_free = -1;
  for (auto t0 = std::chrono::steady_clock::now(); start_free <= 0; std::this_thread::sleep_for(100ms)) {
    REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
    start_free = metric(port, free_series);
  }

  // A long stream (prompt over several chunks): read a few tokens, then leave.
  std::vector<int32_t> prompt(13);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 + 3);
  {
    HttpConnection h(port);
    h.send_request("POST", "/v1/completions", completion_body(prompt, 3000, true).dump());
    std::string got;
    size_t seen = 0;
    const auto until = std::chrono::steady_clock::now() + 120s;
    while (seen < 3) {
      REQUIRE(std::chrono::steady_clock::now() < until);
      got += h.read_some(200ms);
      seen = 0;
      for (size_t at = got.find("\"token_ids\""); at != std::string::npos; at = got.find("\"token_ids\"", at + 1)) ++seen;
    }
    REQUIRE(got.find("[DONE]") == std::string::npos);
    // While it decodes, decode's heartbeats report it running.
    for (auto t0 = std::chrono::steady_clock::now(); metric(port, "k3_cluster_node_running{node=\"decode/d\"}") != 1;
         std::this_thread::sleep_for(50ms))
      REQUIRE(std::chrono::steady_clock::now() - t0 < 5s);
    h.close();
  }
  const auto left = std::chrono::steady_clock::now();
  // Within a few seconds: decode reports idle with the whole pool free, both prefill stages hold no
  // sources and compute nothing; the router's gauges agree.
  auto released = [&] {
    if (nodes.idle_count == 0) return false;
    const auto d = nodes.idle.at("decode/d");
    if (d.first != d.second || d.first != start_free) return false;
    for (const char* s : {"prefill/p/0", "prefill/p/1"}) {
      auto it = nodes.held.find(s);
      if (it == nodes.held.end() || it->second != std::make_pair(0L, 0L)) return false;
    }
    return true;
  };
  while (!released()) {
    INFO("decode IDLE lines " << nodes.idle_count);
    REQUIRE(std::chrono::steady_clock::now() - left < 5s);
    if (auto line = proc.read_line(100ms)) nodes.take(*line);
  }
  for (auto t0 = std::chrono::steady_clock::now(); metric(port, free_series) != start_free; std::this_thread::sleep_for(100ms))
    REQUIRE(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(metric(port, "k3_cluster_node_running{node=\"decode/d\"}") == 0);
  CHECK(metric(port, "k3_cluster_requests_in_flight") == 0);

  // The cluster serves the next request.
  {
    HttpConnection c(port);
    c.send_request("POST", "/v1/completions", completion_body(prompt, 4, false).dump());
    const HttpReply r = c.read_reply(120s);
    INFO(r.body);
    REQUIRE(r.status == 200);
    CHECK(json::parse(r.body).at("choices").at(0).at("token_ids").size() == 4);
  }
  ::kill(proc.pid(), SIGTERM);
  CHECK(proc.wait_exit(20s) == 0);
}
