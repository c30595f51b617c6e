// k3-cluster render --target slurm on a spec spread over several nodes: the router on the first node,
// the other processes `--per-node` to a node in spec order, every endpoint naming the node its peer
// runs on, GPUs asked for with the cuda backend, and the API key in no rendered line. (The script is run
// for real on one node by test_slurm_job.cpp.)
#include <catch2/catch.hpp>

#include <fstream>

#include "deploy/render_slurm.h"
#include "tests/support/run_command.h"

using namespace k3;

namespace {

// The srun line of process `name` and the text of its step script.
std::string step_of(const std::string& script, const std::string& name, std::string& srun) {
  std::string file = name;
  for (char& c : file)
    if (c == '/') c = '_';
  const auto begin = script.find("steps/" + file + ".sh\" <<'K3_STEP'");
  REQUIRE(begin != std::string::npos);
  const auto end = script.find("\nK3_STEP\n", begin);
  const auto line_end = script.find('\n', end + 9);
  srun = script.substr(end + 9, line_end - end - 9);
  return script.substr(begin, end - begin);
}

// The script of `raw` with --bin-dir /opt/k3/bin and --per-node `per_node`, which bash parses.
std::string rendered(const nlohmann::json& raw, int per_node) {
  auto spec = deploy::parse_cluster_spec(raw);
  REQUIRE(spec.is_ok());
  auto script = deploy::render_slurm(*spec, raw, deploy::SlurmOptions{.bin_dir = "/opt/k3/bin", .per_node = per_node});
  REQUIRE(script.is_ok());
  test::TempDir dir("render-slurm");
  std::ofstream(dir.path() + "/k3.sbatch") << *script;
  CHECK(test::run_command("bash -n " + dir.path() + "/k3.sbatch").exit_code == 0);
  return *script;
}

}  // namespace

TEST_CASE("render_slurm places processes per node and points every endpoint at its peer's node", "[deploy][slurm]") {
  const nlohmann::json raw = {{"model", "/models/k3"},
                              {"router", {{"port", 8100}}},
                              {"prefill", {{{"id", "p"}, {"stages", 2}}, {{"id", "q"}, {"stages", 2}}}},
                              {"decode", {{{"id", "d"}, {"ranks", 2}}}},
                              {"backend", "cuda"}};
  const std::string s = rendered(raw, 2);
  // 7 processes: router + 2 decode ranks + 4 stages; 6 after the router, 2 a node -> 3 nodes.
  CHECK(s.find("#SBATCH --nodes=3\n") != std::string::npos);
  CHECK(s.find("#SBATCH --ntasks=7\n") != std::string::npos);
  CHECK(s.find("#SBATCH --gres=gpu:2\n") != std::string::npos);
  CHECK(s.find("k3-cluster\" keys --spec") != std::string::npos);
  CHECK(s.find("echo \"ENDPOINT http://${K3_HOSTS[0]}:8100\"") != std::string::npos);

  std::string srun;
  step_of(s, "router", srun);
  CHECK(srun.find("--nodelist=\"${K3_HOSTS[0]}\"") != std::string::npos);
  const std::string d1 = step_of(s, "decode/d-1", srun);  // process 2: node 0
  CHECK(srun.find("--nodelist=\"${K3_HOSTS[0]}\"") != std::string::npos);
  CHECK(srun.find("--gres=gpu:1") != std::string::npos);
  CHECK(d1.find("'--bind' \"tcp://${K3_ADDR}:5701\"") != std::string::npos);
  CHECK(d1.find("'--rank' '1' '--dp-size' '2'") != std::string::npos);
  CHECK(d1.find("unset K3_API_KEY") != std::string::npos);
  // prefill q (instance 1) feeds decode rank 1 (d-1, on node 0); its stage 0 (process 5: node 2) pushes
  // to its stage 1 (process 6: node 2, global stage 3 -> port 5803).
  const std::string q0 = step_of(s, "prefill/q/0", srun);
  CHECK(srun.find("--nodelist=\"${K3_HOSTS[2]}\"") != std::string::npos);
  CHECK(q0.find("'--decode-endpoint' \"tcp://${K3_HOST_0}:5701\"") != std::string::npos);
  CHECK(q0.find("'--next-endpoint' \"tcp://${K3_HOST_2}:5803\"") != std::string::npos);
  CHECK(q0.find("'--router-endpoint' \"tcp://${K3_HOST_0}:5600\"") != std::string::npos);
  CHECK(q0.find("'--control-key' \"${K3_RUN_DIR}/keys/prefill_q_0.key\"") != std::string::npos);
  const std::string q1 = step_of(s, "prefill/q/1", srun);
  CHECK(q1.find("'--listen' \"tcp://${K3_ADDR}:5803\"") != std::string::npos);
  // prefill p (instance 0) feeds decode rank 0.
  CHECK(step_of(s, "prefill/p/0", srun).find("'--decode-endpoint' \"tcp://${K3_HOST_0}:5700\"") != std::string::npos);
  step_of(s, "prefill/p/1", srun);
  CHECK(srun.find("--nodelist=\"${K3_HOSTS[1]}\"") != std::string::npos);  // process 4: node 1
}

