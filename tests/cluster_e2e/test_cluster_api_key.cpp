// The router's API key from the cluster spec (router.api_key), k3-cluster --api-key or K3_API_KEY, in
// that order of precedence: /v1 without the key is 401, with it 200 (a lower-precedence key is 401),
// /health stays open; the key reaches k3-router through its environment only: it is in no child's
// /proc/<pid>/cmdline, and in no environment but the router's.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>

#include "deploy/cluster_spec.h"
#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/router/http_client.h"
#include "tests/support/scratch_dir.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;

namespace {

std::string read_proc(pid_t pid, const char* what) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + what, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int models_status(int port, const std::string& key) {
  HttpConnection h(port);
  h.send_request("GET", "/v1/models", "", key.empty() ? "" : "Authorization: Bearer " + key + "\r\n");
  return h.read_reply(10s).status;
}

// K3_API_KEY in this process for the scope (k3-cluster inherits it), restored after.
struct EnvKey {
  explicit EnvKey(const char* v) {
    if (v) ::setenv("K3_API_KEY", v, 1);
    else ::unsetenv("K3_API_KEY");
  }
  ~EnvKey() { ::unsetenv("K3_API_KEY"); }
};

// Starts k3-cluster with the spec key / flag / env given, checks who wins and where the key travels.
void check_key(k3::testing::ScratchDir& dir, const std::string& spec_key, const std::string& flag_key, const char* env_key,
               const std::string& want, const std::string& loser) {
  json spec = {{"model", dir.file("model")},
               {"router", {{"host", "127.0.0.1"}, {"port", 0}}},
               {"prefill", json::array({{{"id", "p"}, {"stages", 1}, {"chunk_size", 16}}})},
               {"decode", json::array({{{"id", "d"}, {"ranks", 1}}})},
               {"threads", 1}};
  if (!spec_key.empty()) spec["router"]["api_key"] = spec_key;
  dir.write("spec.json", spec.dump(2));
  EnvKey env(env_key);
  std::vector<std::string> extra;
  if (!flag_key.empty()) extra = {"--api-key", flag_key};
  auto c = k3::test::launch_cluster(dir.file("spec.json"), 300s, extra);
  CHECK(models_status(c.port, "") == 401);
  CHECK(models_status(c.port, want) == 200);
  CHECK(models_status(c.port, loser) == 401);
  {
    HttpConnection h(c.port);
    h.send_request("GET", "/health");
    CHECK(h.read_reply(10s).status == 200);
  }
  REQUIRE(c.pids.count("router"));
  REQUIRE(c.pids.size() >= 3);
  for (const auto& [name, pid] : c.pids) {
    INFO(name);
    const std::string cmdline = read_proc(pid, "cmdline"), environ = read_proc(pid, "environ");
    REQUIRE_FALSE(cmdline.empty());
    CHECK(cmdline.find(want) == std::string::npos);
    CHECK(cmdline.find("api-key") == std::string::npos);
    const bool has_key = environ.find(std::string("K3_API_KEY=") + want + '\0') != std::string::npos;
    CHECK(has_key == (name == "router"));
    CHECK((name == "router" || environ.find("K3_API_KEY") == std::string::npos));
  }
  ::kill(c.proc->pid(), SIGTERM);
  CHECK(c.proc->wait_exit(20s) == 0);
}

}  // namespace

TEST_CASE("k3-cluster: the API key from the spec, --api-key or K3_API_KEY reaches the router, never a command line",
          "[cluster_e2e]") {
  static k3::testing::ScratchDir dir("api_key");  // one model for every section (Catch2 reruns the case per section)
  SECTION("spec wins over --api-key and K3_API_KEY") { check_key(dir, "spec-Key.1", "flag-Key.2", "env-Key.3", "spec-Key.1", "flag-Key.2"); }
  SECTION("--api-key wins over K3_API_KEY") { check_key(dir, "", "flag-Key.2", "env-Key.3", "flag-Key.2", "env-Key.3"); }
  SECTION("K3_API_KEY alone") { check_key(dir, "", "", "env Key/3", "env Key/3", "spec-Key.1"); }
}

TEST_CASE("api key validation names its source and never quotes the key", "[cluster_e2e]") {
  using k3::deploy::resolve_api_key;
  k3::deploy::ClusterSpec spec;
  auto key_of = [](const k3::deploy::ClusterSpec& s, const std::string& flag, const char* env) {
    auto r = resolve_api_key(s, flag, env);
    REQUIRE(r.is_ok());
    return *r;
  };
  CHECK(key_of(spec, "", nullptr) == "");
  CHECK(key_of(spec, "", "") == "");
  CHECK(key_of(spec, "", "e") == "e");
  CHECK(key_of(spec, "f", "e") == "f");
  spec.api_key = "s";
  CHECK(key_of(spec, "f", "e") == "s");
  spec.api_key.clear();
  const auto bad = resolve_api_key(spec, "sec\x01ret", nullptr);
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message().find("--api-key") != std::string::npos);
  CHECK(bad.status().message().find("sec") == std::string::npos);
  CHECK_FALSE(resolve_api_key(spec, "", " padded").is_ok());
  CHECK_FALSE(resolve_api_key(spec, "", "caf\xc3\xa9").is_ok());
  const json j = {{"model", "m"}, {"prefill", json::array({json::object()})}, {"decode", json::array({json::object()})},
                  {"router", {{"api_key", "tab\tsecret"}}}};
  const auto s = k3::deploy::parse_cluster_spec(j);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.status().message().find("router.api_key") != std::string::npos);
  CHECK(s.status().message().find("secret") == std::string::npos);
  const json empty = {{"model", "m"}, {"prefill", json::array({json::object()})}, {"decode", json::array({json::object()})},
                      {"router", {{"api_key", ""}}}};
  CHECK_FALSE(k3::deploy::parse_cluster_spec(empty).is_ok());
}
