// The processes of a cluster spec and the command line each one runs with, for launchers that place
// them on other hosts (the Kubernetes and Slurm renderers). Every process binds a fixed port on an
// address it is given and is reached by a name other processes can resolve (a Service or node name),
// so they can start in any order: ZeroMQ connections retry until the peer is there.
//
// Ports (Layout): the router's control endpoint on control_port; decode rank r (global) binds
// decode_port + r; prefill stage k (global index over all instances' stages, k > 0 within its instance)
// listens on prefill_port + k. Distinct ports let several processes share one host (Slurm); on
// Kubernetes each pod has its own address and the distinct ports are merely harmless.
//
// A decode rank group (docs/RANKS.md) is one unit wherever it is placed: its leader and members run
// together (one pod, one Slurm step, on one host) from one script (group_unit_script), which ends them
// all when one ends, so the group restarts as a whole. The leader binds the group's communicator on
// 127.0.0.1:group_port + its global rank, which only the group's own processes reach.
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
  int group_port = 6000;
  // A rank group's member i serves its own /metrics (its steps and collectives) here + i, or, where
  // processes share a host (NodeContext::metrics_per_process), here + its global rank.
  int member_metrics_port = 9600;
};

// One process of the deployment.
struct NodeProcess {
  // Decode: a decode DP rank's process (the group's leader); DecodeMember: rank i > 0 of its group.
  enum class Kind { Router, Decode, DecodeMember, Prefill } kind = Kind::Router;
  // control name: "router", "decode/<instance>", "decode/<instance>/<i>", "prefill/<id>/<stage>"
  std::string name;
  int instance_index = 0;  // index into spec.prefill / spec.decode
  int local_index = 0;     // stage within its prefill instance / DP rank within its decode entry / group rank
  int global_index = 0;    // decode DP rank (index into decode_processes) / global prefill stage number
  int port = 0;            // what it binds (router: the control port; prefill stage 0 and members: none)
};

// Every process in launch order: the router, the decode DP ranks (each leader followed by its
// members), then each prefill instance's stages in order.
std::vector<NodeProcess> node_processes(const ClusterSpec& spec, const PortLayout& ports);
// The processes one placement unit runs: a decode leader and its members, or the process alone.
std::vector<NodeProcess> unit_of(const std::vector<NodeProcess>& procs, const NodeProcess& first);
// How many GPUs a unit takes with the cuda backend: a group over NCCL one a rank, the router none, else one.
int unit_gpus(const ClusterSpec& spec, const NodeProcess& first);

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

// The port `p` serves its /metrics on (0 for the router, whose /metrics is its HTTP port's; a rank group's
// member: PortLayout::member_metrics_port's).
int metrics_port_of(const ClusterSpec& spec, const PortLayout& ports, const NodeProcess& p, bool per_process);

// The argv (executable first) of `p`. CUDA devices are numbered within the unit (what a pod or a Slurm
// step sees): the leader 0, member i its own GPU i over NCCL, the leader's over UCX.
std::vector<std::string> node_command(const ClusterSpec& spec, const PortLayout& ports, const NodeProcess& p,
                                      const NodeContext& ctx);

// The POSIX sh lines that run the unit starting at `first`: `exec` of its command for a single
// process; for a rank group, the members in the background, then the leader, each signal passed on to
// all, and when the leader ends (it ends when a member does: it fails the group) the members are stopped
// and the script exits with the leader's status.
std::string unit_script(const ClusterSpec& spec, const PortLayout& ports, const std::vector<NodeProcess>& unit,
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
