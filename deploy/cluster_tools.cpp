#include "deploy/cluster_tools.h"

#include <CLI/CLI.hpp>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "deploy/http_probe.h"
#include "deploy/render_k8s.h"
#include "deploy/render_slurm.h"
#include "deploy/request_logs.h"
#include "transfer/cluster_key_files.h"

namespace k3::deploy {
namespace fs = std::filesystem;
namespace {

int fail(const std::string& msg, int code = 2) {
  std::fprintf(stderr, "k3-cluster: %s\n", msg.c_str());
  return code;
}

struct LoadedSpec {
  ClusterSpec spec;
  nlohmann::json raw;
};

Result<LoadedSpec> load(const std::string& path) {
  LoadedSpec out;
  K3_ASSIGN_OR_RETURN(out.spec, load_cluster_spec(path));
  std::ifstream in(path);
  out.raw = nlohmann::json::parse(in);  // parsed already by load_cluster_spec
  return out;
}

Status write_file(const fs::path& path, const std::string& text, fs::perms mode) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return io_error(path.parent_path().string() + ": " + ec.message());
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return io_error("cannot write " + path.string());
  fs::permissions(path, mode, ec);
  return Status::ok();
}

Status write_keys(const ClusterSpec& spec, const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& p : node_processes(spec, PortLayout{})) names.push_back(p.name);
  return transfer::ClusterKeyFiles::write(dir, names).status();
}

std::string own_bin_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

int render(const std::string& spec_path, const std::string& target, const std::string& out_dir,
           const std::string& model, const K8sOptions& k8s, SlurmOptions slurm, bool keys) {
  auto loaded = load(spec_path);
  if (!loaded.is_ok()) return fail(loaded.status().message());
  ClusterSpec& spec = loaded->spec;
  spec.model = model.empty() ? fs::absolute(spec.model).lexically_normal().string() : model;
  const nlohmann::json raw = spec_for_render(loaded->raw, spec.model);
  if (target == "slurm") {
    if (slurm.bin_dir.empty()) slurm.bin_dir = own_bin_dir();
    auto script = render_slurm(spec, raw, slurm);
    if (!script.is_ok()) return fail(script.status().message());
    const fs::path path = fs::path(out_dir) / (slurm.job_name + ".sbatch");
    if (Status s = write_file(path, *script, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read); !s.is_ok())
      return fail(s.message(), 1);
    std::printf("RENDERED %s\n", path.c_str());
    return 0;
  }
  K8sOptions opt = k8s;
  opt.ports = slurm.ports;
  auto files = render_k8s(spec, raw, opt);
  if (!files.is_ok()) return fail(files.status().message());
  for (const auto& [rel, text] : *files) {
    const fs::path path = fs::path(out_dir) / rel;
    if (Status s = write_file(path, text, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                                              fs::perms::others_read);
        !s.is_ok())
      return fail(s.message(), 1);
    std::printf("RENDERED %s\n", path.c_str());
  }
  if (keys) {
    if (Status s = write_keys(spec, (fs::path(out_dir) / "base" / "keys").string()); !s.is_ok()) return fail(s.message(), 1);
    std::printf("KEYS %s\n", (fs::path(out_dir) / "base" / "keys").c_str());
  }
  return 0;
}

// 0 when the router's /metrics says `node` heartbeats (k3_cluster_node_up{node="..."} 1).
int probe(const std::string& router_url, const std::string& node, bool router_down_ok) {
  const std::string prefix = "http://";
  if (router_url.rfind(prefix, 0) != 0) return fail("--router must be http://HOST:PORT, got '" + router_url + "'");
  const std::string hostport = router_url.substr(prefix.size(), router_url.find('/', prefix.size()) - prefix.size());
  const auto colon = hostport.rfind(':');
  if (colon == std::string::npos) return fail("--router must name a port: '" + router_url + "'");
  const std::string host = hostport.substr(0, colon);
  const int port = std::atoi(hostport.c_str() + colon + 1);
  auto reply = http_get(host, port, "/metrics", std::chrono::milliseconds(3000));
  if (!reply.is_ok() || reply->status != 200) {
    const std::string why = reply.is_ok() ? "HTTP " + std::to_string(reply->status) : reply.status().message();
    std::printf("router unreachable (%s)%s\n", why.c_str(), router_down_ok ? ": not the node's fault" : "");
    return router_down_ok ? 0 : 1;
  }
  const std::string line = "k3_cluster_node_up{node=\"" + node + "\"} ";
  const auto at = reply->body.find(line);
  if (at == std::string::npos) {
    std::printf("the router does not know node %s\n", node.c_str());
    return 1;
  }
  const bool up = reply->body.compare(at + line.size(), 1, "1") == 0;
  std::printf("%s %s\n", node.c_str(), up ? "up" : "down");
  return up ? 0 : 1;
}

}  // namespace

bool is_cluster_tool(const char* arg) {
  const std::string a = arg;
  return a == "render" || a == "keys" || a == "probe" || a == "logs";
}