TEST_CASE("render_slurm with the cpu backend overcommits instead of asking for GPUs", "[deploy][slurm]") {
  const nlohmann::json raw = {{"model", "/m"}, {"prefill", {{{"id", "p"}}}}, {"decode", {{{"id", "d"}}}}};
  auto spec = deploy::parse_cluster_spec(raw);
  REQUIRE(spec.is_ok());
  auto script = deploy::render_slurm(*spec, raw, deploy::SlurmOptions{.bin_dir = "/b"});
  REQUIRE(script.is_ok());
  CHECK(script->find("#SBATCH --nodes=1\n") != std::string::npos);
  CHECK(script->find("#SBATCH --overcommit\n") != std::string::npos);
  CHECK(script->find("gres") == std::string::npos);
  CHECK(deploy::render_slurm(*spec, raw, deploy::SlurmOptions{.per_node = -1}).status().message().find("--per-node") !=
        std::string::npos);
}

TEST_CASE("render_slurm runs each decode rank group as one step on one node", "[deploy][slurm]") {
  // DP2 x EP2 over NCCL (a GPU per rank) and one prefill stage, 4 processes a node: both groups on node 0
  // (4 GPUs), the stage on node 1. The router counts for no node's share.
  const nlohmann::json raw = {{"model", "/models/k3"},
                              {"prefill", {{{"id", "p"}, {"stages", 1}}}},
                              {"decode", {{{"id", "d"}, {"dp", 2}, {"ep", 2}, {"collectives", "nccl"}}}},
                              {"backend", "cuda"}};
  const std::string s = rendered(raw, 4);
  CHECK(s.find("#SBATCH --nodes=2\n") != std::string::npos);
  CHECK(s.find("#SBATCH --ntasks=4\n") != std::string::npos);   // router, two groups, one stage
  CHECK(s.find("#SBATCH --gres=gpu:4\n") != std::string::npos);  // node 0: two groups of two GPUs
  CHECK(s.find("#SBATCH --exclusive\n") != std::string::npos);     // the steps' CPUs and GPUs are on their nodes
  std::string srun;
  const std::string d1 = step_of(s, "decode/d-1", srun);
  CHECK(srun.find("--nodelist=\"${K3_HOSTS[0]}\"") != std::string::npos);
  CHECK(srun.find("--gres=gpu:2 --cpus-per-task=2") != std::string::npos);  // a CPU per process of the group
  // The leader of d-1 is global rank 2: control port 5702, communicator 6002 on the node's loopback.
  CHECK(d1.find("'--bind' \"tcp://${K3_ADDR}:5702\"") != std::string::npos);
  CHECK(d1.find("'--dp-size' '4'") != std::string::npos);
  CHECK(d1.find("'--group-rank' '1' '--interface' \"${K3_ADDR}\" '--device' '1'") != std::string::npos);
  CHECK(d1.find("'--group-endpoint' 'tcp://127.0.0.1:6002'") != std::string::npos);
  CHECK(d1.find("'--control-key' \"${K3_RUN_DIR}/keys/decode_d-1_1.key\"") != std::string::npos);
  CHECK(d1.find("wait $leader") != std::string::npos);
  CHECK(s.find("steps/decode_d-1_1.sh") == std::string::npos);  // a member has no step of its own
  step_of(s, "prefill/p/0", srun);
  CHECK(srun.find("--nodelist=\"${K3_HOSTS[1]}\"") != std::string::npos);
  CHECK(srun.find("--gres=gpu:1") != std::string::npos);
  CHECK(step_of(s, "prefill/p/0", srun).find("'--decode-endpoint' \"tcp://${K3_HOST_0}:5702\"") != std::string::npos);

  // A group is never split over nodes: fewer processes a node than a group has is named.
  const auto too_small = deploy::render_slurm(deploy::parse_cluster_spec(raw).value(), raw,
                                              deploy::SlurmOptions{.bin_dir = "/opt/k3/bin", .per_node = 1});
  REQUIRE(!too_small.is_ok());
  CHECK(too_small.status().message().find("--per-node 1 is less than the 2 processes of rank group decode/d-0") !=
        std::string::npos);
}

TEST_CASE("k3-cluster render writes rank groups for both targets, and a DCP rank of one as one process", "[deploy][slurm]") {
  test::TempDir dir("render-groups");
  for (const char* target : {"slurm", "k8s"}) {
    const auto r = test::run_command(std::string(K3_BIN_DIR) + "/k3-cluster render --target " + target + " --spec " +
                                     K3_SOURCE_DIR + "/deploy/cluster-ep.json --out " + dir.path() + "/" + target + " 2>&1");
    INFO(target << ": " << r.out);
    CHECK(r.exit_code == 0);
  }
  // One rank with kv_partitions 2 runs the rank-sliced forward alone: its flags, no members, no communicator.
  std::ifstream in(std::string(K3_SOURCE_DIR) + "/deploy/cluster-ep.json");
  nlohmann::json raw = nlohmann::json::parse(in);
  raw["decode"][0].erase("ep");
  raw["decode"][0]["kv_partitions"] = 2;
  auto spec = deploy::parse_cluster_spec(raw);
  REQUIRE(spec.is_ok());
  auto script = deploy::render_slurm(*spec, raw, deploy::SlurmOptions{.bin_dir = "/b"});
  REQUIRE(script.is_ok());
  std::string srun;
  const std::string d0 = step_of(*script, "decode/d-0", srun);
  CHECK(d0.find("'--group-dcp' '1'") != std::string::npos);
  CHECK(d0.find("'--kv-partitions' '2'") != std::string::npos);
  CHECK(d0.find("--group-endpoint") == std::string::npos);
  CHECK(d0.find("'--group-rank'") == std::string::npos);
}
