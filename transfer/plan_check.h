// Self-describing transfer test data (docs/STYLE.md habit 15) and an independent checker, for the unit tests and
// for the multi-process transfer tests: every source byte encodes (request, layer, kind, its offset in
// the layer's source region); after the writes, each decode byte must carry the pattern of the source
// byte the relayout maps to it. The checker walks DESTINATION bytes with the layout formulas of
// plan_layout.h (it shares no code with the planner), so a planner bug cannot hide in both.
#pragma once
#include <cstdint>
#include <span>

#include "common/core/status.h"
#include "transfer/plan.h"

namespace k3::transfer {

// The byte at `offset` of layer `layer`'s `kind` source region of request `request_id`.
uint8_t pattern_byte(uint64_t request_id, uint32_t layer, EntryKind kind, uint64_t offset);

// Fills a stage's source buffer (at least source.total_bytes long, offsets as in `source`).
Status fill_stage_source(const CacheLayout& model, const StageSource& source, uint64_t request_id,
                         std::span<uint8_t> buffer);

// Checks every byte the request owns on decode rank index `rank_index` (MLA/draft rows in its pages, its
// KDA conv/state slices). `region` holds the rank's memory starting at address `region_base`. Errors:
// InvalidArgument naming rank, layer, kind, coordinates, expected and found byte; NotFound
// for a missing ADDRS entry or page table; OutOfRange when an address falls outside `region`.
Status verify_rank_region(const CacheLayout& model, const DecodeLayout& decode, uint32_t rank_index,
                          uint32_t num_tokens, const DecodeDestinations& dest, uint64_t request_id,
                          uint64_t region_base, std::span<const uint8_t> region);

}  // namespace k3::transfer
