// Layer-indexed transfer plans: pure functions from (model, prefill stage source, decode layout, decode
// destinations) to a list of RMA writes. Destinations are looked up by (global layer id, kind, rank),
// never by list position, so an ADDRS list in any order yields the same plan.
//
// Relayouts (plan_layout.h has the byte layouts):
//   MLA/draft rows: token p -> rank index p % N, local row q = p / N, at
//                   layer_base + (page_ids[q / page_size] * page_size + q % page_size) * row_bytes;
//   KDA state:      rank index i gets the contiguous heads [i*H/N, (i+1)*H/N) (or all heads, replicated);
//   KDA conv:       per conv row, per q/k/v, the channel range of rank i's heads.
// Ops are emitted in (layer, kind, rank, source offset) order, then coalesced: an op is merged into the
// previous one when both are from the same stage to the same rank and region and are contiguous in
// source and destination.
#pragma once
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "common/core/status.h"
#include "common/protocol/messages.h"
#include "transfer/plan_layout.h"

namespace k3::transfer {

struct WriteOp {
  uint32_t src_stage = 0;
  uint64_t src_offset = 0;   // in the stage's source buffer space (StageSource offsets)
  uint32_t dst_rank = 0;     // global decode rank
  uint32_t region_id = 0;    // registered region (rkey) on dst_rank
  uint64_t dst_addr = 0;     // remote virtual address
  uint64_t length = 0;
  bool operator==(const WriteOp&) const = default;
};

// ADDRS, indexed for lookup and validated (no duplicate (layer, kind, rank); one page table per rank).
struct Destination {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t region_id = 0;
};
struct DecodeDestinations {
  using Key = std::tuple<uint32_t, EntryKind, uint32_t>;  // (layer id, kind, global rank)
  std::map<Key, Destination> entries;
  std::map<uint32_t, protocol::PageTable> page_tables;    // by global rank

  static Result<DecodeDestinations> from_addrs(const protocol::Addrs& addrs);
};

// Which part of a stage's source a plan covers: the MLA/draft rows of tokens [row_begin, row_end) and,
// when `states`, the KDA conv and state entries. A streaming stage plans each chunk's rows as they are
// computed and the states after its last chunk; the parts of one request partition its whole plan.
struct PlanPart {
  uint32_t row_begin = 0;
  uint32_t row_end = UINT32_MAX;
  bool states = true;
};

// The writes one prefill stage must issue for one request (or the `part` of them). Errors (NotFound / OutOfRange /
// InvalidArgument) name the layer, kind and rank: a missing destination or page table, a page table too
// short for the rank's rows, a KDA destination whose length is not the layout's, or a write past the
// destination's length. A rank that holds no row of a short prompt needs no MLA entry.
Result<std::vector<WriteOp>> plan_stage_writes(const CacheLayout& model,
                                               const PrefillLayout& prefill, const DecodeLayout& decode,
                                               const StageSource& source,
                                               const DecodeDestinations& dest, PlanPart part = {});

// Same, without coalescing: the finest-grained ops (one MLA row / one conv q|k|v head range / one state
// slice each). The reference the coalesced plan is tested against.
Result<std::vector<WriteOp>> plan_stage_writes_uncoalesced(const CacheLayout& model,
                                                           const PrefillLayout& prefill,
                                                           const DecodeLayout& decode,
                                                           const StageSource& source,
                                                           const DecodeDestinations& dest, PlanPart part = {});

// Merges contiguous neighbours (see top). Total bytes and every (src byte -> dst byte) pair are preserved.
std::vector<WriteOp> coalesce(const std::vector<WriteOp>& ops);

uint64_t total_bytes(const std::vector<WriteOp>& ops);

}  // namespace k3::transfer
