// k3-cluster render --target k8s: the Kustomize base and both overlays build with kubectl kustomize,
// every resource passes kubernetes-validate (strict) against the Kubernetes schemas, and the layout is
// the spec's (a StatefulSet per prefill instance and decode group, a pod per stage / rank, probes,
// GPUs in the k3 overlay, the model generated in the k3-tiny-cpu one): tests/deploy/check_manifests.py.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "deploy/node_commands.h"
#include "tests/deploy/deploy_tools.h"
#include "transfer/cluster_key_files.h"

using namespace k3;
using k3::test::run_command;

namespace {

const char* kSpec = R"({
  "model": "models/k3-tiny",
  "router": {"port": 8000, "api_key": "not-in-any-manifest"},
  "prefill": [{"id": "p", "stages": 2, "chunk_size": 64}, {"id": "q", "stages": 3, "partition": [3, 3, 2]}],
  "decode": [{"id": "d", "ranks": 1}, {"id": "e", "ranks": 2}],
  "backend": "cpu"
})";

std::string write_spec(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/spec.json";
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("rendered Kubernetes manifests build and validate against the schemas", "[deploy][k8s]") {
  const std::string kubectl = test::deploy_tool("kubectl"), python = test::deploy_tool("python3");
  INFO("kubectl and a python3 with kubernetes-validate come from tests/requirements.txt (tools/test.sh installs them)");
  REQUIRE(!kubectl.empty());
  REQUIRE(run_command(python + " -c 'import kubernetes_validate, yaml'").exit_code == 0);
  test::TempDir dir("render-k8s");
  const std::string spec = write_spec(dir.path(), kSpec);
  auto r = run_command(std::string(K3_BIN_DIR) + "/k3-cluster render --target k8s --spec " + spec + " --out " +
                       dir.path() + "/out --image registry.example/k3serve:1");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("RENDERED " + dir.path() + "/out/base/prefill-q.yaml") != std::string::npos);
  // Pods bind every interface and announce their pod IP; every prefill stage may feed every decode rank.
  {
    std::ifstream in(dir.path() + "/out/base/decode-e.yaml");
    const std::string y((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(y.find("'--bind' 'tcp://0.0.0.0:") != std::string::npos);
    CHECK(y.find("'--advertise-host' \"${K3_ADDR}\"") != std::string::npos);
    std::ifstream pin(dir.path() + "/out/base/prefill-q.yaml");
    const std::string py((std::istreambuf_iterator<char>(pin)), std::istreambuf_iterator<char>());
    for (const char* d : {"'--decode-instance' 'd'", "'--decode-instance' 'e-0'", "'--decode-instance' 'e-1'"}) {
      INFO(d);
      CHECK(py.find(d) != std::string::npos);
    }
  }
  // No manifest carries the API key.
  CHECK(run_command("grep -rl not-in-any-manifest " + dir.path() + "/out").out.empty());
  const auto check = run_command(python + " " + K3_SOURCE_DIR + "/tests/deploy/check_manifests.py " + dir.path() +
                                 "/out " + kubectl + " '{\"prefill\": {\"p\": 2, \"q\": 3}, \"decode\": {\"d\": 1, \"e\": 2}}' 2>&1");
  INFO(check.out);
  CHECK(check.exit_code == 0);
  CHECK(check.out.find("checked ") != std::string::npos);
}

// Decode rank groups: each DP rank's leader and members in one pod (their communicator on the pod's
// loopback, a GPU per rank over NCCL), the leader's control port on the Service, every member's key in
// the Secret, and the group ended whole when its leader ends.
TEST_CASE("rendered Kubernetes manifests run each decode rank group in one pod", "[deploy][k8s]") {
  const std::string kubectl = test::deploy_tool("kubectl"), python = test::deploy_tool("python3");
  REQUIRE(!kubectl.empty());
  REQUIRE(run_command(python + " -c 'import kubernetes_validate, yaml'").exit_code == 0);
  test::TempDir dir("render-k8s-groups");
  const std::string spec = write_spec(dir.path(), R"({
    "model": "models/k3-tiny",
    "prefill": [{"id": "p", "stages": 1}],
    "decode": [{"id": "g", "dp": 2, "ep": 2, "collectives": "nccl"}, {"id": "c", "dp": 1, "dcp": 2}],
    "backend": "cuda"
  })");
  auto r = run_command(std::string(K3_BIN_DIR) + "/k3-cluster render --target k8s --spec " + spec + " --out " +
                       dir.path() + "/out 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  auto slurp = [&](const std::string& rel) {
    std::ifstream in(dir.path() + "/out/" + rel);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string g = slurp("base/decode-g.yaml"), c = slurp("base/decode-c.yaml"), k = slurp("base/kustomization.yaml");
  // Global ranks: g-0 is 0 and 1, g-1 is 2 and 3, c is 4 and 5; control ports 5700 + the leader's rank.
  CHECK(g.find("'--group-endpoint' 'tcp://127.0.0.1:6000'") != std::string::npos);
  CHECK(g.find("'--group-endpoint' 'tcp://127.0.0.1:6002'") != std::string::npos);
  CHECK(c.find("'--group-endpoint' 'tcp://127.0.0.1:6004'") != std::string::npos);
  CHECK(g.find("'--bind' 'tcp://0.0.0.0:5702'") != std::string::npos);
  CHECK(g.find("'--dp-size' '6'") != std::string::npos);
  CHECK(g.find("'--group-rank' '1' '--interface' \"${K3_ADDR}\" '--device' '1'") != std::string::npos);  // its own GPU
  CHECK(c.find("'--group-rank' '1' '--interface' \"${K3_ADDR}\" '--group-dcp'") != std::string::npos);  // UCX: the group's GPU
  CHECK(g.find("wait $leader") != std::string::npos);
  // The group's processes talk through shared memory: a memory-backed /dev/shm, only where a pod runs several.
  CHECK(g.find("mountPath: \"/dev/shm\"") != std::string::npos);
  CHECK(g.find("medium: \"Memory\"") != std::string::npos);
  CHECK(slurp("base/prefill-p.yaml").find("/dev/shm") == std::string::npos);
  // Each member serves its own /metrics next to the leader's: a container port each, the same in every pod.
  CHECK(g.find("'--group-rank' '1'") != std::string::npos);
  CHECK(g.find("'--metrics-listen' '0.0.0.0:9601'") != std::string::npos);
  CHECK(g.find("name: \"rank-1\"") != std::string::npos);
  for (const char* key : {"keys/decode_g-0_1.key", "keys/decode_g-1_1.key", "keys/decode_c_1.key"}) {
    INFO(key);
    CHECK(k.find(key) != std::string::npos);
  }
  // The prefill stage reaches each group's leader at its pod's name and port.
  CHECK(slurp("base/prefill-p.yaml").find("'--decode-endpoint' 'tcp://k3-decode-g-1.k3-decode-g:5702'") != std::string::npos);
  const auto check = run_command(python + " " + K3_SOURCE_DIR + "/tests/deploy/check_manifests.py " + dir.path() +
                                 "/out " + kubectl + " '{\"prefill\": {\"p\": 1}, \"decode\": {\"g\": {\"pods\": 2, " +
                                 "\"group\": 2, \"gpus\": 2}, \"c\": {\"pods\": 1, \"group\": 2, \"gpus\": 1}}}' 2>&1");
  INFO(check.out);
  CHECK(check.exit_code == 0);
}

TEST_CASE("the key file names the manifests mount are the ones k3-cluster keys writes", "[deploy][k8s]") {
  test::TempDir dir("render-keys");
  const std::vector<std::string> names = {"router", "decode/e-1", "prefill/q/2"};
  auto keys = transfer::ClusterKeyFiles::write(dir.path() + "/keys", names);
  REQUIRE(keys.is_ok());
  for (const auto& n : names) CHECK(keys->keypair(n) == dir.path() + "/keys/" + deploy::key_file_of(n));
  CHECK(keys->public_keys() == dir.path() + "/keys/public_keys");
}

TEST_CASE("render refuses ids Kubernetes cannot name, and names the field", "[deploy][k8s]") {
  test::TempDir dir("render-bad");
  const std::string spec = write_spec(dir.path(), R"({"model": "m", "prefill": [{"id": "P_1"}], "decode": [{"id": "d"}]})");
  auto r = run_command(std::string(K3_BIN_DIR) + "/k3-cluster render --target k8s --spec " + spec + " --out " +
                       dir.path() + "/out 2>&1");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("prefill[0].id: 'P_1' must be a DNS label") != std::string::npos);
}
