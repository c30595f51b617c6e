// A node's Prometheus endpoint over real sockets: curl (a real HTTP client) and raw requests read the
// registry's text, /health answers, other paths and methods get 404 / 405; a client that sends nothing
// holds the endpoint for at most its request timeout; bad --metrics-listen values are clear errors.
#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>
#include <thread>

#include "common/protocol/metrics_endpoint.h"
#include "tests/router/http_client.h"
#include "tests/support/run_command.h"

using namespace k3::protocol;
using namespace std::chrono_literals;

namespace {
// stdout of `cmd`, and its exit status.
std::pair<std::string, int> run(const std::string& cmd) {
  const auto r = k3::test::run_command(cmd);
  return {r.out, r.exit_code};
}
}  // namespace

TEST_CASE("metrics endpoint: curl and raw clients read the registry; health, 404 and 405", "[protocol][metrics]") {
  MetricsRegistry m;
  m.counter("k3_test_things_total", {{"kind", "a"}}, "things").add(3);
  auto ep = MetricsEndpoint::start({.host = "127.0.0.1", .port = 0}, m).value();
  REQUIRE(ep->port() != 0);
  CHECK(ep->url() == "http://127.0.0.1:" + std::to_string(ep->port()) + "/metrics");

  auto [body, rc] = run("curl -sf --max-time 10 " + ep->url());
  CHECK(rc == 0);
  CHECK_THAT(body, Catch::Contains("k3_test_things_total{kind=\"a\"} 3"));
  m.counter("k3_test_things_total", {{"kind", "a"}}).add(1);   // each scrape reads the registry now
  CHECK_THAT(run("curl -sf --max-time 10 " + ep->url()).first, Catch::Contains("k3_test_things_total{kind=\"a\"} 4"));

  {
    k3::test::HttpConnection c(ep->port());
    c.send_request("GET", "/metrics?x=1");
    const auto r = c.read_reply(10s);
    CHECK(r.status == 200);
    CHECK_THAT(r.headers.at("content-type"), Catch::StartsWith("text/plain; version=0.0.4"));
    CHECK_THAT(r.body, Catch::Contains("# TYPE k3_test_things_total counter"));
  }
  {
    k3::test::HttpConnection c(ep->port());
    c.send_request("GET", "/health");
    CHECK(c.read_reply(10s).body == "ok\n");
  }
  {
    k3::test::HttpConnection c(ep->port());
    c.send_request("GET", "/v1/models");
    CHECK(c.read_reply(10s).status == 404);
  }
  {
    k3::test::HttpConnection c(ep->port());
    c.send_request("POST", "/metrics", "{}");
    CHECK(c.read_reply(10s).status == 405);
  }
}

TEST_CASE("metrics endpoint: a client that sends nothing is dropped after the request timeout", "[protocol][metrics]") {
  MetricsRegistry m;
  auto ep = MetricsEndpoint::start({.host = "127.0.0.1", .port = 0}, m).value();
  k3::test::HttpConnection silent(ep->port());
  std::this_thread::sleep_for(100ms);   // the endpoint is now waiting on the silent one
  const auto t0 = std::chrono::steady_clock::now();
  auto [body, rc] = run("curl -sf --max-time 20 http://127.0.0.1:" + std::to_string(ep->port()) + "/health");
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(rc == 0);
  CHECK(body == "ok\n");
  CHECK(waited < 8s);   // the 5 s request timeout, not forever
}

TEST_CASE("metrics endpoint: listen addresses are checked, and a taken port is an error naming it", "[protocol][metrics]") {
  CHECK(parse_listen_address("0.0.0.0:9400", "--metrics-listen").value().port == 9400);
  CHECK(parse_listen_address("127.0.0.1:0", "--metrics-listen").value().host == "127.0.0.1");
  for (const std::string bad : {"9400", ":9400", "0.0.0.0:", "localhost:9400", "0.0.0.0:70000", "0.0.0.0:94a0"}) {
    INFO(bad);
    auto r = parse_listen_address(bad, "--metrics-listen");
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains("--metrics-listen") && Catch::Contains(bad));
  }
  MetricsRegistry m;
  auto first = MetricsEndpoint::start({.host = "127.0.0.1", .port = 0}, m).value();
  auto second = MetricsEndpoint::start({.host = "127.0.0.1", .port = first->port()}, m);
  REQUIRE_FALSE(second.is_ok());
  CHECK_THAT(second.status().message(), Catch::Contains(std::to_string(first->port())));
}
