// Protocol details clients trip over: media types compared case-insensitively, numbers a double cannot
// hold named by field, max_completion_tokens winning over the deprecated max_tokens, and an HTTP/1.0
// client (no chunked coding) getting its event stream delimited by the connection's close.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "http_client.h"
#include "router/json_body.h"
#include "router_fixture.h"
#include "tiny_router.h"

using namespace k3;
using namespace k3::test;
using json = nlohmann::json;

TEST_CASE("JSON media types: case-insensitive, parameters ignored, +json suffixes") {
  using router::is_json_media_type;
  CHECK(is_json_media_type("application/json"));
  CHECK(is_json_media_type("Application/JSON"));
  CHECK(is_json_media_type("APPLICATION/JSON ; Charset=UTF-8"));
  CHECK(is_json_media_type("application/vnd.api+json"));
  CHECK(is_json_media_type("text/json"));
  CHECK_FALSE(is_json_media_type("text/plain"));
  CHECK_FALSE(is_json_media_type("application/jsonx"));
  CHECK_FALSE(is_json_media_type("json"));
  CHECK_FALSE(is_json_media_type("application/x-www-form-urlencoded; note=json"));
}

TEST_CASE("a failed parse is located by path; only overflow is out of range") {
  auto f = router::locate_json_failure(R"({"a":{"b":[1,{"c":2},1e400]}})");
  CHECK(f.out_of_range);
  CHECK(f.path == "a.b[2]");
  f = router::locate_json_failure(R"([1e999])");
  CHECK(f.out_of_range);
  CHECK(f.path == "[0]");
  f = router::locate_json_failure(R"({"a":[1,2,}")");
  CHECK_FALSE(f.out_of_range);
  CHECK_FALSE(f.reason.empty());
  // A huge but finite number parses: range checks on the field decide.
  CHECK(router::locate_json_failure("{\"t\":1e300}").reason.empty());
}

TEST_CASE("handlers: mixed-case JSON media type accepted; max_completion_tokens wins") {
  TinyServer s;
  const std::string body = R"({"model":"k3-tiny","prompt":"hi","ignore_eos":true,"max_tokens":2})";
  for (const char* ct : {"Application/JSON", "application/json; charset=UTF-8", "application/vnd.k3+json"}) {
    auto r = s.api->handle({.method = "POST", .target = "/v1/completions", .headers = {{"content-type", ct}}, .body = body});
    INFO(ct << " -> " << r.body);
    CHECK(r.status == 200);
  }
  auto usage = [&](const std::string& fields) {
    auto r = s.post("/v1/chat/completions",
                    R"({"model":"k3-tiny","messages":[{"role":"user","content":"hi"}],"ignore_eos":true,)" + fields + "}");
    INFO(r.body);
    REQUIRE(r.status == 200);
    return json::parse(r.body)["usage"]["completion_tokens"].get<int>();
  };
  CHECK(usage(R"("max_tokens":9,"max_completion_tokens":3)") == 3);
  CHECK(usage(R"("max_completion_tokens":4,"max_tokens":2)") == 4);
  CHECK(usage(R"("max_tokens":2)") == 2);
  // A number at the edge of a double is an ordinary range error on its field.
  auto r = s.post("/v1/chat/completions", R"({"model":"k3-tiny","messages":[{"role":"user","content":"hi"}],"temperature":1e308})");
  CHECK(r.status == 400);
  CHECK(json::parse(r.body)["error"]["param"] == "temperature");
}

TEST_CASE("HTTP/1.0 over a real socket: the event stream is close-delimited, not chunked") {
  TinyRouter cl;
  const std::string body =
      R"({"model":"k3-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"ignore_eos":true,"stream":true})";
  HttpConnection c(cl.router->port());
  c.send_raw("POST /v1/chat/completions HTTP/1.0\r\nContent-Type: Application/JSON\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string all;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool eof = false;
  while (!eof && std::chrono::steady_clock::now() < deadline) {
    const std::string piece = c.read_some(std::chrono::milliseconds(2000));
    all += piece;
    if (piece.empty()) eof = c.closed_by_peer(std::chrono::milliseconds(100));  // the end of the body
  }
  INFO(all);
  REQUIRE(eof);
  const size_t head_end = all.find("\r\n\r\n");
  REQUIRE(head_end != std::string::npos);
  std::string head = all.substr(0, head_end);
  for (char& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  CHECK(head.rfind("http/1.0 200", 0) == 0);
  CHECK(head.find("transfer-encoding") == std::string::npos);
  CHECK(head.find("content-length") == std::string::npos);
  CHECK(head.find("text/event-stream") != std::string::npos);
  const std::string events = all.substr(head_end + 4);
  CHECK(events.rfind("data: {", 0) == 0);  // no chunk-size line in front
  REQUIRE(events.size() > 14);
  CHECK(events.substr(events.size() - 14) == "data: [DONE]\n\n");
  int content = 0;
  for (size_t at = events.find("\"content\":\""); at != std::string::npos; at = events.find("\"content\":\"", at + 1)) ++content;
  CHECK(content >= 1);
  // The router is fine afterwards and HTTP/1.0 without streaming still gets a Content-Length answer.
  HttpConnection d(cl.router->port());
  const std::string plain = R"({"model":"k3-tiny","prompt":"hi","max_tokens":2,"ignore_eos":true})";
  d.send_raw("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(plain.size()) +
             "\r\n\r\n" + plain);
  HttpReply r = d.read_reply();
  CHECK(r.status == 200);
  CHECK(r.headers.count("content-length") == 1);
  CHECK(json::parse(r.body)["usage"]["completion_tokens"] == 2);
}

TEST_CASE("handlers: X-Request-Id is honoured, made when absent, refused when unfit for a log line") {
  TinyServer s;
  const std::string body = R"({"model":"k3-tiny","prompt":"hi","max_tokens":1})";
  auto header = [](const router::HttpResponse& r) {
    for (const auto& [k, v] : r.headers)
      if (k == "X-Request-Id") return v;
    return std::string();
  };
  auto post = [&](std::map<std::string, std::string> headers) {
    headers["content-type"] = "application/json";
    return s.api->handle({.method = "POST", .target = "/v1/completions", .headers = headers, .body = body});
  };
  auto r = post({{"x-request-id", "abc-123_XYZ.4"}});
  CHECK(r.status == 200);
  CHECK(header(r) == "abc-123_XYZ.4");
  r = post({});
  CHECK(r.status == 200);
  const std::string made = header(r);
  CHECK(made.rfind("req-", 0) == 0);
  CHECK(made.size() == 36);
  CHECK(header(post({})) != made);
  for (const std::string& bad : {std::string(), std::string(129, 'x'), std::string("has space"), std::string("tab\there"),
                                std::string("nl\ninjected")}) {
    r = post({{"x-request-id", bad}});
    INFO(bad << " -> " << r.body);
    CHECK(r.status == 400);
    CHECK(json::parse(r.body)["error"]["param"] == "X-Request-Id");
    CHECK(header(r).rfind("req-", 0) == 0);  // an error still carries an id
  }
  CHECK(header(post({{"x-request-id", std::string(128, 'x')}})) == std::string(128, 'x'));
  // Every response carries one, errors and other endpoints included.
  CHECK(!header(s.get("/health")).empty());
  CHECK(!header(s.get("/nope")).empty());
}
