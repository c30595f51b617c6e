#include "transfer/gathered_writes.h"

#include <cstring>

namespace k3::transfer {

namespace {
constexpr size_t kMinOps = 8;   // fewer puts than this cost nothing worth a staging copy
}  // namespace

std::optional<GatheredWrites> gather_writes(std::span<const WriteOp> ops) {
  if (ops.size() < kMinOps) return std::nullopt;
  GatheredWrites g;
  // Gathers: runs of equal-length ops whose sources step by one pitch (the first pair sets it).
  for (size_t i = 0; i < ops.size();) {
    RowGather r{.src_offset = ops[i].src_offset, .pitch = ops[i].length, .row_bytes = ops[i].length, .rows = 1,
                .staged_offset = g.staged_bytes};
    size_t j = i + 1;
    if (j < ops.size() && ops[j].length == r.row_bytes && ops[j].src_offset > r.src_offset) {
      r.pitch = ops[j].src_offset - r.src_offset;
      while (j < ops.size() && ops[j].length == r.row_bytes && ops[j].src_offset == r.src_offset + r.rows * r.pitch) {
        ++r.rows;
        ++j;
      }
    }
    if (r.rows == 1) r.pitch = r.row_bytes;
    g.staged_bytes += r.rows * r.row_bytes;
    g.gathers.push_back(r);
    i = j;
  }
  // Puts: the staging holds the ops' bytes in op order; neighbours contiguous in the region merge.
  uint64_t at = 0;
  for (const WriteOp& op : ops) {
    if (!g.writes.empty() && g.writes.back().dst_addr + g.writes.back().length == op.dst_addr)
      g.writes.back().length += op.length;
    else
      g.writes.push_back({.staged_offset = at, .dst_addr = op.dst_addr, .length = op.length});
    at += op.length;
  }
  if (g.writes.size() * 2 > ops.size()) return std::nullopt;
  return g;
}

void apply_writes(std::span<const WriteOp> ops, const uint8_t* src, uint8_t* dst, uint64_t dst_base) {
  for (const WriteOp& op : ops) std::memcpy(dst + (op.dst_addr - dst_base), src + op.src_offset, op.length);
}

void gather_on_host(const GatheredWrites& g, const uint8_t* src, uint8_t* staging) {
  for (const RowGather& r : g.gathers)
    for (uint64_t k = 0; k < r.rows; ++k)
      std::memcpy(staging + r.staged_offset + k * r.row_bytes, src + r.src_offset + k * r.pitch, r.row_bytes);
}

void apply_gathered(const GatheredWrites& g, const uint8_t* src, uint8_t* staging, uint8_t* dst, uint64_t dst_base) {
  gather_on_host(g, src, staging);
  for (const StagedWrite& w : g.writes) std::memcpy(dst + (w.dst_addr - dst_base), staging + w.staged_offset, w.length);
}

}  // namespace k3::transfer
