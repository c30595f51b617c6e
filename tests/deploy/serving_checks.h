// What the deploy tests ask of a cluster they started some other way than k3-cluster: is it serving
// (/health 200 and the router counts every node registered), and the greedy tokens of a completion.
#pragma once
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "deploy/http_probe.h"
#include "tests/router/http_client.h"

namespace k3::test {

inline bool cluster_serving(int port) {
  using namespace std::chrono_literals;
  auto h = deploy::http_get("127.0.0.1", port, "/health", 2000ms);
  if (!h.is_ok() || h->status != 200) return false;
  auto m = deploy::http_get("127.0.0.1", port, "/metrics", 2000ms);
  if (!m.is_ok()) return false;
  auto value = [&](const std::string& name) {
    const auto at = m->body.find("\n" + name + " ");
    return at == std::string::npos ? -1L : std::atol(m->body.c_str() + at + name.size() + 2);
  };
  return value("k3_cluster_nodes_expected") > 0 &&
         value("k3_cluster_nodes_registered") == value("k3_cluster_nodes_expected");
}

inline std::vector<int32_t> greedy_completion(int port, const std::vector<int32_t>& prompt, int max_tokens) {
  HttpConnection c(port);
  const nlohmann::json body = {{"model", "model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                               {"ignore_eos", true}, {"return_token_ids", true}};
  c.send_request("POST", "/v1/completions", body.dump());
  const auto r = c.read_reply(std::chrono::seconds(120));
  INFO(r.body);
  REQUIRE(r.status == 200);
  return nlohmann::json::parse(r.body).at("choices").at(0).at("token_ids").get<std::vector<int32_t>>();
}

// The same without assertions: empty when the request fails (a cluster still healing answers 503).
inline std::vector<int32_t> try_greedy_completion(int port, const std::vector<int32_t>& prompt, int max_tokens) {
  try {
    HttpConnection c(port);
    const nlohmann::json body = {{"model", "model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                                 {"ignore_eos", true}, {"return_token_ids", true}};
    c.send_request("POST", "/v1/completions", body.dump());
    const auto r = c.read_reply(std::chrono::seconds(60));
    if (r.status != 200) return {};
    return nlohmann::json::parse(r.body).at("choices").at(0).at("token_ids").get<std::vector<int32_t>>();
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace k3::test
