// A k3-router process serving the generated k3-tiny model (random weights, the tiny tokenizer) from a
// temp dir, with plain request and /metrics helpers, for the process tests.
#pragma once
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "router_fixture.h"
#include "router_process.h"

namespace k3::test {

struct TinyRouter {
  TempDir dir;
  std::unique_ptr<RouterProcess> router;
  explicit TinyRouter(std::vector<std::string> extra = {}, int64_t context = 256) {
    write_tiny_model(dir.path, context);
    std::vector<std::string> args{"--model", dir.path, "--port", "0", "--served-model-name", "k3-tiny", "--threads", "2"};
    if (std::find(extra.begin(), extra.end(), "--max-running") == extra.end()) args.insert(args.end(), {"--max-running", "2"});
    args.insert(args.end(), extra.begin(), extra.end());
    router = std::make_unique<RouterProcess>(args);
  }
  HttpReply request(const std::string& method, const std::string& path, const std::string& body = "",
                    const std::string& headers = "") {
    HttpConnection c(router->port());
    c.send_request(method, path, body, headers);
    return c.read_reply();
  }
  // A /metrics line "<name> <integer>" (name may carry labels); -999 when absent.
  static int64_t metric(const std::string& text, const std::string& name) {
    std::smatch m;
    if (!std::regex_search(text, m, std::regex("\n" + std::regex_replace(name, std::regex(R"([{}])"), R"(\$&)") +
                                               " (-?[0-9]+)\n")))
      return -999;
    return std::stoll(m[1]);
  }
  int64_t gauge(const std::string& name, const std::string& headers = "") {
    return metric(request("GET", "/metrics", "", headers).body, name);
  }
  // Polls /metrics until `name` reads `want` (the router notices a closed connection a moment after
  // the client sees it closed); returns the last value read.
  int64_t await_gauge(const std::string& name, int64_t want, const std::string& headers = "") {
    int64_t v = gauge(name, headers);
    for (int i = 0; i < 500 && v != want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      v = gauge(name, headers);
    }
    return v;
  }
};

// An OpenAI-style error reply: the status, and {"error": {message, type, param, code}}.
inline void check_openai_error(const HttpReply& r, int status, const std::string& what) {
  INFO(what << " -> " << r.status << " " << r.body);
  CHECK(r.status == status);
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  REQUIRE(j.is_object());
  CHECK(j["error"]["message"].is_string());
  CHECK(j["error"]["type"].is_string());
  CHECK(j["error"].contains("param"));
  CHECK(j["error"].contains("code"));
}

}  // namespace k3::test
