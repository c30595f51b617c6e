#include "deploy/render_k8s.h"

#include "deploy/yaml_text.h"

namespace k3::deploy {
namespace {

using J = nlohmann::ordered_json;

constexpr const char* kKeysDir = "/etc/k3/keys";
constexpr const char* kModelDir = "/model";

Status check_dns_label(const std::string& field, const std::string& id) {
  bool ok = !id.empty() && id.size() <= 40 && std::isalnum(static_cast<unsigned char>(id.front())) &&
            std::isalnum(static_cast<unsigned char>(id.back()));
  for (char c : id) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (!ok)
    return invalid_argument("spec: " + field + ": '" + id +
                            "' must be a DNS label for Kubernetes (lowercase letters, digits and '-', at most 40 "
                            "characters, starting and ending with a letter or digit)");
  return Status::ok();
}

J labels(const std::string& component, const std::string& group = "") {
  J l = {{"app.kubernetes.io/name", "k3serve"}, {"app.kubernetes.io/component", component}};
  if (!group.empty()) l["k3serve/group"] = group;
  return l;
}

// Env of every container: the pod IP to bind, the model directory, the backend (overlays replace it:
// index 2), and the router's API key from an optional Secret.
J env(const ClusterSpec& spec, bool router) {
  J e = J::array({{{"name", "K3_ADDR"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
                  {{"name", "K3_MODEL"}, {"value", kModelDir}},
                  {{"name", "K3_BACKEND"}, {"value", spec.backend}}});
  if (router)
    e.push_back({{"name", "K3_API_KEY"},
                 {"valueFrom", {{"secretKeyRef", {{"name", "k3-api-key"}, {"key", "api-key"}, {"optional", true}}}}}});
  return e;
}

J volumes(const K8sOptions& opt) {
  return J::array({{{"name", "model"}, {"persistentVolumeClaim", {{"claimName", opt.model_claim}, {"readOnly", true}}}},
                   {{"name", "keys"}, {"secret", {{"secretName", "k3-control-keys"}, {"defaultMode", 0400}}}},
                   {{"name", "spec"}, {"configMap", {{"name", "k3-spec"}}}}});
}

J mounts() {
  return J::array({{{"name", "model"}, {"mountPath", kModelDir}, {"readOnly", true}},
                   {{"name", "keys"}, {"mountPath", kKeysDir}, {"readOnly", true}},
                   {{"name", "spec"}, {"mountPath", "/etc/k3/spec"}, {"readOnly", true}}});
}

J sh(const std::string& script) { return J::array({"/bin/sh", "-c", script}); }

// `case` over the StatefulSet ordinal (the hostname's last '-' field): one branch per pod.
std::string by_ordinal(const std::vector<std::string>& branches, const std::string& what) {
  std::string s = "case \"${HOSTNAME##*-}\" in\n";
  for (size_t i = 0; i < branches.size(); ++i) s += "  " + std::to_string(i) + ") " + branches[i] + " ;;\n";
  return s + "  *) echo \"k3serve: no " + what + " for pod ${HOSTNAME}\" >&2; exit 1 ;;\nesac\n";
}

// The annotations a Prometheus with the common pod-discovery rules scrapes a pod by: every prefill and
// decode pod serves its own /metrics (the router's /metrics is on its HTTP port).
J scrape_annotations(int port) {
  return {{"prometheus.io/scrape", "true"}, {"prometheus.io/port", std::to_string(port)}, {"prometheus.io/path", "/metrics"}};
}

J probe_exec(const std::string& script, int period, int failures) {
  return {{"exec", {{"command", sh(script)}}}, {"periodSeconds", period}, {"timeoutSeconds", 5},
          {"failureThreshold", failures}};
}

// A StatefulSet (one pod per unit of `units`, in ordinal order: a process, or a decode rank group's
// leader and members together) and its headless Service.
std::string stateful_group(const ClusterSpec& spec, const K8sOptions& opt, const NodeContext& ctx,
                           const std::vector<std::vector<NodeProcess>>& units, const std::string& name,
                           const std::string& component, const std::string& group) {
  std::vector<std::string> starts, node_names;
  J ports = J::array();
  size_t processes = 1;  // a pod's processes: each takes spec.threads cores
  for (const auto& unit : units) {
    const NodeProcess& p = unit.front();   // what the router knows the unit by
    std::string start = unit_script(spec, opt.ports, unit, ctx);
    start.pop_back();  // the case branch's ";;" follows
    starts.push_back(start);
    node_names.push_back("n=" + shell_word(p.name));
    if (p.port) ports.push_back({{"name", "p" + std::to_string(p.port)}, {"port", p.port}, {"targetPort", p.port}});
    processes = std::max(processes, unit.size());
  }
  // Every process's /metrics: the leader's (or the process's) on the scraped port, each member's beside it.
  J metrics_ports = J::array({{{"name", "metrics"}, {"containerPort", opt.ports.metrics_port}}});
  for (size_t i = 1; i < processes; ++i)
    metrics_ports.push_back({{"name", "rank-" + std::to_string(i)}, {"containerPort", opt.ports.member_metrics_port + int(i)}});
  // A rank group's processes share the pod: UCX between them (and NCCL's proxies) use shared memory,
  // which a container's default 64 MiB /dev/shm would starve. Memory-backed, counted in the pod's memory.
  J vols = volumes(opt), mnts = mounts();
  if (processes > 1) {
    vols.push_back({{"name", "dshm"}, {"emptyDir", {{"medium", "Memory"}, {"sizeLimit", "8Gi"}}}});
    mnts.push_back({{"name", "dshm"}, {"mountPath", "/dev/shm"}});
  }
  const std::string router_url = "http://k3-router:" + std::to_string(spec.port);
  const std::string probe = by_ordinal(node_names, "process") + "exec k3-cluster probe --router " + router_url + " --node \"$n\"";
  J container = {{"name", component},
                 {"image", opt.image},
                 {"command", sh("set -eu\n" + by_ordinal(starts, "process"))},
                 {"ports", metrics_ports},
                 {"env", env(spec, false)},
                 {"resources", {{"requests", {{"cpu", std::to_string(std::max<size_t>(1, processes * size_t(std::max(1, spec.threads))))}}}}},
                 {"volumeMounts", mnts},
                 {"startupProbe", probe_exec(probe, 5, 120)},
                 {"readinessProbe", probe_exec(probe, 10, 3)},
                 {"livenessProbe", probe_exec(probe + " --router-down-ok", 10, 6)}};
  J svc_spec = {{"clusterIP", "None"}, {"publishNotReadyAddresses", true}, {"selector", labels(component, group)}};
  if (!ports.empty()) svc_spec["ports"] = ports;
  J svc = {{"apiVersion", "v1"}, {"kind", "Service"},
           {"metadata", {{"name", name}, {"labels", labels(component, group)}}}, {"spec", svc_spec}};
  J sts = {{"apiVersion", "apps/v1"},
           {"kind", "StatefulSet"},
           {"metadata", {{"name", name}, {"labels", labels(component, group)}}},
           {"spec",
            {{"serviceName", name},
             {"replicas", units.size()},
             {"podManagementPolicy", "Parallel"},
             {"selector", {{"matchLabels", labels(component, group)}}},
             {"template",
              {{"metadata", {{"labels", labels(component, group)}, {"annotations", scrape_annotations(opt.ports.metrics_port)}}},
               {"spec", {{"containers", J::array({container})}, {"volumes", vols}}}}}}}};
  return yaml_text(svc) + "---\n" + yaml_text(sts);
}

std::string router_yaml(const ClusterSpec& spec, const K8sOptions& opt, const NodeContext& ctx, const NodeProcess& router) {
  J http_port = {{"port", "http"}};
  J container = {
      {"name", "router"},
      {"image", opt.image},
      {"command", sh("exec " + shell_join(node_command(spec, opt.ports, router, ctx)))},
      {"ports", J::array({{{"name", "http"}, {"containerPort", spec.port}},
                          {{"name", "control"}, {"containerPort", opt.ports.control_port}}})},
      {"env", env(spec, true)},
      {"volumeMounts", mounts()},
      {"startupProbe", {{"tcpSocket", http_port}, {"periodSeconds", 5}, {"failureThreshold", 120}}},
      {"readinessProbe", {{"httpGet", {{"path", "/health"}, {"port", "http"}}}, {"periodSeconds", 5}}},
      {"livenessProbe", {{"tcpSocket", http_port}, {"periodSeconds", 10}, {"failureThreshold", 6}}}};
  J svc = {{"apiVersion", "v1"},
           {"kind", "Service"},
           {"metadata", {{"name", "k3-router"}, {"labels", labels("router")}}},
           {"spec",
            {{"selector", labels("router")},
             {"ports", J::array({{{"name", "http"}, {"port", spec.port}, {"targetPort", "http"}},
                                 {{"name", "control"}, {"port", opt.ports.control_port}, {"targetPort", "control"}}})}}}};
  J dep = {{"apiVersion", "apps/v1"},
           {"kind", "Deployment"},
           {"metadata", {{"name", "k3-router"}, {"labels", labels("router")}}},
           {"spec",
            {{"replicas", 1},
             {"strategy", {{"type", "Recreate"}}},  // one router owns the control endpoint
             {"selector", {{"matchLabels", labels("router")}}},
             {"template",
              {{"metadata", {{"labels", labels("router")}}},
               {"spec", {{"containers", J::array({container})}, {"volumes", volumes(opt)}}}}}}}};
  return yaml_text(svc) + "---\n" + yaml_text(dep);
}

// A workload of the base and the GPUs each of its pods takes on the k3 overlay (0: the router's none).
struct Workload {
  std::string kind, name;
  int gpus = 1;
};

// JSON 6902 patches of an overlay: the router's file, the nodes' (one GPU a pod), and one more for each
// other GPU count (a rank group over NCCL: a GPU per rank, the group in one pod).
std::string patch_file(const Workload& w, bool per_gpu_count) {
  if (w.kind == "Deployment") return "router.yaml";
  return !per_gpu_count || w.gpus == 1 ? "nodes.yaml" : "nodes-" + std::to_string(w.gpus) + "gpu.yaml";
}
J patch_target(const Workload& w, bool per_gpu_count) {
  return {{"path", patch_file(w, per_gpu_count)},
          {"target", {{"group", "apps"}, {"version", "v1"}, {"kind", w.kind}, {"name", w.name}}}};
}

std::string tiny_overlay_patch(const std::string& image) {
  // The model is generated in each pod (the same seed gives the same weights) instead of a PVC.
  J gen = {{"name", "model"},
           {"image", image},
           {"command", J::array({"k3-genweights", "--preset", "k3-tiny", "--seed", "0", "--out", "/model/k3-tiny"})},
           {"volumeMounts", J::array({{{"name", "model"}, {"mountPath", "/model"}}})}};
  J ops = J::array({{{"op", "replace"}, {"path", "/spec/template/spec/containers/0/env/1/value"}, {"value", "/model/k3-tiny"}},
                    {{"op", "replace"}, {"path", "/spec/template/spec/containers/0/env/2/value"}, {"value", "cpu"}},
                    {{"op", "replace"}, {"path", "/spec/template/spec/volumes/0"}, {"value", {{"name", "model"}, {"emptyDir", J::object()}}}},
                    {{"op", "add"}, {"path", "/spec/template/spec/initContainers"}, {"value", J::array({gen})}}});
  return yaml_text(ops);
}

std::string k3_overlay_patch(int gpus) {
  J ops = J::array({{{"op", "replace"}, {"path", "/spec/template/spec/containers/0/env/2/value"}, {"value", "cuda"}}});
  if (gpus > 0) {
    ops.push_back({{"op", "add"}, {"path", "/spec/template/spec/containers/0/resources/limits"},
                   {"value", {{"nvidia.com/gpu", gpus}}}});
    // Loading a real K3 stage takes minutes: allow 30 of them before the first heartbeat.
    ops.push_back({{"op", "replace"}, {"path", "/spec/template/spec/containers/0/startupProbe/failureThreshold"}, {"value", 360}});
  }
  return yaml_text(ops);
}

}  // namespace

Result<std::map<std::string, std::string>> render_k8s(const ClusterSpec& spec, const nlohmann::json& raw,
                                                      const K8sOptions& opt) {
  for (size_t i = 0; i < spec.prefill.size(); ++i)
    K3_TRY(check_dns_label("prefill[" + std::to_string(i) + "].id", spec.prefill[i].id));
  for (size_t i = 0; i < spec.decode.size(); ++i)
    K3_TRY(check_dns_label("decode[" + std::to_string(i) + "].id", spec.decode[i].id));
  const auto procs = node_processes(spec, opt.ports);
  std::map<std::string, std::string> host;  // control name -> stable DNS name of its pod
  for (const auto& p : procs) {
    if (p.kind == NodeProcess::Kind::Decode) {
      const std::string sts = "k3-decode-" + spec.decode[p.instance_index].id;
      host[p.name] = sts + "-" + std::to_string(p.local_index) + "." + sts;
    } else if (p.kind == NodeProcess::Kind::Prefill) {
      const std::string sts = "k3-prefill-" + spec.prefill[p.instance_index].id;
      host[p.name] = sts + "-" + std::to_string(p.local_index) + "." + sts;
    }
  }
  NodeContext ctx;
  ctx.model = "${K3_MODEL}";
  ctx.keys_dir = kKeysDir;
  ctx.address = "${K3_ADDR}";  // the pod IP: what the UCX data plane uses and nodes announce
  ctx.bind_address = "0.0.0.0"; // control sockets listen on every interface of the pod
  ctx.router_host = "k3-router";
  ctx.backend = "${K3_BACKEND}";
  ctx.host_of = [&](const std::string& name) { return host.at(name); };

  std::map<std::string, std::string> files;
  J resources = J::array({"configmap.yaml", "router.yaml"});
  J secret_files = J::array();
  for (const auto& p : procs) secret_files.push_back("keys/" + key_file_of(p.name));
  secret_files.push_back("keys/public_keys");
  files["base/router.yaml"] = router_yaml(spec, opt, ctx, procs.front());
  std::vector<Workload> workloads = {{"Deployment", "k3-router", 0}};
  // One pod per unit of the entry: each decode DP rank (a rank group whole), each prefill stage.
  auto units_of = [&](NodeProcess::Kind kind, size_t index) {
    std::vector<std::vector<NodeProcess>> units;
    for (const auto& p : procs)
      if (p.kind == kind && p.instance_index == int(index)) units.push_back(unit_of(procs, p));
    return units;
  };
  for (size_t g = 0; g < spec.decode.size(); ++g) {
    const auto units = units_of(NodeProcess::Kind::Decode, g);
    const std::string name = "k3-decode-" + spec.decode[g].id, file = "decode-" + spec.decode[g].id + ".yaml";
    files["base/" + file] = stateful_group(spec, opt, ctx, units, name, "decode", spec.decode[g].id);
    resources.push_back(file);
    workloads.push_back({"StatefulSet", name, unit_gpus(spec, units.front().front())});
  }
  for (size_t i = 0; i < spec.prefill.size(); ++i) {
    const std::string name = "k3-prefill-" + spec.prefill[i].id, file = "prefill-" + spec.prefill[i].id + ".yaml";
    files["base/" + file] = stateful_group(spec, opt, ctx, units_of(NodeProcess::Kind::Prefill, i), name, "prefill",
                                           spec.prefill[i].id);
    resources.push_back(file);
    workloads.push_back({"StatefulSet", name, 1});
  }
  J cm = {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", "k3-spec"}, {"labels", labels("spec")}}},
          {"data", {{"spec.json", raw.dump(2) + "\n"}}}};
  files["base/configmap.yaml"] = yaml_text(cm);
  files["base/kustomization.yaml"] =
      "# The spec's topology (k3-cluster render --target k8s). keys/: the control-plane keypairs, generated\n"
      "# with the render (k3-cluster keys); keep them out of version control.\n" +
      yaml_text(J{{"apiVersion", "kustomize.config.k8s.io/v1beta1"},
                  {"kind", "Kustomization"},
                  {"resources", resources},
                  {"generatorOptions", {{"disableNameSuffixHash", true}}},
                  {"secretGenerator", J::array({{{"name", "k3-control-keys"}, {"files", secret_files}}})}});
  for (const auto& [overlay, comment] :
       std::vector<std::pair<std::string, std::string>>{
           {"k3-tiny-cpu", "# k3-tiny on CPU: every pod generates the model (same seed, same weights); no GPU.\n"},
           {"k3", "# Real K3 on GPUs: the model on the PVC, one GPU per node pod (a rank group over NCCL: one per rank,\n"
                  "# the group in one pod), long startups.\n"}}) {
    const bool tiny = overlay == "k3-tiny-cpu";
    J patches = J::array();
    for (const Workload& w : workloads) {
      patches.push_back(patch_target(w, !tiny));
      files["overlays/" + overlay + "/" + patch_file(w, !tiny)] = tiny ? tiny_overlay_patch(opt.image) : k3_overlay_patch(w.gpus);
    }
    files["overlays/" + overlay + "/kustomization.yaml"] =
        comment + yaml_text(J{{"apiVersion", "kustomize.config.k8s.io/v1beta1"},
                              {"kind", "Kustomization"},
                              {"resources", J::array({"../../base"})},
                              {"patches", patches}});
  }
  return files;
}

}  // namespace k3::deploy
