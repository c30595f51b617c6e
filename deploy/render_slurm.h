// `k3-cluster render --target slurm`: one sbatch script from a cluster spec. The script writes the spec
// (without its API key) and the control-plane keys into a run directory on the shared filesystem,
// then starts every process of the spec with its own `srun` step pinned to a node of the allocation:
// the router on the first node, the decode ranks and prefill stages after it, `per_node` to a node.
// A decode rank group is one step (its leader and members on one node, node_commands.h's unit script,
// with a GPU per rank over NCCL) and counts as its processes towards `per_node`.
// Each step binds the address its node's name resolves to (or $K3_ADDR) on a fixed port
// (node_commands.h) and restarts its process when it exits with an error (up to $K3_MAX_RESTARTS times;
// the restarted process registers again). The job runs until it is cancelled (scancel).
#pragma once
#include <string>

#include "deploy/cluster_spec.h"
#include "deploy/node_commands.h"

namespace k3::deploy {

struct SlurmOptions {
  std::string bin_dir;         // where k3-* are on the compute nodes (the script's default for $K3_BIN)
  std::string job_name = "k3serve";
  int per_node = 0;            // processes (besides the router) per node; 0: all on one node
  std::string partition;       // sbatch --partition; empty: the cluster's default
  std::string time_limit;      // sbatch --time; empty: the partition's default
  PortLayout ports;
};

// `raw`: the spec file's JSON as the rendered files carry it (spec_for_render).
Result<std::string> render_slurm(const ClusterSpec& spec, const nlohmann::json& raw, const SlurmOptions& opt);

}  // namespace k3::deploy
