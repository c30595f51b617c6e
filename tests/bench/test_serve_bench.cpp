// `k3-bench serve --spawn-cluster`: the bench brings up the default k3-tiny cluster itself, drives
// concurrent streams through the router and stops the cluster; the JSON summary must show every
// request completed with exactly the requested number of tokens and self-consistent latencies.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "bench/latency_summary.h"

namespace fs = std::filesystem;
using nlohmann::json;

TEST_CASE("nearest-rank percentiles match a sort-and-pick reference on random samples") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> v(1 + rng() % 200);
    for (double& x : v) x = std::uniform_real_distribution<double>(0, 10)(rng);
    const auto s = k3::bench::summarize(v);
    std::sort(v.begin(), v.end());
    for (auto [p, got] : {std::pair{50.0, s.p50}, {90.0, s.p90}, {99.0, s.p99}}) {
      // Reference: the first sample whose count-at-or-below reaches p% of the samples.
      double want = v.back();
      for (size_t i = 0; i < v.size(); ++i)
        if (100.0 * static_cast<double>(i + 1) >= p * static_cast<double>(v.size())) {
          want = v[i];
          break;
        }
      REQUIRE(got == want);
    }
    REQUIRE(s.max == v.back());
    REQUIRE(s.count == v.size());
    REQUIRE(s.p50 <= s.p90);
    REQUIRE(s.p90 <= s.p99);
  }
  REQUIRE(k3::bench::summarize({}).count == 0);
}

TEST_CASE("k3-bench serve --spawn-cluster completes every request with exact lengths") {
  const fs::path out = fs::temp_directory_path() / ("k3_serve_bench_" + std::to_string(::getpid()) + ".json");
  const std::string cmd = std::string("cd ") + K3_SOURCE_DIR + " && " + K3_BIN_DIR +
                          "/k3-bench serve --spawn-cluster deploy/cluster-default.json --requests 6 --concurrency 2"
                          " --input-len 8:40 --output-len 4:12 --seed 3 --stream --timeout 50 --json " +
                          out.string();
  const int rc = std::system(cmd.c_str());
  REQUIRE(rc == 0);
  std::ifstream f(out);
  REQUIRE(f.good());
  const json j = json::parse(f);
  fs::remove(out);
  INFO(j.dump(2));
  REQUIRE(j["failed"] == 0);
  REQUIRE(j["completed"] == 6);
  REQUIRE(j["errors"].empty());
  REQUIRE(j["output_tokens"] == j["expected_output_tokens"]);
  REQUIRE(j["output_tokens"].get<int>() >= 6 * 4);
  REQUIRE(j["output_tokens"].get<int>() <= 6 * 12);
  REQUIRE(j["input_tokens"].get<int>() >= 6 * 8);
  REQUIRE(j["input_tokens"].get<int>() <= 6 * 40);
  const double wall = j["wall_s"];
  REQUIRE(wall > 0);
  REQUIRE(j["request_throughput"].get<double>() == Approx(6 / wall));
  REQUIRE(j["ttft"]["count"] == 6);
  REQUIRE(j["e2e"]["count"] == 6);
  REQUIRE(j["tpot"]["count"] == 6);  // every output is >= 4 tokens
  // One ITL gap per token after the first, unless chunks carried several tokens.
  REQUIRE(j["itl"]["count"].get<int>() <= j["output_tokens"].get<int>() - 6);
  REQUIRE(j["itl"]["count"].get<int>() > 0);
  REQUIRE(j["ttft"]["p50_ms"].get<double>() > 0);
  REQUIRE(j["ttft"]["mean_ms"].get<double>() < j["e2e"]["mean_ms"].get<double>());
  REQUIRE(j["e2e"]["max_ms"].get<double>() <= wall * 1e3);
  // The router saw the same 6 first tokens and, being inside the path, no later than the client.
  REQUIRE(j["router_ttft_count"] == 6);
  REQUIRE(j["router_ttft_mean_ms"].get<double>() > 0);
  REQUIRE(j["router_ttft_mean_ms"].get<double>() <= j["ttft"]["mean_ms"].get<double>());
}

namespace {
// Runs k3-bench serve with `args` from the source dir; returns its exit status and the JSON it wrote.
std::pair<int, json> run_bench(const std::string& args) {
  const fs::path out = fs::temp_directory_path() / ("k3_serve_bench_err_" + std::to_string(::getpid()) + ".json");
  const std::string cmd = std::string("cd ") + K3_SOURCE_DIR + " && " + K3_BIN_DIR + "/k3-bench serve " + args +
                          " --json " + out.string();
  const int rc = std::system(cmd.c_str());
  std::ifstream f(out);
  json j = f.good() ? json::parse(f) : json();
  fs::remove(out);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, j};
}
}  // namespace

TEST_CASE("k3-bench serve counts and reports failed requests and exits non-zero") {
  SECTION("the router rejects every request (unknown model): each is an HTTP 404 error") {
    const auto [rc, j] = run_bench("--spawn-cluster deploy/cluster-default.json --model no-such-model --requests 3 "
                                   "--concurrency 2 --input-len 4:8 --output-len 2:4 --stream --timeout 50");
    INFO(j.dump(2));
    REQUIRE(rc == 1);
    REQUIRE(j["completed"] == 0);
    REQUIRE(j["failed"] == 3);
    REQUIRE(j["errors"].size() == 1);
    const std::string why = j["errors"].begin().key();
    REQUIRE(why.find("HTTP 404") != std::string::npos);
    REQUIRE(why.find("model") != std::string::npos);
    REQUIRE(j["errors"].begin().value() == 3);
  }
  SECTION("nothing listens on the port: each request fails to connect") {
    const auto [rc, j] = run_bench("--url http://127.0.0.1:1 --requests 4 --concurrency 2 --stream --timeout 10");
    INFO(j.dump(2));
    REQUIRE(rc == 1);
    REQUIRE(j["failed"] == 4);
    REQUIRE(j["completed"] == 0);
    REQUIRE(j["output_tokens"] == 0);
  }
}
