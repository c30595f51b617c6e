// The restart bookkeeping of k3-cluster without a cluster: the backoff sequence, its reset after a
// stable run, the crash-loop limit, the spec's "restart" fields, and the Supervisor on real (tiny)
// processes: a crashing child is restarted with its recipe and environment, then given up.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "deploy/cluster_spec.h"
#include "deploy/supervisor.h"

using namespace std::chrono_literals;
using nlohmann::json;
using namespace k3::deploy;

TEST_CASE("restart backoff doubles from the initial delay to the cap and resets after a stable run", "[cluster_e2e]") {
  RestartBackoff b({.enabled = true, .initial_backoff_ms = 200, .max_backoff_ms = 10000, .stable_ms = 30000, .max_restarts = 100});
  std::vector<long> got;
  for (int i = 0; i < 9; ++i) got.push_back(b.on_exit(1s)->count());
  CHECK(got == std::vector<long>{200, 400, 800, 1600, 3200, 6400, 10000, 10000, 10000});
  CHECK(b.consecutive() == 9);
  CHECK(b.on_exit(30s)->count() == 200);  // it had run stably: a fresh start
  CHECK(b.consecutive() == 1);
}

TEST_CASE("restart backoff gives a node up after max_restarts crashes in a row; disabled never restarts", "[cluster_e2e]") {
  RestartBackoff b({.enabled = true, .initial_backoff_ms = 100, .max_backoff_ms = 1000, .stable_ms = 5000, .max_restarts = 2});
  CHECK(b.on_exit(10ms).has_value());
  CHECK(b.on_exit(10ms).has_value());
  CHECK_FALSE(b.on_exit(10ms).has_value());
  RestartBackoff off({.enabled = false});
  CHECK_FALSE(off.on_exit(1h).has_value());
  RestartBackoff huge({.enabled = true, .initial_backoff_ms = 3600000, .max_backoff_ms = 3600000, .stable_ms = 1, .max_restarts = 1000000});
  for (int i = 0; i < 200; ++i) REQUIRE(huge.on_exit(0ms)->count() == 3600000);  // no overflow in a long loop
}

TEST_CASE("cluster spec: restart fields, defaults and errors", "[cluster_e2e]") {
  const json base = {{"model", "m"}, {"prefill", json::array({json::object()})}, {"decode", json::array({json::object()})}};
  auto s = parse_cluster_spec(base);
  REQUIRE(s.is_ok());
  CHECK(s->restart.enabled);
  CHECK(s->restart.initial_backoff_ms == 200);
  CHECK(s->restart.max_backoff_ms == 10000);
  CHECK(s->restart.stable_ms == 30000);
  CHECK(s->restart.max_restarts == 5);
  json j = base;
  j["restart"] = {{"enabled", false}, {"initial_backoff_ms", 50}, {"max_backoff_ms", 400}, {"stable_ms", 1000}, {"max_restarts", 0}};
  s = parse_cluster_spec(j);
  REQUIRE(s.is_ok());
  CHECK_FALSE(s->restart.enabled);
  CHECK(s->restart.max_backoff_ms == 400);
  CHECK(s->restart.max_restarts == 0);
  for (const auto& [bad, field] : std::vector<std::pair<json, std::string>>{
           {{{"enabled", 1}}, "restart.enabled"},
           {{{"initial_backoff_ms", 0}}, "restart.initial_backoff_ms"},
           {{{"initial_backoff_ms", 500}, {"max_backoff_ms", 100}}, "restart.max_backoff_ms"},
           {{{"max_restarts", -1}}, "restart.max_restarts"},
           {{{"bogus", 1}}, "restart.bogus"}}) {
    j["restart"] = bad;
    const auto r = parse_cluster_spec(j);
    INFO(bad.dump());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find(field) != std::string::npos);
  }
}

TEST_CASE("set_option replaces a flag's value or appends it", "[cluster_e2e]") {
  std::vector<std::string> a = {"--model", "m", "--bind", "tcp://127.0.0.1:*"};
  set_option(a, "--bind", "tcp://127.0.0.1:5000");
  set_option(a, "--listen", "tcp://127.0.0.1:6000");
  CHECK(a == std::vector<std::string>{"--model", "m", "--bind", "tcp://127.0.0.1:5000", "--listen", "tcp://127.0.0.1:6000"});
}

