#include "deploy/render_slurm.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace k3::deploy {
namespace {

std::string step_file(const std::string& name) {
  std::string f = name;
  for (char& c : f)
    if (c == '/') c = '_';
  return f;
}

// The srun steps of the job: each unit (a process, or a decode rank group whole) and its node.
struct Step {
  std::vector<NodeProcess> unit;
  int node = 0;
  int gpus = 0;  // with the cuda backend
};

// The router on node 0; every other unit after it, per_node processes to a node in spec order, a rank
// group never split over two nodes (its communicator and GPUs are the node's).
Result<std::vector<Step>> place(const ClusterSpec& spec, const std::vector<NodeProcess>& procs, int per_node) {
  std::vector<Step> steps;
  int node = 0, used = 0;
  for (const NodeProcess& p : procs) {
    if (p.kind == NodeProcess::Kind::DecodeMember) continue;  // with its leader
    Step st{.unit = unit_of(procs, p), .node = 0, .gpus = spec.backend == "cuda" ? unit_gpus(spec, p) : 0};
    if (p.kind != NodeProcess::Kind::Router && per_node > 0) {
      const int n = static_cast<int>(st.unit.size());
      if (n > per_node)
        return invalid_argument("--per-node " + std::to_string(per_node) + " is less than the " + std::to_string(n) +
                                " processes of rank group " + p.name + ", which run on one node");
      if (used + n > per_node) {
        ++node;
        used = 0;
      }
      st.node = node;
      used += n;
    }
    steps.push_back(std::move(st));
  }
  return steps;
}

// CPUs a step takes: each of its processes its spec.threads (0, all cores: one here).
int cpus(const ClusterSpec& spec, const Step& st) { return static_cast<int>(st.unit.size()) * std::max(1, spec.threads); }

}  // namespace

