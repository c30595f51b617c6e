// The decode forward of one rank of a decode group (engine/rank_layout.h): the model's math cut by heads
// (DCP), by tokens of the MLA cache (DCP) or by experts (EP), with the collectives between the cuts.
// The collectives go through the `Comm` interface (common/core/comm.h: UCX, or NCCL between GPUs).
//
// Equivalence (tests/engine/test_rank_*.cpp): every rank of a DCP group returns the same logits, bit for
// bit, as one rank with the same kv_partitions (DCPn == DCP1); EP ranks return for their requests the bits
// one rank returns (EPn == EP1); and a single rank with kv_partitions = 1 is the monolithic Model.
// Why exact: KDA heads and MLA heads are gathered (not reduced) before the output projection, the MLA
// partials are merged in partition order whatever rank computed them, and the expert outputs are summed
// on the token's own rank in slot order, as moe_experts does.
#pragma once
#include <functional>
#include <memory>
#include <span>

#include "common/core/comm.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/rank_layout.h"

namespace k3 {

// One request in a rank's decode step.
struct RankItem {
  SeqCache* seq = nullptr;  // this rank's caches of the request (num_tokens = its local MLA rows)
  int64_t position = 0;     // tokens of the request already cached over the whole group (>= 1)
};

// Seconds spent in each collective kind (and bytes sent), summed over steps; compute = step - these.
struct CollectiveTimes {
  double all_gather = 0, all_to_all = 0, all_to_allv = 0, all_reduce = 0;
  double step = 0;          // whole decode steps
  uint64_t bytes = 0;       // bytes handed to the collectives by this rank
  uint64_t steps = 0;
  double collectives() const { return all_gather + all_to_all + all_to_allv + all_reduce; }
};

class RankModel {
 public:
  // The rank reads its part of `weights` only (upload_weights' expert range and head share); its cache
  // pools are the rank's slice (rank_cache_config). Any backend; a communicator that takes device memory (NCCL) needs a device
  // backend. The collectives stage between host and device where the two differ (rank_step.h).
  static Result<std::unique_ptr<RankModel>> create(Backend& backend, const ModelConfig& cfg, const WeightStore& weights,
                                                   const RankLayout& layout, Comm& comm, const CacheOptions& cache);
  ~RankModel();

  // One decode step, one new token per item. Every rank of the group calls it in lockstep: DCP ranks with
  // the same items and tokens, EP ranks each with their own (possibly empty) batch. Appends the new MLA
  // rows on the ranks that own their positions, then advances every item (position + 1, local rows + 1
  // where owned). Returns F32 host logits [B, vocab].
  // Errors: when any rank of the group is out of cache pages every rank returns ResourceExhausted before
  // touching a cache; a collective that fails (a peer died or timed out) returns its error, and the
  // group is then unusable.
  // `progress`, when set, is called on this thread after each layer's work has been enqueued (and, with
  // collectives through the host, exchanged): a step that runs long on a shared or loaded GPU lets its host
  // keep up control heartbeats meanwhile, as Model::forward's does.
  // `with_logits` false skips the final norm and the LM head and returns [B, 0]: a rank whose logits nobody
  // draws (a DCP member's; its leader computes the same rows).
  Result<Tensor> decode_step(std::span<RankItem> batch, std::span<const int32_t> tokens,
                             const std::function<void()>& progress = {}, bool with_logits = true);

  CachePools& caches() { return *caches_; }
  const RankLayout& layout() const { return layout_; }
  const ModelConfig& config() const { return cfg_; }
  const CollectiveTimes& times() const { return times_; }
  void reset_times() { times_ = {}; }

  struct Impl;

 private:
  RankModel() = default;
  ModelConfig cfg_;
  RankLayout layout_;
  CollectiveTimes times_;
  std::unique_ptr<CachePools> caches_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3
