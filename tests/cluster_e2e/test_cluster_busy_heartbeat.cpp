// A prefill stage busy with one prompt chunk for longer than the heartbeat timeout stays alive: real
// k3-router (cluster mode), k3-decode and one k3-prefill stage, all with a 25 ms heartbeat and 16 misses
// (400 ms of silence = dead), and a 1000-token prompt computed as a single chunk that takes well over
// that on an idle core (k3-tiny's shapes with 64 layers instead of 8, two of them MLA; with 24 layers a
// faster host of the same kind computed it in 315 ms, and the test proved nothing). The stage
// sends the heartbeats due inside the chunk's forward, after each layer's attention and FFN; the longest
// of those stretches, an MLA attention, takes about 75 ms here, so the gap between heartbeats stays far
// inside the window even when the machine is loaded several times over. The request ends with
// k3-generate's tokens, the router declares no node dead, and the stage, reading its sockets only after
// the chunk, declares no peer dead either (it drains what queued up before it judges silence).
// The chunk's compute time comes from the stage's own log and must exceed the 400 ms, or the test
// would prove nothing.
#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <regex>
#include <string>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/paired_nodes.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/support/generate_reference.h"
#include "tests/support/run_command.h"
#include "tests/support/scratch_dir.h"

using namespace std::chrono_literals;
using k3::test::ProcessGuard;
using k3::test::StreamOutcome;

namespace {

const std::string kBin = K3_BIN_DIR;
const std::vector<std::string> kHeartbeat{"--heartbeat-ms", "25", "--heartbeat-misses", "16"};
constexpr long kDeadAfterMs = 25 * 16;

// Every line `p` printed so far (its log goes to stdout too), up to a second of quiet.
std::string printed_lines(ProcessGuard& p) {
  std::string all;
  while (auto line = p.read_line(1s)) all += *line + "\n";
  return all;
}

}  // namespace

TEST_CASE("cluster: a prefill chunk longer than the heartbeat timeout does not make the stage look dead",
          "[cluster_e2e][heartbeat]") {
  k3::testing::ScratchDir dir("busy-heartbeat");
  const std::string model = dir.file("model");
  // k3-tiny with 64 layers: a longer forward made of stretches as short as k3-tiny's.
  constexpr int kLayers = 64;
  const std::string tiny = dir.file("tiny");
  REQUIRE(k3::test::run_command(kBin + "/k3-genweights --preset k3-tiny --config-only --out '" + tiny + "'").exit_code == 0);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(tiny + "/config.json"));
  cfg["num_hidden_layers"] = kLayers;
  cfg["linear_attn_config"]["full_attn_layers"] = {kLayers / 2, kLayers};
  std::vector<int> kda;
  for (int l = 1; l <= kLayers; ++l)
    if (l != kLayers / 2 && l != kLayers) kda.push_back(l);
  cfg["linear_attn_config"]["kda_layers"] = kda;
  std::ofstream(dir.file("config_deep.json")) << cfg.dump();
  REQUIRE(k3::test::run_command(kBin + "/k3-genweights --config '" + dir.file("config_deep.json") + "' --seed 0 --out '" +
                                model + "'").exit_code == 0);
  k3::test::PairedNodes nodes(model, kHeartbeat);
  nodes.start_router();
  ProcessGuard& decode = nodes.start_decode();
  // One chunk holds the whole prompt: the stage does not poll its sockets until all of it is computed.
  ProcessGuard& prefill = nodes.start_prefill(k3::test::wait_line(decode, "READY "),
                                              {"--chunk-size", "1024", "--log-level", "debug"});
  nodes.wait_healthy();
  const int port = nodes.port();

  std::mt19937 rng(7);
  const std::vector<int32_t> prompt = k3::test::random_tokens(rng, k3::test::model_vocab(model), 1000);
  constexpr int kMaxTokens = 4;
  const StreamOutcome r = k3::test::stream_completion(port, prompt, kMaxTokens, 120s);
  // Read after the request ended: a peer the stage declared dead after the chunk would be logged by now.
  const std::string log = printed_lines(prefill);
  INFO("the stage's output:\n" << log);
  INFO(k3::test::outcome_name(r.kind) << " " << r.error);
  REQUIRE(r.kind == StreamOutcome::Kind::Done);
  CHECK(r.ids == k3::test::k3_generate_tokens(model, prompt, kMaxTokens, "--prefill-chunk 1024"));

  // The chunk really kept the stage from its sockets for longer than the timeout.
  const std::regex chunk_line(R"re(chunk \[0, 1000\) computed in (\d+) ms)re");
  std::smatch m;
  REQUIRE(std::regex_search(log, m, chunk_line));
  const long chunk_ms = std::stol(m[1].str());
  INFO("chunk took " << chunk_ms << " ms");
  CHECK(chunk_ms > kDeadAfterMs);
  // Nobody was declared dead: not the stage by the router (nor decode, whose failure would have failed
  // the request above), not the stage's peers by the stage.
  const auto metrics = k3::test::read_metrics(port);
  CHECK(k3::test::metric_sum(metrics, "k3_cluster_node_failures_total") == 0);
  CHECK(k3::test::metric_sum(metrics, "k3_cluster_request_failures_total") == 0);
  CHECK(log.find("down (") == std::string::npos);
}
