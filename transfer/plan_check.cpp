#include "transfer/plan_check.h"

#include <cstdio>
#include <string>

namespace k3::transfer {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: every input bit moves every output byte
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string hex(uint8_t b) {
  char s[8];
  std::snprintf(s, sizeof s, "0x%02x", b);
  return s;
}

class RankChecker {
 public:
  RankChecker(uint32_t rank, uint64_t request, uint64_t base, std::span<const uint8_t> region)
      : rank_(rank), request_(request), base_(base), region_(region) {}

  // Destination bytes [addr, addr+len) must equal the pattern of source offsets [src, src+len).
  Status expect(uint64_t addr, uint64_t len, uint32_t layer, EntryKind kind, uint64_t src, const std::string& what) {
    if (addr < base_ || addr - base_ + len > region_.size())
      return Status(Code::OutOfRange, "verify rank " + std::to_string(rank_) + " layer " + std::to_string(layer) +
                                          " " + protocol::entry_kind_name(kind) + " " + what +
                                          ": address outside the region");
    for (uint64_t j = 0; j < len; ++j) {
      const uint8_t want = pattern_byte(request_, layer, kind, src + j);
      const uint8_t got = region_[addr - base_ + j];
      if (got != want)
        return invalid_argument("verify rank " + std::to_string(rank_) + " layer " + std::to_string(layer) + " " +
                                protocol::entry_kind_name(kind) + " " + what + " byte " + std::to_string(j) +
                                ": found " + hex(got) + ", expected " + hex(want));
    }
    return Status::ok();
  }

 private:
  uint32_t rank_;
  uint64_t request_, base_;
  std::span<const uint8_t> region_;
};

Result<Destination> entry(const DecodeDestinations& d, uint32_t layer, EntryKind kind, uint32_t rank) {
  auto it = d.entries.find({layer, kind, rank});
  if (it == d.entries.end())
    return not_found("verify: no ADDRS entry for layer " + std::to_string(layer) + " " +
                     protocol::entry_kind_name(kind) + " rank " + std::to_string(rank));
  return it->second;
}

}  // namespace

uint8_t pattern_byte(uint64_t request_id, uint32_t layer, EntryKind kind, uint64_t offset) {
  return uint8_t(mix(mix(request_id) ^ (uint64_t(layer) << 40) ^ (uint64_t(kind) << 56) ^ offset));
}

Status fill_stage_source(const CacheLayout& model, const StageSource& source, uint64_t request_id,
                         std::span<uint8_t> buffer) {
  if (buffer.size() < source.total_bytes)
    return invalid_argument("fill_stage_source: buffer of " + std::to_string(buffer.size()) + " bytes, need " +
                            std::to_string(source.total_bytes));
  const auto fill = [&](uint32_t layer, EntryKind kind, uint64_t at, uint64_t len) -> Status {
    if (at + len > buffer.size()) return Status(Code::OutOfRange, "fill_stage_source: layer " + std::to_string(layer) + " beyond the buffer");
    for (uint64_t j = 0; j < len; ++j) buffer[at + j] = pattern_byte(request_id, layer, kind, j);
    return Status::ok();
  };
  for (const auto& [l, ls] : source.layers) {
    if (l >= model.layers.size()) return invalid_argument("fill_stage_source: layer " + std::to_string(l) + " not in the model");
    const LayerCache c = model.layers[l];
    if (c == LayerCache::Kda) {
      K3_TRY(fill(l, EntryKind::KdaConv, ls.conv, model.kda_conv_bytes()));
      K3_TRY(fill(l, EntryKind::KdaState, ls.state, model.kda_state_bytes()));
    } else {
      K3_TRY(fill(l, c == LayerCache::Mla ? EntryKind::MlaKv : EntryKind::DraftKv, ls.rows,
                  uint64_t(source.num_tokens) * model.row_bytes(c)));
    }
  }
  return Status::ok();
}

Status verify_rank_region(const CacheLayout& model, const DecodeLayout& decode, uint32_t i,
                          uint32_t num_tokens, const DecodeDestinations& dest, uint64_t request_id,
                          uint64_t region_base, std::span<const uint8_t> region) {
  K3_TRY(decode.validate(model));
  if (i >= decode.group_size()) return invalid_argument("verify: rank index out of range");
  const uint32_t rank = decode.ranks[i];
  const uint64_t N = decode.group_size();
  RankChecker check(rank, request_id, region_base, region);
  const uint64_t H = model.kda_heads, chb = model.kda_conv_head_bytes, shb = model.kda_state_head_bytes;
  const uint64_t hpr = decode.kda_head_sliced ? H / N : H, h0 = decode.kda_head_sliced ? i * hpr : 0;
  for (uint32_t l = 0; l < model.layers.size(); ++l) {
    const LayerCache c = model.layers[l];
    if (c == LayerCache::Kda) {
      K3_ASSIGN_OR_RETURN(const Destination conv, entry(dest, l, EntryKind::KdaConv, rank));
      K3_ASSIGN_OR_RETURN(const Destination state, entry(dest, l, EntryKind::KdaState, rank));
      for (uint64_t t = 0; t < model.kda_conv_rows; ++t)
        for (uint64_t g = 0; g < 3; ++g)
          for (uint64_t hh = 0; hh < hpr; ++hh)
            K3_TRY(check.expect(conv.addr + ((t * 3 + g) * hpr + hh) * chb, chb, l, EntryKind::KdaConv,
                                (t * 3 * H + g * H + h0 + hh) * chb,
                                "conv row " + std::to_string(t) + " qkv " + std::to_string(g) + " head " +
                                    std::to_string(h0 + hh)));
      for (uint64_t hh = 0; hh < hpr; ++hh)
        K3_TRY(check.expect(state.addr + hh * shb, shb, l, EntryKind::KdaState, (h0 + hh) * shb,
                            "state head " + std::to_string(h0 + hh)));
      continue;
    }
    const EntryKind kind = c == LayerCache::Mla ? EntryKind::MlaKv : EntryKind::DraftKv;
    const uint64_t row = model.row_bytes(c);
    if (num_tokens <= i) continue;
    K3_ASSIGN_OR_RETURN(const Destination pages, entry(dest, l, kind, rank));
    auto pt = dest.page_tables.find(rank);
    if (pt == dest.page_tables.end()) return not_found("verify: no page table for rank " + std::to_string(rank));
    const uint64_t ps = pt->second.page_size;
    for (uint64_t p = i; p < num_tokens; p += N) {
      const uint64_t q = p / N;
      if (q / ps >= pt->second.page_ids.size())
        return Status(Code::OutOfRange, "verify: page table of rank " + std::to_string(rank) + " too short");
      const uint64_t dst_row = uint64_t(pt->second.page_ids[q / ps]) * ps + q % ps;
      K3_TRY(check.expect(pages.addr + dst_row * row, row, l, kind, p * row, "token " + std::to_string(p)));
    }
  }
  return Status::ok();
}

}  // namespace k3::transfer
