// k3-router as a real process on 127.0.0.1, driven over real sockets: every endpoint, keep-alive,
// the bad-request table over the wire plus transport-level abuse (10 MB bodies, broken HTTP), health
// and memory afterwards, client disconnect freeing the engine sequence, graceful SIGTERM.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <regex>

#include "bad_requests.h"
#include "http_client.h"
#include "router_fixture.h"
#include "router_process.h"
#include "tiny_router.h"

using namespace k3;
using namespace k3::test;
using json = nlohmann::json;

namespace {

using Cluster = TinyRouter;

}  // namespace

TEST_CASE("every endpoint over a real socket, with keep-alive") {
  Cluster cl;
  HttpConnection c(cl.router->port());
  c.send_request("GET", "/health");
  HttpReply h = c.read_reply();
  CHECK(h.status == 200);
  CHECK(json::parse(h.body)["status"] == "ok");
  // Same connection: models, metrics, a completion and a streamed chat.
  c.send_request("GET", "/v1/models");
  HttpReply m = c.read_reply();
  CHECK(m.status == 200);
  CHECK(json::parse(m.body)["data"][0]["id"] == "k3-tiny");
  c.send_request("POST", "/v1/completions", R"({"model":"k3-tiny","prompt":"hello","max_tokens":3,"ignore_eos":true})");
  HttpReply comp = c.read_reply();
  REQUIRE(comp.status == 200);
  CHECK(json::parse(comp.body)["usage"]["completion_tokens"] == 3);
  c.send_request("POST", "/v1/chat/completions",
                 R"({"model":"k3-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"ignore_eos":true,"stream":true})");
  HttpReply sse = c.read_reply();
  CHECK(sse.status == 200);
  CHECK(sse.headers["content-type"] == "text/event-stream");
  CHECK(sse.headers["transfer-encoding"] == "chunked");
  CHECK(sse.body.rfind("data: ", 0) == 0);
  CHECK(sse.body.substr(sse.body.size() - 14) == "data: [DONE]\n\n");
  c.send_request("GET", "/metrics");
  HttpReply met = c.read_reply();
  CHECK(met.status == 200);
  CHECK(met.body.find("k3_router_requests_total{endpoint=\"chat\",code=\"200\"} 1") != std::string::npos);
  CHECK(met.body.find("k3_router_time_to_first_token_seconds_count 2") != std::string::npos);
  // HEAD has the GET headers and no body.
  c.send_request("HEAD", "/health");
  HttpReply head = c.read_reply(std::chrono::milliseconds(10000), /*head=*/true);
  CHECK(head.status == 200);
  CHECK(std::stoul(head.headers["content-length"]) == h.body.size());
  // Connection: close is honoured.
  c.send_request("GET", "/health", "", "Connection: close\r\n");
  CHECK(c.read_reply().status == 200);
  CHECK(c.closed_by_peer(std::chrono::milliseconds(3000)));
}

