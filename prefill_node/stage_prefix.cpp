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

Result<PrefixLease> StagePrefixCache::open_first(std::span<const int32_t> prompt, SeqCache& seq, ChunkCacheSync& sync) {
  // No donation: the request's own slot is exported to decode after the prompt, so the prompt's end is
  // a planned checkpoint (a copy) like any other.
  K3_ASSIGN_OR_RETURN(PrefixLease lease, cache_->acquire(prompt, seq, /*donate_end=*/false));
  sync.prompt.assign(prompt.begin(), prompt.end());
  sync.plan.clear();
  for (const KdaCheckpoint& c : lease.plan) sync.plan.push_back(static_cast<uint64_t>(c.pos));
  return lease;
}

Result<PrefixLease> StagePrefixCache::open_replica(std::span<const int32_t> prompt, SeqCache& seq, uint64_t resume_at,
                                                   const std::vector<uint64_t>& plan, int stage) {
  K3_ASSIGN_OR_RETURN(PrefixLease lease, cache_->acquire(prompt, seq, /*donate_end=*/false));
  std::vector<uint64_t> mine;
  for (const KdaCheckpoint& c : lease.plan) mine.push_back(static_cast<uint64_t>(c.pos));
  if (static_cast<uint64_t>(lease.cached_tokens) == resume_at && mine == plan) return lease;
  const std::string why = "prefix cache of stage " + std::to_string(stage) + " is out of step with stage 0: it resumes at " +
                          std::to_string(lease.cached_tokens) + " with " + std::to_string(mine.size()) +
                          " checkpoints planned, stage 0 at " + std::to_string(resume_at) + " with " +
                          std::to_string(plan.size());
  cache_->release(lease);
  pools_.close(seq);
  return internal_error(why);
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
    spdlog::warn("prefix cache replica: evicting on its own for {} pages (it may go out of step with stage 0)", need);
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
