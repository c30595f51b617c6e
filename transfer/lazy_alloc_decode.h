// Decode side of the lazy-alloc protocol, for one decode instance (one DP group's leader accounts for
// every rank of the group through their RankPools).
//
//   CLAIM            -> CLAIMED: recorded, no memory. Deadline compute_wait (or Claim.timeout_ms).
//   COMPUTE_DONE(s)  -> first one: allocate on every rank of the claim (pages for the rank's rows + one
//                       KDA slot), state ALLOCATED, deadline transfer_wait; every one: send ADDRS (all
//                       entries of all ranks) to stage s, state TRANSFERRING. The first token is taken
//                       from the COMPUTE_DONE that has it (the last stage).
//                       A streaming COMPUTE_DONE (sent at stage s's first chunk) is treated the same; the
//                       stage's later final COMPUTE_DONE only brings the first token (last stage).
//   TRANSFER_DONE(s) -> stage s done; when all num_prefill_stages stages are done -> DECODING + Ready.
//   hand_over        -> (DECODING only) the decode engine owns the request's memory now: the side lets go
//                       of its pages and slot; the request stays DECODING with none held.
//   on_finished      -> FINISHED, memory released (if still held).
//   ABORT / deadline / peer death / allocation failure -> ABORTED / EXPIRED / FAILED at once. ABORT goes
//                       to every prefill stage that has not finished (unless the prefill instance is dead);
//                       FAILED goes to the router when the end started here (deadline, allocation, a
//                       prefill death), not for an ABORT (its origin told the router). Memory is released at
//                       once if no stage can be writing, else deferred (lazy_alloc.h guarantees).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/protocol/metrics.h"
#include "transfer/lazy_alloc.h"
#include "transfer/request_records.h"
#include "transfer/pool.h"

namespace k3::transfer {

// Where a rank with several regions (its own and alternates, each able to hold a whole request: an EP
// group, where each request lives on one rank) allocates a request: the regions to try, best first (one
// left out is not tried); the side takes the first with room. Unset: in the order the pools were given.
using RegionOrder = std::function<std::vector<uint32_t>(const protocol::Claim&, std::vector<uint32_t> regions)>;

struct DecodeSideConfig {
  std::string instance_id;
  CacheLayout model;
  bool kda_head_sliced = true;
  ProtocolTimeouts timeouts;
  RegionOrder region_order;
};

class DecodeSide {
 public:
  // `pools`: one or more per global rank this side accounts for (not owned; must outlive this object), each
  // with its own region id. Several pools of one rank are alternates: a request is allocated in one of them.
  // `metrics` may be nullptr.
  DecodeSide(DecodeSideConfig config, std::vector<RankPool*> pools, protocol::MetricsRegistry* metrics);
  ~DecodeSide();
  DecodeSide(const DecodeSide&) = delete;
  DecodeSide& operator=(const DecodeSide&) = delete;

  Actions on_claim(const protocol::Claim& m, Millis now);
  Actions on_compute_done(const protocol::ComputeDone& m, Millis now);
  Actions on_transfer_done(const protocol::TransferDone& m, Millis now);
  Actions on_abort(const protocol::Abort& m, Millis now);
  Actions on_abort_ack(const protocol::AbortAck& m, Millis now);
  // Dispatches the message types above; others give an Ignored action.
  Actions on_message(const protocol::Message& m, Millis now);

  // Decoding of the request ended normally (the decode node emitted the last token).
  Actions on_finished(uint64_t request_id, Millis now);
  // The decode engine took the request's pages and slot over (its caches live in the pool, and it holds
  // its own references): the side drops its hold now, not at the end, so that what the engine frees (a
  // preempted request's cache) returns to the pool at once. Only in DECODING, when every stage is done and
  // no write can land; an error names the state otherwise. The record stays until the request ends.
  Status hand_over(uint64_t request_id);
  // Heartbeats of `peer` stopped. Router: every request fails. Prefill instance: its requests fail, and
  // its stages count as unable to write once the quarantine has passed.
  Actions on_peer_dead(const Peer& peer, Millis now);
  // Expires waits, releases deferred memory whose quarantine passed, forgets old tombstones.
  Actions tick(Millis now);

  // Current state; nullopt for unknown ids; the terminal state for remembered (tombstoned) ids.
  std::optional<RequestState> state(uint64_t request_id) const;
  // The request's per-rank allocations (page tables, slots) while it holds memory; nullptr otherwise.
  const std::vector<RankAllocation>* allocation(uint64_t request_id) const;
  bool holds_memory(uint64_t request_id) const;
  // The CLAIM of a live request (its sampling params tell decode how to sample and stop); nullptr otherwise.
  const protocol::Claim* claim(uint64_t request_id) const;
  size_t num_live() const;            // records not yet ended, or ended but still holding memory

 private:
  struct Record;
  Actions end_request(Record& r, RequestState terminal, AbortReason cause, bool notify_router,
                      bool notify_prefill, Millis now);
  void maybe_release(Record& r, Millis now, bool quarantine_over, Actions& out);
  void set_state(Record& r, RequestState to);
  Record* find(uint64_t id, const char* what, Actions& out);

  DecodeSideConfig cfg_;
  std::map<uint32_t, RankPool*> pools_;        // by region id
  std::map<uint32_t, std::vector<uint32_t>> regions_;  // global rank -> its regions (the first given first)
  protocol::MetricsRegistry* metrics_;
  LiveRecords<Record> records_;
  Tombstones tombstones_;  // ended: state, forget-at
};

}  // namespace k3::transfer
