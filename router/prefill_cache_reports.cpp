#include "router/prefill_cache_reports.h"

namespace k3::router {

void PrefillCacheReports::update(const std::string& node, const protocol::Heartbeat& hb) {
  if (hb.role != protocol::Role::Prefill) return;
  std::lock_guard lk(mu_);
  Entry& e = by_node_[node];
  e.blocks = std::set<uint64_t>(hb.prefix.block_hashes.begin(), hb.prefix.block_hashes.end());
  e.report = hb.prefix;
  e.report.block_hashes.clear();
}

void PrefillCacheReports::forget(const std::string& node) {
  std::lock_guard lk(mu_);
  auto it = by_node_.find(node);
  if (it != by_node_.end()) it->second.blocks.clear();   // counters stay: they are totals
}

protocol::PrefixCacheReport PrefillCacheReports::instance_totals() const {
  protocol::PrefixCacheReport t;
  std::lock_guard lk(mu_);
  for (const auto& [node, e] : by_node_) {
    if (node.size() < 2 || node.compare(node.size() - 2, 2, "/0") != 0) continue;   // stage 0 speaks for its instance
    t.lookup_tokens += e.report.lookup_tokens;
    t.hit_tokens += e.report.hit_tokens;
    t.checkpoints_stored += e.report.checkpoints_stored;
    t.checkpoints_evicted += e.report.checkpoints_evicted;
    t.cache_bytes += e.report.cache_bytes;
    t.prompts_prefilled += e.report.prompts_prefilled;
  }
  return t;
}

const std::set<uint64_t>* PrefillCacheReports::blocks(const std::string& node, int& block_tokens) const {
  std::lock_guard lk(mu_);
  auto it = by_node_.find(node);
  if (it == by_node_.end() || it->second.report.block_tokens == 0) return nullptr;
  block_tokens = static_cast<int>(it->second.report.block_tokens);
  return &it->second.blocks;
}

std::string PrefillCacheReports::prometheus_text() const {
  struct Family {
    const char* name;
    const char* type;
    const char* help;
    uint64_t (*get)(const protocol::PrefixCacheReport&);
  };
  static constexpr Family kFamilies[] = {
      {"k3_prefill_prefix_cache_lookup_tokens_total", "counter", "Prompt tokens a prefill stage looked up in its prefix cache.",
       [](const protocol::PrefixCacheReport& r) { return r.lookup_tokens; }},
      {"k3_prefill_prefix_cache_hit_tokens_total", "counter", "Prompt tokens a prefill stage restored from its prefix cache (prefill skipped).",
       [](const protocol::PrefixCacheReport& r) { return r.hit_tokens; }},
      {"k3_prefill_prefix_cache_checkpoints_stored_total", "counter", "KDA checkpoints a prefill stage's prefix cache stored.",
       [](const protocol::PrefixCacheReport& r) { return r.checkpoints_stored; }},
      {"k3_prefill_prefix_cache_checkpoints_evicted_total", "counter", "KDA checkpoints a prefill stage's prefix cache evicted.",
       [](const protocol::PrefixCacheReport& r) { return r.checkpoints_evicted; }},
      {"k3_prefill_prefix_cache_bytes", "gauge", "Bytes a prefill instance's prefix cache holds (checkpoints and pages, whole model).",
       [](const protocol::PrefixCacheReport& r) { return r.cache_bytes; }},
      {"k3_prefill_prefix_cache_cached_prefixes", "gauge", "Cached prefixes a hit can resume from (block hashes reported).",
       nullptr},
      {"k3_prefill_prompts_prefilled_total", "counter", "Prompts a prefill stage finished (n choices of one prompt count once).",
       [](const protocol::PrefixCacheReport& r) { return r.prompts_prefilled; }},
      {"k3_prefill_pool_free_pages", "gauge", "Free pages of a prefill stage's local MLA pool (requests and the cache share it).",
       [](const protocol::PrefixCacheReport& r) { return uint64_t{r.pool_free_pages}; }},
      {"k3_prefill_pool_pages", "gauge", "Pages of a prefill stage's local MLA pool.",
       [](const protocol::PrefixCacheReport& r) { return uint64_t{r.pool_pages}; }},
      {"k3_prefill_pool_free_slots", "gauge", "Free KDA slots of a prefill stage (requests and cache checkpoints share them).",
       [](const protocol::PrefixCacheReport& r) { return uint64_t{r.pool_free_slots}; }},
      {"k3_prefill_pool_slots", "gauge", "KDA slots of a prefill stage.",
       [](const protocol::PrefixCacheReport& r) { return uint64_t{r.pool_slots}; }},
      {"k3_prefill_cache_region_free_bytes", "gauge", "Free bytes of a prefill stage's unified cache region (slots and pages share them).",
       [](const protocol::PrefixCacheReport& r) { return r.region_free_bytes; }},
      {"k3_prefill_cache_region_free_extents", "gauge", "Runs of adjacent free bytes in a prefill stage's unified cache region.",
       [](const protocol::PrefixCacheReport& r) { return uint64_t{r.region_free_extents}; }},
      {"k3_prefill_cache_region_slot_moves_total", "counter", "KDA slots compaction moved in a prefill stage's region to make room for pages.",
       [](const protocol::PrefixCacheReport& r) { return r.region_slot_moves; }},
  };
  std::lock_guard lk(mu_);
  std::string o;
  for (const Family& f : kFamilies) {
    o += std::string("# HELP ") + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.type + "\n";
    for (const auto& [node, e] : by_node_) {
      const uint64_t v = f.get ? f.get(e.report) : e.blocks.size();
      o += std::string(f.name) + "{node=\"" + node + "\"} " + std::to_string(v) + "\n";
    }
  }
  return o;
}

}  // namespace k3::router
