#include "transfer/plan.h"

#include <algorithm>
#include <string>

namespace k3::transfer {
namespace {

std::string where(uint32_t layer, EntryKind kind, uint32_t rank) {
  return std::string("layer ") + std::to_string(layer) + " " + protocol::entry_kind_name(kind) + " rank " +
         std::to_string(rank);
}

Result<Destination> lookup(const DecodeDestinations& d, uint32_t layer, EntryKind kind, uint32_t rank) {
  auto it = d.entries.find({layer, kind, rank});
  if (it == d.entries.end()) return not_found("transfer plan: ADDRS has no entry for " + where(layer, kind, rank));
  return it->second;
}

// Where ops go: appended as they are, or merged into the previous op on the fly (the same result as
// coalesce() over the fine list, without materialising millions of one-row ops for long prompts).
struct OpSink {
  std::vector<WriteOp>& ops;
  bool merge;
  void push(const WriteOp& op) {
    if (merge && !ops.empty()) {
      WriteOp& last = ops.back();
      if (last.src_stage == op.src_stage && last.dst_rank == op.dst_rank && last.region_id == op.region_id &&
          last.src_offset + last.length == op.src_offset && last.dst_addr + last.length == op.dst_addr) {
        last.length += op.length;
        return;
      }
    }
    ops.push_back(op);
  }
};

// Appends one op after checking it stays inside the destination entry.
Status emit(OpSink& ops, uint32_t stage, uint64_t src, uint32_t rank, const Destination& d, uint64_t dst_off,
            uint64_t len, uint32_t layer, EntryKind kind) {
  if (dst_off + len > d.length)
    return {Code::OutOfRange, "transfer plan: write of " + std::to_string(len) + " bytes at offset " +
                                  std::to_string(dst_off) + " overruns the " + std::to_string(d.length) +
                                  "-byte destination of " + where(layer, kind, rank)};
  if (len == 0) return Status::ok();
  ops.push({.src_stage = stage, .src_offset = src, .dst_rank = rank, .region_id = d.region_id,
            .dst_addr = d.addr + dst_off, .length = len});
  return Status::ok();
}

// MLA / draft rows: token p -> rank index p % N, local row p / N, paged.
Status plan_rows(const CacheLayout& model, const DecodeLayout& decode, const StageSource& src,
                 const DecodeDestinations& dest, uint32_t layer, const PlanPart& part, OpSink& ops) {
  const LayerCache cache = model.layers[layer];
  const EntryKind kind = cache == LayerCache::Draft ? EntryKind::DraftKv : EntryKind::MlaKv;
  const uint64_t row = model.row_bytes(cache);
  const uint32_t n = decode.group_size();
  const uint64_t base = src.layers.at(layer).rows;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t rank = decode.ranks[i];
    const uint32_t rows = decode.rows_on(i, src.num_tokens);
    if (rows == 0) continue;  // this rank holds no token of a short prompt
    K3_ASSIGN_OR_RETURN(const Destination d, lookup(dest, layer, kind, rank));
    auto pt = dest.page_tables.find(rank);
    if (pt == dest.page_tables.end())
      return not_found("transfer plan: ADDRS has no page table for rank " + std::to_string(rank));
    const uint64_t ps = pt->second.page_size;
    const uint64_t pages_needed = (rows + ps - 1) / ps;
    if (pt->second.page_ids.size() < pages_needed)
      return {Code::OutOfRange, "transfer plan: page table of rank " + std::to_string(rank) + " has " +
                                    std::to_string(pt->second.page_ids.size()) + " pages, " +
                                    std::to_string(rows) + " rows need " + std::to_string(pages_needed)};
    // Local rows q of this rank whose token q*n+i lies in [row_begin, row_end).
    const auto first_q = [&](uint64_t token) { return token <= i ? uint64_t(0) : (token - i + n - 1) / n; };
    const uint64_t q_end = std::min<uint64_t>(rows, first_q(part.row_end));
    for (uint64_t q = first_q(part.row_begin); q < q_end; ++q) {
      const uint64_t p = q * n + i;
      const uint64_t dst_row = CacheLayout::paged_row(pt->second.page_ids, ps, q);
      K3_TRY(emit(ops, src.stage, base + p * row, rank, d, dst_row * row, row, layer, kind));
    }
  }
  return Status::ok();
}

// KDA conv [W-1, 3P] -> per rank [W-1, 3P/N] (sliced) or [W-1, 3P] (replicated), and state heads.
Status plan_kda(const CacheLayout& model, const DecodeLayout& decode, const StageSource& src,
                const DecodeDestinations& dest, uint32_t layer, OpSink& ops) {
  const uint32_t n = decode.group_size();
  const uint32_t hpr = decode.kda_heads_per_rank(model);
  const uint64_t chb = model.kda_conv_head_bytes, H = model.kda_heads;
  const PackedEntry& ls = src.layers.at(layer);
  const auto exact = [&](const Destination& d, uint64_t want, EntryKind kind, uint32_t rank) -> Status {
    if (d.length != want)
      return invalid_argument("transfer plan: destination of " + where(layer, kind, rank) + " is " +
                              std::to_string(d.length) + " bytes, the decode layout needs " + std::to_string(want));
    return Status::ok();
  };
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t rank = decode.ranks[i];
    const uint64_t h0 = decode.kda_head_sliced ? uint64_t(i) * hpr : 0;
    K3_ASSIGN_OR_RETURN(const Destination d, lookup(dest, layer, EntryKind::KdaConv, rank));
    K3_TRY(exact(d, decode.kda_conv_bytes_per_rank(model), EntryKind::KdaConv, rank));
    for (uint64_t t = 0; t < model.kda_conv_rows; ++t)
      for (uint64_t g = 0; g < 3; ++g) {  // q, k, v: each sliced by head
        const uint64_t s = ls.conv + (t * 3 * H + g * H + h0) * chb;
        const uint64_t o = (t * 3 * hpr + g * hpr) * chb;
        K3_TRY(emit(ops, src.stage, s, rank, d, o, hpr * chb, layer, EntryKind::KdaConv));
      }
  }
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t rank = decode.ranks[i];
    const uint64_t h0 = decode.kda_head_sliced ? uint64_t(i) * hpr : 0;
    K3_ASSIGN_OR_RETURN(const Destination d, lookup(dest, layer, EntryKind::KdaState, rank));
    K3_TRY(exact(d, decode.kda_state_bytes_per_rank(model), EntryKind::KdaState, rank));
    K3_TRY(emit(ops, src.stage, ls.state + h0 * model.kda_state_head_bytes, rank, d, 0,
                hpr * model.kda_state_head_bytes, layer, EntryKind::KdaState));
  }
  return Status::ok();
}

}  // namespace

