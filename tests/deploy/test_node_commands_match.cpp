// The renderers' command lines (node_commands.h) and the local launcher's (k3-cluster) come from the same
// spec: this test starts k3-cluster, reads each child's argv from /proc, and checks that the renderers
// pass every flag k3-cluster passes, with the same value wherever the value is not a place (endpoints,
// key files, model path; k3-cluster binds port * where the renderers bind fixed ports), and add only the
// binding flags (--bind, --interface) where k3-cluster leaves them out. A flag added to one
// launcher and not the other fails here.
#include <catch2/catch.hpp>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "deploy/node_commands.h"
#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/support/run_command.h"

using namespace k3;
using nlohmann::json;

namespace {

using Flags = std::map<std::string, std::vector<std::string>>;  // flag -> values (repeatable flags)

Flags flags_of(const std::vector<std::string>& argv) {
  Flags f;
  for (size_t i = 1; i < argv.size(); ++i) {
    if (argv[i].rfind("--", 0) != 0) continue;
    const bool has_value = i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0;
    f[argv[i]].push_back(has_value ? argv[i + 1] : "");
  }
  return f;
}

std::vector<std::string> cmdline(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> out;
  std::string arg;
  while (std::getline(in, arg, '\0')) out.push_back(arg);
  return out;
}

// Starts k3-cluster on `raw` (its "model" under `dir`) and compares every process's flags with the rendered ones.
void check_commands_match(const std::string& dir, const json& raw) {
  std::ofstream(dir + "/spec.json") << raw.dump(2);
  auto launched = test::launch_cluster(dir + "/spec.json", std::chrono::seconds(300), {"--log-level", "info"});
  auto spec = deploy::parse_cluster_spec(json::parse(raw.dump()));  // as read from the file
  INFO(spec.status().message());
  REQUIRE(spec.is_ok());
  spec->port = launched.port;
  deploy::NodeContext ctx;
  ctx.model = spec->model;
  ctx.keys_dir = dir + "/keys";
  ctx.address = ctx.router_host = "127.0.0.1";
  ctx.host_of = [](const std::string&) { return std::string("127.0.0.1"); };
  // Flags whose values are places, which the launchers choose differently.
  const std::set<std::string> places = {"--model", "--host", "--port", "--cluster-endpoint", "--router-endpoint",
                                        "--decode-endpoint", "--next-endpoint", "--listen", "--bind", "--control-key",
                                        "--control-public-keys", "--metrics-listen", "--group-endpoint"};
  // Binding flags the renderers add where k3-cluster takes a default or a port it is told after start-up
  // (a group leader binds its communicator on a port of its choosing and prints it).
  const std::set<std::string> binding = {"--bind", "--interface", "--group-endpoint"};
  for (const auto& p : deploy::node_processes(*spec, deploy::PortLayout{})) {
    INFO(p.name);
    REQUIRE(launched.pids.count(p.name));
    const Flags local = flags_of(cmdline(launched.pids.at(p.name)));
    const Flags rendered = flags_of(deploy::node_command(*spec, deploy::PortLayout{}, p, ctx));
    REQUIRE(!local.empty());
    if (p.kind != deploy::NodeProcess::Kind::Router) {   // the spec's kernels reach every node, and it started
      REQUIRE(local.count("--kernels"));
      CHECK(local.at("--kernels") == std::vector<std::string>{"fast"});
    }
    for (const auto& [flag, values] : local) {
      INFO(flag);
      REQUIRE(rendered.count(flag));
      if (!places.count(flag)) CHECK(rendered.at(flag) == values);
    }
    for (const auto& [flag, values] : rendered) {
      INFO(flag);
      CHECK((local.count(flag) || binding.count(flag)));
    }
  }
  ::kill(launched.proc->pid(), SIGTERM);
  CHECK(launched.proc->wait_exit(std::chrono::seconds(20)) == 0);
}

}  // namespace

TEST_CASE("the rendered command lines carry every flag k3-cluster passes its children", "[deploy][render]") {
  test::TempDir tmp("node-commands");
  const std::string dir = std::filesystem::canonical(tmp.path()).string();
  check_commands_match(dir, {{"model", dir + "/model"},
                             {"generate", {{"preset", "k3-tiny"}, {"seed", 2}}},
                             {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"placement", "least-loaded"}, {"affinity_tokens", 32}}},
                             {"prefill", json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", 64}, {"max_requests", 4},
                                                       {"prefix_cache", {{"slots", 2}, {"budget_mb", 1}}}}})},
                             {"decode", json::array({{{"id", "d"}, {"ranks", 1}, {"max_requests", 10}}})},
                             {"threads", 1},
                             {"kernels", "fast"},   // every node gets --kernels fast (the CPU backend's kernels ignore it)
                             {"timeouts", {{"heartbeat_ms", 250}, {"heartbeat_misses", 4}, {"claim_ms", 4000}}}});
}

TEST_CASE("the rendered command lines of a decode rank group carry k3-cluster's flags, leader and members",
          "[deploy][render]") {
  test::TempDir tmp("node-commands-group");
  const std::string dir = std::filesystem::canonical(tmp.path()).string();
  check_commands_match(dir, {{"model", dir + "/model"},
                             {"generate", {{"preset", "k3-tiny"}, {"seed", 2}}},
                             {"router", {{"host", "127.0.0.1"}, {"port", 0}}},
                             {"prefill", json::array({{{"id", "p"}, {"stages", 1}, {"chunk_size", 64}}})},
                             {"decode", json::array({{{"id", "d"}, {"dp", 1}, {"ep", 2}, {"max_requests", 8},
                                                      {"step_deadline_ms", 3000}}})},
                             {"threads", 1},
                             {"kernels", "fast"}});
}
