// The processes of a cluster spec and the command line each one runs with, for launchers that place
// them on other hosts (the Kubernetes and Slurm renderers). Every process binds a fixed port on an
// address it is given and is reached by a name other processes can resolve (a Service or node name),
// so they can start in any order: ZeroMQ connections retry until the peer is there.
//
// Ports (Layout): the router's control endpoint on control_port; decode rank r (global) binds
// decode_port + r; prefill stage k (global index over all instances' stages, k > 0 within its instance)
// listens on prefill_port + k. Distinct ports let several processes share one host (Slurm); on
// Kubernetes each pod has its own address and the distinct ports are merely harmless.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "deploy/cluster_spec.h"

namespace k3::deploy {

struct PortLayout {
  int control_port = 5600;
  int decode_port = 5700;
  int prefill_port = 5800;
  // Every prefill stage and decode rank serves its own Prometheus /metrics (--metrics-listen) here, or,
  // where processes share a host (NodeContext::metrics_per_process), decode rank r at metrics_port + r
  // and prefill stage k at metrics_port + (decode ranks) + k.
  int metrics_port = 9400;
};

// One process of the deployment.
struct NodeProcess {
  enum class Kind { Router, Decode, Prefill } kind = Kind::Router;
  std::string name;        // control name: "router", "decode/<instance>", "prefill/<id>/<stage>"
  int instance_index = 0;  // index into spec.prefill / spec.decode
  int local_index = 0;     // stage within its prefill instance / rank within its decode group
  int global_index = 0;    // global decode rank / global prefill stage number
  int port = 0;            // what it binds (router: the control port; prefill stage 0: none)
};

// Every process in launch order: the router, the decode ranks (global rank order), then each prefill
// instance's stages in order.
std::vector<NodeProcess> node_processes(const ClusterSpec& spec, const PortLayout& ports);

// The router's --pair values: every prefill instance with every decode process (any prefill instance can
// feed any decode rank or group; the router chooses the decode target per request), prefill-major.
std::vector<std::string> router_pair_flags(const ClusterSpec& spec);

// Where things are, as the command lines name them. Strings may reference shell variables (e.g.
// "${K3_ADDR}") that the launcher script sets before it starts the process.
struct NodeContext {
  std::string bin_dir;           // directory of k3-router / k3-prefill / k3-decode; empty: on PATH
  std::string model;             // model directory as the node sees it
  std::string keys_dir;          // <name with '/' as '_'>.key files and public_keys (k3-cluster keys)
  std::string address;           // the address peers reach this process at and UCX uses (an IPv4 or a variable)
  // What the control and activation sockets bind; empty: `address`. When set (e.g. 0.0.0.0: every
  // interface), the process is told to advertise `address` (--advertise-host).
  std::string bind_address;
  std::string router_host;       // name or address of the router's host, as other processes reach it
  std::string log_level = "info";
  std::string backend;           // --backend of the nodes; empty: the spec's "backend"
  bool node_metrics = true;      // prefill and decode get --metrics-listen <bind address>:<their metrics port>
  bool metrics_per_process = false;   // a metrics port per process (several share a host), else one for all
  // Name or address under which the process `name` is reached (for decode endpoints and stage links).
  std::function<std::string(const std::string& name)> host_of;
};

// The port `p` serves its /metrics on (0 for the router, whose /metrics is its HTTP port's).
int metrics_port_of(const ClusterSpec& spec, const PortLayout& ports, const NodeProcess& p, bool per_process);

// The argv (executable first) of `p`.
std::vector<std::string> node_command(const ClusterSpec& spec, const PortLayout& ports, const NodeProcess& p,
                                      const NodeContext& ctx);

// The key file of a control name inside the keys directory: transfer::ClusterKeyFiles' naming ('/' -> '_',
// ".key"), which a test checks against the files it writes.
std::string key_file_of(const std::string& control_name);

// The spec file's JSON as rendered deployments carry it: "model" set to `model`, router.api_key removed
// (the key reaches the router through K3_API_KEY, never a file others may read).
nlohmann::json spec_for_render(nlohmann::json raw, const std::string& model);

// A POSIX shell word for `arg`: single-quoted, or double-quoted when it references "${...}" variables.
std::string shell_word(const std::string& arg);
std::string shell_join(const std::vector<std::string>& argv);

}  // namespace k3::deploy
