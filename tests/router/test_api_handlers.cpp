// The API handlers without sockets, over a real k3-tiny engine: a table of malformed and hostile
// requests (each gets the right status and an OpenAI-shaped error), the success shapes of every
// endpoint, and SSE framing.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <thread>

#include "bad_requests.h"
#include "router_fixture.h"

using namespace k3;
using namespace k3::router;
using json = nlohmann::json;

namespace {

void check_error_shape(const HttpResponse& r, int status, const std::string& param, const std::string& what) {
  INFO(what << " -> " << r.status << " " << r.body);
  CHECK(r.status == status);
  CHECK_FALSE(r.sse);
  json j = json::parse(r.body, nullptr, false);
  REQUIRE(j.is_object());
  REQUIRE(j.contains("error"));
  const json& e = j["error"];
  CHECK(e["message"].is_string());
  CHECK_FALSE(e["message"].get<std::string>().empty());
  CHECK(e["type"].is_string());
  CHECK(e.contains("param"));
  CHECK((e["param"].is_null() || e["param"].is_string()));
  CHECK(e.contains("code"));
  CHECK((e["code"].is_null() || e["code"].is_string()));
  if (!param.empty()) CHECK(e["param"] == param);
}

}  // namespace

TEST_CASE("malformed and hostile requests get the right status and an OpenAI error body") {
  test::TinyServer s;
  const auto cases = test::bad_cases();
  REQUIRE(cases.size() >= 30);
  for (const test::BadCase& c : cases) {
    HttpRequest rq{.method = c.method, .target = c.path, .headers = {{"content-type", c.content_type}}, .body = c.body};
    check_error_shape(s.api->handle(rq), c.status, c.param, c.what);
  }
  // Nothing was admitted and the service is still healthy.
  CHECK(s.get("/health").status == 200);
  const ServiceStats st = s.service->stats();
  CHECK(st.running == 0);
  CHECK(st.waiting == 0);
  CHECK(s.api->metrics().request_count("chat", 400) > 20);
}

TEST_CASE("405 names the allowed method") {
  test::TinyServer s;
  HttpResponse r = s.get("/v1/completions");
  CHECK(r.status == 405);
  bool allow = false;
  for (auto& [k, v] : r.headers) allow |= k == "Allow" && v == "POST";
  CHECK(allow);
}

TEST_CASE("api key: missing or wrong key is 401, the right key passes; health and metrics stay open") {
  test::TinyServer s({}, "sekrit");
  check_error_shape(s.get("/v1/models"), 401, "", "no key");
  HttpRequest wrong{.method = "GET", .target = "/v1/models", .headers = {{"authorization", "Bearer nope"}}};
  check_error_shape(s.api->handle(wrong), 401, "", "wrong key");
  HttpRequest right{.method = "GET", .target = "/v1/models", .headers = {{"authorization", "Bearer sekrit"}}};
  CHECK(s.api->handle(right).status == 200);
  CHECK(s.get("/health").status == 200);
  CHECK(s.get("/metrics").status == 200);
}

