// Nodes placed by a launcher other than k3-cluster (the command lines the Kubernetes and Slurm renderers
// use, node_commands.h, with fixed ports): the decode rank and both prefill stages start BEFORE the
// router and join it when it comes up; then a prefill stage and the decode rank are each killed mid-run
// and started again with the same command line, re-register, and the cluster serves the same greedy
// tokens as k3-generate again.
#include <catch2/catch.hpp>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "deploy/node_commands.h"
#include "common/core/free_port.h"
#include "tests/deploy/serving_checks.h"
#include "tests/support/generate_reference.h"
#include "tests/transfer/process_guard.h"
#include "transfer/cluster_key_files.h"

using namespace std::chrono_literals;
using namespace k3;
using k3::test::ProcessGuard;

namespace {

struct Nodes {
  deploy::ClusterSpec spec;
  deploy::PortLayout ports;
  deploy::NodeContext ctx;
  std::map<std::string, deploy::NodeProcess> by_name;
  std::map<std::string, std::unique_ptr<ProcessGuard>> running;

  void start(const std::string& name) {
    auto argv = deploy::node_command(spec, ports, by_name.at(name), ctx);
    const std::string exe = argv.front();
    argv.erase(argv.begin());
    running[name] = std::make_unique<ProcessGuard>(exe, argv);
  }
  void kill(const std::string& name) {
    running.at(name)->kill_now();
    running.erase(name);
  }
};

bool wait_serving(int port, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!test::cluster_serving(port)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(200ms);
  }
  return true;
}

// The router's /metrics stops counting `node` as registered (its heartbeats stopped).
bool wait_node_down(int port, const std::string& node, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = deploy::http_get("127.0.0.1", port, "/metrics", 2000ms);
    if (m.is_ok() && m->body.find("k3_cluster_node_up{node=\"" + node + "\"} 0") != std::string::npos) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

}  // namespace

TEST_CASE("nodes started before the router join it, and a node restarted mid-run re-registers and serves",
          "[deploy][join]") {
  test::TempDir tmp("join-order");
  const std::string dir = std::filesystem::canonical(tmp.path()).string();
  const std::string model = dir + "/model";
  REQUIRE(test::run_command(std::string(K3_BIN_DIR) + "/k3-genweights --preset k3-tiny --seed 1 --out " + model +
                            " --quiet >/dev/null").exit_code == 0);

  Nodes n;
  n.spec.model = model;
  // One block of consecutive free ports for the whole layout: HTTP, control, the decode rank, prefill stage 1
  // (prefill_port + 1) and a metrics port per node (metrics_port + 0, 1, 2). Picked apart, the derived
  // ports (metrics_port + 1, ...) were never checked and could be held by another process's connection.
  const int base = free_tcp_ports(8);
  REQUIRE(base > 0);
  n.spec.port = base;
  n.spec.prefill = {{.id = "p", .stages = 2, .chunk_size = 16}};
  n.spec.decode = {{.id = "d", .ranks = 1}};
  n.spec.heartbeat_ms = 200;
  n.spec.heartbeat_misses = 5;
  const int stage1_port = base + 3;  // stage 0 binds no prefill port: stage i listens on prefill_port + i
  n.ports = {.control_port = base + 1, .decode_port = base + 2, .prefill_port = stage1_port - 1, .metrics_port = base + 4};
  n.ctx.bin_dir = K3_BIN_DIR;
  n.ctx.model = model;
  n.ctx.keys_dir = dir + "/keys";
  n.ctx.address = n.ctx.router_host = "127.0.0.1";
  n.ctx.log_level = "warn";
  n.ctx.host_of = [](const std::string&) { return std::string("127.0.0.1"); };
  n.ctx.metrics_per_process = true;   // every node on this host: a metrics port each
  std::vector<std::string> names;
  for (const auto& p : deploy::node_processes(n.spec, n.ports)) {
    n.by_name[p.name] = p;
    names.push_back(p.name);
  }
  REQUIRE(transfer::ClusterKeyFiles::write(n.ctx.keys_dir, names).is_ok());

  // The nodes first; the decode rank binds its endpoint without a router.
  for (const char* name : {"decode/d", "prefill/p/1", "prefill/p/0"}) n.start(name);
  REQUIRE(n.running.at("decode/d")->wait_for("READY ", 60s));
  std::this_thread::sleep_for(1s);
  for (auto& [name, proc] : n.running) CHECK(proc->running());
  CHECK(!test::cluster_serving(n.spec.port));

  n.start("router");
  REQUIRE(wait_serving(n.spec.port, 120s));
  const std::vector<int32_t> prompt = {9, 8, 7, 200, 31, 4, 77, 5, 12, 150, 3, 61, 40, 2, 18, 90, 33};
  const auto want = test::k3_generate_tokens(model, prompt, 6);
  CHECK(test::greedy_completion(n.spec.port, prompt, 6) == want);

  // A prefill stage, the decode rank and the router each die mid-run and are started again in the same
  // place; the cluster serves the same tokens again (requests while it heals may get 503).
  for (const char* victim : {"prefill/p/1", "decode/d", "router"}) {
    INFO("restarted " << victim);
    n.kill(victim);
    const auto killed = std::chrono::steady_clock::now();
    if (std::string(victim) != "router") REQUIRE(wait_node_down(n.spec.port, victim, 30s));
    n.start(victim);
    while (test::try_greedy_completion(n.spec.port, prompt, 6) != want) {
      REQUIRE(std::chrono::steady_clock::now() - killed < 60s);
      std::this_thread::sleep_for(200ms);
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - killed;
    std::printf("%s: killed -> served again in %.2f s\n", victim, took.count());
    CHECK(test::cluster_serving(n.spec.port));
  }
  for (auto& [name, proc] : n.running) CHECK(proc->running());
}
