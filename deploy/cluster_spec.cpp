#include "deploy/cluster_spec.h"

#include <cctype>
#include <fstream>
#include <numeric>
#include <set>

namespace k3::deploy {

using nlohmann::json;

namespace {

Status bad(const std::string& field, const std::string& what) { return invalid_argument("spec: " + field + ": " + what); }

Status known_keys(const json& obj, const std::string& where, const std::set<std::string>& keys) {
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!keys.count(it.key())) return bad(where + it.key(), "unknown field");
  return Status::ok();
}

Status get_int(const json& obj, const std::string& where, const char* key, int& out, int lo, int hi) {
  if (!obj.contains(key)) return Status::ok();
  const json& v = obj.at(key);
  if (!v.is_number_integer()) return bad(where + key, "must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return bad(where + key, std::to_string(x) + " outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  out = static_cast<int>(x);
  return Status::ok();
}

Status get_number(const json& obj, const std::string& where, const char* key, double& out, double lo, double hi) {
  if (!obj.contains(key)) return Status::ok();
  const json& v = obj.at(key);
  if (!v.is_number()) return bad(where + key, "must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) return bad(where + key, json(x).dump() + " outside [" + json(lo).dump() + ", " + json(hi).dump() + "]");
  out = x;
  return Status::ok();
}

Status get_string(const json& obj, const std::string& where, const char* key, std::string& out, bool required = false) {
  if (!obj.contains(key)) return required ? bad(where + key, "is required") : Status::ok();
  if (!obj.at(key).is_string()) return bad(where + key, "must be a string");
  out = obj.at(key).get<std::string>();
  if (required && out.empty()) return bad(where + key, "must not be empty");
  return Status::ok();
}

Status check_id(const std::string& field, const std::string& id) {
  if (id.empty()) return bad(field, "must not be empty");
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'))
      return bad(field, "'" + id + "' may use only letters, digits, '-' and '_'");
  return Status::ok();
}

}  // namespace

std::vector<DecodeProcess> decode_processes(const ClusterSpec& spec) {
  std::vector<DecodeProcess> out;
  uint32_t rank = 0;
  for (const auto& d : spec.decode)
    for (int r = 0; r < d.ranks; ++r) {
      out.push_back({.instance = d.ranks == 1 ? d.id : d.id + "-" + std::to_string(r), .rank = rank,
                     .max_requests = d.max_requests, .dcp = d.dcp, .ep = d.ep, .kv_partitions = d.kv_partitions,
                     .step_deadline_ms = d.step_deadline_ms, .collectives = d.collectives, .gpu = d.gpu});
      rank += static_cast<uint32_t>(d.dcp * d.ep);
    }
  return out;
}

std::vector<std::string> group_args(const DecodeProcess& d) {
  if (!d.rank_sliced()) return {};
  std::vector<std::string> a = {d.ep > 1 ? "--group-ep" : "--group-dcp", std::to_string(d.group_size()),
                                "--group-step-deadline-ms", std::to_string(d.step_deadline_ms)};
  if (d.kv_partitions > 0) a.insert(a.end(), {"--kv-partitions", std::to_string(d.kv_partitions)});
  a.insert(a.end(), {"--group-collectives", d.collectives});
  return a;
}

std::vector<std::string> kernels_flags(const ClusterSpec& spec) {
  if (spec.kernels == "invariant") return {};
  return {"--kernels", spec.kernels};
}

Result<ClusterSpec> parse_cluster_spec(const json& j) {
  ClusterSpec s;
  if (!j.is_object()) return bad("(top level)", "must be a JSON object");
  K3_TRY(known_keys(j, "", {"model", "generate", "router", "prefill", "decode", "threads", "backend", "kernels",
                            "timeouts", "restart", "network"}));
  if (j.contains("network")) {
    const json& n = j.at("network");
    if (!n.is_object()) return bad("network", "must be an object");
    K3_TRY(known_keys(n, "network.", {"bind_host", "advertise_host"}));
    K3_TRY(get_string(n, "network.", "bind_host", s.bind_host));
    K3_TRY(get_string(n, "network.", "advertise_host", s.advertise_host));
    if (s.bind_host.empty()) return bad("network.bind_host", "must not be empty");
    if (s.bind_host == "0.0.0.0" && s.advertise_host.empty())
      return bad("network.advertise_host", "is required when network.bind_host is 0.0.0.0 (peers cannot connect to it)");
  }
  K3_TRY(get_string(j, "", "model", s.model, true));
  K3_TRY(get_int(j, "", "threads", s.threads, 0, 1024));
  K3_TRY(get_string(j, "", "backend", s.backend));
  if (s.backend != "cpu" && s.backend != "cuda") return bad("backend", "must be \"cpu\" or \"cuda\", got \"" + s.backend + "\"");
  K3_TRY(get_string(j, "", "kernels", s.kernels));
  if (s.kernels != "invariant" && s.kernels != "fast")
    return bad("kernels", "must be \"invariant\" or \"fast\", got \"" + s.kernels + "\"");
  if (j.contains("generate")) {
    const json& g = j.at("generate");
    if (!g.is_object()) return bad("generate", "must be an object");
    K3_TRY(known_keys(g, "generate.", {"preset", "seed"}));
    K3_TRY(get_string(g, "generate.", "preset", s.preset));
    if (g.contains("seed")) {
      if (!g.at("seed").is_number_unsigned()) return bad("generate.seed", "must be a non-negative integer");
      s.seed = g.at("seed").get<uint64_t>();
    }
  }
  if (j.contains("router")) {
    const json& r = j.at("router");
    if (!r.is_object()) return bad("router", "must be an object");
    K3_TRY(known_keys(r, "router.", {"host", "port", "placement", "affinity_tokens", "served_model_name", "api_key"}));
    K3_TRY(get_int(r, "router.", "affinity_tokens", s.affinity_tokens, 1, 1 << 24));
    K3_TRY(get_string(r, "router.", "host", s.host));
    K3_TRY(get_int(r, "router.", "port", s.port, 0, 65535));
    K3_TRY(get_string(r, "router.", "placement", s.placement));
    K3_TRY(get_string(r, "router.", "served_model_name", s.served_model_name));
    if (r.contains("api_key")) {
      K3_TRY(get_string(r, "router.", "api_key", s.api_key));
      K3_TRY(check_api_key(s.api_key, "spec: router.api_key"));
    }
    if (s.placement != "round-robin" && s.placement != "least-loaded" && s.placement != "prefix-affinity")
      return bad("router.placement", "'" + s.placement + "' is not round-robin, least-loaded or prefix-affinity");
  }
  if (!j.contains("prefill")) return bad("prefill", "is required");
  if (!j.at("prefill").is_array() || j.at("prefill").empty()) return bad("prefill", "must be a non-empty array");
  std::set<std::string> ids;
  for (size_t i = 0; i < j.at("prefill").size(); ++i) {
    const std::string at = "prefill[" + std::to_string(i) + "].";
    const json& p = j.at("prefill")[i];
    if (!p.is_object()) return bad("prefill[" + std::to_string(i) + "]", "must be an object");
    K3_TRY(known_keys(p, at, {"id", "stages", "partition", "chunk_size", "max_requests", "stream", "max_inflight_chunks",
                              "prefix_cache", "cache_region_mib", "source_arena_mib"}));
    PrefillSpec ps;
    ps.id = "p" + std::to_string(i);
    K3_TRY(get_string(p, at, "id", ps.id));
    K3_TRY(check_id(at + "id", ps.id));
    if (!ids.insert("prefill:" + ps.id).second) return bad(at + "id", "'" + ps.id + "' is used twice");
    K3_TRY(get_int(p, at, "stages", ps.stages, 1, 256));
    K3_TRY(get_int(p, at, "chunk_size", ps.chunk_size, 1, 1 << 20));
    K3_TRY(get_int(p, at, "max_requests", ps.max_requests, 1, 4096));
    if (p.contains("stream")) {
      if (!p.at("stream").is_boolean()) return bad(at + "stream", "must be true or false");
      ps.stream = p.at("stream").get<bool>();
    }
    K3_TRY(get_int(p, at, "max_inflight_chunks", ps.max_inflight_chunks, 1, 4096));
    K3_TRY(get_number(p, at, "cache_region_mib", ps.cache_region_mib, 0, 1 << 24));
    K3_TRY(get_number(p, at, "source_arena_mib", ps.source_arena_mib, 0, 1 << 24));
    if (p.contains("prefix_cache")) {
      const json& pc = p.at("prefix_cache");
      const std::string pat = at + "prefix_cache.";
      if (!pc.is_object()) return bad(at + "prefix_cache", "must be an object");
      K3_TRY(known_keys(pc, pat, {"slots", "block_tokens", "checkpoint_every", "budget_mb"}));
      ps.prefix_slots = 8;
      K3_TRY(get_int(pc, pat, "slots", ps.prefix_slots, 1, 4096));
      K3_TRY(get_int(pc, pat, "block_tokens", ps.prefix_block_tokens, 64, 1 << 20));
      K3_TRY(get_int(pc, pat, "checkpoint_every", ps.prefix_checkpoint_every, 1, 1 << 20));
      K3_TRY(get_int(pc, pat, "budget_mb", ps.prefix_budget_mb, 0, 1 << 24));
      if (ps.prefix_block_tokens % 64 != 0) return bad(pat + "block_tokens", "must be a multiple of 64 (the KDA chunk)");
      if (ps.chunk_size % 64 != 0) return bad(at + "chunk_size", "must be a multiple of 64 with the prefix cache on");
    }
    if (p.contains("partition")) {
      const json& part = p.at("partition");
      if (!part.is_array()) return bad(at + "partition", "must be an array of layer counts");
      for (const json& x : part) {
        if (!x.is_number_integer() || x.get<int64_t>() < 1 || x.get<int64_t>() > 100000)
          return bad(at + "partition", "every entry must be a positive integer");
        ps.partition.push_back(x.get<int>());
      }
      if (static_cast<int>(ps.partition.size()) != ps.stages)
        return bad(at + "partition", "has " + std::to_string(ps.partition.size()) + " entries but stages is " +
                                         std::to_string(ps.stages));
    }
    s.prefill.push_back(ps);
  }
  if (!j.contains("decode")) return bad("decode", "is required");
  if (!j.at("decode").is_array() || j.at("decode").empty()) return bad("decode", "must be a non-empty array");
  for (size_t i = 0; i < j.at("decode").size(); ++i) {
    const std::string at = "decode[" + std::to_string(i) + "].";
    const json& d = j.at("decode")[i];
    if (!d.is_object()) return bad("decode[" + std::to_string(i) + "]", "must be an object");
    K3_TRY(known_keys(d, at, {"id", "ranks", "dp", "dcp", "ep", "kv_partitions", "step_deadline_ms", "max_requests",
                                  "collectives", "gpu"}));
    DecodeSpec ds;
    ds.id = "d" + std::to_string(i);
    K3_TRY(get_string(d, at, "id", ds.id));
    K3_TRY(check_id(at + "id", ds.id));
    if (!ids.insert("decode:" + ds.id).second) return bad(at + "id", "'" + ds.id + "' is used twice");
    K3_TRY(get_int(d, at, "ranks", ds.ranks, 1, 256));
    if (d.contains("dp") && d.contains("ranks")) return bad(at + "dp", "is another name of 'ranks': give one of them");
    K3_TRY(get_int(d, at, "dp", ds.ranks, 1, 256));
    K3_TRY(get_int(d, at, "dcp", ds.dcp, 1, 256));
    K3_TRY(get_int(d, at, "ep", ds.ep, 1, 256));
    if (ds.dcp > 1 && ds.ep > 1) return bad(at + "ep", "a group is DCP or EP, not both (dcp is " + std::to_string(ds.dcp) + ")");
    K3_TRY(get_int(d, at, "kv_partitions", ds.kv_partitions, 0, 4096));
    if (ds.kv_partitions > 0 && ds.kv_partitions % ds.dcp != 0)
      return bad(at + "kv_partitions", "must be a multiple of dcp (" + std::to_string(ds.dcp) + ")");
    K3_TRY(get_int(d, at, "step_deadline_ms", ds.step_deadline_ms, 50, 600000));
    K3_TRY(get_int(d, at, "max_requests", ds.max_requests, 1, 4096));
    K3_TRY(get_string(d, at, "collectives", ds.collectives));
    if (ds.collectives != "ucx" && ds.collectives != "nccl")
      return bad(at + "collectives", "must be \"ucx\" or \"nccl\", got \"" + ds.collectives + "\"");
    if (ds.collectives == "nccl" && s.backend != "cuda") return bad(at + "collectives", "\"nccl\" needs \"backend\": \"cuda\"");
    if (ds.collectives == "nccl" && ds.dcp * ds.ep == 1)
      return bad(at + "collectives", "is for rank groups (dcp or ep > 1); this decode rank is one process");
    K3_TRY(get_int(d, at, "gpu", ds.gpu, 0, 1023));
    if (d.contains("gpu") && s.backend != "cuda") return bad(at + "gpu", "needs \"backend\": \"cuda\"");
    s.decode.push_back(ds);
  }
  std::set<std::string> names;
  for (const auto& dp : decode_processes(s))
    if (!names.insert(dp.instance).second) return bad("decode", "process name '" + dp.instance + "' is used twice");
  if (j.contains("timeouts")) {
    const json& t = j.at("timeouts");
    if (!t.is_object()) return bad("timeouts", "must be an object");
    K3_TRY(known_keys(t, "timeouts.", {"heartbeat_ms", "heartbeat_misses", "claim_ms", "startup_s", "shutdown_ms"}));
    K3_TRY(get_int(t, "timeouts.", "heartbeat_ms", s.heartbeat_ms, 10, 60000));
    K3_TRY(get_int(t, "timeouts.", "heartbeat_misses", s.heartbeat_misses, 1, 100));
    K3_TRY(get_int(t, "timeouts.", "claim_ms", s.claim_ms, 1, 3600000));
    K3_TRY(get_int(t, "timeouts.", "startup_s", s.startup_s, 1, 86400));
    K3_TRY(get_int(t, "timeouts.", "shutdown_ms", s.shutdown_ms, 1, 600000));
  }
  if (j.contains("restart")) {
    const json& r = j.at("restart");
    if (!r.is_object()) return bad("restart", "must be an object");
    K3_TRY(known_keys(r, "restart.", {"enabled", "initial_backoff_ms", "max_backoff_ms", "stable_ms", "max_restarts"}));
    if (r.contains("enabled")) {
      if (!r.at("enabled").is_boolean()) return bad("restart.enabled", "must be true or false");
      s.restart.enabled = r.at("enabled").get<bool>();
    }
    K3_TRY(get_int(r, "restart.", "initial_backoff_ms", s.restart.initial_backoff_ms, 1, 3600000));
    K3_TRY(get_int(r, "restart.", "max_backoff_ms", s.restart.max_backoff_ms, 1, 3600000));
    K3_TRY(get_int(r, "restart.", "stable_ms", s.restart.stable_ms, 1, 86400000));
    K3_TRY(get_int(r, "restart.", "max_restarts", s.restart.max_restarts, 0, 1000000));
    if (s.restart.max_backoff_ms < s.restart.initial_backoff_ms)
      return bad("restart.max_backoff_ms", "is below restart.initial_backoff_ms");
  }
  return s;
}

Status check_api_key(const std::string& key, const std::string& source) {
  if (key.empty()) return invalid_argument(source + ": the API key must not be empty");
  for (char c : key)
    if (c < 0x20 || c > 0x7e) return invalid_argument(source + ": the API key must be printable ASCII");
  if (key.front() == ' ' || key.back() == ' ')
    return invalid_argument(source + ": the API key must not start or end with a space");
  return Status::ok();
}

Result<std::string> resolve_api_key(const ClusterSpec& spec, const std::string& flag, const char* env) {
  if (!spec.api_key.empty()) return spec.api_key;  // validated when the spec was parsed
  if (!flag.empty()) {
    K3_TRY(check_api_key(flag, "--api-key"));
    return flag;
  }
  if (env && *env) {
    K3_TRY(check_api_key(env, "K3_API_KEY"));
    return std::string(env);
  }
  return std::string();
}

Result<ClusterSpec> load_cluster_spec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(Code::NotFound, "spec: cannot open '" + path + "'");
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    return invalid_argument("spec: '" + path + "' is not valid JSON: " + e.what());
  }
  return parse_cluster_spec(j);
}

