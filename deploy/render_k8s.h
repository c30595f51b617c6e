// `k3-cluster render --target k8s`: a Kustomize layout from a cluster spec (docs/DEPLOY.md):
//   base/                 the spec's topology, independent of model size and hardware
//     kustomization.yaml  the resources, the ConfigMap of the spec, the Secret of control-plane keys
//     router.yaml         Deployment (1 replica) + Service k3-router (HTTP and control ports)
//     decode-<id>.yaml    each decode group: a StatefulSet with one pod per rank + its headless Service
//     prefill-<id>.yaml   each prefill instance: a StatefulSet with one pod per PP stage + headless Service
//   overlays/k3-tiny-cpu/ CPU backend; each pod generates the k3-tiny model in an init container
//   overlays/k3/          CUDA backend, one nvidia.com/gpu per node pod, the model on a PVC, long startups
// A pod finds its process from its StatefulSet ordinal (the hostname's suffix). Every process binds
// its pod IP on a fixed port (node_commands.h) and reaches its peers by stable DNS names, so pods start
// in any order and a restarted pod registers again. Probes ask the router whether the node heartbeats
// (`k3-cluster probe`): startup and readiness until it does; liveness fails only while the router is
// reachable and says the node is down.
#pragma once
#include <map>
#include <string>

#include "deploy/cluster_spec.h"
#include "deploy/node_commands.h"

namespace k3::deploy {

struct K8sOptions {
  std::string image = "k3serve:latest";  // holds k3-router, k3-prefill, k3-decode, k3-cluster on PATH
  std::string model_claim = "k3-model";  // base and k3 overlay: a PVC with the model directory
  PortLayout ports;
};

// Relative path -> file text. Ids must be DNS labels (lowercase letters, digits, '-'): errors name the field.
Result<std::map<std::string, std::string>> render_k8s(const ClusterSpec& spec, const nlohmann::json& raw,
                                                      const K8sOptions& opt);

}  // namespace k3::deploy
