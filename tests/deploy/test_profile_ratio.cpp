// k3-bench profile measures a real k3-tiny cluster (one prefill instance, one decode rank, spawned for the
// run) and writes the profile k3-plan ratio reads: every figure positive, the file accepted, a
// recommendation with a binding constraint printed, and the share of a core the measured node had.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>

#include "tests/support/run_command.h"

using namespace k3;
using nlohmann::json;

TEST_CASE("k3-bench profile on a k3-tiny cluster feeds k3-plan ratio", "[deploy][plan]") {
  test::TempDir dir("profile-ratio");
  const json spec = {{"model", dir.path() + "/model"},
                     {"generate", {{"preset", "k3-tiny"}, {"seed", 0}}},
                     {"router", {{"host", "127.0.0.1"}, {"port", 0}}},
                     {"prefill", json::array({{{"id", "p"}, {"stages", 1}, {"chunk_size", 64}}})},
                     {"decode", json::array({{{"id", "d"}, {"ranks", 1}, {"max_requests", 8}}})},
                     {"threads", 1}};
  std::ofstream(dir.path() + "/spec.json") << spec.dump();
  const std::string profile = dir.path() + "/profile.json";
  auto r = test::run_command(std::string(K3_BIN_DIR) + "/k3-bench profile --spawn-cluster " + dir.path() +
                             "/spec.json --model model --input-lens 16,64 --batches 1,2 --output-len 8 --reps 1 --out " +
                             profile + " 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  std::ifstream in(profile);
  const json p = json::parse(in);
  REQUIRE(p.at("prefill").size() == 2);
  REQUIRE(p.at("decode").size() == 2);
  for (const auto& e : p.at("prefill")) CHECK(e.at("seconds").get<double>() > 0);
  for (const auto& e : p.at("decode")) CHECK(e.at("itl_ms").get<double>() > 0);
  CHECK(p.at("decode_max_requests") == 8);
  // The share of a core the busy node had while measured (less than 1 when other work shares the host).
  CHECK(p.at("threads_per_process") == 1);
  CHECK(p.at("cores_per_process").get<double>() > 0);
  CHECK(p.at("cores_per_process").get<double>() <= 1);

  auto plan = test::run_command(std::string(K3_BIN_DIR) + "/k3-plan ratio --profile " + profile +
                                " --rate 2 --input 64 --output 8 --ttft-ms 5000 --itl-ms 1000 --total 4 --json");
  INFO(plan.out);
  REQUIRE(plan.exit_code == 0);
  const json j = json::parse(plan.out);
  CHECK(j.at("prefill_instances").get<int>() + j.at("decode_ranks").get<int>() == 4);
  CHECK(j.at("goodput_rps").get<double>() > 0);
  CHECK(!j.at("binding").get<std::string>().empty());
}
