// The prefill->decode workload shared by the PD test and its processes. Source bytes describe
// themselves: byte `off` of (layer, kind, index) is a hash of all four, where index is the token (MLA
// rows), the conv row (KDA conv) or the head (KDA state). The decode side verifies every destination
// byte from the relayout rules alone (token p -> rank p mod N, local row p div N; rank i holds heads
// i*H/N..), independently of the plan that produced the writes, and that nothing else was touched.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transfer/plan_layout.h"
#include "transfer/pool.h"

namespace k3::test::pd {

using namespace k3::transfer;

// "KKKM..." : K = KDA layer, M = MLA layer.
inline CacheLayout model_from_pattern(const std::string& pattern, uint32_t heads) {
  CacheLayout m;
  for (char c : pattern) m.layers.push_back(c == 'M' ? LayerCache::Mla : LayerCache::Kda);
  m.mla_row_bytes = 24;
  m.kda_heads = heads;
  m.kda_conv_rows = 3;
  m.kda_conv_head_bytes = 4;
  m.kda_state_head_bytes = 16;
  return m;
}

inline uint8_t src_byte(uint32_t layer, EntryKind kind, uint64_t index, uint64_t off) {
  uint64_t x = (uint64_t{layer} << 48) ^ (uint64_t(kind) << 44) ^ (index << 20) ^ off;
  x += 0x9e3779b97f4a7c15ull;  // splitmix64 finaliser
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint8_t>(x ^ (x >> 31));
}

// The stage's source buffer laid out as `src` says, every byte self-describing.
inline std::vector<uint8_t> fill_source(const CacheLayout& m, const StageSource& src) {
  std::vector<uint8_t> b(src.total_bytes, 0);
  const uint64_t conv_row = 3ull * m.kda_heads * m.kda_conv_head_bytes;
  for (const auto& [layer, ls] : src.layers) {
    if (m.layers[layer] == LayerCache::Mla) {
      for (uint64_t p = 0; p < src.num_tokens; ++p)
        for (uint64_t o = 0; o < m.mla_row_bytes; ++o) b[ls.rows + p * m.mla_row_bytes + o] = src_byte(layer, EntryKind::MlaKv, p, o);
    } else {
      for (uint64_t r = 0; r < m.kda_conv_rows; ++r)
        for (uint64_t o = 0; o < conv_row; ++o) b[ls.conv + r * conv_row + o] = src_byte(layer, EntryKind::KdaConv, r, o);
      for (uint64_t h = 0; h < m.kda_heads; ++h)
        for (uint64_t o = 0; o < m.kda_state_head_bytes; ++o)
          b[ls.state + h * m.kda_state_head_bytes + o] = src_byte(layer, EntryKind::KdaState, h, o);
    }
  }
  return b;
}

struct Verdict {
  bool ok = true;
  uint64_t bytes_checked = 0;   // destination bytes that must hold source bytes
  std::string first_error;
};

// Checks rank index `i` of a group of `n` after a `tokens`-token request landed in `alloc`:
// every expected byte is the source byte, every other byte of the region still holds `poison`.
inline Verdict verify_rank(const CacheLayout& m, const RankPoolGeometry& geo, const RankAllocation& alloc,
                           std::span<const uint8_t> region, uint32_t i, uint32_t n, bool sliced, uint32_t tokens,
                           uint8_t poison) {
  Verdict v;
  std::vector<uint8_t> expected_mask(region.size(), 0);
  auto expect = [&](uint64_t addr, uint8_t want, const char* what, uint32_t layer) {
    const uint64_t off = addr - geo.base;
    if (off >= region.size()) {
      if (v.ok) v.first_error = std::string(what) + " of layer " + std::to_string(layer) + " outside region";
      v.ok = false;
      return;
    }
    expected_mask[off] = 1;
    v.bytes_checked++;
    if (region[off] != want && v.ok) {
      v.ok = false;
      v.first_error = std::string(what) + " of layer " + std::to_string(layer) + " on rank index " + std::to_string(i) +
                      ": byte at region offset " + std::to_string(off) + " is " + std::to_string(region[off]) +
                      ", expected " + std::to_string(want);
    }
  };
  const uint32_t ps = geo.page_size;
  const auto& pages = alloc.pages.page_ids();
  const uint32_t hpr = sliced ? m.kda_heads / n : m.kda_heads;
  const uint32_t h0 = sliced ? i * hpr : 0;
  const uint64_t chb = m.kda_conv_head_bytes, full_part = uint64_t{m.kda_heads} * chb;
  for (uint32_t layer = 0; layer < m.layers.size(); ++layer) {
    if (m.layers[layer] == LayerCache::Mla) {
      const uint64_t base = geo.layer_pages_addr(layer).value();
      for (uint32_t p = i; p < tokens; p += n) {
        const uint32_t q = p / n;
        const uint64_t row = base + (uint64_t{pages.at(q / ps)} * ps + q % ps) * m.mla_row_bytes;
        for (uint64_t o = 0; o < m.mla_row_bytes; ++o) expect(row + o, src_byte(layer, EntryKind::MlaKv, p, o), "MLA row", layer);
      }
    } else {
      const uint32_t slot = alloc.slot.slot().value();
      const uint64_t conv = geo.kda_conv_addr(slot, layer).value();
      const uint64_t local_row = 3ull * hpr * chb;
      for (uint64_t r = 0; r < m.kda_conv_rows; ++r)
        for (uint64_t part = 0; part < 3; ++part)
          for (uint64_t hl = 0; hl < hpr; ++hl)
            for (uint64_t c = 0; c < chb; ++c)
              expect(conv + r * local_row + part * hpr * chb + hl * chb + c,
                     src_byte(layer, EntryKind::KdaConv, r, part * full_part + (h0 + hl) * chb + c), "KDA conv", layer);
      const uint64_t state = geo.kda_state_addr(slot, layer).value();
      for (uint64_t hl = 0; hl < hpr; ++hl)
        for (uint64_t o = 0; o < m.kda_state_head_bytes; ++o)
          expect(state + hl * m.kda_state_head_bytes + o, src_byte(layer, EntryKind::KdaState, h0 + hl, o), "KDA state", layer);
    }
  }
  for (size_t off = 0; off < region.size(); ++off) {
    if (!expected_mask[off] && region[off] != poison) {
      if (v.ok) v.first_error = "byte at region offset " + std::to_string(off) + " was written but no write targets it";
      v.ok = false;
      break;
    }
  }
  return v;
}

// Destination bytes a request of `tokens` tokens must fill on all ranks together.
inline uint64_t expected_bytes(const CacheLayout& m, uint32_t n, bool sliced, uint32_t tokens) {
  uint64_t total = 0;
  for (auto c : m.layers) {
    if (c == LayerCache::Mla) total += uint64_t{tokens} * m.mla_row_bytes;
    else total += (sliced ? 1 : n) * (m.kda_conv_bytes() + m.kda_state_bytes());
  }
  return total;
}

}  // namespace k3::test::pd
