#include "prefill_node/stage_prefix.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

namespace k3::prefill {

Result<std::unique_ptr<StagePrefixCache>> StagePrefixCache::create(CachePools& pools, const ModelConfig& cfg,
                                                                   const CacheLayout& layout, PrefixCacheOptions opts,
                                                                   int chunk_size, const Backend& backend) {
  K3_CHECK(opts.enabled, "StagePrefixCache::create with the cache off");
  K3_TRY(opts.validate(pools.options(), chunk_size));
  // A stage cannot cut its chunk at a checkpoint on its own (the chunks are stage 0's), so the
  // checkpoints must be taken inside the pass.
  if (const std::string why = backend.supports("kda_chunk_checkpoints", {}); !why.empty())
    return invalid_argument("prefix cache on a prefill stage needs in-pass KDA checkpoints: " + why);
  const auto kda = layout.layer_ids(LayerCache::Kda), mla = layout.layer_ids(LayerCache::Mla);
  opts.tree_slot_bytes = kda.size() * (layout.kda_conv_bytes() + layout.kda_state_bytes());
  opts.tree_page_bytes = mla.size() * layout.mla_row_bytes * static_cast<uint64_t>(pools.options().page_size);
  return std::unique_ptr<StagePrefixCache>(new StagePrefixCache(pools, std::make_unique<PrefixCache>(pools, cfg, opts)));
}

Result<PrefixLease> StagePrefixCache::open_first(std::span<const int32_t> prompt, SeqCache& seq, ChunkCacheSync& sync,
                                                 bool recompute) {
  // No donation: the request's own slot is exported to decode after the prompt, so the prompt's end is
  // a planned checkpoint (a copy) like any other.
  AcquireOptions how{.donate_end = false};
  if (recompute) {
    how.resume_limit = 0;
    how.replan_cached = true;
  }
  K3_ASSIGN_OR_RETURN(PrefixLease lease, cache_->acquire(prompt, seq, how));
  sync.prompt.assign(prompt.begin(), prompt.end());
  sync.plan.clear();
  for (const KdaCheckpoint& c : lease.plan) sync.plan.push_back(static_cast<uint64_t>(c.pos));
  return lease;
}

Result<PrefixLease> StagePrefixCache::open_replica(std::span<const int32_t> prompt, SeqCache& seq, uint64_t resume_at,
                                                   const std::vector<uint64_t>& plan, int stage) {
  // Peek first: a drifted replica neither counts a lookup nor touches its tree for a try that stage 0
  // computes again.
  const int64_t have = cache_->tree().peek(prompt, static_cast<int64_t>(resume_at)).tokens;
  if (static_cast<uint64_t>(have) != resume_at)
    return Status(Code::NotFound, "prefix cache of stage " + std::to_string(stage) + " lacks the checkpoint at " +
                                      std::to_string(resume_at) + " that stage 0 resumes from (its deepest there is " +
                                      std::to_string(have) + ")");
  const std::vector<int64_t> positions(plan.begin(), plan.end());
  const AcquireOptions how{.donate_end = false, .resume_limit = static_cast<int64_t>(resume_at), .plan = &positions};
  K3_ASSIGN_OR_RETURN(PrefixLease lease, cache_->acquire(prompt, seq, how));
  K3_CHECK(static_cast<uint64_t>(lease.cached_tokens) == resume_at, "StagePrefixCache: lookup disagrees with peek");
  return lease;
}

int StagePrefixCache::pages_short(const SeqCache& seq, int64_t extra) const {
  const int64_t ps = pools_.options().page_size;
  const int64_t need = (seq.num_tokens + extra + ps - 1) / ps - static_cast<int64_t>(seq.pages.size());
  return static_cast<int>(std::max<int64_t>(0, need));
}

Status StagePrefixCache::reserve_first(SeqCache& seq, int64_t extra, uint32_t& evicted) {
  const uint64_t before = cache_->stats().evictions;
  const int need = pages_short(seq, extra);
  while (pools_.free_pages() < need && cache_->evict(1) == 1) {
  }
  evicted += static_cast<uint32_t>(cache_->stats().evictions - before);
  return pools_.reserve(seq, extra);
}

Status StagePrefixCache::reserve_replica(SeqCache& seq, int64_t extra, uint32_t evictions) {
  if (const int done = cache_->evict(static_cast<int>(evictions)); done != static_cast<int>(evictions))
    spdlog::warn("prefix cache replica: stage 0 evicted {} entries here, this replica only {}", evictions, done);
  const int need = pages_short(seq, extra);
  if (pools_.free_pages() < need) {
    spdlog::warn("prefix cache replica: evicting on its own for {} pages (it may drift from stage 0; a later lookup repairs it)", need);
    while (pools_.free_pages() < need && cache_->evict(1) == 1) {
    }
  }
  return pools_.reserve(seq, extra);
}

std::vector<KdaCheckpoint> StagePrefixCache::checkpoints_in(const PrefixLease& lease, int64_t from, int64_t n) {
  std::vector<KdaCheckpoint> out;
  for (const KdaCheckpoint& c : lease.plan)
    if (c.pos > from && c.pos <= from + n) out.push_back(c);
  return out;
}

}  // namespace k3::prefill
