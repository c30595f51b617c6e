// The prefix cache of one prefill pipeline stage (docs/PREFIX_CACHE.md, "On a prefill pipeline").
//
// Every stage keeps a replica of one radix tree, over its own layers' MLA pages and KDA checkpoints.
// Stage 0 decides: its lookup fixes where a request resumes and which checkpoints the pass takes, and
// what it decided travels with the chunks (ChunkCacheSync). A later stage follows: it resumes exactly
// where stage 0 does and takes the checkpoints stage 0 planned. The stages make the same calls in the
// same order (a prefill instance computes requests first come, first served on every stage, and the
// activation link is FIFO) and count bytes as the whole model does, so replicas in step make the same
// choices, evictions included.
//
// A replica can still drift: a request that ends on one stage while another already committed it, a
// stage restarted with an empty cache, an eviction of its own under pressure. Drift only ever shows as
// a replica that lacks the checkpoint stage 0 resumes from (open_replica answers NotFound). The
// request then does not fail: the stage asks stage 0 (through the link, backwards) to compute it again
// from its first token with a forced miss, and that pass also plans every checkpoint stage 0 holds on
// the prompt's path, so the replica takes the ones it lacked and the trees converge.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "common/config/cache_layout.h"
#include "engine/prefix_cache.h"
#include "prefill_node/stage_link.h"

namespace k3::prefill {

class StagePrefixCache {
 public:
  // opts.enabled must be set; `layout` is the whole model's (byte accounting shared by all stages);
  // `chunk_size` the pipeline's chunk (resumed passes must cut KDA chunks where a full pass does).
  static Result<std::unique_ptr<StagePrefixCache>> create(CachePools& pools, const ModelConfig& cfg,
                                                          const CacheLayout& layout, PrefixCacheOptions opts,
                                                          int chunk_size, const Backend& backend);

  // Stage 0: opens `seq` for `prompt` (restoring the deepest checkpoint) and fills the sync of the
  // request's first chunk. `recompute`: a later stage lacked the state of the first try; a miss whose
  // plan also holds every checkpoint this replica has on the prompt's path (so the others take them).
  Result<PrefixLease> open_first(std::span<const int32_t> prompt, SeqCache& seq, ChunkCacheSync& sync,
                                 bool recompute = false);
  // A later stage: resumes exactly at `resume_at` and takes stage 0's `plan`. Code::NotFound when this
  // replica lacks the checkpoint at `resume_at` (it drifted): nothing is held then.
  Result<PrefixLease> open_replica(std::span<const int32_t> prompt, SeqCache& seq, uint64_t resume_at,
                                   const std::vector<uint64_t>& plan, int stage);
  // Stage 0: pages for `extra` more tokens, evicting cached entries when the pool is short; the
  // evictions are counted into `evicted` (sent with the chunk). Fails when nothing more can go.
  Status reserve_first(SeqCache& seq, int64_t extra, uint32_t& evicted);
  // A later stage: replays stage 0's `evictions` first, then reserves (evicting on its own only as a
  // last resort: the replica may then drift, which a later request's lookup repairs).
  Status reserve_replica(SeqCache& seq, int64_t extra, uint32_t evictions);
  // The lease's planned checkpoints inside (from, from + n].
  static std::vector<KdaCheckpoint> checkpoints_in(const PrefixLease& lease, int64_t from, int64_t n);

  // A later stage: stage 0's evictions announced with chunks this stage drops (a request that ended
  // or is computed again here), so the replica still makes them.
  void replay_evictions(uint32_t evictions) { cache_->evict(static_cast<int>(evictions)); }
  void commit(PrefixLease& lease, std::span<const int32_t> prompt, SeqCache& seq) { cache_->commit(lease, prompt, seq); }
  void release(PrefixLease& lease) { cache_->release(lease); }
  const PrefixCache& cache() const { return *cache_; }

 private:
  StagePrefixCache(CachePools& pools, std::unique_ptr<PrefixCache> cache) : pools_(pools), cache_(std::move(cache)) {}
  int pages_short(const SeqCache& seq, int64_t extra) const;

  CachePools& pools_;
  std::unique_ptr<PrefixCache> cache_;
};

}  // namespace k3::prefill
