// What the leader of a decode rank group (group_leader.h) tells every other rank before each step, over
// the group's Comm: the requests that left, the requests that join (each with the rank's own slice of
// their caches, read out of the transfer region the prefill stages wrote), and the batch to step.
// A command without a step is a tick: it keeps the members' receive deadline alive while the group idles,
// so a dead leader is noticed by its members at the step deadline and a dead member by the leader.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/core/comm.h"
#include "common/core/status.h"
#include "common/protocol/messages.h"
#include "engine/rank_layout.h"

namespace k3::decode {

struct GroupAdmit {
  uint64_t id = 0;
  int64_t position = 0;         // tokens of the request cached over the whole group (the prompt length)
  std::vector<uint8_t> image;   // this rank's packed cache image (engine/cache_io.h), when carried
  // The prefill stages wrote this rank's share (DCP slice, or EP whole request) into the rank's own transfer
  // region; the rank reads it from there (its page table and slot in that region; slot -1: none) and
  // `image` is empty. The leader's commands always say so: no cache bytes travel in them.
  bool from_region = false;
  std::vector<uint32_t> page_ids;
  int64_t slot = -1;
};

struct GroupFeed {
  uint64_t id = 0;
  int32_t token = 0;
};

// The group's waits (commands, rooms, logits and the forward's exchanges over the group's Comm). The step
// deadline bounds them once the group runs, so a rank that died or hung fails its group that soon. The
// start-up timeout bounds two waits that carry one-time costs: a member's wait for its first command
// (the leader may still be setting up its worker and transfer regions) and the group's first step (first
// kernel launches, workspaces and GEMM plans sized on every rank; a 93-layer model's first step on a
// shared GPU outlasted a 2 s deadline).
struct GroupDeadlines {
  std::chrono::milliseconds startup{180000}, step{2000};
  std::function<void(std::chrono::milliseconds)> set;  // sets the group Comm's wait limit; null: left alone
  void use(std::chrono::milliseconds limit) const {
    if (set) set(limit);
  }
};

struct GroupCommand {
  bool stop = false;                 // the leader is shutting down: members exit normally
  bool step = false;                 // run one decode step (EP: every rank, even with no feeds of its own)
  std::vector<uint64_t> drops;       // requests to close (ended, aborted or failed)
  std::vector<GroupAdmit> admits;
  std::vector<GroupFeed> feeds;      // this rank's batch in step order: one token per request
};

std::vector<std::byte> encode_group_command(const GroupCommand& c);
// Errors name what is truncated or inconsistent.
Result<GroupCommand> decode_group_command(std::span<const std::byte> bytes);

// Size then payload, point to point (tags kept apart from the collectives' own).
Status send_group_command(Comm& comm, int peer, const GroupCommand& c);
Result<GroupCommand> recv_group_command(Comm& comm, int leader);

// Start-up of a group: the leader tells every member the geometry of its transfer region (the group's
// first global rank and the pool sizes, so the leader's bookkeeping and the member's memory agree); the
// member maps the region with its own UCX worker and answers with it (base, length, packed rkey, worker
// address), which the leader lists in its REGISTER.
struct GroupRegionRequest {
  uint32_t first_rank = 0;
  uint32_t page_size = 0;
  uint32_t num_pages = 0;
  uint32_t num_slots = 0;
};
Status send_region_request(Comm& comm, int peer, const GroupRegionRequest& r);
Result<GroupRegionRequest> recv_region_request(Comm& comm, int leader);
Status send_region_offer(Comm& comm, int leader, const protocol::MemoryRegion& region);
Result<protocol::MemoryRegion> recv_region_offer(Comm& comm, int peer);

// What a rank's decode caches hold: every member reports it once the group formed and after every
// command, so the leader admits onto each rank by that rank's own pages and slots.
struct GroupRoom {
  uint32_t page_size = 0;      // tokens per cache page
  uint32_t cache_pages = 0;
  uint32_t free_pages = 0;
  uint32_t seqs = 0;
  uint32_t free_seqs = 0;
};
Status send_group_room(Comm& comm, int leader, const GroupRoom& r);
Result<GroupRoom> recv_group_room(Comm& comm, int peer);

// Start-up, after the region request: where each member's beacon sends its beats, and how often
// (member_liveness.h).
struct GroupLiveness {
  std::string endpoint;
  std::chrono::milliseconds interval{200};
};
Status send_group_liveness(Comm& comm, int peer, const GroupLiveness& l);
Result<GroupLiveness> recv_group_liveness(Comm& comm, int leader);

// Whether members return their step's logits to the leader, one rule for both sides. EP: each member's
// rows are its own requests', which the leader draws. DCP: every rank computes the same rows, the leader
// draws from its own, and its members skip the LM head. (A member that sent rows the leader never receives
// would block on the send once a row outgrows UCX's eager size: 640 KiB at K3's vocabulary.)
inline bool members_return_logits(const RankLayout& layout) { return layout.ep > 1; }

// EP: a member returns the logits of its feeds (B x vocab F32, step order) to the leader.
Status send_group_logits(Comm& comm, int leader, std::span<const float> logits);
Status recv_group_logits(Comm& comm, int peer, std::span<float> logits);

}  // namespace k3::decode
