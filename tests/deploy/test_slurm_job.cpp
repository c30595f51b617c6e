// The rendered sbatch script, run for real: a local slurmctld + slurmd + munged on 127.0.0.1
// (local_slurm.h), `k3-cluster render --target slurm` from a k3-tiny spec (router + prefill PP2 +
// decode DP1, each its own srun step), sbatch, wait for /health and every node registered, greedy
// completions equal to k3-generate's tokens, then scancel and nothing of the job left running.
#include <catch2/catch.hpp>
#include <dirent.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/deploy/local_slurm.h"
#include "tests/deploy/serving_checks.h"
#include "tests/support/generate_reference.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::run_command;

namespace {

// Pids of processes whose command line mentions `needle` (the job's run directory).
std::vector<int> processes_mentioning(const std::string& needle) {
  std::vector<int> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(needle) != std::string::npos) out.push_back(pid);
  }
  ::closedir(d);
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("the rendered sbatch script serves k3-tiny on a real local Slurm and scancel stops all of it", "[deploy][slurm]") {
  k3::test::TempDir tmp("slurm-job");
  REQUIRE(!tmp.path().empty());
  struct { std::string p; const std::string& path() const { return p; } } dir{std::filesystem::canonical(tmp.path()).string()};
  k3::test::LocalSlurm slurm(dir.path() + "/slurm");

  const std::string model = dir.path() + "/model";
  REQUIRE(run_command(std::string(K3_BIN_DIR) + "/k3-genweights --preset k3-tiny --seed 0 --out " + model +
                      " --quiet >/dev/null").exit_code == 0);
  // Every port of the job from one block of free ones: HTTP, control, the decode rank, prefill stage 1
  // (--prefill-port + 1) and a metrics port per node (--metrics-port + 0, 1, 2).
  const int base = k3::free_tcp_ports(7);
  REQUIRE(base > 0);
  const int http_port = base;
  const json spec = {{"model", model},
                     {"router", {{"port", http_port}}},
                     {"prefill", json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", 16}}})},
                     {"decode", json::array({{{"id", "d"}, {"ranks", 1}}})},
                     {"threads", 1},
                     {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 10}}}};
  std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
  const int decode_port = base + 2, stage1_port = base + 3;
  auto rendered = run_command(std::string(K3_BIN_DIR) + "/k3-cluster render --target slurm --spec " + dir.path() +
                              "/spec.json --out " + dir.path() + " --job-name k3slurmtest --control-port " +
                              std::to_string(base + 1) + " --decode-port " + std::to_string(decode_port) +
                              " --prefill-port " + std::to_string(stage1_port - 1) + " --metrics-port " +
                              std::to_string(base + 4));
  REQUIRE(rendered.exit_code == 0);

  auto submitted = run_command("cd " + dir.path() + " && " + slurm.env() + "sbatch --parsable k3slurmtest.sbatch");
  REQUIRE(submitted.exit_code == 0);
  const std::string job = submitted.out.substr(0, submitted.out.find_first_of(";\n"));
  const std::string run_dir = dir.path() + "/k3slurmtest-" + job;
  INFO("job " << job << ", run dir " << run_dir);

  const auto submitted_at = std::chrono::steady_clock::now();
  const auto deadline = submitted_at + 240s;
  while (!k3::test::cluster_serving(http_port)) {
    const auto state = run_command(slurm.env() + "squeue -h -j " + job + " -o %T").out;
    INFO("job state: " << state << "\njob output:\n" << slurp(dir.path() + "/k3slurmtest-" + job + ".out") << "\nlogs:\n"
                       << run_command("tail -n 20 " + run_dir + "/logs/*.log 2>&1").out);
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    REQUIRE(state.find("FAILED") == std::string::npos);
    std::this_thread::sleep_for(500ms);
  }
  const std::chrono::duration<double> up = std::chrono::steady_clock::now() - submitted_at;
  std::printf("sbatch -> serving (every node registered) in %.2f s\n", up.count());
  // The job printed where it serves; every process is one srun step.
  CHECK(slurp(dir.path() + "/k3slurmtest-" + job + ".out").find("ENDPOINT http://localhost:" + std::to_string(http_port)) !=
        std::string::npos);
  const auto steps = run_command(slurm.env() + "squeue -h -s -j " + job + " -o %j").out;
  for (const char* name : {"router", "decode/d", "prefill/p/0", "prefill/p/1"}) CHECK(steps.find(name) != std::string::npos);

  for (const auto& prompt : {std::vector<int32_t>{5, 17, 42, 7, 99, 3, 250, 11, 64, 8, 21, 300, 2, 45, 77, 19, 6, 120},
                             std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}})
    CHECK(k3::test::greedy_completion(http_port, prompt, 6) == k3::test::k3_generate_tokens(model, prompt, 6));

  CHECK(!processes_mentioning(run_dir).empty());
  const auto cancelled_at = std::chrono::steady_clock::now();
  REQUIRE(run_command(slurm.env() + "scancel " + job).exit_code == 0);
  CHECK(slurm.cancel_all(60s));
  const auto gone = std::chrono::steady_clock::now() + 30s;
  while (!processes_mentioning(run_dir).empty() && std::chrono::steady_clock::now() < gone) std::this_thread::sleep_for(200ms);
  CHECK(processes_mentioning(run_dir).empty());
  const std::chrono::duration<double> stopped = std::chrono::steady_clock::now() - cancelled_at;
  std::printf("scancel -> no process of the job left in %.2f s\n", stopped.count());
  CHECK(!k3::test::cluster_serving(http_port));
}