TEST_CASE("Supervisor restarts a crashing child from its recipe, then gives it up; status and metrics count it",
          "[cluster_e2e]") {
  std::vector<std::string> said, noted;
  Supervisor sup({.enabled = true, .initial_backoff_ms = 20, .max_backoff_ms = 40, .stable_ms = 60000, .max_restarts = 2},
                 {.say = [&](const std::string& s) { said.push_back(s); }, .note = [&](const std::string& s) { noted.push_back(s); }});
  // The child exits 3 when it sees the variable, 4 otherwise: the environment travels with the recipe.
  REQUIRE(sup.start({.name = "node/x", .exe = "/bin/sh", .args = {"-c", "test \"$K3_TEST_VAR\" = yes && exit 3; exit 4"},
                     .env = {.unset = {}, .set = {{"K3_TEST_VAR", "yes"}}}})
              .is_ok());
  std::vector<SupervisorEvent> events;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::none_of(events.begin(), events.end(), [](const auto& e) { return e.kind == SupervisorEvent::Kind::Failed; })) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    for (auto& e : sup.poll(std::chrono::steady_clock::now())) events.push_back(e);
    std::this_thread::sleep_for(5ms);
  }
  std::vector<SupervisorEvent::Kind> kinds;
  for (const auto& e : events) kinds.push_back(e.kind);
  using K = SupervisorEvent::Kind;
  CHECK(kinds == std::vector<K>{K::Exited, K::Restarted, K::Exited, K::Restarted, K::Exited, K::Failed});
  CHECK(events[0].detail == "exited with status 3");
  CHECK(events[4].detail == "exited with status 3");
  // One log line per restart naming the node, how it ended and the next delay (20 ms, then doubled).
  REQUIRE(noted.size() >= 3);
  CHECK(noted[0].find("node/x") != std::string::npos);
  CHECK(noted[0].find("exited with status 3") != std::string::npos);
  CHECK(noted[0].find("in 20 ms") != std::string::npos);
  CHECK(noted[1].find("in 40 ms") != std::string::npos);
  CHECK(noted[2].find("given up") != std::string::npos);
  CHECK(std::count_if(said.begin(), said.end(), [](const auto& s) { return s.rfind("RESTARTED node/x pid ", 0) == 0; }) == 2);
  CHECK(std::find(said.begin(), said.end(), "FAILED node/x") != said.end());
  const json st = json::parse(sup.status_json());
  CHECK(st["nodes"][0]["name"] == "node/x");
  CHECK(st["nodes"][0]["state"] == "failed");
  CHECK(st["nodes"][0]["restarts"] == 2);
  CHECK(sup.prometheus_text().find("k3_cluster_node_restarts_total{node=\"node/x\"} 2") != std::string::npos);
  CHECK(sup.prometheus_text().find("k3_cluster_process_failed{node=\"node/x\"} 1") != std::string::npos);
  CHECK(sup.any_crashed());
}

TEST_CASE("Supervisor stops a node with stops_after only once that node has exited (a group member after its leader)",
          "[cluster_e2e]") {
  const std::string log = std::filesystem::temp_directory_path() / ("k3-stop-order-" + std::to_string(::getpid()));
  std::filesystem::remove(log);
  Supervisor sup({.enabled = false}, {.say = [](const std::string&) {}, .note = [](const std::string&) {}});
  // The leader takes 300 ms to stop after SIGTERM; the member notes when its SIGTERM comes. Both loop in
  // short sleeps so the shell runs its trap promptly.
  const std::string loop = "; touch '" + log + ".'$0; while :; do sleep 0.02; done";
  REQUIRE(sup.start({.name = "decode/d", .exe = "/bin/sh",
                     .args = {"-c", "trap 'sleep 0.3; echo leader-exited >> \"" + log + "\"; exit 0' TERM" + loop, "leader"}})
              .is_ok());
  REQUIRE(sup.start({.name = "decode/d/1", .exe = "/bin/sh",
                     .args = {"-c", "trap 'echo member-signalled >> \"" + log + "\"; exit 0' TERM" + loop, "member"},
                     .stops_after = "decode/d"})
              .is_ok());
  // Both traps are installed before the stop (each shell touches its file after `trap`).
  for (const auto until = std::chrono::steady_clock::now() + 10s;
       !(std::filesystem::exists(log + ".leader") && std::filesystem::exists(log + ".member"));
       std::this_thread::sleep_for(10ms))
    REQUIRE(std::chrono::steady_clock::now() < until);
  sup.stop_all(5000ms);
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  CHECK(lines == std::vector<std::string>{"leader-exited", "member-signalled"});
  const json st = json::parse(sup.status_json());
  CHECK(st["nodes"][0]["state"] == "stopped");
  CHECK(st["nodes"][1]["state"] == "stopped");
  for (const char* f : {"", ".leader", ".member"}) std::filesystem::remove(log + f);
}
