// A non-streamed request to a router, in two halves so that a test may send many at once: post_json
// sends and reads the reply and may run on any thread (it uses no Catch macro: Catch2 v2 is not
// thread-safe, and INFO or an assertion from two threads at once corrupts its state and can crash the
// test process); token_ids_of checks a completion's reply and belongs on the test's main thread.
#pragma once
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/router/http_client.h"

namespace k3::test {

// Any thread. Throws (through the future, when run by std::async) on a timeout or a dropped connection.
inline HttpReply post_json(int port, const std::string& path, const nlohmann::json& body,
                           std::chrono::milliseconds timeout = std::chrono::seconds(180)) {
  HttpConnection c(port);
  c.send_request("POST", path, body.dump());
  return c.read_reply(timeout);
}

// Main thread only: the token ids of a /v1/completions reply (return_token_ids), which must be a 200.
inline std::vector<int32_t> token_ids_of(const HttpReply& r) {
  INFO(r.body);
  REQUIRE(r.status == 200);
  return nlohmann::json::parse(r.body).at("choices").at(0).at("token_ids").get<std::vector<int32_t>>();
}

}  // namespace k3::test
