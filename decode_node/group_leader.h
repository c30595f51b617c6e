// The leader (rank 0) of a decode rank group: one DP group of a decode instance, DCP or EP
// (engine/rank_layout.h, docs/RANKS.md), and the only rank the router and the prefill stages see.
//
//  - Its transfer DecodeDriver holds the registered region of every rank of the group (region id = the
//    rank's global rank), each owned by its rank's process (member_region.h): at start-up the leader asks
//    each member for it (group_command.h) and lists it, with the member's UCX worker, in its REGISTER, so
//    the prefill stages write straight into the process that decodes the bytes. The leader keeps the
//    pages-and-slots bookkeeping of every region (the lazy-alloc protocol allocates on each rank).
//    DCP: the router's CLAIM names the group's ranks and the prefill stages plan their writes with the DCP
//    interleave and the KDA head slicing (transfer/plan.h), each rank's slice into its region. EP: the CLAIM
//    names the leader's rank and the members' regions are its alternates; when the prefill stages ask where
//    to write, the leader picks the rank that will decode the request (ep_region_order) and allocates it
//    there, whole.
//  - When a request is ready, the leader reads its own share out of its region (region_image.h's tables,
//    in place: device memory on a GPU, so the import is device gathers) and tells every member holding a
//    share where it is (page table and slot) in the next GroupCommand; the member reads it from its own
//    region the same way. No cache bytes travel in commands.
//  - Admission by every rank's own room: members report their caches after every command (GroupRoom);
//    a ready request joins only where each rank it needs (DCP: all; EP: the one it was written to) holds its
//    prompt now and, promised, its prompt + max_tokens; otherwise it waits here in arrival order (WAITING
//    names the ranks), or is refused when no rank can ever hold it. room() reports the group as one target
//    to the router.
//  - Every step: one GroupCommand to every member, then the rank-sliced step on every rank in lockstep.
//    The leader samples (DCP: its own logits, equal on every rank; EP: each rank's logits come back) the way
//    a plain decode rank does (draw_tokens.h: logprobs, the structured-output mask) and streams TOKENS like
//    one (streamed_request.h).
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
#include "decode_node/member_liveness.h"
#include "decode_node/region_image.h"

namespace k3::decode {

struct GroupLeaderOptions {
  DecodeRankOptions rank;          // the decode rank's options (rank = the group's first global rank)
  RankLayout layout;               // dcp / ep / kv_partitions; rank 0
  Comm* collectives = nullptr;     // the forward's collectives (group_collectives.h); null: the group comm
  GroupDeadlines deadlines;        // the group's first step under the start-up timeout, then the step deadline
  // Where the members' beats arrive (member_liveness.h): the group's interface, any port. Their interval
  // and window are the rank's heartbeat's (rank.heartbeat).
  std::string liveness_bind = "tcp://127.0.0.1:*";
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
  // What the leader does while it waits on its members (the group Comm's while-waiting hook): an error
  // when a member has stopped beating (it is dead: the wait fails now, not at the step deadline);
  // otherwise it heartbeats to the router, so a long wait on a live member does not look like a dead group.
  Status while_waiting();

  size_t num_running() const { return running_.size(); }  // waiting ones not counted
  protocol::DecodeRoom room();
  std::vector<FinishedRequest> take_finished() { return std::exchange(finished_, {}); }
  uint64_t pool_free_bytes();
  uint64_t pool_capacity_bytes();
  transfer::DecodeDriver& driver() { return *driver_; }
  GroupWorker& worker() { return *worker_; }

  // Everything this node counts (k3-decode / k3-prefill --metrics-listen serve it).
  const protocol::MetricsRegistry& metrics() const { return metrics_; }
  protocol::MetricsRegistry& metrics() { return metrics_; }
 private:
  struct Running : StreamedRequest {
    int rank = 0;                  // EP: the rank that holds it (its region was written); DCP: 0 (every rank)
    uint64_t step = 1;             // the decode step of its next token (the first token was step 0)
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
  // `ep_rank`: EP, the rank the request was written to (unused for DCP).
  Placement place(int64_t prompt_len, int max_tokens, int ep_rank) const;
  // Whether `rank`'s decode cache takes the request now (its prompt's pages free, prompt + max_tokens within
  // what is not promised yet, a free sequence).
  bool fits_now(int rank, int64_t prompt_len, int max_tokens) const;
  // EP: the regions (one per rank) to allocate a request in, best first (DecodeSideConfig::region_order).
  std::vector<uint32_t> ep_region_order(const protocol::Claim& c, std::vector<uint32_t> regions) const;
  uint32_t pages_on(int rank, int64_t tokens) const;   // cache pages of a request of `tokens` on `rank`
  std::string room_of(int rank, uint32_t need) const;
  bool emit(Running& r, int32_t token, std::vector<protocol::TokenLogprobs> logprobs);
  void finish(uint64_t id, protocol::FinishReason why);
  void abort_local(uint64_t id, const std::string& why);
  void drop(uint64_t id);          // ends its caches on every rank (next command) and forgets it
  Status step();         // the batch step, then every member's room
  Status step_batch();
  Status fail_group(const Status& why);
  // The leader's share of a request's caches, read from its own region.
  Result<RegionTables> own_tables(const transfer::RankAllocation& a, uint32_t prompt_len);

  GroupLeaderOptions opts_;
  Backend& backend_;
  Comm& comm_;
  ModelConfig cfg_;
  std::vector<transfer::CacheLayout> rank_layouts_;  // per rank of a DCP group (its KDA head slice)
  transfer::CacheLayout full_layout_;
  std::unique_ptr<GroupWorker> worker_;
  std::unique_ptr<MemberLiveness> liveness_;
  protocol::MetricsRegistry metrics_;
  std::unique_ptr<transfer::DecodeDriver> driver_;
  std::map<uint64_t, Running> running_;
  std::vector<uint64_t> order_;                       // running ids in admission order (the step order)
  std::vector<uint64_t> pending_end_;
  std::vector<FinishedRequest> finished_;
  std::vector<GroupCommand> next_;                    // per rank: what the next command carries
  std::vector<GroupRoom> rooms_;                      // per rank: its caches as last reported (rank 0: its own)
  bool stepped_ = false;  // the group's first step is done (GroupDeadlines)
  std::vector<uint32_t> committed_;                   // per rank: pages promised to its running requests
  std::deque<transfer::ReadyAction> waiting_;         // ready, waiting for room on their ranks (arrival order)
  std::set<uint64_t> said_waiting_;                   // WAITING said once per request
};

}  // namespace k3::decode
