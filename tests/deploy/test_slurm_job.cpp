// The rendered sbatch script, run for real: a local slurmctld + slurmd + munged on 127.0.0.1
// (local_slurm.h), `k3-cluster render --target slurm` from a k3-tiny spec (router + prefill PP2 +
// decode DP1, each its own srun step; and router + prefill + a DP1 x EP2 decode rank group, the group
// one step), sbatch, wait for /health and every node registered, greedy completions equal to
// k3-generate's tokens, then scancel and nothing of the job left running.
#include <catch2/catch.hpp>
#include <dirent.h>
#include <signal.h>
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

// Pids of processes whose command line mentions `needle` (the job's run directory) and `also`.
std::vector<int> processes_mentioning(const std::string& needle, const std::string& also = "") {
  std::vector<int> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(needle) != std::string::npos && cmd.find(also) != std::string::npos) out.push_back(pid);
  }
  ::closedir(d);
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A k3-tiny spec (its "model" and ports filled in here) rendered for Slurm, submitted to a local Slurm,
// served until every node registered, checked against k3-generate's greedy tokens, then cancelled:
// nothing of the job may be left running. `steps`: the srun step names the job must show.
// `logged`: (step log file, a line it must hold) pairs, read while the job serves. `kill_member`: then
// SIGKILL a rank group's member: its step restarts the group whole, which serves the same tokens again.
void serve_on_slurm(const std::string& test_name, json spec, const std::vector<std::string>& steps,
                    const std::vector<std::pair<std::string, std::string>>& logged = {}, bool kill_member = false) {
  k3::test::TempDir tmp(test_name);
  REQUIRE(!tmp.path().empty());
  const std::string dir = std::filesystem::canonical(tmp.path()).string();
  k3::test::LocalSlurm slurm(dir + "/slurm");

  const std::string model = dir + "/model";
  REQUIRE(run_command(std::string(K3_BIN_DIR) + "/k3-genweights --preset k3-tiny --seed 0 --out " + model +
                      " --quiet >/dev/null").exit_code == 0);
  // Every port of the job from one block of free ones: HTTP, control, the decode ranks (+ their global
  // rank), prefill stage 1 (--prefill-port + 1), a metrics port per process (--metrics-port + 0, 1, 2),
  // a rank group's communicator (--group-port + its leader's rank) and its members' metrics
  // (--member-metrics-port + their global rank).
  const int base = k3::free_tcp_ports(10);
  REQUIRE(base > 0);
  const int http_port = base;
  spec["model"] = model;
  spec["router"] = {{"port", http_port}};
  std::ofstream(dir + "/spec.json") << spec.dump(2);
  auto rendered = run_command(std::string(K3_BIN_DIR) + "/k3-cluster render --target slurm --spec " + dir +
                              "/spec.json --out " + dir + " --job-name k3slurmtest --control-port " +
                              std::to_string(base + 1) + " --decode-port " + std::to_string(base + 2) +
                              " --prefill-port " + std::to_string(base + 2) + " --metrics-port " +
                              std::to_string(base + 4) + " --group-port " + std::to_string(base + 7) +
                              " --member-metrics-port " + std::to_string(base + 8) + " 2>&1");
  INFO(rendered.out);
  REQUIRE(rendered.exit_code == 0);

  auto submitted = run_command("cd " + dir + " && " + slurm.env() + "sbatch --parsable k3slurmtest.sbatch");
  REQUIRE(submitted.exit_code == 0);
  const std::string job = submitted.out.substr(0, submitted.out.find_first_of(";\n"));
  const std::string run_dir = dir + "/k3slurmtest-" + job;
  INFO("job " << job << ", run dir " << run_dir);

  const auto submitted_at = std::chrono::steady_clock::now();
  const auto deadline = submitted_at + 240s;
  while (!k3::test::cluster_serving(http_port)) {
    const auto state = run_command(slurm.env() + "squeue -h -j " + job + " -o %T").out;
    INFO("job state: " << state << "\njob output:\n" << slurp(dir + "/k3slurmtest-" + job + ".out") << "\nlogs:\n"
                       << run_command("tail -n 20 " + run_dir + "/logs/*.log 2>&1").out);
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    REQUIRE(state.find("FAILED") == std::string::npos);
    std::this_thread::sleep_for(500ms);
  }
  const std::chrono::duration<double> up = std::chrono::steady_clock::now() - submitted_at;
  std::printf("%s: sbatch -> serving (every node registered) in %.2f s\n", test_name.c_str(), up.count());
  // The job printed where it serves; every process (a rank group: the group) is one srun step.
  CHECK(slurp(dir + "/k3slurmtest-" + job + ".out").find("ENDPOINT http://localhost:" + std::to_string(http_port)) !=
        std::string::npos);
  const auto step_names = run_command(slurm.env() + "squeue -h -s -j " + job + " -o %j").out;
  for (const std::string& name : steps) {
    INFO(name);
    CHECK(step_names.find(name) != std::string::npos);
  }

  for (const auto& [file, line] : logged) {
    INFO(file << " should hold '" << line << "'");
    CHECK(slurp(run_dir + "/logs/" + file).find(line) != std::string::npos);
  }

  for (const auto& prompt : {std::vector<int32_t>{5, 17, 42, 7, 99, 3, 250, 11, 64, 8, 21, 300, 2, 45, 77, 19, 6, 120},
                             std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}})
    CHECK(k3::test::greedy_completion(http_port, prompt, 6) == k3::test::k3_generate_tokens(model, prompt, 6));

  if (kill_member) {
    const std::vector<int> members = processes_mentioning(run_dir, "--group-rank");
    REQUIRE(members.size() == 1);
    const auto killed_at = std::chrono::steady_clock::now();
    REQUIRE(::kill(members[0], SIGKILL) == 0);
    // The leader fails the group and ends; the step stops the unit and starts it again (restart 1): the
    // new member joins the new leader (a second MEMBER line), which registers with the router.
    auto count = [](const std::string& text, const std::string& what) {
      size_t n = 0;
      for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
      return n;
    };
    const auto back_by = killed_at + 120s;
    for (;;) {
      const std::string log = slurp(run_dir + "/logs/decode_d.log");
      if (log.find("restart 1 of") != std::string::npos && count(log, "MEMBER 1 of ") >= 2 &&
          k3::test::cluster_serving(http_port))
        break;
      INFO("decode step log:\n" << log);
      REQUIRE(std::chrono::steady_clock::now() < back_by);
      std::this_thread::sleep_for(250ms);
    }
    const std::chrono::duration<double> back = std::chrono::steady_clock::now() - killed_at;
    std::printf("%s: member killed -> the group restarted and registered in %.2f s\n", test_name.c_str(), back.count());
    CHECK(processes_mentioning(run_dir, "--group-rank").size() == 1);   // a new member, the old one reaped
    const std::vector<int32_t> prompt = {9, 8, 7, 6, 5, 4, 3, 2, 1};
    CHECK(k3::test::greedy_completion(http_port, prompt, 6) == k3::test::k3_generate_tokens(model, prompt, 6));
  }

  CHECK(!processes_mentioning(run_dir).empty());
  const auto cancelled_at = std::chrono::steady_clock::now();
  REQUIRE(run_command(slurm.env() + "scancel " + job).exit_code == 0);
  CHECK(slurm.cancel_all(60s));
  const auto gone = std::chrono::steady_clock::now() + 30s;
  while (!processes_mentioning(run_dir).empty() && std::chrono::steady_clock::now() < gone) std::this_thread::sleep_for(200ms);
  CHECK(processes_mentioning(run_dir).empty());
  const std::chrono::duration<double> stopped = std::chrono::steady_clock::now() - cancelled_at;
  std::printf("%s: scancel -> no process of the job left in %.2f s\n", test_name.c_str(), stopped.count());
  CHECK(!k3::test::cluster_serving(http_port));
}

}  // namespace

TEST_CASE("the rendered sbatch script serves k3-tiny on a real local Slurm and scancel stops all of it", "[deploy][slurm]") {
  serve_on_slurm("slurm-job", {{"prefill", json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", 16}}})},
                               {"decode", json::array({{{"id", "d"}, {"ranks", 1}}})},
                               {"threads", 1},
                               {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 10}}}},
                 {"router", "decode/d", "prefill/p/0", "prefill/p/1"});
}

// A decode rank group (DP1 x EP2: a leader and a member sharing the routed experts) is one srun step
// running both; its tokens are k3-generate's; a member killed restarts the group whole, which serves
// the same tokens again; and scancel ends the member with the rest.
TEST_CASE("the rendered sbatch script serves a decode rank group on a real local Slurm", "[deploy][slurm]") {
  serve_on_slurm("slurm-job-group", {{"prefill", json::array({{{"id", "p"}, {"stages", 1}, {"chunk_size", 16}}})},
                                     {"decode", json::array({{{"id", "d"}, {"dp", 1}, {"ep", 2}}})},
                                     {"threads", 1},
                                     {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 10}}}},
                 {"router", "decode/d", "prefill/p/0"}, {{"decode_d.log", "MEMBER 1 of "}}, true);
}
