// The compute of one rank of a decode rank group (leader and members alike): its RankModel (the
// rank-sliced forward, engine/rank_model.h) and its caches of the requests it serves, driven by the
// leader's GroupCommands (group_command.h). DCP: every rank serves every request of the group, each with
// its slice; EP: each rank serves the requests the leader gave it, and every rank joins every step.
#pragma once
#include <functional>
#include <map>
#include <memory>

#include "decode_node/group_command.h"
#include "decode_node/rank_metrics.h"
#include "engine/cache_io.h"
#include "engine/rank_model.h"

namespace k3::decode {

class GroupWorker {
 public:
  static Result<std::unique_ptr<GroupWorker>> create(Backend& backend, const ModelConfig& cfg, const WeightStore& weights,
                                                     const RankLayout& layout, Comm& comm, const CacheOptions& cache);
  ~GroupWorker() { close_all(); }

  // A command's pieces. admit imports the image into this rank's caches; an admit that does not fit a
  // member's caches is an error (the leader imports its own slice first and admits only what its caches
  // hold; rank 0 of a DCP group holds the most rows). step returns the logits of the feeds ([feeds, vocab]
  // F32, feed order). A failed collective leaves the group unusable: the caller closes everything.
  Status admit(const GroupAdmit& a);
  // The same from the tables of the rank's transfer region (region_image.h), read in place: on a GPU rank
  // the region is device memory and the bytes move by device gathers.
  Status admit_from(const GroupAdmit& a, const CacheTables& tables);
  void drop(uint64_t id);
  // `progress`: called after each layer (RankModel::decode_step), e.g. the leader's control heartbeats.
  // `with_logits` false: the LM head is skipped and nothing is returned (a DCP member's step).
  Result<std::vector<float>> step(const std::vector<GroupFeed>& feeds, const std::function<void()>& progress = {},
                                  bool with_logits = true);
  void close_all();
  // From now on every step adds its times to `m` (rank_metrics.h), which must outlive this worker.
  void publish_to(protocol::MetricsRegistry& m) { metrics_ = std::make_unique<RankMetrics>(m); }

  size_t num_requests() const { return seqs_.size(); }
  GroupRoom room();                  // this rank's decode caches: pages and sequence slots, free and all
  CachePools& caches() { return model_->caches(); }
  RankModel& model() { return *model_; }

 private:
  struct Served {
    SeqCache seq;
    int64_t position = 0;
  };
  GroupWorker() = default;
  // Opens and reserves the request's sequence, fills it with `import`, keeps it; closes it on an error.
  Status admit_with(const GroupAdmit& a, const std::function<Status(CachePools&, const SeqCache&, int64_t rows)>& import);

  Backend* backend_ = nullptr;
  ModelConfig cfg_;
  std::unique_ptr<RankModel> model_;
  std::map<uint64_t, Served> seqs_;
  std::unique_ptr<RankMetrics> metrics_;
};

}  // namespace k3::decode