TEST_CASE("bad requests over the wire: right 4xx, OpenAI error, health stays OK, no memory growth") {
  Cluster cl;
  const auto cases = bad_cases();
  REQUIRE(cases.size() >= 30);
  auto round = [&] {
    HttpConnection c(cl.router->port());  // all on one keep-alive connection: errors do not close it
    for (const BadCase& bc : cases) {
      std::string headers = "Content-Type: " + bc.content_type + "\r\nContent-Length: " + std::to_string(bc.body.size()) + "\r\n";
      c.send_raw(bc.method + " " + bc.path + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n" + bc.body);
      HttpReply r = c.read_reply();
      check_openai_error(r, bc.status, bc.what);
    }
  };
  round();
  const long rss_before = cl.router->rss_kb();
  for (int i = 0; i < 10; ++i) round();
  const long rss_after = cl.router->rss_kb();
  INFO("RSS " << rss_before << " kB -> " << rss_after << " kB");
  CHECK(rss_after - rss_before < 8 * 1024);
  CHECK(cl.request("GET", "/health").status == 200);

}

TEST_CASE("transport abuse: 10 MB bodies, broken HTTP, huge headers") {
  Cluster cl;
  const long rss_before = cl.router->rss_kb();
  {  // Declared 10 MB: refused from the header, before the body is read.
    HttpConnection c(cl.router->port());
    const std::string big(10 << 20, 'x');
    c.send_raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
               std::to_string(big.size()) + "\r\n\r\n");
    c.send_raw(big);  // may stop early: the server is allowed to stop reading
    check_openai_error(c.read_reply(), 413, "10 MB content-length");
  }
  {  // Chunked 10 MB: refused when the limit is crossed.
    HttpConnection c(cl.router->port());
    c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    const std::string piece(1 << 20, 'y');
    char size_line[32];
    std::snprintf(size_line, sizeof size_line, "%zx\r\n", piece.size());
    for (int i = 0; i < 10; ++i)
      if (!c.send_raw(size_line + piece + "\r\n")) break;
    c.send_raw("0\r\n\r\n");
    check_openai_error(c.read_reply(), 413, "10 MB chunked");
  }
  {  // Not HTTP at all.
    HttpConnection c(cl.router->port());
    c.send_raw("HELLO THERE\r\n\r\n");
    check_openai_error(c.read_reply(), 400, "garbage request line");
  }
  {  // A 100 kB header.
    HttpConnection c(cl.router->port());
    c.send_raw("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(100 << 10, 'h') + "\r\n\r\n");
    check_openai_error(c.read_reply(), 431, "huge header");
  }
  {  // A client that connects and leaves without a byte.
    HttpConnection c(cl.router->port());
  }
  CHECK(cl.request("GET", "/health").status == 200);
  const long rss_after = cl.router->rss_kb();
  INFO("RSS " << rss_before << " kB -> " << rss_after << " kB");
  CHECK(rss_after - rss_before < 16 * 1024);  // the 10 MB bodies were never buffered
}

TEST_CASE("api key over the wire") {
  Cluster cl({"--api-key", "k3-secret"});
  check_openai_error(cl.request("GET", "/v1/models"), 401, "no key");
  check_openai_error(cl.request("GET", "/v1/models", "", "Authorization: Bearer wrong\r\n"), 401, "wrong key");
  CHECK(cl.request("GET", "/v1/models", "", "Authorization: Bearer k3-secret\r\n").status == 200);
  CHECK(cl.request("GET", "/health").status == 200);
}

TEST_CASE("queue full over the wire: 429 while the only slot is busy") {
  Cluster cl({"--max-queue", "0", "--max-running", "1"}, 4096);
  HttpConnection busy(cl.router->port());
  busy.send_request("POST", "/v1/completions", R"({"model":"k3-tiny","prompt":"x","max_tokens":4000,"ignore_eos":true,"stream":true})");
  bool running = false;
  for (int i = 0; i < 500 && !running; ++i) {
    running = cl.gauge("k3_router_running_requests") == 1;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(running);
  HttpReply r = cl.request("POST", "/v1/chat/completions", chat(R"("max_tokens":2)"));
  check_openai_error(r, 429, "queue full");
  CHECK(json::parse(r.body)["error"]["code"] == "queue_full");
  CHECK(cl.request("GET", "/health").status == 200);
}

TEST_CASE("client disconnect mid-stream frees the engine sequence") {
  Cluster cl({}, 4096);  // room for a generation of seconds, surely running when the client leaves
  REQUIRE(cl.gauge("k3_engine_free_slots") == 2);
  {
    HttpConnection c(cl.router->port());
    c.send_request("POST", "/v1/chat/completions",
                   R"({"model":"k3-tiny","messages":[{"role":"user","content":"go"}],"max_tokens":4000,"ignore_eos":true,"stream":true})");
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    // The role chunk comes before admission; two more events mean tokens are flowing.
    auto events = [&] {
      size_t n = 0;
      for (size_t at = 0; (at = got.find("data: {", at)) != std::string::npos; ++at) ++n;
      return n;
    };
    while (events() < 3 && std::chrono::steady_clock::now() < deadline) got += c.read_some(std::chrono::milliseconds(500));
    REQUIRE(events() >= 3);
    CHECK(cl.gauge("k3_router_running_requests") == 1);
    CHECK(cl.gauge("k3_engine_free_slots") == 1);
  }  // the client closes here, mid-stream
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    freed = cl.gauge("k3_router_running_requests") == 0 && cl.gauge("k3_engine_free_slots") == 2;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(freed);
  CHECK(cl.request("GET", "/metrics").body.find("k3_router_request_finish_total{outcome=\"cancelled\"} 1") != std::string::npos);
}

TEST_CASE("client disconnect during a non-streamed request frees the engine sequence") {
  Cluster cl({}, 4096);
  const auto t0 = std::chrono::steady_clock::now();
  {
    HttpConnection c(cl.router->port());
    c.send_request("POST", "/v1/completions", R"({"model":"k3-tiny","prompt":"x","max_tokens":4000,"ignore_eos":true})");
    bool running = false;
    for (int i = 0; i < 200 && !running; ++i) {
      running = cl.gauge("k3_router_running_requests") == 1;
      if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(running);
  }  // the client gives up
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    freed = cl.gauge("k3_router_running_requests") == 0 && cl.gauge("k3_engine_free_slots") == 2;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(freed);
  // Freed because of the disconnect, not because 4000 tokens were done.
  CHECK(cl.request("GET", "/metrics").body.find("k3_router_request_finish_total{outcome=\"cancelled\"} 1") != std::string::npos);
  INFO("seconds: " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

TEST_CASE("SIGTERM: an in-flight stream gets an error event and [DONE], the process exits cleanly") {
  Cluster cl({}, 4096);
  HttpConnection c(cl.router->port());
  c.send_request("POST", "/v1/completions", R"({"model":"k3-tiny","prompt":"x","max_tokens":4000,"ignore_eos":true,"stream":true})");
  std::string got;
  const auto first_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got.find("data: {") == std::string::npos && std::chrono::steady_clock::now() < first_deadline)
    got += c.read_some(std::chrono::milliseconds(500));
  REQUIRE(got.find("data: {") != std::string::npos);
  ::kill(cl.router->pid(), SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.find("data: [DONE]") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::string more = c.read_some(std::chrono::milliseconds(500));
    got += more;
  }
  CHECK(got.find("data: {\"error\":") != std::string::npos);
  CHECK(got.find("data: [DONE]") != std::string::npos);
  const int status = cl.router->stop(std::chrono::seconds(15));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
