// Overload against a real k3-cluster (router, prefill PP2, decode DP1 with 8 slots and a 4096-token
// pool): 64 concurrent streams of mixed length for 60 s, each client sending its next request as soon
// as the last one ended, so the offered load stays far above what decode can hold at once. Counted and
// asserted: no stream hangs (each ends with [DONE] or an error event within its deadline), none fails
// with alloc_failed (requests wait in the router's queue instead), and the decode pool is back to its
// starting free bytes afterwards. The figures (requests, outcomes, queue-time percentiles) are printed
// for docs/PERF.md.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/support/scratch_dir.h"

using namespace std::chrono_literals;
using k3::test::StreamOutcome;

namespace {

const std::string kPoolFree = "k3_cluster_node_pool_free_bytes{node=\"decode/d\"}";

// Queue-time percentile from the router's histogram buckets (upper bound of the bucket that holds it).
double histogram_quantile(const std::map<std::string, double>& m, const std::string& name, double q) {
  std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
  for (const auto& [k, v] : m)
    if (k.rfind(name + "_bucket{le=\"", 0) == 0) {
      const std::string le = k.substr(name.size() + 12, k.size() - name.size() - 14);
      buckets.push_back({le == "+Inf" ? 1e300 : std::atof(le.c_str()), v});
    }
  std::sort(buckets.begin(), buckets.end());
  if (buckets.empty() || buckets.back().second == 0) return 0;
  const double want = q * buckets.back().second;
  for (const auto& [le, n] : buckets)
    if (n >= want) return le;
  return buckets.back().first;
}

}  // namespace

TEST_CASE("k3-cluster: 64 concurrent mixed streams for 60 s at several times decode's capacity", "[cluster_e2e][overload]") {
  k3::testing::ScratchDir dir("cluster-overload");
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(k3::test::write_default_spec(dir.str()));
  const int port = cluster.port;
  double start_free = 0;
  for (auto t0 = std::chrono::steady_clock::now(); start_free <= 0; std::this_thread::sleep_for(100ms)) {
    REQUIRE(std::chrono::steady_clock::now() - t0 < 20s);
    start_free = k3::test::metric_or(k3::test::read_metrics(port), kPoolFree);
  }

  constexpr int kClients = 64;
  const auto load_for = 60s;
  // A stream that has not ended this long after it was sent counts as hung (the router's own deadlines
  // are shorter for every phase but the queue; the load ends after 60 s, so the queue drains too).
  const auto stream_deadline = 150s;
  std::mutex mu;
  std::map<std::string, int> kinds;
  std::map<int, int> refused;  // status -> count
  int alloc_failed = 0;
  std::vector<std::string> errors;
  const auto t_start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] {
      std::mt19937 rng(1000 + c);
      for (int n = 0; std::chrono::steady_clock::now() - t_start < load_for; ++n) {
        // Mixed: 1 in 10 long (300-900 tokens), the rest short (4-60); 4-24 tokens generated.
        const bool long_one = rng() % 10 == 0;
        const int len = long_one ? 300 + static_cast<int>(rng() % 600) : 4 + static_cast<int>(rng() % 56);
        std::vector<int32_t> prompt(len);
        for (auto& t : prompt) t = 10 + static_cast<int32_t>(rng() % 490);
        const int max_tokens = 4 + static_cast<int>(rng() % 20);
        const StreamOutcome r = k3::test::stream_completion(port, prompt, max_tokens, stream_deadline);
        std::lock_guard lk(mu);
        ++kinds[k3::test::outcome_name(r.kind)];
        if (r.kind == StreamOutcome::Kind::Refused) ++refused[r.status];
        if (r.error.find("alloc_failed") != std::string::npos) ++alloc_failed;
        if (r.kind != StreamOutcome::Kind::Done && errors.size() < 5)
          errors.push_back(std::string(k3::test::outcome_name(r.kind)) + " " + std::to_string(r.status) + " " + r.error);
        if (r.kind == StreamOutcome::Kind::Done && static_cast<int>(r.tokens) != max_tokens && errors.size() < 5)
          errors.push_back("done with " + std::to_string(r.tokens) + " of " + std::to_string(max_tokens) + " tokens");
      }
    });
  // The launcher relays node lines: keep its pipe drained while the load runs.
  std::atomic<bool> joined{false};
  std::thread joiner([&] {
    for (auto& t : clients) t.join();
    joined = true;
  });
  while (!joined) cluster.proc->read_line(100ms);
  joiner.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  auto m = k3::test::read_metrics(port);
  const int total = kinds["done"] + kinds["error_event"] + kinds["refused"] + kinds["hung"];
  std::printf("OVERLOAD clients=%d wall_s=%.1f requests=%d done=%d error_event=%d refused=%d (429: %d) hung=%d "
              "alloc_failed=%d queue_wait_p50<=%.2fs p90<=%.2fs p99<=%.2fs requeued=%.0f deadline_expired=%.0f\n",
              kClients, wall, total, kinds["done"], kinds["error_event"], kinds["refused"], refused[429], kinds["hung"],
              alloc_failed, histogram_quantile(m, "k3_cluster_queue_wait_seconds", 0.5),
              histogram_quantile(m, "k3_cluster_queue_wait_seconds", 0.9),
              histogram_quantile(m, "k3_cluster_queue_wait_seconds", 0.99), k3::test::metric_or(m, "k3_cluster_requeued_total"),
              k3::test::metric_sum(m, "k3_cluster_deadline_expired_total"));
  for (const auto& e : errors) std::printf("  %s\n", e.c_str());
  std::fflush(stdout);
  INFO("first errors: " << (errors.empty() ? "" : errors.front()));
  CHECK(total >= kClients);
  CHECK(kinds["hung"] == 0);
  CHECK(alloc_failed == 0);
  CHECK(k3::test::metric_or(m, "k3_cluster_request_failures_total{cause=\"alloc_failed\"}") == 0);
  CHECK(kinds["error_event"] == 0);
  CHECK(kinds["done"] + refused[429] == total);
  // Far above capacity: requests did wait in the queue.
  CHECK(histogram_quantile(m, "k3_cluster_queue_wait_seconds", 0.9) > 0.01);
  for (auto t0 = std::chrono::steady_clock::now();
       k3::test::metric_or(k3::test::read_metrics(port), kPoolFree) != start_free; std::this_thread::sleep_for(100ms)) {
    cluster.proc->read_line(0ms);
    REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
  }
  m = k3::test::read_metrics(port);
  CHECK(k3::test::metric_or(m, "k3_cluster_queue_length") == 0);
  CHECK(k3::test::metric_or(m, "k3_cluster_requests_in_flight") == 0);
  ::kill(cluster.proc->pid(), SIGTERM);
  CHECK(cluster.proc->wait_exit(20s) == 0);
}