TEST_CASE("queue full is 429 with an OpenAI error; a free slot still takes a request with max_queue 0") {
  test::TinyServer s({.max_running = 1, .max_queue = 0}, "", 4096);
  HttpResponse first = s.post("/v1/completions", test::completion(R"("prompt":"x","max_tokens":4000,"ignore_eos":true,"stream":true)"));
  REQUIRE(first.status == 200);
  for (int i = 0; i < 500 && s.service->stats().running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(s.service->stats().running == 1);
  check_error_shape(s.post("/v1/chat/completions", test::chat(R"("max_tokens":2)")), 429, "", "queue full");
  first = HttpResponse{};  // cancel: the slot frees up
  for (int i = 0; i < 500 && s.service->stats().free_slots == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(s.post("/v1/chat/completions", test::chat(R"("max_tokens":2)")).status == 200);
}

TEST_CASE("models, health and metrics") {
  test::TinyServer s;
  json m = json::parse(s.get("/v1/models").body);
  CHECK(m["object"] == "list");
  REQUIRE(m["data"].size() == 1);
  CHECK(m["data"][0]["id"] == "k3-tiny");
  CHECK(m["data"][0]["object"] == "model");
  CHECK(json::parse(s.get("/v1/models/k3-tiny").body)["id"] == "k3-tiny");
  CHECK(json::parse(s.get("/health?x=1").body)["status"] == "ok");
  HttpResponse metrics = s.get("/metrics");
  CHECK(metrics.content_type.find("text/plain") == 0);
  for (const char* name : {"k3_router_requests_total", "k3_router_time_to_first_token_seconds_bucket",
                           "k3_router_inter_token_latency_seconds_count", "k3_router_e2e_request_latency_seconds_sum",
                           "k3_router_queue_depth", "k3_router_running_requests", "k3_engine_free_slots"})
    CHECK(metrics.body.find(name) != std::string::npos);
}

TEST_CASE("non-streamed chat and completions: shape, usage, finish_reason") {
  test::TinyServer s;
  HttpResponse r = s.post("/v1/chat/completions", test::chat(R"("max_tokens":5,"temperature":0,"ignore_eos":true)"));
  REQUIRE(r.status == 200);
  json j = json::parse(r.body);
  CHECK(j["object"] == "chat.completion");
  CHECK(j["model"] == "k3-tiny");
  CHECK(j["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  CHECK(j["choices"][0]["message"]["role"] == "assistant");
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"] == 5);
  CHECK(j["usage"]["prompt_tokens"].get<int>() > 0);
  CHECK(j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"].get<int>() + 5);

  r = s.post("/v1/completions", test::completion(R"("prompt":[1,2,3],"max_tokens":4,"temperature":0,"ignore_eos":true,"return_token_ids":true)"));
  REQUIRE(r.status == 200);
  j = json::parse(r.body);
  CHECK(j["object"] == "text_completion");
  CHECK(j["choices"][0]["text"].is_string());
  CHECK(j["choices"][0]["token_ids"].size() == 4);
  CHECK(j["prompt_token_ids"] == json::array({1, 2, 3}));
  CHECK(j["usage"]["prompt_tokens"] == 3);
}

TEST_CASE("SSE framing: role chunk, content chunks, finish chunk, usage chunk, [DONE]") {
  test::TinyServer s;
  const std::string body = test::chat(R"("max_tokens":6,"temperature":0,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true})");
  HttpResponse r = s.post("/v1/chat/completions", body);
  REQUIRE(r.status == 200);
  REQUIRE(r.sse);
  CHECK(r.content_type == "text/event-stream");
  const std::string all = test::drain_sse(r);
  // Split into events; every event is "data: <payload>" and ends with a blank line.
  std::vector<std::string> events;
  size_t at = 0;
  while (at < all.size()) {
    const size_t end = all.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    events.push_back(all.substr(at, end - at));
    at = end + 2;
  }
  std::erase_if(events, [](const std::string& e) { return e.rfind(":", 0) == 0; });  // keep-alive comments
  REQUIRE(events.size() >= 4);
  CHECK(events.back() == "data: [DONE]");
  std::string content;
  std::string finish;
  int usage_chunks = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    REQUIRE(events[i].rfind("data: ", 0) == 0);
    json c = json::parse(events[i].substr(6));
    CHECK(c["object"] == "chat.completion.chunk");
    if (i == 0) CHECK(c["choices"][0]["delta"]["role"] == "assistant");
    if (c["choices"].empty()) {
      ++usage_chunks;
      CHECK(i + 2 == events.size());  // the usage chunk is the last before [DONE]
      CHECK(c["usage"]["completion_tokens"] == 6);
      continue;
    }
    CHECK(c["usage"].is_null());
    const json& ch = c["choices"][0];
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  CHECK(usage_chunks == 1);
  CHECK(finish == "length");
  // The same greedy request unstreamed gives the same text.
  json whole = json::parse(s.post("/v1/chat/completions", test::chat(R"("max_tokens":6,"temperature":0,"ignore_eos":true)")).body);
  CHECK(whole["choices"][0]["message"]["content"] == content);
}
