// HTTP 400 for a request no decode rank can ever hold, against real processes (k3-router in cluster
// mode, one k3-prefill stage, one k3-decode) where the decode rank is smaller than the model's context:
// a 64-page transfer pool and a 48-page decode cache (16 tokens a page) under k3-tiny's 4096-token
// context. The refusal comes before any response byte, names the limit and the numbers; a request that
// fits is served; the router counts the refusal. With --max-queue 1, of three requests that each need
// most of the pool, one runs, one waits, and the third gets 429 (before any response byte); the prefill
// stage is frozen meanwhile so that the one running cannot finish before the 429.
#include <catch2/catch.hpp>

#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/paired_nodes.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/support/run_command.h"
#include "tests/support/scratch_dir.h"
#include "tests/transfer/process_guard.h"

using namespace std::chrono_literals;
using k3::test::ProcessGuard;
using k3::test::StreamOutcome;

namespace {

const std::string kBin = K3_BIN_DIR;

std::vector<int32_t> prompt_of(int len) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = 10 + (i * 13) % 490;
  return p;
}

}  // namespace

TEST_CASE("cluster router: a request beyond one decode rank's capacity gets 400 naming the limit", "[cluster_e2e][admission]") {
  k3::testing::ScratchDir dir("never-fits");
  const std::string model = dir.file("model");
  REQUIRE(k3::test::run_command(kBin + "/k3-genweights --preset k3-tiny --seed 0 --out '" + model + "'").exit_code == 0);
  // 20 s of silence before a node counts as dead: the prefill stage is frozen for a moment below.
  k3::test::PairedNodes nodes(model, {"--heartbeat-ms", "200", "--heartbeat-misses", "100"});
  nodes.start_router({"--max-queue", "1"});
  ProcessGuard& decode =
      nodes.start_decode({"--pool-pages", "64", "--cache-pages", "48", "--no-cache-in-pool"});
  ProcessGuard& prefill = nodes.start_prefill(k3::test::wait_line(decode, "READY "));
  nodes.wait_healthy();
  const int port = nodes.port();

  // 1100 prompt tokens need 69 transfer pages; the rank has 64 (1024 tokens).
  StreamOutcome r = k3::test::stream_completion(port, prompt_of(1100), 8, 60s);
  CHECK(r.status == 400);
  CHECK_THAT(r.error, Catch::Contains("1100 tokens") && Catch::Contains("69 transfer pool pages") &&
                          Catch::Contains("64 (1024 tokens)"));
  // 700 + 100 = 800 tokens need 50 cache pages; the rank has 48 (768 tokens).
  r = k3::test::stream_completion(port, prompt_of(700), 100, 60s);
  CHECK(r.status == 400);
  CHECK_THAT(r.error, Catch::Contains("max_tokens (100)") && Catch::Contains("50 decode cache pages") &&
                          Catch::Contains("48 (768 tokens)"));
  // What fits is served.
  r = k3::test::stream_completion(port, prompt_of(700), 60, 120s);
  INFO(k3::test::outcome_name(r.kind) << " " << r.error);
  CHECK(r.kind == StreamOutcome::Kind::Done);
  CHECK(r.tokens == 60);
  // 600 prompt tokens take 38 of the 64 pool pages: one at a time. The first is placed, the second
  // waits (the queue holds one), the third is refused with 429 at once. (A request counts as queued
  // from submit until the router places it.) The prefill stage is frozen meanwhile, so the first holds
  // its room until the 429 is seen: unfrozen, it is done in a fraction of a second, sometimes before
  // the third is even sent.
  auto send = [&] {
    return std::async(std::launch::async, [&] { return k3::test::stream_completion(port, prompt_of(600), 160, 120s); });
  };
  // Metrics are read until `holds` is true of them (10 s at most). The in-flight gauge alone cannot say
  // "the new request is placed": the router publishes it after each worker turn, so just after the
  // previous request's [DONE] it may still count that one. The placements counter only grows.
  using Metrics = std::map<std::string, double>;
  auto wait_metrics = [&](auto holds) {
    for (auto t0 = std::chrono::steady_clock::now();; std::this_thread::sleep_for(10ms)) {
      const Metrics g = k3::test::read_metrics(port);
      if (holds(g)) return g;
      REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
    }
  };
  auto gauge = [](const Metrics& g, const std::string& series) { return k3::test::metric_or(g, series); };
  auto placed = [](const Metrics& g) { return k3::test::metric_sum(g, "k3_cluster_placements_total"); };
  const double placed_before = placed(k3::test::read_metrics(port));
  std::vector<std::future<StreamOutcome>> three;
  {
    k3::test::FrozenProcess frozen(prefill);
    REQUIRE(frozen.frozen());
    three.push_back(send());
    // Placed: no longer queued, the router reserved its room on the decode rank, and (published at the
    // end of the worker's turn) counted in flight.
    auto first_placed = [&](const Metrics& m) {
      return placed(m) == placed_before + 1 && gauge(m, "k3_cluster_queue_length") == 0 &&
             gauge(m, "k3_cluster_node_reserved_requests{node=\"decode/d\"}") == 1 &&
             gauge(m, "k3_cluster_requests_in_flight") == 1;
    };
    wait_metrics(first_placed);
    three.push_back(send());
    // Queued: the second waits for room; the first still holds it and nothing else was placed.
    const Metrics g = wait_metrics([&](const Metrics& m) { return gauge(m, "k3_cluster_queue_length") == 1; });
    CHECK(placed(g) == placed_before + 1);
    CHECK(gauge(g, "k3_cluster_node_reserved_requests{node=\"decode/d\"}") == 1);
    three.push_back(send());
    // A 429 comes at once; a third queued by mistake would wait for the frozen stage.
    CHECK(three.back().wait_for(10s) == std::future_status::ready);
    // Refused while the first still held the pool and the second still waited.
    const Metrics after = k3::test::read_metrics(port);
    CHECK(placed(after) == placed_before + 1);
    CHECK(gauge(after, "k3_cluster_queue_length") == 1);
  }
  {
    const StreamOutcome third = three.back().get();
    INFO(k3::test::outcome_name(third.kind) << " " << third.error);
    CHECK(third.status == 429);
    CHECK_THAT(third.error, Catch::Contains("queue_full") && Catch::Contains("--max-queue 1"));
    CHECK(third.tokens == 0);
  }
  // Thawed, the first finishes, then the second is placed and finishes too.
  for (size_t i = 0; i < 2; ++i) {
    const StreamOutcome o = three[i].get();
    INFO("request " << i << ": " << k3::test::outcome_name(o.kind) << " " << o.status << " " << o.error);
    CHECK(o.status == 200);
    CHECK(o.kind == StreamOutcome::Kind::Done);
    CHECK(o.tokens == 160);
  }
  const auto m = k3::test::read_metrics(port);
  CHECK(k3::test::metric_or(m, "k3_cluster_rejected_total{reason=\"queue_full\"}") == 1);
  CHECK(k3::test::metric_or(m, "k3_cluster_rejected_total{reason=\"never_fits\"}") == 2);
  CHECK(k3::test::metric_sum(m, "k3_cluster_request_failures_total") == 0);
}