Result<std::string> render_slurm(const ClusterSpec& spec, const nlohmann::json& raw, const SlurmOptions& opt) {
  if (opt.per_node < 0) return invalid_argument("--per-node must be >= 0");
  const auto procs = node_processes(spec, opt.ports);
  K3_ASSIGN_OR_RETURN(std::vector<Step> steps, place(spec, procs, opt.per_node));
  int nodes = 0, gpus_per_node = 0;
  std::map<int, int> gpus_on;  // node -> GPUs its steps take
  for (const Step& st : steps) {
    nodes = std::max(nodes, st.node + 1);
    gpus_per_node = std::max(gpus_per_node, gpus_on[st.node] += st.gpus);
  }
  const bool gpu = spec.backend == "cuda";
  std::ostringstream o;
  o << "#!/bin/bash\n"
    << "# k3serve on Slurm: the router, " << spec.prefill.size() << " prefill instance(s) and "
    << decode_processes(spec).size() << " decode rank(s), one srun step per process (a decode rank group:\n"
    << "# one step for the group, on one node).\n"
    << "# Rendered by `k3-cluster render --target slurm`; see docs/DEPLOY.md. Submit with sbatch; the\n"
    << "# router's URL is printed as the job output's ENDPOINT line; scancel stops everything.\n"
    << "# Environment: K3_BIN (binaries on the nodes), K3_RUN_DIR (shared directory for the spec, keys\n"
    << "# and logs), K3_API_KEY (the router's API key, optional), K3_ADDR (bind address; default: what the\n"
    << "# node's name resolves to), K3_MAX_RESTARTS (per process, default 5).\n"
    << "#SBATCH --job-name=" << opt.job_name << "\n"
    << "#SBATCH --nodes=" << nodes << "\n"
    << "#SBATCH --ntasks=" << steps.size() << "\n"
    << "#SBATCH --output=" << opt.job_name << "-%j.out\n";
  // GPU serving owns its nodes (every CPU and GPU): the steps pinned to a node then find there the CPUs
  // and GPUs they ask for, whatever share of the tasks Slurm's distribution would have put on it. The
  // cpu backend (tests, small models) overcommits instead.
  if (gpu) o << "#SBATCH --exclusive\n#SBATCH --gres=gpu:" << gpus_per_node << "\n";
  else o << "#SBATCH --overcommit\n";
  if (!opt.partition.empty()) o << "#SBATCH --partition=" << opt.partition << "\n";
  if (!opt.time_limit.empty()) o << "#SBATCH --time=" << opt.time_limit << "\n";
  o << "set -euo pipefail\n"
    << "export K3_BIN=\"${K3_BIN:-" << opt.bin_dir << "}\"\n"
    << "export K3_RUN_DIR=\"${K3_RUN_DIR:-$PWD/" << opt.job_name << "-$SLURM_JOB_ID}\"\n"
    << "export K3_MAX_RESTARTS=\"${K3_MAX_RESTARTS:-5}\"\n"
    << "mkdir -p \"$K3_RUN_DIR/logs\" \"$K3_RUN_DIR/steps\"\n"
    << "cat > \"$K3_RUN_DIR/spec.json\" <<'K3_SPEC'\n" << raw.dump(2) << "\nK3_SPEC\n"
    << "# One CURVE keypair per process (0600 files in a 0700 directory) and the public keys.\n"
    << "\"$K3_BIN/k3-cluster\" keys --spec \"$K3_RUN_DIR/spec.json\" --out \"$K3_RUN_DIR/keys\"\n"
    << "mapfile -t K3_HOSTS < <(scontrol show hostnames \"$SLURM_JOB_NODELIST\")\n"
    << "if (( ${#K3_HOSTS[@]} < " << nodes << " )); then echo \"need " << nodes
    << " nodes, got ${#K3_HOSTS[@]}\" >&2; exit 1; fi\n"
    << "for i in \"${!K3_HOSTS[@]}\"; do export \"K3_HOST_$i=${K3_HOSTS[$i]}\"; done\n"
    << "echo \"ENDPOINT http://${K3_HOSTS[0]}:" << spec.port << "\"\n"
    << "echo \"RUN_DIR $K3_RUN_DIR\"\n";

  NodeContext ctx;
  ctx.bin_dir = "${K3_BIN}";
  ctx.model = spec.model;
  ctx.keys_dir = "${K3_RUN_DIR}/keys";
  ctx.address = "${K3_ADDR}";
  ctx.router_host = "${K3_HOST_0}";
  ctx.metrics_per_process = true;   // several processes per host: a metrics port each
  std::map<std::string, int> node_by_name;
  for (const Step& st : steps)
    for (const NodeProcess& p : st.unit) node_by_name[p.name] = st.node;
  ctx.host_of = [&](const std::string& name) { return "${K3_HOST_" + std::to_string(node_by_name.at(name)) + "}"; };

  for (const Step& st : steps) {
    const NodeProcess& p = st.unit.front();
    const std::string file = step_file(p.name);
    const int metrics = metrics_port_of(spec, opt.ports, p, ctx.metrics_per_process);
    o << "\n# " << p.name << (p.port ? " (port " + std::to_string(p.port) + ")" : "")
      << (metrics ? " (GET /metrics on port " + std::to_string(metrics) + ")" : "")
      << (st.unit.size() > 1 ? " (a rank group of " + std::to_string(st.unit.size()) + " processes)" : "") << "\n"
      << "cat > \"$K3_RUN_DIR/steps/" << file << ".sh\" <<'K3_STEP'\n"
      << "#!/bin/bash\n"
      << "K3_ADDR=\"${K3_ADDR:-$(getent ahostsv4 \"$SLURMD_NODENAME\" | awk 'NR==1{print $1}')}\"\n";
    if (p.kind != NodeProcess::Kind::Router) o << "unset K3_API_KEY  # the router's alone\n";
    o << "restarts=0\n"
      << "while :; do\n"
      << "  rc=0\n";
    if (st.unit.size() == 1) {
      o << "  " << shell_join(node_command(spec, opt.ports, p, ctx)) << " || rc=$?\n";
    } else {  // the group as a whole: it ends when its leader does, and starts again whole
      o << "  (\n" << unit_script(spec, opt.ports, st.unit, ctx) << "  ) || rc=$?\n";
    }
    o << "  if (( rc == 0 || restarts >= K3_MAX_RESTARTS )); then exit $rc; fi\n"
      << "  restarts=$((restarts + 1))\n"
      << "  echo \"" << p.name << " exited with $rc; restart $restarts of $K3_MAX_RESTARTS\" >&2\n"
      << "  sleep $((restarts < 10 ? restarts : 10))\n"
      << "done\n"
      << "K3_STEP\n"
      << "srun --nodes=1 --ntasks=1 --exact "
      << (st.gpus > 0 ? "--gres=gpu:" + std::to_string(st.gpus) + " --cpus-per-task=" + std::to_string(cpus(spec, st)) + " "
                      : "--overcommit ")
      << "--nodelist=\"${K3_HOSTS[" << st.node << "]}\" --job-name=" << shell_word(p.name)
      << " --output=\"$K3_RUN_DIR/logs/" << file << ".log\" bash \"$K3_RUN_DIR/steps/" << file << ".sh\" &\n";
  }
  o << "\n# Serve until cancelled; a step that gave up leaves the others serving (degraded).\nwait\n";
  return o.str();
}

}  // namespace k3::deploy
