// k3-cluster heals itself: a SIGKILLed decode rank, prefill stage or router is started again in the
// same place (same control endpoint / activation endpoint / HTTP port), re-registers, and the cluster
// serves a completion again within 10 s of the kill, with the same greedy tokens as before (the
// restarted decode's new UCX worker address and rkeys reached the prefill stages). k3-cluster's status
// endpoint counts the restarts. A node that crash-loops past restart.max_restarts is given up (FAILED)
// while k3-cluster keeps running with what is left.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/router/http_client.h"
#include "tests/support/scratch_dir.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;
using k3::test::HttpReply;
using Clock = std::chrono::steady_clock;

namespace {

struct HealCluster {
  k3::testing::ScratchDir dir{"heal"};
  k3::test::LaunchedCluster c;
  explicit HealCluster(const json& restart) {
    const json spec = {{"model", dir.file("model")},
                       {"generate", {{"preset", "k3-tiny"}, {"seed", 4}}},
                       {"router", {{"host", "127.0.0.1"}, {"port", 0}}},
                       {"prefill", json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", 8}}})},
                       {"decode", json::array({{{"id", "d"}, {"ranks", 1}}})},
                       {"threads", 1},
                       {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 3}, {"startup_s", 240}}},
                       {"restart", restart}};
    dir.write("spec.json", spec.dump(2));
    c = k3::test::launch_cluster(dir.file("spec.json"));
  }
  ~HealCluster() {
    if (!c.proc) return;
    ::kill(c.proc->pid(), SIGTERM);
    c.proc->wait_exit(20s);
  }
  HttpReply get(int port, const std::string& path) {
    HttpConnection h(port);
    h.send_request("GET", path);
    return h.read_reply(10s);
  }
  json status() { return json::parse(get(c.status_port, "/status").body); }
  json node(const std::string& name) {
    const json st = status();
    for (const auto& n : st.at("nodes"))
      if (n.at("name") == name) return n;
    FAIL("no node " << name << " in /status");
    return {};
  }
};

const std::vector<int32_t> kPrompt = {5, 17, 99, 3, 42, 7, 61, 8, 23, 11, 2};

// One greedy completion; its token ids, or empty when the cluster did not serve it.
std::vector<int32_t> complete(int port, std::chrono::milliseconds timeout) {
  try {
    HttpConnection h(port);
    const json body = {{"model", "model"}, {"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0},
                       {"ignore_eos", true}, {"return_token_ids", true}};
    h.send_request("POST", "/v1/completions", body.dump());
    const HttpReply r = h.read_reply(timeout);
    if (r.status != 200) return {};
    return json::parse(r.body).at("choices").at(0).at("token_ids").get<std::vector<int32_t>>();
  } catch (const std::exception&) {
    return {};  // the router itself is down (connection refused or closed)
  }
}

// SIGKILLs `name` and returns how long until a completion is served again (giving up after 60 s).
std::chrono::duration<double> kill_and_time_recovery(HealCluster& h, const std::string& name,
                                                     const std::vector<int32_t>& want) {
  const pid_t old_pid = h.node(name).at("pid").get<pid_t>();
  REQUIRE(old_pid > 0);
  REQUIRE(::kill(old_pid, SIGKILL) == 0);
  const auto killed = Clock::now();
  REQUIRE(h.c.proc->wait_for("RESTARTED " + name + " pid", 30s));
  for (;;) {
    INFO("waiting for the cluster to serve again after killing " << name);
    REQUIRE(Clock::now() - killed < 60s);
    if (complete(h.c.port, 20s) == want) break;
    std::this_thread::sleep_for(100ms);
  }
  const std::chrono::duration<double> took = Clock::now() - killed;
  std::printf("%s: SIGKILL -> served again in %.2f s\n", name.c_str(), took.count());
  const json n = h.node(name);
  CHECK(n.at("state") == "running");
  CHECK(n.at("pid").get<pid_t>() != old_pid);
  CHECK(n.at("pid").get<pid_t>() > 0);
  return took;
}

}  // namespace

