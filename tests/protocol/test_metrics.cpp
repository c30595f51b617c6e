// Metrics registry: counters/gauges by name+labels, thread safety, Prometheus text.
#include <catch2/catch.hpp>

#include <thread>

#include "common/protocol/metrics.h"

using namespace k3::protocol;

TEST_CASE("counters and gauges by name and labels", "[metrics]") {
  MetricsRegistry m;
  m.counter("x_total", {{"a", "1"}}).add(3);
  m.counter("x_total", {{"a", "1"}}).add();
  m.counter("x_total", {{"a", "2"}}).add(10);
  CHECK(m.counter_value("x_total", {{"a", "1"}}) == 4);
  CHECK(m.counter_value("x_total", {{"a", "2"}}) == 10);
  CHECK(m.counter_value("x_total") == 0);
  CHECK(m.counter_value("missing") == 0);
  Counter& c = m.counter("x_total", {{"a", "1"}});
  for (int i = 0; i < 50; ++i) m.counter("other_" + std::to_string(i)).add();  // references stay valid
  c.add(1);
  CHECK(m.counter_value("x_total", {{"a", "1"}}) == 5);
  m.gauge("g").set(-7);
  m.gauge("g").add(2);
  CHECK(m.gauge_value("g") == -5);
}

TEST_CASE("invalid names and type conflicts are programming errors", "[metrics]") {
  MetricsRegistry m;
  CHECK_THROWS_AS(m.counter("1abc"), k3::Error);
  CHECK_THROWS_AS(m.counter("a-b"), k3::Error);
  CHECK_THROWS_AS(m.counter("ok", {{"bad-label", "v"}}), k3::Error);
  m.counter("dup");
  CHECK_THROWS_AS(m.gauge("dup"), k3::Error);
}

TEST_CASE("Prometheus text exposition", "[metrics]") {
  MetricsRegistry m;
  m.counter("b_total", {{"cause", "x\"y\\z\n"}}, "Help with\nnewline").add(2);
  m.counter("b_total", {{"cause", "a"}}).add(1);
  m.gauge("a_gauge", {}, "A gauge").set(-3);
  m.counter("c_total").add(0);
  const std::string expected =
      "# HELP a_gauge A gauge\n"
      "# TYPE a_gauge gauge\n"
      "a_gauge -3\n"
      "# HELP b_total Help with\\nnewline\n"
      "# TYPE b_total counter\n"
      "b_total{cause=\"a\"} 1\n"
      "b_total{cause=\"x\\\"y\\\\z\\n\"} 2\n"
      "# TYPE c_total counter\n"
      "c_total 0\n";
  CHECK(m.prometheus_text() == expected);
}

TEST_CASE("concurrent adds are all counted", "[metrics]") {
  MetricsRegistry m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&m, t] {
      for (int i = 0; i < 5000; ++i) {
        metric::count_bytes(&m, 3);
        metric::count_transition(&m, RequestState::Claimed, RequestState(2 + (i + t) % 2));
        m.counter("per_thread_total", {{"t", std::to_string(t % 2)}}).add();
      }
    });
  for (auto& th : threads) th.join();
  CHECK(m.counter_value(metric::kBytes) == 8 * 5000 * 3);
  CHECK(m.counter_value(metric::kTransitions, {{"from", "CLAIMED"}, {"to", "PREFILLING"}}) +
            m.counter_value(metric::kTransitions, {{"from", "CLAIMED"}, {"to", "COMPUTE_DONE"}}) ==
        8 * 5000);
  CHECK(m.counter_value("per_thread_total", {{"t", "0"}}) == 4 * 5000);
}

TEST_CASE("transfer metric helpers", "[metrics]") {
  MetricsRegistry m;
  metric::count_failure(&m, AbortReason::PeerDead);
  metric::count_failure(&m, AbortReason::PeerDead);
  metric::count_failure(&m, AbortReason::Deadline);
  metric::count_transfer(&m);
  metric::count_rejected_frame(&m);
  metric::count_bytes(nullptr, 5);  // a null registry is allowed and does nothing
  CHECK(m.counter_value(metric::kFailures, {{"cause", "peer_dead"}}) == 2);
  CHECK(m.counter_value(metric::kFailures, {{"cause", "deadline"}}) == 1);
  CHECK(m.counter_value(metric::kTransfers) == 1);
  CHECK(m.counter_value(metric::kRejectedFrames) == 1);
  const std::string text = m.prometheus_text();
  CHECK(text.find("k3_request_failures_total{cause=\"peer_dead\"} 2\n") != std::string::npos);
  CHECK(text.find("# TYPE k3_transfers_total counter\n") != std::string::npos);
}
