// Every node's own Prometheus endpoint, against real processes (cluster-mode k3-router, one k3-prefill
// stage, one k3-decode): `--metrics-listen 127.0.0.1:0` makes each print "METRICS <url>", and after a
// request each serves what it counted there and nowhere else: decode the transfer bytes it received and
// its region, prefill the bytes it put and its source arena (whole again once the request released it).
// A malformed address stops the node at start with the flag named. The nodes run with their default
// flags: their heartbeat default now agrees with the router's (it did not, 1000 ms against the router's
// 200 ms x 3 misses, and a cluster started by hand flapped: "the generation service is not ready").
#include <catch2/catch.hpp>

#include <string>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/paired_nodes.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/support/run_command.h"
#include "tests/support/scratch_dir.h"

using namespace std::chrono_literals;
using k3::test::ProcessGuard;
using k3::test::StreamOutcome;

namespace {
const std::string kBin = K3_BIN_DIR;

// The port of "http://127.0.0.1:PORT/metrics".
int port_of(const std::string& url) {
  const auto colon = url.rfind(':');
  return std::stoi(url.substr(colon + 1, url.find('/', colon) - colon - 1));
}
}  // namespace

TEST_CASE("k3-prefill and k3-decode serve their own /metrics with --metrics-listen", "[cluster_e2e][metrics]") {
  k3::testing::ScratchDir dir("node-metrics");
  const std::string model = dir.file("model");
  REQUIRE(k3::test::run_command(kBin + "/k3-genweights --preset k3-tiny --seed 0 --out '" + model + "'").exit_code == 0);
  k3::test::PairedNodes nodes(model, {});
  nodes.start_router();
  ProcessGuard& decode = nodes.start_decode({"--metrics-listen", "127.0.0.1:0"});
  const int decode_port = port_of(k3::test::wait_line(decode, "METRICS "));
  ProcessGuard& prefill = nodes.start_prefill(k3::test::wait_line(decode, "READY "), {"--metrics-listen", "127.0.0.1:0"});
  const int prefill_port = port_of(k3::test::wait_line(prefill, "METRICS "));
  nodes.wait_healthy();

  std::vector<int32_t> prompt(300);
  for (int i = 0; i < 300; ++i) prompt[i] = 10 + (i * 17) % 490;
  const StreamOutcome r = k3::test::stream_completion(nodes.port(), prompt, 8, 120s);
  INFO(k3::test::outcome_name(r.kind) << " " << r.error);
  REQUIRE(r.kind == StreamOutcome::Kind::Done);

  const auto d = k3::test::read_metrics(decode_port);
  CHECK(k3::test::metric_or(d, "k3_transfer_bytes_total") > 0);
  CHECK(k3::test::metric_or(d, "k3_transfer_region_bytes{memory=\"host\",region=\"0\"}") > 0);
  CHECK(d.count("k3_transfer_source_bytes_total{memory=\"host\"}") == 0);   // decode puts nothing
  CHECK(k3::test::metric_or(d, "k3_kernels_invariant{backend=\"cpu\"}") == 1);   // the cpu backend's always are

  // The stage's arena (256 MiB by default on the host) is whole again once the request let go of its image.
  const double arena = 256.0 * (1 << 20);
  auto p = k3::test::read_metrics(prefill_port);
  for (auto t0 = std::chrono::steady_clock::now();
       k3::test::metric_or(p, "k3_transfer_source_arena_free_bytes") != arena; std::this_thread::sleep_for(100ms)) {
    REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
    p = k3::test::read_metrics(prefill_port);
  }
  CHECK(k3::test::metric_or(p, "k3_transfer_source_bytes_total{memory=\"host\"}") > 0);
  CHECK(k3::test::metric_or(p, "k3_transfer_source_arena_overflow_total") == 0);
  CHECK(p.count("k3_transfer_region_bytes{memory=\"host\",region=\"0\"}") == 0);   // prefill receives nothing
  CHECK(k3::test::metric_or(p, "k3_kernels_invariant{backend=\"cpu\"}") == 1);

  const auto bad = k3::test::run_command(kBin + "/k3-decode --model '" + model + "' --metrics-listen nonsense 2>&1");
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.out, Catch::Contains("--metrics-listen 'nonsense'"));
}

// A decode rank group (EP2: a leader and a member started by hand): each rank serves its own /metrics
// with its steps and the group's collectives it joined (k3_rank_*), the member too, though it has no
// control plane; both count the same steps, and their collectives fit inside their steps' time.
TEST_CASE("every rank of a decode group serves its steps and collectives on its own /metrics", "[cluster_e2e][metrics]") {
  k3::testing::ScratchDir dir("node-metrics-group");
  const std::string model = dir.file("model");
  REQUIRE(k3::test::run_command(kBin + "/k3-genweights --preset k3-tiny --seed 0 --out '" + model + "'").exit_code == 0);
  k3::test::PairedNodes nodes(model, {});
  nodes.start_router();
  const std::vector<std::string> group = {"--group-ep", "2", "--group-step-deadline-ms", "10000"};
  std::vector<std::string> leader_args = group;
  leader_args.insert(leader_args.end(), {"--metrics-listen", "127.0.0.1:0"});
  ProcessGuard& leader = nodes.start_decode(leader_args);
  const std::string group_ep = k3::test::wait_line(leader, "GROUP ");
  std::vector<std::string> member_args = {"--model", model, "--instance", "d", "--group-rank", "1", "--group-endpoint",
                                          group_ep, "--threads", "1", "--metrics-listen", "127.0.0.1:0"};
  member_args.insert(member_args.end(), group.begin(), group.end());
  ProcessGuard& member = nodes.start("k3-decode", member_args, "decode/d");
  const int leader_port = port_of(k3::test::wait_line(leader, "METRICS "));
  const int member_port = port_of(k3::test::wait_line(member, "METRICS "));
  nodes.start_prefill(k3::test::wait_line(leader, "READY "));
  nodes.wait_healthy();

  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = 7 + (i * 13) % 480;
  const StreamOutcome r = k3::test::stream_completion(nodes.port(), prompt, 6, 120s);
  INFO(k3::test::outcome_name(r.kind) << " " << r.error);
  REQUIRE(r.kind == StreamOutcome::Kind::Done);

  double steps[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const int port = i == 0 ? leader_port : member_port;
    INFO((i == 0 ? "leader" : "member") << " /metrics on port " << port);
    const auto m = k3::test::read_metrics(port);
    steps[i] = k3::test::metric_or(m, "k3_rank_steps_total");
    CHECK(steps[i] >= 5);   // the request's decode steps (the first token came from the prefill)
    const double a2av = k3::test::metric_or(m, "k3_rank_collective_microseconds_total{op=\"all_to_allv\"}");
    CHECK(a2av > 0);        // EP: the tokens' expert dispatch and combine
    CHECK(k3::test::metric_or(m, "k3_rank_collective_bytes_total") > 0);
    double collectives = 0;
    for (const char* op : {"all_gather", "all_to_all", "all_to_allv", "all_reduce"})
      collectives += k3::test::metric_or(m, std::string("k3_rank_collective_microseconds_total{op=\"") + op + "\"}");
    CHECK(collectives <= k3::test::metric_or(m, "k3_rank_step_microseconds_total") + 10);  // rounding per step
    CHECK(k3::test::metric_or(m, "k3_kernels_invariant{backend=\"cpu\"}") == 1);
  }
  CHECK(steps[0] == steps[1]);   // EP ranks join every step
}