Status check_against_model(const ClusterSpec& spec, int num_layers) {
  for (size_t i = 0; i < spec.prefill.size(); ++i) {
    const auto& p = spec.prefill[i];
    if (p.stages > num_layers)
      return bad("prefill[" + std::to_string(i) + "].stages", std::to_string(p.stages) + " stages for a model of " +
                                                                 std::to_string(num_layers) + " layers");
    if (!p.partition.empty()) {
      const int sum = std::accumulate(p.partition.begin(), p.partition.end(), 0);
      if (sum != num_layers)
        return bad("prefill[" + std::to_string(i) + "].partition",
                   "sums to " + std::to_string(sum) + " but the model has " + std::to_string(num_layers) + " layers");
    }
  }
  return Status::ok();
}

std::vector<std::string> prefix_cache_args(const PrefillSpec& p) {
  if (p.prefix_slots <= 0) return {};
  return {"--prefix-cache-slots", std::to_string(p.prefix_slots), "--prefix-block", std::to_string(p.prefix_block_tokens),
          "--prefix-checkpoint-every", std::to_string(p.prefix_checkpoint_every), "--prefix-budget-mb",
          std::to_string(p.prefix_budget_mb)};
}

std::vector<std::string> prefill_memory_args(const PrefillSpec& p) {
  std::vector<std::string> a;
  if (p.cache_region_mib > 0) a.insert(a.end(), {"--cache-region-mib", json(p.cache_region_mib).dump()});
  if (p.source_arena_mib >= 0) a.insert(a.end(), {"--source-arena-mib", json(p.source_arena_mib).dump()});
  return a;
}

std::vector<std::string> stream_args(const PrefillSpec& p) {
  if (!p.stream) return {"--no-stream"};
  return {"--max-inflight-chunks", std::to_string(p.max_inflight_chunks)};
}

}  // namespace k3::deploy