TEST_CASE("k3-cluster restarts a SIGKILLed decode rank, prefill stage and router; each time the cluster serves "
          "again within 10 s with the same tokens",
          "[cluster_e2e]") {
  HealCluster h(json::object());  // the default policy: restarts on, 0.2 s first backoff
  REQUIRE(h.c.status_port > 0);
  const std::vector<int32_t> want = complete(h.c.port, 120s);
  REQUIRE(want.size() == 4);

  const auto decode_took = kill_and_time_recovery(h, "decode/d", want);
  INFO("decode/d: served again " << decode_took.count() << " s after SIGKILL");
  CHECK(decode_took < 10s);
  // The stage with an activation listener comes back on the endpoint stage 0 pushes to.
  const auto stage_took = kill_and_time_recovery(h, "prefill/p/1", want);
  INFO("prefill/p/1: served again " << stage_took.count() << " s after SIGKILL");
  CHECK(stage_took < 10s);
  // The router comes back on the same HTTP port and control endpoint; the nodes re-register.
  const auto router_took = kill_and_time_recovery(h, "router", want);
  INFO("router: served again " << router_took.count() << " s after SIGKILL");
  CHECK(router_took < 10s);

  for (const std::string name : {"decode/d", "prefill/p/1", "router"}) CHECK(h.node(name).at("restarts") == 1);
  CHECK(h.node("prefill/p/0").at("restarts") == 0);
  const std::string m = h.get(h.c.status_port, "/metrics").body;
  CHECK(m.find("k3_cluster_node_restarts_total{node=\"decode/d\"} 1") != std::string::npos);
  CHECK(m.find("k3_cluster_node_restarts_total{node=\"router\"} 1") != std::string::npos);
  CHECK(m.find("k3_cluster_process_up{node=\"decode/d\"} 1") != std::string::npos);
  const std::string rm = h.get(h.c.port, "/metrics").body;  // the restarted router sees every node again
  CHECK(rm.find("k3_cluster_node_up{node=\"decode/d\"} 1") != std::string::npos);
  CHECK(rm.find("k3_cluster_pairs_ready 1") != std::string::npos);

  // SIGTERM: non-zero (children had crashed), every process gone.
  const auto st = h.status();
  ::kill(h.c.proc->pid(), SIGTERM);
  CHECK(h.c.proc->wait_exit(20s) == 1);
  h.c.proc.reset();
  for (const auto& n : st.at("nodes")) {
    INFO(n.dump());
    CHECK(::kill(n.at("pid").get<pid_t>(), 0) != 0);
  }
}

TEST_CASE("k3-cluster gives a crash-looping node up after restart.max_restarts and keeps running", "[cluster_e2e]") {
  HealCluster h({{"max_restarts", 1}, {"initial_backoff_ms", 100}, {"stable_ms", 600000}});
  REQUIRE(complete(h.c.port, 120s).size() == 4);
  auto kill_decode = [&] {
    const pid_t pid = h.node("decode/d").at("pid").get<pid_t>();
    REQUIRE(pid > 0);
    REQUIRE(::kill(pid, SIGKILL) == 0);
  };
  kill_decode();
  REQUIRE(h.c.proc->wait_for("RESTARTED decode/d pid", 30s));
  kill_decode();  // the second crash in a row: over the limit
  REQUIRE(h.c.proc->wait_for("FAILED decode/d", 30s));
  const json n = h.node("decode/d");
  CHECK(n.at("state") == "failed");
  CHECK(n.at("restarts") == 1);
  CHECK(n.at("last_exit").get<std::string>().find("signal 9") != std::string::npos);
  CHECK(h.get(h.c.status_port, "/metrics").body.find("k3_cluster_process_failed{node=\"decode/d\"} 1") != std::string::npos);
  // The rest keeps running: the router answers, 503 without a decode rank.
  CHECK(h.c.proc->running());
  const auto t0 = Clock::now();
  int health = 0;
  while (Clock::now() - t0 < 10s && (health = h.get(h.c.port, "/health").status) != 503) std::this_thread::sleep_for(100ms);
  CHECK(health == 503);
  CHECK(h.node("prefill/p/0").at("state") == "running");
}