int cluster_tool_main(int argc, char** argv) {
  CLI::App app{"k3-cluster tools: render a deployment, write control-plane keys, probe a node"};
  app.require_subcommand(1);
  std::string spec_path = "deploy/cluster-default.json", target, out_dir, model;
  K8sOptions k8s;
  SlurmOptions slurm;
  bool no_keys = false;
  auto* r = app.add_subcommand("render", "write Kubernetes manifests (Kustomize base + overlays) or a Slurm sbatch "
                                         "script from a cluster spec (docs/DEPLOY.md)");
  r->add_option("--spec", spec_path, "cluster spec JSON (default deploy/cluster-default.json)");
  r->add_option("--target", target, "k8s or slurm")->required()->check(CLI::IsMember({"k8s", "slurm"}));
  r->add_option("--out", out_dir, "output directory")->required();
  r->add_option("--model", model, "model directory as the nodes see it (slurm; default: the spec's, made absolute)");
  r->add_option("--image", k8s.image, "k8s: container image with the k3 binaries on PATH (default k3serve:latest)");
  r->add_option("--model-claim", k8s.model_claim, "k8s: PVC holding the model (base and k3 overlay; default k3-model)");
  r->add_flag("--no-keys", no_keys, "k8s: do not write base/keys (create the k3-control-keys Secret yourself)");
  r->add_option("--bin-dir", slurm.bin_dir, "slurm: k3 binaries on the compute nodes (default: next to k3-cluster)");
  r->add_option("--job-name", slurm.job_name, "slurm: job name and script name (default k3serve)");
  r->add_option("--per-node", slurm.per_node, "slurm: processes per node besides the router (default 0: one node)");
  r->add_option("--partition", slurm.partition, "slurm: partition (default: the cluster's default)");
  r->add_option("--time", slurm.time_limit, "slurm: time limit (default: the partition's)");
  r->add_option("--control-port", slurm.ports.control_port, "router control port (default 5600)")->check(CLI::Range(1, 65535));
  r->add_option("--decode-port", slurm.ports.decode_port, "decode rank r binds this + r (a rank group: its leader's global "
                 "rank; default 5700)")->check(CLI::Range(1, 65535));
  r->add_option("--member-metrics-port", slurm.ports.member_metrics_port,
                 "a decode rank group's member i serves GET /metrics here + i (slurm: + its global rank; default 9600)")
      ->check(CLI::Range(1, 65535));
  r->add_option("--group-port", slurm.ports.group_port, "a decode rank group's leader binds its communicator on 127.0.0.1, "
                 "this + its global rank (default 6000)")->check(CLI::Range(1, 65535));
  r->add_option("--prefill-port", slurm.ports.prefill_port, "prefill stage k listens on this + k (default 5800)")->check(CLI::Range(1, 65535));
  r->add_option("--metrics-port", slurm.ports.metrics_port,
                 "every prefill stage and decode rank serves GET /metrics here (slurm: decode rank r on this + r, "
                 "prefill stage k on this + decode ranks + k; default 9400)")->check(CLI::Range(1, 65535));

  std::string keys_out;
  auto* k = app.add_subcommand("keys", "write a CURVE keypair per process of a spec and the public keys file (0600 "
                                       "files in a 0700 directory; docs/SECURITY.md)");
  k->add_option("--spec", spec_path, "cluster spec JSON");
  k->add_option("--out", keys_out, "keys directory")->required();

  std::string router_url, node;
  bool router_down_ok = false;
  auto* p = app.add_subcommand("probe", "exit 0 when the router reports NODE heartbeating (a Kubernetes probe)");
  p->add_option("--router", router_url, "router URL, http://HOST:PORT")->required();
  p->add_option("--node", node, "control name, e.g. decode/d or prefill/p/0")->required();
  p->add_flag("--router-down-ok", router_down_ok, "exit 0 when the router does not answer (liveness: never restart a "
                                                  "node because the router is away)");
  std::string log_dir, request_id;
  auto* l = app.add_subcommand("logs", "print one request's log lines from every node of a cluster started with "
                                       "--log-dir (router, prefill stages, decode), in time order, each after its node");
  l->add_option("--log-dir", log_dir, "the directory given to k3-cluster --log-dir")->required();
  l->add_option("REQUEST_ID", request_id, "the request id (the X-Request-Id of its response)")->required();
  CLI11_PARSE(app, argc, argv);
  if (l->parsed()) {
    auto lines = request_log_lines(log_dir, request_id);
    if (!lines.is_ok()) return fail(lines.status().message());
    if (lines->empty()) return fail("no log line names request " + request_id + " in " + log_dir +
                                    " (the nodes log a line per request at --log-level info)", 1);
    for (const RequestLogLine& x : *lines) std::printf("%-14s %s\n", x.node.c_str(), x.text.c_str());
    return 0;
  }
  if (r->parsed()) return render(spec_path, target, out_dir, model, k8s, slurm, !no_keys);
  if (k->parsed()) {
    auto loaded = load(spec_path);
    if (!loaded.is_ok()) return fail(loaded.status().message());
    if (Status s = write_keys(loaded->spec, keys_out); !s.is_ok()) return fail(s.message(), 1);
    std::printf("KEYS %s\n", keys_out.c_str());
    return 0;
  }
  return probe(router_url, node, router_down_ok);
}

}  // namespace k3::deploy
