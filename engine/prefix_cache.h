// The prefix cache of the hybrid model (docs/PREFIX_CACHE.md): a PrefixTree whose pages and checkpoint
// slots live in one CachePools. The three state moves:
//   copy-on-write  a hit copies the tree's read-only checkpoint into the request's own slot before the
//                  forward rewrites it (acquire);
//   snapshot       a running request's state is copied into a tree slot: inside the prefill pass at
//                  planned checkpoint positions (Model::forward), or after a feed (snapshot());
//   donate         a request that is done with its slot hands it to the tree without a copy (commit).
// MLA pages are append-only, so a hit shares them by reference (CachePools page references).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/prefix_tree.h"

namespace k3 {

struct PrefixCacheOptions {
  bool enabled = false;
  int block_tokens = 64;        // checkpoint alignment: a multiple of the KDA chunk (64) and the page size
  int checkpoint_every = 1;     // blocks between planned checkpoints of a new prompt (the fork and the last
                                // whole block of the prompt always get one)
  uint64_t budget_bytes = 0;    // tree memory (checkpoints + pages) kept at most; 0: the pools bound it
  double alpha = 1.0;           // eviction: weight of compute-saved-per-byte against recency
  // Bytes the tree counts per checkpoint / per page (budget and eviction scores); 0: this pool's. The
  // stages of a prefill pipeline give the whole model's, so every stage's cache makes the same choices.
  uint64_t tree_slot_bytes = 0, tree_page_bytes = 0;
  // Names the bad field; prefill_chunk is the engine's (0 = whole prompt).
  Status validate(const CacheOptions& cache, int prefill_chunk) const;
};

struct PrefixCacheStats {
  uint64_t lookup_tokens = 0;         // prompt tokens looked up
  uint64_t hit_tokens = 0;            // of those, restored from the cache (prefill skipped)
  uint64_t checkpoints_stored = 0;
  uint64_t checkpoints_evicted = 0;
  uint64_t pages_evicted = 0;
  uint64_t donations = 0;
  uint64_t evictions = 0;             // entries evicted (a leaf, or an inner node's checkpoint)
};

// One request's hold on the cache, from acquire to release.
struct PrefixLease {
  const PrefixTree::Node* node = nullptr;   // pinned checkpoint node of the hit (null: miss)
  int64_t cached_tokens = 0;                // the request resumes here
  std::vector<KdaCheckpoint> plan;          // checkpoints to take during the rest of the prefill
  bool donate_end = false;                  // commit() hands the request's slot over at the prompt's end
  bool active = false;
};

// How acquire() chooses where a request resumes and which checkpoints it takes.
struct AcquireOptions {
  // The caller will not run the request on after the prompt (a prefill node), so an aligned prompt end
  // is donated by commit() instead of copied.
  bool donate_end = false;
  // Resume at or below this position (-1: anywhere below the prompt's last token; 0: a miss).
  int64_t resume_limit = -1;
  // Take checkpoints exactly at these positions (a pipeline replica follows stage 0's plan) instead of
  // planning them; a position whose slot cannot be had is left out.
  const std::vector<int64_t>* plan = nullptr;
  // Also plan every checkpoint the tree already holds on the prompt's path: a recompute that lets the
  // replicas which lack them take them (the tree keeps its own copy and frees the new one).
  bool replan_cached = false;
};

class PrefixCache {
 public:
  PrefixCache(CachePools& pools, const ModelConfig& cfg, const PrefixCacheOptions& opts);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Opens `seq` for `prompt` (a fresh request): restores the deepest checkpoint below the prompt's last
  // token (copy-on-write into seq's own slot), shares the pages before it, and plans the checkpoints of
  // the rest. `donate_end`: the caller will not run the request on after the prompt (a prefill node), so
  // an aligned prompt end is donated by commit() instead of copied.
  Result<PrefixLease> acquire(std::span<const int32_t> prompt, SeqCache& seq, bool donate_end = false) {
    return acquire(prompt, seq, AcquireOptions{.donate_end = donate_end});
  }
  Result<PrefixLease> acquire(std::span<const int32_t> prompt, SeqCache& seq, const AcquireOptions& how);
  // After the prompt's prefill ran with lease.plan: the tree adopts the checkpoints and the pages up to
  // the deepest one; what it did not adopt is freed.
  void commit(PrefixLease& lease, std::span<const int32_t> prompt, SeqCache& seq);
  // Copies seq's current state into the tree as a checkpoint of tokens[0, seq.num_tokens) (aligned).
  bool snapshot(std::span<const int32_t> tokens, const SeqCache& seq);
  // Unpins and frees uncommitted planned slots; idempotent.
  void release(PrefixLease& lease);
  // An acquire of `prompt` the caller backs out of before running anything (a scheduler that found no
  // room for it yet and will ask again): released, and out of the lookup and hit counts, which count
  // the prompts served. The caller closes the sequence.
  void withdraw(PrefixLease& lease, std::span<const int32_t> prompt);

  // Evicts until `slots` KDA slots and `pages` pages are free; false when pinned entries block it.
  bool make_room(int slots, int pages);
  // Evicts up to `count` entries in the policy's order; returns how many went. Replays another
  // cache's evictions on a replica in the same state (pipeline stages).
  int evict(int count);
  // Drops every unpinned entry (all, when no request runs).
  void flush();
  // A new memory budget (0: the pools bound it); takes effect at the next checkpoint taken.
  void set_budget_bytes(uint64_t bytes) { opts_.budget_bytes = bytes; }

  const PrefixCacheStats& stats() const { return stats_; }
  const PrefixTree& tree() const { return tree_; }
  const PrefixCacheOptions& options() const { return opts_; }

 private:
  bool evict_one();
  std::optional<int> take_slot();
  void give_back(const PrefixTree::Adopted& adopted, const std::map<int64_t, int>& ckpts);

  CachePools& pools_;
  PrefixCacheOptions opts_;
  PrefixTree tree_;
  PrefixCacheStats stats_;
  int planned_slots_ = 0;    // slots held by plans, not yet in the tree
};

}  // namespace k3
