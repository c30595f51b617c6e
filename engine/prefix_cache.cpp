#include "engine/prefix_cache.h"

#include <algorithm>
#include <string>

namespace k3 {
namespace {

// Prefill compute of n tokens from scratch, up to a constant: the per-token projections and experts
// grow with n, MLA attention with n^2 (KDA is linear). Only ratios matter (eviction weighs them).
std::function<double(int64_t)> prefill_cost_model(const ModelConfig& cfg) {
  int mla_layers = 0;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) mla_layers += cfg.layer_kind(l) == LayerKind::Mla;
  const double d = cfg.hidden_size;
  const double per_token = 12.0 * d * d * cfg.num_hidden_layers;
  const double per_pair = double(mla_layers) * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim);
  return [per_token, per_pair](int64_t n) { return per_token * double(n) + per_pair * double(n) * double(n) / 2; };
}

}  // namespace

Status PrefixCacheOptions::validate(const CacheOptions& cache, int prefill_chunk) const {
  if (!enabled) return Status::ok();
  if (block_tokens <= 0 || block_tokens % kKdaChunkTokens != 0)
    return invalid_argument("prefix cache block_tokens (" + std::to_string(block_tokens) + ") must be a positive multiple of " +
                            std::to_string(kKdaChunkTokens) + " (KDA checkpoints sit at chunk ends)");
  if (block_tokens % cache.page_size != 0)
    return invalid_argument("prefix cache block_tokens (" + std::to_string(block_tokens) +
                            ") must be a multiple of the page size (" + std::to_string(cache.page_size) + ")");
  if (prefill_chunk % kKdaChunkTokens != 0)
    return invalid_argument("prefill_chunk (" + std::to_string(prefill_chunk) + ") must be 0 or a multiple of " +
                            std::to_string(kKdaChunkTokens) + " with the prefix cache on (a resumed prefill must "
                            "cut KDA chunks where the full prefill does)");
  if (checkpoint_every < 1) return invalid_argument("prefix cache checkpoint_every must be >= 1");
  if (cache.checkpoint_slots < 1) return invalid_argument("prefix cache needs cache checkpoint_slots >= 1");
  if (alpha < 0) return invalid_argument("prefix cache alpha must be >= 0");
  return Status::ok();
}

PrefixCache::PrefixCache(CachePools& pools, const ModelConfig& cfg, const PrefixCacheOptions& opts)
    : pools_(pools),
      opts_(opts),
      tree_({.block_tokens = opts.block_tokens, .page_size = pools.options().page_size,
             .slot_bytes = std::max<uint64_t>(1, opts.tree_slot_bytes ? opts.tree_slot_bytes : pools.slot_bytes()),
             .page_bytes = std::max<uint64_t>(1, opts.tree_page_bytes ? opts.tree_page_bytes : pools.page_bytes()),
             .alpha = opts.alpha, .prefill_cost = prefill_cost_model(cfg)}) {}

PrefixCache::~PrefixCache() {
  for (PrefixTree::Victim& v : tree_.clear()) {
    for (int32_t p : v.pages) pools_.release_page(p);
    if (v.slot >= 0) pools_.free_slot(v.slot);
  }
}

bool PrefixCache::evict_one() {
  auto v = tree_.evict_one();
  if (!v) return false;
  for (int32_t p : v->pages) pools_.release_page(p);
  stats_.pages_evicted += v->pages.size();
  ++stats_.evictions;
  if (v->slot >= 0) {
    pools_.free_slot(v->slot);
    ++stats_.checkpoints_evicted;
  }
  return true;
}

bool PrefixCache::make_room(int slots, int pages) {
  while (pools_.free_slots() < slots || pools_.free_pages() < pages)
    if (!evict_one()) return false;
  return true;
}

int PrefixCache::evict(int count) {
  int done = 0;
  while (done < count && evict_one()) ++done;
  return done;
}

void PrefixCache::flush() {
  while (evict_one()) {
  }
}

// A slot for a checkpoint: never one that a request could still open (requests keep max_seqs), and
// never past the byte budget; evicts to make room.
std::optional<int> PrefixCache::take_slot() {
  const int max_seqs = pools_.options().max_seqs;
  for (;;) {
    const int running = pools_.live_slots() - tree_.num_checkpoints() - planned_slots_;
    const bool over_budget =
        opts_.budget_bytes > 0 && tree_.bytes() + uint64_t(planned_slots_ + 1) * tree_.options().slot_bytes > opts_.budget_bytes;
    // A checkpoint leaves room for every request that may still open (a tight region's room counts).
    if (!over_budget && pools_.free_slots() >= 1 && pools_.free_slots() - 1 >= max_seqs - running) {
      auto s = pools_.alloc_slot();
      K3_CHECK(s.has_value(), "PrefixCache: slot accounting is off");
      ++planned_slots_;
      return s;
    }
    if (!evict_one()) return std::nullopt;
  }
}

