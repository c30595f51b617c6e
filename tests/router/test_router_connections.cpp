// k3-router's connection handling as a real process over real sockets: thousands of idle keep-alive
// connections and slow-header clients cost no thread and do not slow /health or a completion; header,
// body and idle deadlines close slow clients; the per-client and global limits close the oldest idle
// connection first and refuse (429 / 503) only when every connection is busy; /metrics behind the key.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <thread>

#include "router/open_file_limit.h"
#include "tiny_router.h"

using namespace k3;
using namespace k3::test;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kCompletion = R"({"model":"k3-tiny","prompt":"hello","max_tokens":4,"ignore_eos":true})";
const std::string kLongStream = R"({"model":"k3-tiny","prompt":"x","max_tokens":4000,"ignore_eos":true,"stream":true})";

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A connection that made one request and now sits idle in keep-alive.
std::unique_ptr<HttpConnection> idle_connection(int port) {
  auto c = std::make_unique<HttpConnection>(port);
  c->send_request("GET", "/health");
  REQUIRE(c->read_reply().status == 200);
  return c;
}

// Reads from `c` until `what` arrived (60 s at most).
void wait_for(HttpConnection& c, const std::string& what) {
  std::string got;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (got.find(what) == std::string::npos && Clock::now() < deadline) {
    const std::string more = c.read_some(std::chrono::milliseconds(500));
    if (more.empty() && c.closed_by_peer(std::chrono::milliseconds(0))) FAIL("the router closed the connection; got: " << got);
    got += more;
  }
  REQUIRE(got.find(what) != std::string::npos);
}

// Starts a long stream on `c` and waits for its first event, so the router holds it as busy.
void start_stream(HttpConnection& c) {
  c.send_request("POST", "/v1/completions", kLongStream);
  wait_for(c, "data: ");
}

// /metrics once the router lets a new connection in again (after clients left busy connections, the
// router notices at its next write to them).
std::string metrics_when_admitted(TinyRouter& r) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    try {
      HttpConnection c(r.router->port());
      c.send_request("GET", "/metrics");
      HttpReply rep = c.read_reply(std::chrono::milliseconds(10000));
      if (rep.status == 200) return rep.body;
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL("the router never admitted a /metrics connection again");
  return "";
}

}  // namespace

TEST_CASE("2,000 idle keep-alive connections and slow-header clients: /health and a completion answer within 1 s") {
  constexpr int kIdle = 2000, kSlow = 50;
  const uint64_t need = kIdle + kSlow + 256;
  const router::OpenFileLimit lim = router::raise_open_file_limit(need);
  if (lim.soft < need)
    FAIL("this test holds " << need << " sockets but RLIMIT_NOFILE is " << lim.soft << " (hard " << lim.hard << ") "
                            << lim.error << ": raise it (ulimit -n)");
  // Deadlines far beyond the test, so every connection is still open when latencies are measured.
  TinyRouter r({"--max-connections-per-client", "0", "--header-timeout-ms", "600000", "--idle-timeout-ms", "600000"});
  REQUIRE(r.request("POST", "/v1/completions", kCompletion).status == 200);  // warm: pages touched, a handler thread up
  const long threads_before = r.router->threads(), rss_before = r.router->rss_kb();

  std::vector<std::unique_ptr<HttpConnection>> held;
  const auto t_open = Clock::now();
  for (int i = 0; i < kIdle; ++i) held.push_back(idle_connection(r.router->port()));
  for (int i = 0; i < kSlow; ++i) {  // a partial request line, then nothing
    held.push_back(std::make_unique<HttpConnection>(r.router->port()));
    REQUIRE(held.back()->send_raw(i % 2 ? "GET /health HT" : "POST /v1/compl"));
  }
  const double open_s = seconds_since(t_open);
  REQUIRE(r.gauge("k3_router_open_connections") == kIdle + kSlow + 1);  // + the /metrics connection itself

  auto timed = [&](const std::string& method, const std::string& path, const std::string& body) {
    const auto t0 = Clock::now();
    HttpReply rep = r.request(method, path, body);
    const double s = seconds_since(t0);
    REQUIRE(rep.status == 200);
    return s;
  };
  double health_max = 0, completion_max = 0, health_sum = 0, completion_sum = 0;
  constexpr int kSamples = 10;
  for (int i = 0; i < kSamples; ++i) {
    const double h = timed("GET", "/health", ""), c = timed("POST", "/v1/completions", kCompletion);
    health_max = std::max(health_max, h);
    completion_max = std::max(completion_max, c);
    health_sum += h;
    completion_sum += c;
  }
  const long threads_idle = r.router->threads(), rss_idle = r.router->rss_kb();
  WARN("held " << kIdle << " idle keep-alive + " << kSlow << " slow-header connections (opened in " << open_s << " s); "
               << "/health mean " << health_sum / kSamples * 1e3 << " ms max " << health_max * 1e3 << " ms; "
               << "completion (4 tokens) mean " << completion_sum / kSamples * 1e3 << " ms max " << completion_max * 1e3
               << " ms; router threads " << threads_before << " -> " << threads_idle << ", RSS " << rss_before << " kB -> "
               << rss_idle << " kB");
  CHECK(health_max < 1.0);
  CHECK(completion_max < 1.0);
  CHECK(threads_idle < threads_before + 8);  // no thread per connection
  CHECK(rss_idle - rss_before < 64 * 1024);  // a few kB per connection, not a stack each
  // The idle connections are still served.
  for (int i = 0; i < kIdle; i += 250) {
    held[static_cast<size_t>(i)]->send_request("GET", "/health");
    CHECK(held[static_cast<size_t>(i)]->read_reply().status == 200);
  }
}

