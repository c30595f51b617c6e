// RouterMetrics: cumulative histogram buckets, counters by label, and the Prometheus text shape.
#include <catch2/catch.hpp>

#include <map>
#include <regex>
#include <sstream>

#include "router/router_metrics.h"

using namespace k3::router;

TEST_CASE("histogram buckets are cumulative and +Inf equals the count") {
  Histogram h({0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 2.0, 20.0, 30.0}) h.observe(v);
  std::string out;
  h.render(out, "x");
  CHECK(out.find("x_bucket{le=\"0.1\"} 2\n") != std::string::npos);
  CHECK(out.find("x_bucket{le=\"1\"} 3\n") != std::string::npos);
  CHECK(out.find("x_bucket{le=\"10\"} 4\n") != std::string::npos);
  CHECK(out.find("x_bucket{le=\"+Inf\"} 6\n") != std::string::npos);
  CHECK(out.find("x_count 6\n") != std::string::npos);
  CHECK(out.find("x_sum 52.65\n") != std::string::npos);
  CHECK(h.count() == 6);
}

TEST_CASE("prometheus text: every sample line is well formed, families are declared once") {
  RouterMetrics m;
  m.count_request("chat", 200);
  m.count_request("chat", 200);
  m.count_request("chat", 400);
  m.count_finish("length");
  m.add_tokens(10, 5);
  m.ttft().observe(0.02);
  const std::string text = m.prometheus_text({.waiting = 3, .running = 2, .free_slots = 6, .free_pages = 100,
                                              .cache_free_bytes = 400, .cache_largest_free_extent_bytes = 300,
                                              .cache_free_extents = 2, .cache_slot_moves = 7},
                                             true);
  CHECK(m.request_count("chat", 200) == 2);
  CHECK(text.find("k3_router_requests_total{endpoint=\"chat\",code=\"200\"} 2\n") != std::string::npos);
  CHECK(text.find("k3_router_requests_total{endpoint=\"chat\",code=\"400\"} 1\n") != std::string::npos);
  CHECK(text.find("k3_router_request_finish_total{outcome=\"length\"} 1\n") != std::string::npos);
  CHECK(text.find("k3_router_queue_depth 3\n") != std::string::npos);
  CHECK(text.find("k3_router_running_requests 2\n") != std::string::npos);
  CHECK(text.find("k3_engine_free_slots 6\n") != std::string::npos);
  CHECK(text.find("k3_router_generation_tokens_total 5\n") != std::string::npos);
  CHECK(text.find("k3_cache_pool_fragmentation 0.250000\n") != std::string::npos);   // 1 - 300 / 400
  CHECK(text.find("k3_cache_pool_free_bytes 400\n") != std::string::npos);
  CHECK(text.find("k3_cache_pool_free_extents 2\n") != std::string::npos);
  CHECK(text.find("k3_cache_pool_slot_moves_total 7\n") != std::string::npos);
  const std::regex sample(R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+-]+$)");
  const std::regex meta(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  std::istringstream in(text);
  std::string line;
  std::map<std::string, int> types;
  while (std::getline(in, line)) {
    INFO(line);
    CHECK((std::regex_match(line, sample) || std::regex_match(line, meta)));
    if (line.rfind("# TYPE ", 0) == 0) ++types[line.substr(7, line.find(' ', 7) - 7)];
  }
  for (auto& [name, n] : types) {
    INFO(name);
    CHECK(n == 1);
  }
}
