// The leader (rank 0) of a decode rank group: one DP group of a decode instance, DCP or EP
// (engine/rank_layout.h, docs/RANKS.md), and the only rank the router and the prefill stages see.
//
//  - Its transfer DecodeDriver holds the registered region of every rank of a DCP group (region id = the
//    rank's global rank): the router's CLAIM names the group's ranks, the prefill stages plan their
//    writes with the DCP interleave and the KDA head slicing (transfer/plan.h) and put each rank's slice
//    into that rank's region over UCX. An EP group has one region (each request lives whole on one rank).
//  - When a request is ready, the leader reads each rank's image out of its region
//    (region_image.h), imports its own slice, and hands every member its slice in the next GroupCommand
//    (group_command.h) over the group's Comm; EP: the whole image goes to the rank with the fewest requests.
//  - Every step: one GroupCommand to every member, then the rank-sliced step on every rank in lockstep.
//    The leader samples (DCP: its own logits, equal on every rank; EP: each rank's logits come back) and
//    streams TOKENS like a plain decode rank (decode_rank.h).
//  - A failed step (a member died or missed the step deadline) ends every request of the group with
//    FAILED to the router, closes every cache, and the leader leaves (run_once returns the error).
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "decode_node/decode_rank.h"
#include "decode_node/group_worker.h"

namespace k3::decode {

struct GroupLeaderOptions {
  DecodeRankOptions rank;          // the decode rank's options (rank = the group's first global rank)
  RankLayout layout;               // dcp / ep / kv_partitions; rank 0
};

class GroupLeader {
 public:
  // `comm` is the formed group communicator (rank 0 here); it must outlive the leader.
  static Result<std::unique_ptr<GroupLeader>> create(const GroupLeaderOptions& opts, Backend& backend,
                                                     const ModelConfig& cfg, const WeightStore& weights, Comm& comm,
                                                     zmq::context_t& zctx);
  ~GroupLeader();

  const std::string& endpoint() const { return driver_->endpoint(); }
  // Driver events (sleeping up to `idle_wait` when nothing runs), ready requests, one command + step.
  // Returns an error when the group failed (after every request of the group ended).
  Status run_once(std::chrono::milliseconds idle_wait);
  // Tells every member to leave (normal shutdown).
  void stop_members();

  size_t num_running() const { return running_.size(); }
  protocol::DecodeRoom room();
  std::vector<FinishedRequest> take_finished() { return std::exchange(finished_, {}); }
  uint64_t pool_free_bytes();
  uint64_t pool_capacity_bytes();
  transfer::DecodeDriver& driver() { return *driver_; }
  GroupWorker& worker() { return *worker_; }

 private:
  struct Running {
    uint64_t id = 0;
    int rank = 0;                  // EP: the rank that holds it; DCP: 0 (every rank)
    std::vector<int32_t> tokens;
    ops::SamplingRow sampling;
    uint64_t step = 1;             // the decode step of its next token (the first token was step 0)
    int max_tokens = 16;
    std::vector<int32_t> stop_ids;
  };
  GroupLeader(const GroupLeaderOptions& opts, Backend& backend, Comm& comm)
      : opts_(opts), backend_(backend), comm_(comm) {}

  void after_driver();
  void admit(const transfer::ReadyAction& ready);
  bool emit(Running& r, int32_t token);
  void finish(uint64_t id, protocol::FinishReason why);
  void abort_local(uint64_t id, const std::string& why);
  void drop(uint64_t id);          // ends its caches on every rank (next command) and forgets it
  Status step();
  Status fail_group(const Status& why);
  Result<std::vector<uint8_t>> rank_image(uint64_t id, const transfer::RankAllocation& a, int rank_index,
                                          uint32_t prompt_len);
  int least_loaded_rank() const;

  GroupLeaderOptions opts_;
  Backend& backend_;
  Comm& comm_;
  ModelConfig cfg_;
  std::vector<transfer::CacheLayout> rank_layouts_;  // per rank of a DCP group (its KDA head slice)
  transfer::CacheLayout full_layout_;
  std::unique_ptr<GroupWorker> worker_;
  protocol::MetricsRegistry metrics_;
  std::unique_ptr<transfer::DecodeDriver> driver_;
  std::map<uint64_t, Running> running_;
  std::vector<uint64_t> order_;                       // running ids in admission order (the step order)
  std::vector<uint64_t> pending_end_;
  std::vector<FinishedRequest> finished_;
  std::vector<GroupCommand> next_;                    // per rank: what the next command carries
};

}  // namespace k3::decode