Result<DecodeDestinations> DecodeDestinations::from_addrs(const protocol::Addrs& addrs) {
  DecodeDestinations d;
  for (const auto& e : addrs.entries) {
    auto [it, fresh] = d.entries.emplace(Key{e.layer_id, e.kind, e.dest_rank},
                                         Destination{.addr = e.remote_addr, .length = e.length, .region_id = e.region_id});
    if (!fresh) return invalid_argument("ADDRS: duplicate entry for " + where(e.layer_id, e.kind, e.dest_rank));
  }
  for (const auto& pt : addrs.page_tables) {
    if (pt.page_size == 0) return invalid_argument("ADDRS: page table of rank " + std::to_string(pt.rank) + " has page_size 0");
    if (!d.page_tables.emplace(pt.rank, pt).second)
      return invalid_argument("ADDRS: two page tables for rank " + std::to_string(pt.rank));
  }
  return d;
}

namespace {

Result<std::vector<WriteOp>> build_plan(const CacheLayout& model, const PrefillLayout& prefill,
                                        const DecodeLayout& decode, const StageSource& source,
                                        const DecodeDestinations& dest, const PlanPart& part, bool merge) {
  K3_TRY(model.validate());
  K3_TRY(prefill.validate(model));
  K3_TRY(decode.validate(model));
  if (part.row_begin > part.row_end)
    return invalid_argument("transfer plan: rows [" + std::to_string(part.row_begin) + ", " +
                            std::to_string(part.row_end) + ") are reversed");
  if (source.stage >= prefill.num_stages())
    return invalid_argument("transfer plan: source stage " + std::to_string(source.stage) + " >= " +
                            std::to_string(prefill.num_stages()) + " stages");
  const std::vector<uint32_t> layers = prefill.stage_layers(model, source.stage);
  for (uint32_t l : layers)
    if (!source.layers.count(l))
      return invalid_argument("transfer plan: stage " + std::to_string(source.stage) + " source lacks layer " +
                              std::to_string(l));
  if (source.layers.size() != layers.size())
    return invalid_argument("transfer plan: stage " + std::to_string(source.stage) +
                            " source describes layers the stage does not own");
  std::vector<WriteOp> ops;
  OpSink sink{ops, merge};
  for (uint32_t l : layers) {
    if (model.layers[l] == LayerCache::Kda) {
      if (part.states) K3_TRY(plan_kda(model, decode, source, dest, l, sink));
    } else {
      K3_TRY(plan_rows(model, decode, source, dest, l, part, sink));
    }
  }
  return ops;
}

}  // namespace

Result<std::vector<WriteOp>> plan_stage_writes_uncoalesced(const CacheLayout& model,
                                                           const PrefillLayout& prefill,
                                                           const DecodeLayout& decode, const StageSource& source,
                                                           const DecodeDestinations& dest, PlanPart part) {
  return build_plan(model, prefill, decode, source, dest, part, false);
}

Result<std::vector<WriteOp>> plan_stage_writes(const CacheLayout& model, const PrefillLayout& prefill,
                                               const DecodeLayout& decode, const StageSource& source,
                                               const DecodeDestinations& dest, PlanPart part) {
  return build_plan(model, prefill, decode, source, dest, part, true);
}

std::vector<WriteOp> coalesce(const std::vector<WriteOp>& ops) {
  std::vector<WriteOp> out;
  out.reserve(ops.size());
  for (const WriteOp& op : ops) {
    if (op.length == 0) continue;
    if (!out.empty()) {
      WriteOp& last = out.back();
      if (last.src_stage == op.src_stage && last.dst_rank == op.dst_rank && last.region_id == op.region_id &&
          last.src_offset + last.length == op.src_offset && last.dst_addr + last.length == op.dst_addr) {
        last.length += op.length;
        continue;
      }
    }
    out.push_back(op);
  }
  return out;
}

uint64_t total_bytes(const std::vector<WriteOp>& ops) {
  uint64_t n = 0;
  for (const auto& op : ops) n += op.length;
  return n;
}

}  // namespace k3::transfer
