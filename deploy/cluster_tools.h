// k3-cluster's tool commands, beside its default job of running a cluster on this machine:
//   k3-cluster render --target k8s|slurm --spec S --out DIR   deployment files from the spec
//   k3-cluster keys --spec S --out DIR                        control-plane keys for every process
//   k3-cluster probe --router URL --node NAME                 0 when the router sees NAME heartbeating
#pragma once

namespace k3::deploy {

// True when argv[1] names a tool command (then cluster_tool_main handles the whole command line).
bool is_cluster_tool(const char* arg);
int cluster_tool_main(int argc, char** argv);

}  // namespace k3::deploy
