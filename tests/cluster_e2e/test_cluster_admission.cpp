// Admission that matches decode capacity, against a real k3-cluster (router, two prefill stages and a
// decode rank as separate processes; the decode rank has 8 slots and a 4096-token transfer pool):
//  - one prompt near the context limit sent together with seven short ones: every stream ends with
//    [DONE] (none hangs, none fails with alloc_failed: the short ones wait in the router's queue while
//    the long one holds the pool), the queue time is on /metrics, and the decode pool returns to its
//    starting free bytes;
//  - a request that can never fit is refused up front with HTTP 400 naming the limit and the numbers;
//  - eight requests admitted together whose decode caches outgrow the rank's cache mid-decode: the rank
//    preempts (pauses the newest, resumes it later) and every stream still gets exactly the greedy tokens
//    of k3-generate.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cstdio>
#include <future>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/support/generate_reference.h"
#include "tests/support/scratch_dir.h"

using namespace std::chrono_literals;
using k3::test::StreamOutcome;

namespace {

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = 10 + (i * 31 + salt * 7) % 490;
  return p;
}

const std::string kPoolFree = "k3_cluster_node_pool_free_bytes{node=\"decode/d\"}";

}  // namespace

TEST_CASE("k3-cluster: a near-limit prompt with seven short ones: every stream ends, none fails, pools return",
          "[cluster_e2e][admission]") {
  k3::testing::ScratchDir dir("cluster-admission");
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(k3::test::write_default_spec(dir.str()));
  const int port = cluster.port;
  auto drain_lines = [&] {
    while (cluster.proc->read_line(0ms)) {
    }
  };
  // The starting free bytes of decode's pool, from its heartbeats.
  double start_free = 0;
  for (auto t0 = std::chrono::steady_clock::now(); start_free <= 0; std::this_thread::sleep_for(100ms)) {
    REQUIRE(std::chrono::steady_clock::now() - t0 < 20s);
    start_free = k3::test::metric_or(k3::test::read_metrics(port), kPoolFree);
  }

  // Never fits: the prompt alone needs more than the context (4096 tokens).
  {
    const StreamOutcome r = k3::test::stream_completion(port, prompt_of(4090, 1), 64, 60s);
    CHECK(r.status == 400);
    CHECK_THAT(r.error, Catch::Contains("4090") && Catch::Contains("4096"));
  }

  // One prompt of 3990 tokens (+16 generated: 4006 of the 4096-token context and pool) and seven short
  // ones, all at once. The stream deadline is generous for a loaded 2-core machine: the point is that
  // each one ends, not how fast.
  std::vector<std::future<StreamOutcome>> runs;
  runs.push_back(std::async(std::launch::async, [&] { return k3::test::stream_completion(port, prompt_of(3990, 0), 16, 400s); }));
  std::this_thread::sleep_for(50ms);  // the long one first: the short ones must wait behind it, not fail
  for (int i = 0; i < 7; ++i)
    runs.push_back(std::async(std::launch::async, [&, i] {
      return k3::test::stream_completion(port, prompt_of(12 + 5 * i, i + 1), 16, 400s);
    }));
  std::map<std::string, int> kinds;
  for (auto& f : runs) {
    while (f.wait_for(100ms) != std::future_status::ready) drain_lines();
    const StreamOutcome r = f.get();
    INFO(k3::test::outcome_name(r.kind) << " status " << r.status << " " << r.error);
    ++kinds[k3::test::outcome_name(r.kind)];
    CHECK(r.kind == StreamOutcome::Kind::Done);
    CHECK(r.tokens == 16);
  }
  CHECK(kinds["hung"] == 0);
  CHECK(kinds["done"] == 8);

  auto m = k3::test::read_metrics(port);
  for (const auto& [k, v] : m)
    if (k.rfind("k3_cluster_queue_wait", 0) == 0 || k.rfind("k3_cluster_requeued", 0) == 0) std::printf("%s %g\n", k.c_str(), v);
  CHECK(k3::test::metric_or(m, "k3_cluster_request_failures_total{cause=\"alloc_failed\"}") == 0);
  CHECK(k3::test::metric_sum(m, "k3_cluster_request_failures_total") == 0);
  CHECK(k3::test::metric_sum(m, "k3_cluster_deadline_expired_total") == 0);
  CHECK(k3::test::metric_or(m, "k3_cluster_queue_wait_seconds_count") == 8);
  CHECK(k3::test::metric_or(m, "k3_cluster_rejected_total{reason=\"never_fits\"}") == 0);  // the 400 above was the context check
  // The pool comes back to where it started (heartbeats lag: allow them a few seconds).
  for (auto t0 = std::chrono::steady_clock::now();
       k3::test::metric_or(k3::test::read_metrics(port), kPoolFree) != start_free; std::this_thread::sleep_for(100ms)) {
    drain_lines();
    REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
  }
  m = k3::test::read_metrics(port);
  CHECK(k3::test::metric_or(m, "k3_cluster_node_running{node=\"decode/d\"}") == 0);
  CHECK(k3::test::metric_or(m, "k3_cluster_queue_length") == 0);
  CHECK(k3::test::metric_or(m, "k3_cluster_requests_in_flight") == 0);
  ::kill(cluster.proc->pid(), SIGTERM);
  CHECK(cluster.proc->wait_exit(20s) == 0);
}

TEST_CASE("k3-cluster: decode preempts when its cache runs out mid-decode; greedy tokens are unchanged",
          "[cluster_e2e][admission][preemption]") {
  k3::testing::ScratchDir dir("cluster-preempt");
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(k3::test::write_default_spec(dir.str()));
  const int port = cluster.port;
  // Eight prompts of 470 tokens: 30 transfer pages each (240 of 256) and, with the router's 32-token
  // generation reserve, 32 cache pages each (256 of 256): all eight are admitted at once. Generating
  // 600 tokens takes each to 1070 tokens = 67 pages: with four or more decoding at once the cache runs
  // out mid-decode.
  const int kLen = 470, kMax = 600;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(prompt_of(kLen, 11 + i));
  std::vector<std::future<StreamOutcome>> runs;
  for (int i = 0; i < 8; ++i)
    runs.push_back(std::async(std::launch::async, [&, i] { return k3::test::stream_completion(port, prompts[i], kMax, 400s); }));
  std::vector<StreamOutcome> got;
  for (auto& f : runs) {
    while (f.wait_for(100ms) != std::future_status::ready) cluster.proc->read_line(0ms);
    got.push_back(f.get());
  }
  const auto m = k3::test::read_metrics(port);
  std::printf("preemptions %g\n", k3::test::metric_or(m, "k3_cluster_node_preemptions_total{node=\"decode/d\"}"));
  CHECK(k3::test::metric_or(m, "k3_cluster_node_preemptions_total{node=\"decode/d\"}") >= 1);
  CHECK(k3::test::metric_sum(m, "k3_cluster_request_failures_total") == 0);
  for (int i = 0; i < 8; ++i) {
    INFO("request " << i << ": " << k3::test::outcome_name(got[i].kind) << " " << got[i].error);
    REQUIRE(got[i].kind == StreamOutcome::Kind::Done);
    CHECK(got[i].ids == k3::test::k3_generate_tokens(dir.str() + "/model", prompts[i], kMax));
  }
  ::kill(cluster.proc->pid(), SIGTERM);
  CHECK(cluster.proc->wait_exit(20s) == 0);
}
