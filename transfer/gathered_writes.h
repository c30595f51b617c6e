// Puts of a DCP interleave, gathered. The transfer plan sends token p's MLA row to rank p mod N, and a
// stage's source image holds rows in token order: one rank's rows lie N rows apart in the source while
// they are consecutive in the rank's pages, so the plan has one put per row. Into device memory each put
// is a device copy (docs/PERF.md: 0.16 GB/s into a DCP2 group against 2-10 GB/s into one rank). Copied
// first into a staging image in write order, rows of equal length at a constant source stride as one
// strided copy each, the destinations that are contiguous in a region become one put per page run.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "transfer/plan.h"

namespace k3::transfer {

// `rows` rows of `row_bytes` from the source at src_offset, src_offset + pitch, ... into the staging
// image at staged_offset, back to back.
struct RowGather {
  uint64_t src_offset = 0, pitch = 0, row_bytes = 0, rows = 0, staged_offset = 0;
};
// A put from the staging image.
struct StagedWrite {
  uint64_t staged_offset = 0, dst_addr = 0, length = 0;
};
struct GatheredWrites {
  std::vector<RowGather> gathers;   // cover every op's bytes once, in op order
  std::vector<StagedWrite> writes;  // the ops' destinations, contiguous ones merged
  uint64_t staged_bytes = 0;
};

// For the ops of one destination region, in plan order. Nullopt when gathering would not at least halve
// the number of puts (already coalesced runs, or too few ops to matter).
std::optional<GatheredWrites> gather_writes(std::span<const WriteOp> ops);

// What the ops write, applied to host memory (tests, and the reference of the staged form):
// dst[op.dst_addr - dst_base ..] = src[op.src_offset ..]. And the same through a GatheredWrites.
void apply_writes(std::span<const WriteOp> ops, const uint8_t* src, uint8_t* dst, uint64_t dst_base);
void apply_gathered(const GatheredWrites& g, const uint8_t* src, uint8_t* staging, uint8_t* dst, uint64_t dst_base);
// The gathers alone, host memory to host memory.
void gather_on_host(const GatheredWrites& g, const uint8_t* src, uint8_t* staging);

}  // namespace k3::transfer
