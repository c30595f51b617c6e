// The leader (rank 0) of a decode rank group: one DP group of a decode instance, DCP or EP
// (engine/rank_layout.h, docs/RANKS.md), and the only rank the router and the prefill stages see.
//
//  - Its transfer DecodeDriver holds the registered region of every rank of a DCP group (region id = the
//    rank's global rank): the router's CLAIM names the group's ranks, the prefill stages plan their
//    writes with the DCP interleave and the KDA head slicing (transfer/plan.h) and put each rank's slice
//    into that rank's region over UCX. An EP group has one region (each request lives whole on one rank).
//    Every other rank of a DCP group owns its region in its own process (member_region.h): at start-up the
//    leader asks each member for it (group_command.h) and lists it, with the member's UCX worker, in its
//    REGISTER, so the prefill stages write each rank's slice straight into that rank's process; the leader
//    keeps the pages-and-slots bookkeeping of every region (the lazy-alloc protocol allocates on each rank).
//  - When a request is ready, the leader reads its own slice out of its region (region_image.h) and tells
//    every member of a DCP group where its slice is (page table and slot) in the next GroupCommand; the
//    member reads it from its own region. EP: the whole image is read from the leader's region and
//    forwarded in the command to the rank with the fewest requests (forwarded_bytes() counts it).
//  - Admission by every rank's own room: members report their caches after every command (GroupRoom);
//    a ready request joins only where each rank it needs holds its prompt now and, promised, its prompt +
//    max_tokens; otherwise it waits here in arrival order (WAITING names the ranks), or is refused when no
//    rank can ever hold it. room() reports the group as one target to the router.
//  - Every step: one GroupCommand to every member, then the rank-sliced step on every rank in lockstep.
//    The leader samples (DCP: its own logits, equal on every rank; EP: each rank's logits come back) and
//    streams TOKENS like a plain decode rank (decode_rank.h).
//  - A failed step (a member died or missed the step deadline) ends every request of the group with
//    FAILED to the router, closes every cache, and the leader leaves (run_once returns the error).
#pragma once
#include <deque>
#include <map>
#include <set>
#include <string>
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

  size_t num_running() const { return running_.size(); }  // waiting ones not counted
  protocol::DecodeRoom room();
  std::vector<FinishedRequest> take_finished() { return std::exchange(finished_, {}); }
  uint64_t pool_free_bytes();
  uint64_t pool_capacity_bytes();
  transfer::DecodeDriver& driver() { return *driver_; }
  GroupWorker& worker() { return *worker_; }
  // Cache image bytes the leader sent members in commands (EP only; a DCP group's ranks read their own regions).
  uint64_t forwarded_bytes() const { return forwarded_bytes_; }

 private:
  struct Running {
    uint64_t id = 0;
    int rank = 0;                  // EP: the rank that holds it; DCP: 0 (every rank)
    std::vector<int32_t> tokens;
    ops::SamplingRow sampling;
    uint64_t step = 1;             // the decode step of its next token (the first token was step 0)
    int max_tokens = 16;
    std::vector<int32_t> stop_ids;
    std::vector<uint32_t> pages;   // per rank: cache pages promised to it (prompt + max_tokens rows)
  };
  // Where a ready request can go now: rank (EP: its rank; DCP: 0 = every rank), or -1 and why it waits;
  // never: no rank can ever hold it (why names them).
  struct Placement {
    int rank = -1;
    bool never = false;
    std::string why;
  };
  GroupLeader(const GroupLeaderOptions& opts, Backend& backend, Comm& comm)
      : opts_(opts), backend_(backend), comm_(comm) {}

  void after_driver();
  void admit_waiting();
  // False when the request must wait for room (it stays first in waiting_); true when it started or ended.
  bool start(const transfer::ReadyAction& ready);
  bool admit(const transfer::ReadyAction& ready, const std::vector<transfer::RankAllocation>& alloc);
  Placement place(int64_t prompt_len, int max_tokens) const;
  uint32_t pages_on(int rank, int64_t tokens) const;   // cache pages of a request of `tokens` on `rank`
  std::string room_of(int rank, uint32_t need) const;
  bool emit(Running& r, int32_t token);
  void finish(uint64_t id, protocol::FinishReason why);
  void abort_local(uint64_t id, const std::string& why);
  void drop(uint64_t id);          // ends its caches on every rank (next command) and forgets it
  Status step();         // the batch step, then every member's room
  Status step_batch();
  Status fail_group(const Status& why);
  Result<std::vector<uint8_t>> rank_image(uint64_t id, const transfer::RankAllocation& a, int rank_index,
                                          uint32_t prompt_len);

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
  uint64_t forwarded_bytes_ = 0;
  std::vector<GroupRoom> rooms_;                      // per rank: its caches as last reported (rank 0: its own)
  std::vector<uint32_t> committed_;                   // per rank: pages promised to its running requests
  std::deque<transfer::ReadyAction> waiting_;         // ready, waiting for room on their ranks (arrival order)
  std::set<uint64_t> said_waiting_;                   // WAITING said once per request
};

}  // namespace k3::decode
