// One request's caches for a layer range as a packed byte image: CacheLayout::pack of the range
// (common/config/cache_layout.h: ascending layer id; MLA rows [T, r_kv + d_r], KDA conv [W-1, 3P] then
// state [H, V, K]). The transfer plan's StageSource is the same image. Prefill exports it, decode
// imports it.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "engine/kv_cache.h"

namespace k3 {

// Bytes of the packed image of `num_tokens` tokens over layers [begin, end).
uint64_t packed_cache_bytes(const ModelConfig& cfg, const CachePools& pools, int begin, int end, int64_t num_tokens);

// Copies the sequence's caches of layers [begin, end) (all of its num_tokens tokens) into `out`.
void export_caches(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end, std::vector<uint8_t>& out);
// Part of the same image, for a prefill stage that streams it while it computes: into `image` (the packed
// image of `image_tokens` tokens, packed_cache_bytes long) the MLA/draft rows of tokens [row_begin,
// row_end) (the sequence holds them), and when `states` the KDA conv and state entries. The parts of
// one image over a partition of [0, image_tokens) plus the states are export_caches' bytes.
void export_cache_part(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end,
                       int64_t image_tokens, int64_t row_begin, int64_t row_end, bool states, uint8_t* image);
// Writes a packed image into the sequence's slot and pages (the caller reserved room for num_tokens).
Status import_caches(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end,
                     int64_t num_tokens, const uint8_t* data, uint64_t size);

// A sequence's cache bytes kept as tables rather than a packed image: a decode rank's transfer region,
// whose pages the prefill stages wrote. For every MLA layer a table of rows (the layout's row bytes each)
// and the row of each token in it, the same for every layer; for every KDA layer its conv and state
// entries. The bytes are where the pools are (host pools: host memory; device pools: device memory), so
// a device import is gathers and copies on the device with no trip through the host.
struct CacheTables {
  Device device = Device::Cpu;
  int64_t table_rows = 0;                 // rows of every MLA table
  std::vector<int32_t> rows;              // token p's row in the tables, p < the imported tokens
  std::function<uint8_t*(int layer)> mla_table;
  std::function<std::pair<uint8_t*, uint8_t*>(int layer)> kda_entries;  // conv, state
};
// import_caches from tables: the same bytes land in the sequence's slot and pages.
Status import_caches_from(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end,
                          int64_t num_tokens, const CacheTables& src);

}  // namespace k3
