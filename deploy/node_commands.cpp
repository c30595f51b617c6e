#include "deploy/node_commands.h"

#include <algorithm>

namespace k3::deploy {

std::vector<NodeProcess> node_processes(const ClusterSpec& spec, const PortLayout& ports) {
  std::vector<NodeProcess> out;
  out.push_back({.kind = NodeProcess::Kind::Router, .name = "router", .port = ports.control_port});
  const std::vector<DecodeProcess> decodes = decode_processes(spec);
  int dp = 0;
  for (size_t g = 0; g < spec.decode.size(); ++g)
    for (int r = 0; r < spec.decode[g].ranks; ++r, ++dp) {
      const DecodeProcess& d = decodes[size_t(dp)];
      out.push_back({.kind = NodeProcess::Kind::Decode, .name = "decode/" + d.instance, .instance_index = int(g),
                     .local_index = r, .global_index = dp, .port = ports.decode_port + int(d.rank)});
      for (int i = 1; i < d.group_size(); ++i)
        out.push_back({.kind = NodeProcess::Kind::DecodeMember, .name = "decode/" + d.instance + "/" + std::to_string(i),
                       .instance_index = int(g), .local_index = i, .global_index = dp});
    }
  int stage_no = 0;
  for (size_t i = 0; i < spec.prefill.size(); ++i)
    for (int s = 0; s < spec.prefill[i].stages; ++s, ++stage_no)
      out.push_back({.kind = NodeProcess::Kind::Prefill, .name = "prefill/" + spec.prefill[i].id + "/" + std::to_string(s),
                     .instance_index = int(i), .local_index = s, .global_index = stage_no,
                     .port = s > 0 ? ports.prefill_port + stage_no : 0});
  return out;
}

std::vector<NodeProcess> unit_of(const std::vector<NodeProcess>& procs, const NodeProcess& first) {
  std::vector<NodeProcess> unit = {first};
  if (first.kind != NodeProcess::Kind::Decode) return unit;
  for (const NodeProcess& p : procs)
    if (p.kind == NodeProcess::Kind::DecodeMember && p.global_index == first.global_index) unit.push_back(p);
  return unit;
}

int unit_gpus(const ClusterSpec& spec, const NodeProcess& first) {
  if (first.kind == NodeProcess::Kind::Router) return 0;  // it runs no model
  if (first.kind != NodeProcess::Kind::Decode) return 1;
  const DecodeProcess d = decode_processes(spec)[size_t(first.global_index)];
  return d.collectives == "nccl" ? d.group_size() : 1;
}

std::vector<std::string> router_pair_flags(const ClusterSpec& spec) {
  std::vector<std::string> out;
  for (const PrefillSpec& p : spec.prefill)
    for (const DecodeProcess& d : decode_processes(spec))
      out.push_back(p.id + ":" + std::to_string(p.stages) + ":" + d.instance + ":" + std::to_string(d.rank) +
                    (d.dcp > 1 ? ":" + std::to_string(d.dcp) : ""));
  return out;
}

std::string key_file_of(const std::string& control_name) {
  std::string f = control_name;
  std::replace(f.begin(), f.end(), '/', '_');
  return f + ".key";
}

nlohmann::json spec_for_render(nlohmann::json raw, const std::string& model) {
  raw["model"] = model;
  if (raw.contains("router") && raw["router"].is_object()) raw["router"].erase("api_key");
  return raw;
}

std::string shell_word(const std::string& arg) {
  if (arg.find("${") != std::string::npos) {
    std::string out = "\"";
    for (char c : arg) {
      if (c == '"' || c == '\\' || c == '`') out += '\\';
      out += c;
    }
    return out + "\"";
  }
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + shell_word(a);
  return out;
}

namespace {

std::string exe(const NodeContext& ctx, const std::string& name) {
  return ctx.bin_dir.empty() ? name : ctx.bin_dir + "/" + name;
}

void add_keys(std::vector<std::string>& a, const NodeContext& ctx, const std::string& name) {
  a.insert(a.end(), {"--control-key", ctx.keys_dir + "/" + key_file_of(name), "--control-public-keys",
                     ctx.keys_dir + "/public_keys"});
}

// Flags every node shares.
void add_node_common(std::vector<std::string>& a, const ClusterSpec& spec, const NodeContext& ctx) {
  a.insert(a.end(), {"--threads", std::to_string(spec.threads), "--backend",
                     ctx.backend.empty() ? spec.backend : ctx.backend, "--heartbeat-ms",
                     std::to_string(spec.heartbeat_ms), "--heartbeat-misses", std::to_string(spec.heartbeat_misses),
                     "--log-level", ctx.log_level, "--interface", ctx.address});
  const std::vector<std::string> kernels = kernels_flags(spec);
  a.insert(a.end(), kernels.begin(), kernels.end());
}

const std::string& bind_of(const NodeContext& ctx) { return ctx.bind_address.empty() ? ctx.address : ctx.bind_address; }

bool cuda(const ClusterSpec& spec, const NodeContext& ctx) { return (ctx.backend.empty() ? spec.backend : ctx.backend) == "cuda"; }

// Processes of all decode DP ranks, group members included (k3-decode --dp-size, as k3-cluster counts).
size_t global_ranks(const std::vector<DecodeProcess>& decodes) {
  size_t n = 0;
  for (const DecodeProcess& d : decodes) n += size_t(d.group_size());
  return n;
}

// A rank group's flags, the same for its leader and members, and the communicator the leader binds and
// they join: on 127.0.0.1, since the unit runs on one host.
void add_group(std::vector<std::string>& a, const PortLayout& ports, const DecodeProcess& d) {
  const std::vector<std::string> group = group_args(d);
  a.insert(a.end(), group.begin(), group.end());
  if (d.group_size() > 1)
    a.insert(a.end(), {"--group-endpoint", "tcp://127.0.0.1:" + std::to_string(ports.group_port + int(d.rank))});
}

// A process binding something else than the address peers reach it at says which one to announce.
void add_advertise(std::vector<std::string>& a, const NodeContext& ctx) {
  if (!ctx.bind_address.empty()) a.insert(a.end(), {"--advertise-host", ctx.address});
}

}  // namespace

int metrics_port_of(const ClusterSpec& spec, const PortLayout& ports, const NodeProcess& p, bool per_process) {
  if (p.kind == NodeProcess::Kind::Router) return 0;
  if (p.kind == NodeProcess::Kind::DecodeMember)
    return ports.member_metrics_port +
           (per_process ? static_cast<int>(decode_processes(spec)[size_t(p.global_index)].rank) + p.local_index
                        : p.local_index);
  if (!per_process) return ports.metrics_port;
  const int decode_ranks = static_cast<int>(decode_processes(spec).size());
  return ports.metrics_port + (p.kind == NodeProcess::Kind::Decode ? 0 : decode_ranks) + p.global_index;
}

std::vector<std::string> node_command(const ClusterSpec& spec, const PortLayout& ports, const NodeProcess& p,
                                      const NodeContext& ctx) {
  const auto decodes = decode_processes(spec);
  const std::string router_ep = "tcp://" + ctx.router_host + ":" + std::to_string(ports.control_port);
  std::vector<std::string> a;
  switch (p.kind) {
    case NodeProcess::Kind::Router: {
      a = {exe(ctx, "k3-router"), "--model", ctx.model, "--host", ctx.address, "--port", std::to_string(spec.port),
           "--cluster-endpoint", "tcp://" + bind_of(ctx) + ":" + std::to_string(ports.control_port), "--placement",
           spec.placement, "--heartbeat-ms", std::to_string(spec.heartbeat_ms), "--heartbeat-misses",
           std::to_string(spec.heartbeat_misses), "--claim-timeout-ms", std::to_string(spec.claim_ms), "--log-level",
           ctx.log_level};
      if (!spec.served_model_name.empty()) a.insert(a.end(), {"--served-model-name", spec.served_model_name});
      if (spec.affinity_tokens > 0) a.insert(a.end(), {"--affinity-tokens", std::to_string(spec.affinity_tokens)});
      for (const std::string& pair : router_pair_flags(spec)) a.insert(a.end(), {"--pair", pair});
      break;
    }
    case NodeProcess::Kind::Decode: {
      const DecodeProcess& d = decodes[p.global_index];
      a = {exe(ctx, "k3-decode"), "--model", ctx.model, "--router-endpoint", router_ep, "--instance", d.instance,
           "--rank", std::to_string(d.rank), "--dp-size", std::to_string(global_ranks(decodes)), "--max-requests",
           std::to_string(d.max_requests), "--bind", "tcp://" + bind_of(ctx) + ":" + std::to_string(p.port)};
      add_node_common(a, spec, ctx);
      if (cuda(spec, ctx)) a.insert(a.end(), {"--device", "0"});
      add_group(a, ports, d);
      break;
    }
    case NodeProcess::Kind::DecodeMember: {
      const DecodeProcess& d = decodes[p.global_index];
      a = {exe(ctx, "k3-decode"), "--model", ctx.model, "--instance", d.instance, "--threads",
           std::to_string(spec.threads), "--backend", ctx.backend.empty() ? spec.backend : ctx.backend,
           "--max-requests", std::to_string(d.max_requests), "--log-level", ctx.log_level, "--group-rank",
           std::to_string(p.local_index), "--interface", ctx.address};
      // Over NCCL (the spec's backend is cuda then) each member has a GPU of its own, whatever the
      // launcher's backend variable says.
      if (d.collectives == "nccl") a.insert(a.end(), {"--device", std::to_string(p.local_index)});
      else if (cuda(spec, ctx)) a.insert(a.end(), {"--device", "0"});
      const std::vector<std::string> kernels = kernels_flags(spec);
      a.insert(a.end(), kernels.begin(), kernels.end());
      add_group(a, ports, d);
      if (ctx.node_metrics)  // its own steps and collectives; the leader speaks for the group
        a.insert(a.end(), {"--metrics-listen", bind_of(ctx) + ":" +
                                                   std::to_string(metrics_port_of(spec, ports, p, ctx.metrics_per_process))});
      add_keys(a, ctx, p.name);
      return a;  // no control socket
    }
    case NodeProcess::Kind::Prefill: {
      const PrefillSpec& ps = spec.prefill[p.instance_index];
      a = {exe(ctx, "k3-prefill"), "--model", ctx.model, "--stage", std::to_string(p.local_index), "--stages",
           std::to_string(ps.stages), "--chunk-size", std::to_string(ps.chunk_size), "--max-requests",
           std::to_string(ps.max_requests), "--instance", ps.id};
      for (const DecodeProcess& d : decodes)  // every decode process: the router names each request's
        a.insert(a.end(), {"--decode-instance", d.instance, "--decode-endpoint",
                           "tcp://" + ctx.host_of("decode/" + d.instance) + ":" +
                               std::to_string(ports.decode_port + static_cast<int>(d.rank))});
      a.insert(a.end(), {"--router-endpoint", router_ep});
      if (!ps.partition.empty()) {
        std::string part;
        for (int n : ps.partition) part += (part.empty() ? "" : ",") + std::to_string(n);
        a.insert(a.end(), {"--partition", part});
      }
      const std::vector<std::string> prefix = prefix_cache_args(ps);
      const std::vector<std::string> stream = stream_args(ps);
      const std::vector<std::string> region = prefill_memory_args(ps);
      a.insert(a.end(), prefix.begin(), prefix.end());
      a.insert(a.end(), stream.begin(), stream.end());
      a.insert(a.end(), region.begin(), region.end());
      if (p.local_index > 0) a.insert(a.end(), {"--listen", "tcp://" + bind_of(ctx) + ":" + std::to_string(p.port)});
      if (p.local_index + 1 < ps.stages) {
        const std::string next = "prefill/" + ps.id + "/" + std::to_string(p.local_index + 1);
        a.insert(a.end(), {"--next-endpoint", "tcp://" + ctx.host_of(next) + ":" +
                                                  std::to_string(ports.prefill_port + p.global_index + 1)});
      }
      add_node_common(a, spec, ctx);
      break;
    }
  }
  if (ctx.node_metrics && p.kind != NodeProcess::Kind::Router)
    a.insert(a.end(), {"--metrics-listen",
                       bind_of(ctx) + ":" + std::to_string(metrics_port_of(spec, ports, p, ctx.metrics_per_process))});
  add_advertise(a, ctx);
  add_keys(a, ctx, p.name);
  return a;
}

std::string unit_script(const ClusterSpec& spec, const PortLayout& ports, const std::vector<NodeProcess>& unit,
                        const NodeContext& ctx) {
  if (unit.size() == 1) return "exec " + shell_join(node_command(spec, ports, unit.front(), ctx)) + "\n";
  // Members first: each retries joining the leader's communicator until it is bound (for the group's
  // start-up deadline). The leader, once formed, fails the group when a member dies, and ends.
  // Written for `set -eu` (Kubernetes' command line sets it): no failing command outside a condition.
  std::string s = "members=\"\"\nleader=\"\"\ntrap 'kill -TERM $leader $members 2>/dev/null || true' TERM INT\n";
  for (size_t i = 1; i < unit.size(); ++i)
    s += shell_join(node_command(spec, ports, unit[i], ctx)) + " &\nmembers=\"$members $!\"\n";
  s += shell_join(node_command(spec, ports, unit.front(), ctx)) + " &\nleader=$!\n"
       "rc=0\nwait $leader || rc=$?\n"
       "kill -TERM $members 2>/dev/null || true\nwait || true\n"
       "exit $rc\n";
  return s;
}

}  // namespace k3::deploy
