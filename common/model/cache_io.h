// One request's caches for a layer range as a packed byte image, in ascending global layer id:
//   MLA layer: rows [T, r_kv + d_r]  (token p at row p)
//   KDA layer: conv [W-1, 3P] then state [H, V, K]
// (the layout transfer/plan_layout.h calls a packed StageSource). Prefill exports it, decode imports it;
// the transfer plan moves the same bytes with relayouts for DCP.
#pragma once
#include <cstdint>
#include <vector>

#include "common/model/kv_cache.h"

namespace k3 {

// Element sizes of the pools a backend keeps (kv_cache.cpp): MLA latent rows and KDA conv caches in
// the compute dtype, KDA recurrent state always F32. Prefill and decode must agree on them (the
// transfer layout and the handshake's kv_dtype carry them).
struct CacheElementBytes {
  uint32_t kv = 4, conv = 4, state = 4;
};
CacheElementBytes cache_element_bytes(const Backend& backend);

// Bytes of the packed image of `num_tokens` tokens over layers [begin, end).
uint64_t packed_cache_bytes(const ModelConfig& cfg, const CachePools& pools, int begin, int end, int64_t num_tokens);

// Copies the sequence's caches of layers [begin, end) (all of its num_tokens tokens) into `out`.
void export_caches(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end, std::vector<uint8_t>& out);
// Writes a packed image into the sequence's slot and pages (the caller reserved room for num_tokens).
Status import_caches(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end,
                     int64_t num_tokens, const uint8_t* data, uint64_t size);

}  // namespace k3
