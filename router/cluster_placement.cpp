#include "router/cluster_placement.h"

#include <algorithm>
#include <sstream>

#include "engine/prefix_hash.h"

namespace k3::router {

Result<ClusterPair> parse_cluster_pair(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ':')) parts.push_back(item);
  if (parts.size() != 4 && parts.size() != 5)
    return invalid_argument("--pair '" + text + "': expected PREFILL:STAGES:DECODE:RANK[:DCP] (4 or 5 parts, got " +
                            std::to_string(parts.size()) + ")");
  auto number = [&](const std::string& s, const char* what) -> Result<uint32_t> {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
      return invalid_argument("--pair '" + text + "': " + what + " '" + s + "' is not a number");
    return static_cast<uint32_t>(std::stoul(s));
  };
  ClusterPair p;
  p.prefill_instance = parts[0];
  p.decode_instance = parts[2];
  if (p.prefill_instance.empty() || p.prefill_instance.find('/') != std::string::npos)
    return invalid_argument("--pair '" + text + "': prefill instance must be non-empty without '/'");
  if (p.decode_instance.empty() || p.decode_instance.find('/') != std::string::npos)
    return invalid_argument("--pair '" + text + "': decode instance must be non-empty without '/'");
  K3_ASSIGN_OR_RETURN(p.stages, number(parts[1], "STAGES"));
  if (p.stages == 0) return invalid_argument("--pair '" + text + "': STAGES must be >= 1");
  K3_ASSIGN_OR_RETURN(p.decode_rank, number(parts[3], "RANK"));
  if (parts.size() == 5) {
    K3_ASSIGN_OR_RETURN(p.dcp, number(parts[4], "DCP"));
    if (p.dcp == 0) return invalid_argument("--pair '" + text + "': DCP must be >= 1");
  }
  return p;
}

Status check_pairs(const std::vector<ClusterPair>& pairs) {
  std::map<std::string, const ClusterPair*> prefill, decode;
  std::set<std::pair<std::string, std::string>> seen;
  for (const ClusterPair& p : pairs) {
    const std::string name = p.prefill_instance + ":" + std::to_string(p.stages) + ":" + p.decode_instance + ":" +
                             std::to_string(p.decode_rank) + ":" + std::to_string(p.dcp);
    if (!seen.insert({p.prefill_instance, p.decode_instance}).second)
      return invalid_argument("--pair " + name + ": prefill '" + p.prefill_instance + "' and decode '" +
                              p.decode_instance + "' are paired twice");
    auto [pi, pnew] = prefill.emplace(p.prefill_instance, &p);
    if (!pnew && pi->second->stages != p.stages)
      return invalid_argument("--pair " + name + ": prefill '" + p.prefill_instance + "' has " +
                              std::to_string(pi->second->stages) + " stage(s) in another pair");
    auto [di, dnew] = decode.emplace(p.decode_instance, &p);
    if (!dnew && (di->second->decode_rank != p.decode_rank || di->second->dcp != p.dcp))
      return invalid_argument("--pair " + name + ": decode '" + p.decode_instance + "' has rank " +
                              std::to_string(di->second->decode_rank) + " and DCP " + std::to_string(di->second->dcp) +
                              " in another pair");
  }
  return Status::ok();
}

std::vector<uint32_t> decode_group_ranks(const ClusterPair& p) {
  std::vector<uint32_t> ranks;
  for (uint32_t i = 0; i < p.dcp; ++i) ranks.push_back(p.decode_rank + i);
  return ranks;
}

Result<Placement> parse_placement(const std::string& name) {
  if (name == "round-robin") return Placement::RoundRobin;
  if (name == "least-loaded") return Placement::LeastLoaded;
  if (name == "prefix-affinity") return Placement::PrefixAffinity;
  return invalid_argument("--placement '" + name + "': expected round-robin, least-loaded or prefix-affinity");
}

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::RoundRobin: return "round-robin";
    case Placement::LeastLoaded: return "least-loaded";
    case Placement::PrefixAffinity: return "prefix-affinity";
  }
  return "?";
}