Result<PrefixLease> PrefixCache::acquire(std::span<const int32_t> prompt, SeqCache& seq, const AcquireOptions& how) {
  const int B = opts_.block_tokens;
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) return invalid_argument("prefix cache: empty prompt");
  auto opened = pools_.open();
  if (!opened.is_ok() && make_room(1, 0)) opened = pools_.open();
  if (!opened.is_ok()) return opened.status();
  seq = std::move(opened).value();

  PrefixLease lease;
  lease.active = true;
  stats_.lookup_tokens += n;
  // The last prompt token is always computed: its logits start the answer.
  const int64_t limit = how.resume_limit < 0 ? n - 1 : std::min(how.resume_limit, n - 1);
  PrefixTree::Match m = tree_.match(prompt, limit);
  if (m.node) {
    pools_.copy_slot(m.slot, seq.slot);   // copy-on-write: the tree's checkpoint stays read-only
    for (int32_t p : m.pages) pools_.retain_page(p);
    seq.pages = m.pages;
    seq.num_tokens = m.tokens;
    tree_.lock(m.node);
    lease.node = m.node;
    lease.cached_tokens = m.tokens;
    stats_.hit_tokens += m.tokens;
  }
  const int64_t c = lease.cached_tokens, last = n / B * B, fork = m.matched / B * B;
  lease.donate_end = how.donate_end && n % B == 0;
  std::vector<int64_t> positions;
  if (how.plan) {
    for (int64_t p : *how.plan)
      if (p > c && p <= n && p % B == 0) positions.push_back(p);
  } else {
    // Planned checkpoints: every checkpoint_every blocks, the aligned fork from the cached path (a later
    // branch resumes right there) and the prompt's last whole block.
    std::vector<int64_t> cached;
    if (how.replan_cached) cached = tree_.checkpoints_on(prompt);
    for (int64_t p = (c / B + 1) * B; p <= last; p += B)
      if (p == last || p == fork || (p / B) % opts_.checkpoint_every == 0 ||
          std::find(cached.begin(), cached.end(), p) != cached.end())
        positions.push_back(p);
  }
  for (int64_t p : positions) {
    if (p == n && lease.donate_end) continue;
    auto slot = take_slot();
    if (!slot) break;
    lease.plan.push_back({.pos = p, .slot = *slot});
  }
  return lease;
}

// The tree's own references on what it adopted; planned slots it did not take are freed. Adopted
// pages may take the tree past its budget: evict back under it (pinned entries may keep it over).
void PrefixCache::give_back(const PrefixTree::Adopted& adopted, const std::map<int64_t, int>& ckpts) {
  for (int32_t p : adopted.pages) pools_.retain_page(p);
  stats_.checkpoints_stored += adopted.slots.size();
  for (const auto& [pos, slot] : ckpts)
    if (std::find(adopted.slots.begin(), adopted.slots.end(), slot) == adopted.slots.end()) pools_.free_slot(slot);
  while (opts_.budget_bytes > 0 && tree_.bytes() > opts_.budget_bytes)
    if (!evict_one()) break;
}

void PrefixCache::commit(PrefixLease& lease, std::span<const int32_t> prompt, SeqCache& seq) {
  K3_CHECK(lease.active, "PrefixCache::commit of a released lease");
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::map<int64_t, int> ckpts;
  for (const KdaCheckpoint& c : lease.plan) ckpts[c.pos] = c.slot;
  planned_slots_ -= static_cast<int>(lease.plan.size());
  lease.plan.clear();
  const bool donate = lease.donate_end && seq.num_tokens == n && seq.slot >= 0;
  if (donate) ckpts[n] = seq.slot;
  if (ckpts.empty()) return;
  const int64_t L = ckpts.rbegin()->first;
  K3_CHECK(seq.num_tokens >= L, "PrefixCache::commit before the prefill reached checkpoint " + std::to_string(L));
  const std::vector<int32_t> pages(seq.pages.begin(), seq.pages.begin() + L / pools_.options().page_size);
  PrefixTree::Adopted adopted = tree_.insert(prompt.subspan(0, L), pages, ckpts);
  const bool donated = donate && std::find(adopted.slots.begin(), adopted.slots.end(), seq.slot) != adopted.slots.end();
  if (donate) ckpts.erase(n);   // the request's own slot: kept by the request unless the tree took it
  if (donated) {
    seq.slot = -1;                // the tree owns it now: no copy was made
    ++stats_.donations;
  }
  give_back(adopted, ckpts);
}

bool PrefixCache::snapshot(std::span<const int32_t> tokens, const SeqCache& seq) {
  const int64_t p = seq.num_tokens;
  if (p <= 0 || p % opts_.block_tokens != 0 || static_cast<int64_t>(tokens.size()) < p || seq.slot < 0) return false;
  auto slot = take_slot();
  if (!slot) return false;
  --planned_slots_;
  pools_.copy_slot(seq.slot, *slot);
  const std::vector<int32_t> pages(seq.pages.begin(), seq.pages.begin() + p / pools_.options().page_size);
  std::map<int64_t, int> ckpts{{p, *slot}};
  PrefixTree::Adopted adopted = tree_.insert(tokens.subspan(0, p), pages, ckpts);
  const bool kept = !adopted.slots.empty();
  give_back(adopted, ckpts);
  return kept;
}

void PrefixCache::withdraw(PrefixLease& lease, std::span<const int32_t> prompt) {
  if (!lease.active) return;
  stats_.lookup_tokens -= prompt.size();
  stats_.hit_tokens -= static_cast<uint64_t>(lease.cached_tokens);
  release(lease);
}

void PrefixCache::release(PrefixLease& lease) {
  if (!lease.active) return;
  if (lease.node) tree_.unlock(lease.node);
  for (const KdaCheckpoint& c : lease.plan) pools_.free_slot(c.slot);
  planned_slots_ -= static_cast<int>(lease.plan.size());
  lease = PrefixLease{};
}

}  // namespace k3
