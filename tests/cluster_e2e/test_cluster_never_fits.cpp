// HTTP 400 for a request no decode rank can ever hold, against real processes (k3-router in cluster
// mode, one k3-prefill stage, one k3-decode) where the decode rank is smaller than the model's context:
// a 64-page transfer pool and a 48-page decode cache (16 tokens a page) under k3-tiny's 4096-token
// context. The refusal comes before any response byte, names the limit and the numbers; a request that
// fits is served; the router counts the refusal. With --max-queue 1, of three requests that each need
// most of the pool, one runs, one waits, and the third gets 429 (before any response byte).
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
  k3::test::PairedNodes nodes(model, {"--heartbeat-ms", "200", "--heartbeat-misses", "10"});
  nodes.start_router({"--max-queue", "1"});
  ProcessGuard& decode =
      nodes.start_decode({"--pool-pages", "64", "--cache-pages", "48", "--no-cache-in-pool"});
  nodes.start_prefill(k3::test::wait_line(decode, "READY "));
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
  // 600 prompt tokens take 38 of the 64 pool pages: one at a time (and 160 tokens to generate keep it
  // there a while). The first is placed, the second waits (the queue holds one), the third is refused
  // with 429 at once. (A request counts as queued from submit until the router places it.)
  auto send = [&] {
    return std::async(std::launch::async, [&] { return k3::test::stream_completion(port, prompt_of(600), 160, 120s); });
  };
  auto wait_metrics = [&](double in_flight, double queued) {
    for (auto t0 = std::chrono::steady_clock::now();; std::this_thread::sleep_for(5ms)) {
      const auto g = k3::test::read_metrics(port);
      if (k3::test::metric_or(g, "k3_cluster_requests_in_flight") == in_flight &&
          k3::test::metric_or(g, "k3_cluster_queue_length") == queued)
        return;
      REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
    }
  };
  std::vector<std::future<StreamOutcome>> three;
  three.push_back(send());
  wait_metrics(1, 0);
  three.push_back(send());
  wait_metrics(1, 1);
  three.push_back(send());
  std::map<int, int> by_status;
  int done = 0;
  for (auto& f : three) {
    const StreamOutcome o = f.get();
    ++by_status[o.status];
    done += o.kind == StreamOutcome::Kind::Done && o.tokens == 160;
  }
  CHECK(by_status[429] == 1);
  CHECK(by_status[200] == 2);
  CHECK(done == 2);
  const auto m = k3::test::read_metrics(port);
  CHECK(k3::test::metric_or(m, "k3_cluster_rejected_total{reason=\"queue_full\"}") == 1);
  CHECK(k3::test::metric_or(m, "k3_cluster_rejected_total{reason=\"never_fits\"}") == 2);
  CHECK(k3::test::metric_sum(m, "k3_cluster_request_failures_total") == 0);
}