namespace {

uint64_t prefix_hash(const std::vector<int32_t>& prompt, int n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids
  const size_t len = std::min(prompt.size(), static_cast<size_t>(std::max(n, 1)));
  for (size_t i = 0; i < len; ++i) {
    const uint32_t t = static_cast<uint32_t>(prompt[i]);
    for (int b = 0; b < 4; ++b) {
      h ^= (t >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

int least_loaded(const std::vector<int>& ready, const std::vector<PairLoad>& load) {
  int best = ready.front();
  auto score = [&](int i) { return load[i].in_flight + load[i].reported_running; };
  for (int i : ready)
    if (score(i) < score(best)) best = i;
  return best;
}

}  // namespace

std::vector<int> prefer_other_prefill(const std::vector<int>& fitting, const std::vector<ClusterPair>& pairs,
                                      const std::set<std::string>& failed) {
  std::vector<int> elsewhere;
  for (int i : fitting)
    if (!failed.count(pairs[i].prefill_instance)) elsewhere.push_back(i);
  return elsewhere.empty() ? fitting : elsewhere;
}

int deepest_cached_pair(const std::vector<int>& ready, const std::vector<PairLoad>& load,
                        const std::vector<int32_t>& prompt) {
  int best = -1;
  size_t best_depth = 0;
  std::map<int, std::vector<uint64_t>> hashes;   // by block size: pairs may use different ones
  for (int i : ready) {
    const PairLoad& l = load[i];
    if (!l.cached_blocks || l.cached_block_tokens <= 0) continue;
    auto& h = hashes[l.cached_block_tokens];
    // Only a prefix strictly shorter than the prompt can be resumed (the last token is computed).
    if (h.empty()) h = prefix_block_hashes(std::span(prompt).first(prompt.empty() ? 0 : prompt.size() - 1), l.cached_block_tokens);
    size_t depth = 0;
    for (size_t b = h.size(); b > 0; --b)
      if (l.cached_blocks->count(h[b - 1])) {
        depth = b * static_cast<size_t>(l.cached_block_tokens);
        break;
      }
    auto score = [&](int j) { return load[j].in_flight + load[j].reported_running; };
    if (depth > best_depth || (depth == best_depth && depth > 0 && best >= 0 && score(i) < score(best))) {
      best = i;
      best_depth = depth;
    }
  }
  return best;
}

int PlacementPolicy::pick(const std::vector<int>& ready, const std::vector<PairLoad>& load,
                          const std::vector<int32_t>& prompt) {
  if (ready.empty()) return -1;
  switch (p_) {
    case Placement::RoundRobin: return ready[next_++ % ready.size()];
    case Placement::LeastLoaded: return least_loaded(ready, load);
    case Placement::PrefixAffinity: {
      // Sticky: a prefix goes where it went before while that pair is ready (its prefill caches are
      // warm there); a new prefix goes to the least-loaded pair and stays.
      // KV-aware first: the pair whose reported cache resumes this prompt deepest.
      if (const int cached = deepest_cached_pair(ready, load, prompt); cached >= 0) return cached;
      const uint64_t h = prefix_hash(prompt, affinity_tokens_);
      auto it = sticky_.find(h);
      if (it != sticky_.end() && std::find(ready.begin(), ready.end(), it->second) != ready.end()) return it->second;
      const int chosen = least_loaded(ready, load);
      if (sticky_.size() > 100000) sticky_.clear();  // bound the table; affinity is only a hint
      sticky_[h] = chosen;
      return chosen;
    }
  }
  return ready.front();
}

std::string decode_control_name(const ClusterPair& p) { return "decode/" + p.decode_instance; }

std::string stage_control_name(const ClusterPair& p, uint32_t stage) {
  return "prefill/" + p.prefill_instance + "/" + std::to_string(stage);
}

std::vector<std::string> pair_control_names(const ClusterPair& p) {
  std::vector<std::string> v{decode_control_name(p)};
  for (uint32_t s = 0; s < p.stages; ++s) v.push_back(stage_control_name(p, s));
  return v;
}

}  // namespace k3::router
