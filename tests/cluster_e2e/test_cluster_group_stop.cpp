// A decode group's leader stops on SIGTERM even while it waits on a member that does not answer: the
// stop signal ends the wait (the leader's while-waiting hook), the group's requests end with an error
// event, and the leader leaves in seconds. The windows are set so that nothing else would end the wait
// within the test: a 30 s liveness window and a 60 s step deadline.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <fstream>
#include <future>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/router/http_client.h"
#include "tests/support/run_command.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::StreamOutcome;
using Clock = std::chrono::steady_clock;

namespace {

// Whether `pid` has exited (gone, or a zombie its parent has not reaped yet).
bool exited(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  stat >> pid_field >> comm >> state;
  return state == "Z";
}

}  // namespace

TEST_CASE("k3-cluster: a group leader waiting on a stopped member leaves on SIGTERM within seconds",
          "[cluster_e2e][ranks]") {
  k3::test::TempDir dir("cluster-group-stop");
  std::ifstream in(std::string(K3_SOURCE_DIR) + "/deploy/cluster-dcp.json");
  json spec = json::parse(in);
  spec["model"] = dir.path() + "/model";
  spec["router"]["port"] = 0;
  spec["router"]["served_model_name"] = "k3-tiny";
  spec["prefill"] = json::array({spec["prefill"][0]});
  spec["decode"][0]["dp"] = 1;
  spec["decode"][0]["dcp"] = 2;
  spec["decode"][0]["step_deadline_ms"] = 60000;
  spec["timeouts"]["heartbeat_ms"] = 1000;
  spec["timeouts"]["heartbeat_misses"] = 30;
  std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
  k3::test::LaunchedCluster c = k3::test::launch_cluster(dir.path() + "/spec.json", 300s, {"--verbose"});
  REQUIRE(c.pids.count("decode/d"));
  REQUIRE(c.pids.count("decode/d/1"));
  const pid_t leader = c.pids.at("decode/d"), member = c.pids.at("decode/d/1");

  const int port = c.port;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back(static_cast<int32_t>(i * 13 % 400 + 1));
  auto stream = std::async(std::launch::async, [port, prompt] {
    return k3::test::stream_completion(port, prompt, 2000, 120s);
  });
  // The group decodes (its heartbeats report a running request), and has streamed some tokens.
  const auto until = Clock::now() + 120s;
  while (k3::test::metric_or(k3::test::read_metrics(port), "k3_cluster_node_running{node=\"decode/d\"}") < 1) {
    if (stream.wait_for(0s) == std::future_status::ready) {
      const StreamOutcome early = stream.get();
      INFO("the stream ended first: " << k3::test::outcome_name(early.kind) << " " << early.error);
      REQUIRE(false);
    }
    REQUIRE(Clock::now() < until);
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(500ms);
  REQUIRE(::kill(member, SIGSTOP) == 0);  // the member neither computes nor answers; the leader waits
  std::this_thread::sleep_for(500ms);
  const auto stop_at = Clock::now();
  REQUIRE(::kill(leader, SIGTERM) == 0);
  while (!exited(leader) && Clock::now() - stop_at < 30s) std::this_thread::sleep_for(50ms);
  const auto took = Clock::now() - stop_at;
  ::kill(member, SIGCONT);
  INFO("the leader left " << std::chrono::duration<double>(took).count() << " s after SIGTERM");
  CHECK(exited(leader));
  CHECK(took < 10s);
  const StreamOutcome o = stream.get();
  INFO("the stream: " << k3::test::outcome_name(o.kind) << " after " << o.tokens << " tokens: " << o.error);
  CHECK(o.kind == StreamOutcome::Kind::ErrorEvent);
  CHECK(o.tokens > 0);
  CHECK(o.tokens < 2000u);
  ::kill(c.proc->pid(), SIGTERM);
  c.proc->wait_exit(30s);
}