TEST_CASE("header, body and idle deadlines close slow clients, and the closes are counted") {
  TinyRouter r({"--header-timeout-ms", "1000", "--body-timeout-ms", "1000", "--idle-timeout-ms", "1500"});
  struct Held {
    std::unique_ptr<HttpConnection> c;
    Clock::time_point since;  // the deadline runs from here
    double deadline_s;
  };
  std::vector<Held> held;
  const int port = r.router->port();
  for (const char* partial : {"G", "GET /health HTTP/1.1\r\n", "GET /health HTTP/1.1\r\nHost: x\r\n", "POST /v1/co", "GET"}) {
    auto c = std::make_unique<HttpConnection>(port);
    const auto t = Clock::now();
    REQUIRE(c->send_raw(partial));
    held.push_back({std::move(c), t, 1.0});  // header_timeout from accept
  }
  for (int i = 0; i < 3; ++i) held.push_back({std::make_unique<HttpConnection>(port), Clock::now(), 1.0});  // silent
  for (int i = 0; i < 2; ++i) {
    auto c = idle_connection(port);
    held.push_back({std::move(c), Clock::now(), 1.5});  // idle_timeout after the response
  }
  for (int i = 0; i < 2; ++i) {
    auto c = std::make_unique<HttpConnection>(port);
    REQUIRE(c->send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        "Content-Length: 100\r\n\r\n{\"model\":"));
    held.push_back({std::move(c), Clock::now(), 1.0});  // body_timeout after the header
  }
  for (auto& h : held) {
    CHECK(h.c->closed_by_peer(std::chrono::milliseconds(30000)));
    const double s = seconds_since(h.since);
    INFO("closed after " << s << " s, deadline " << h.deadline_s << " s");
    CHECK(s >= h.deadline_s * 0.9);
    CHECK(s < h.deadline_s + 30);
  }
  const std::string m = r.request("GET", "/metrics").body;
  CHECK(TinyRouter::metric(m, "k3_router_connections_closed_total{reason=\"header_timeout\"}") == 8);
  CHECK(TinyRouter::metric(m, "k3_router_connections_closed_total{reason=\"body_timeout\"}") == 2);
  CHECK(TinyRouter::metric(m, "k3_router_connections_closed_total{reason=\"idle_timeout\"}") == 2);
  CHECK(r.await_gauge("k3_router_open_connections", 1) == 1);  // the /metrics connection alone
  CHECK(r.request("POST", "/v1/completions", kCompletion).status == 200);
}

TEST_CASE("per-client limit: that client's oldest idle connection makes room; 429 when all are busy") {
  TinyRouter r({"--max-connections-per-client", "2"}, 4096);
  const int port = r.router->port();
  auto a = std::make_unique<HttpConnection>(port);  // a slow body still counts as idle: nothing to answer yet
  REQUIRE(a->send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: 100\r\n\r\n{\"model\":"));
  auto b = idle_connection(port);
  auto c = idle_connection(port);  // admitting c closed a, the oldest idle one
  CHECK(a->closed_by_peer(std::chrono::milliseconds(10000)));
  start_stream(*b);
  start_stream(*c);
  {  // b and c busy: nothing of this client can make room
    HttpConnection d(port);
    d.send_request("GET", "/health");
    HttpReply rep = d.read_reply();
    check_openai_error(rep, 429, "third connection while two stream");
    CHECK(d.closed_by_peer(std::chrono::milliseconds(10000)));
  }
  b->close();
  c->close();
  const std::string m = metrics_when_admitted(r);
  CHECK(TinyRouter::metric(m, "k3_router_connections_closed_total{reason=\"per_client_limit\"}") == 1);
  CHECK(TinyRouter::metric(m, "k3_router_connections_refused_total{reason=\"per_client_limit\"}") >= 1);
}

TEST_CASE("global limit: the oldest idle connection of all makes room; 503 when all are busy") {
  TinyRouter r({"--max-connections", "3", "--max-connections-per-client", "0"}, 4096);
  const int port = r.router->port();
  auto a = idle_connection(port);
  auto b = idle_connection(port);
  auto c = idle_connection(port);
  auto d = idle_connection(port);  // admitting d closed a
  CHECK(a->closed_by_peer(std::chrono::milliseconds(10000)));
  start_stream(*b);
  start_stream(*c);
  d->send_request("POST", "/v1/completions", kLongStream);  // queued behind --max-running 2: busy too
  wait_for(*d, "HTTP/1.1 200");                              // the stream's headers come at once
  {
    HttpConnection e(port);
    e.send_request("GET", "/health");
    check_openai_error(e.read_reply(), 503, "fourth connection while three are busy");
  }
  b->close();
  c->close();
  d->close();
  const std::string m = metrics_when_admitted(r);
  CHECK(TinyRouter::metric(m, "k3_router_connections_closed_total{reason=\"global_limit\"}") == 1);
  CHECK(TinyRouter::metric(m, "k3_router_connections_refused_total{reason=\"global_limit\"}") >= 1);
}

TEST_CASE("--metrics-require-key: /metrics wants the Bearer key (here from K3_API_KEY); /health stays open") {
  ::setenv("K3_API_KEY", "env-secret", 1);
  TinyRouter r({"--metrics-require-key"});
  ::unsetenv("K3_API_KEY");
  check_openai_error(r.request("GET", "/metrics"), 401, "metrics without a key");
  check_openai_error(r.request("GET", "/metrics", "", "Authorization: Bearer wrong\r\n"), 401, "metrics, wrong key");
  HttpReply ok = r.request("GET", "/metrics", "", "Authorization: Bearer env-secret\r\n");
  CHECK(ok.status == 200);
  CHECK(TinyRouter::metric(ok.body, "k3_router_open_connections") >= 1);
  CHECK(r.request("GET", "/health").status == 200);
  check_openai_error(r.request("GET", "/v1/models"), 401, "models without a key");
  CHECK(r.request("GET", "/v1/models", "", "Authorization: Bearer env-secret\r\n").status == 200);
}

TEST_CASE("--metrics-require-key without any API key: the router refuses to start") {
  ::unsetenv("K3_API_KEY");
  CHECK_THROWS_WITH(TinyRouter({"--metrics-require-key"}), Catch::Contains("exited early"));
}
