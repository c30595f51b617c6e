// The per-request cache layout, defined once: which cache every global layer id carries, the element
// dtypes, and from those every byte size the engine's cache pools, the packed cache images, the transfer
// plan and the decode pool use (docs/ARCHITECTURE.md §4). Pure data + arithmetic: no memory is touched.
//
// Per request and layer (row-major, innermost last):
//   MLA / draft layer   one row per token: [r_kv + d_r] kv elements ([c | κ], docs/MODEL.md §3.1)
//   KDA layer           conv  [W-1, 3P] conv elements, columns [q (P) | k (P) | v (P)], channel c of head h
//                             at h*D + c within each third (pre-convolution rows)
//                       state [H, V, K] state elements, head-major (V-first, docs/MODEL.md §2.6)
// Packed image of a set of layers (pack()): the layers back to back in ascending id; an MLA/draft layer
// is its T token rows, a KDA layer its conv then its state.
// Paged rows: token p of a request with page table `pages` lives at flat row paged_row(pages, page_size, p).
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "common/config/config.h"
#include "common/core/status.h"
#include "common/core/tensor.h"

namespace k3 {

// Which cache a global layer id carries.
enum class LayerCache : uint8_t { Kda, Mla, Draft };

// Element dtypes of the three caches.
struct CacheDtypes {
  DType kv = DType::BF16;      // MLA / draft rows
  DType conv = DType::BF16;    // KDA conv cache
  DType state = DType::F32;    // KDA recurrent state
};

// Where one layer's regions start in a packed image.
struct PackedEntry {
  uint64_t rows = 0;   // MLA/draft: [T, row_bytes]
  uint64_t conv = 0;   // KDA: [W-1, 3P]
  uint64_t state = 0;  // KDA: [H, V, K]
};
struct PackedImage {
  std::map<uint32_t, PackedEntry> layers;   // by global layer id
  uint64_t total_bytes = 0;
};

struct CacheLayout {
  // Indexed by global layer id: main layers 0..L-1 (Kda or Mla), then draft layers (Draft).
  std::vector<LayerCache> layers;
  CacheDtypes dtypes;
  // Element counts (set by from_config; the engine shapes its pools from them).
  uint32_t mla_row_width = 0;       // r_kv + d_r (576 for K3)
  uint32_t kda_head_dim = 0;        // D (= K = V)
  // Byte strides (a transfer-only layout may set just these).
  uint64_t mla_row_bytes = 0;       // mla_row_width * sizeof(kv)
  uint64_t draft_row_bytes = 0;     // one token row of a draft layer (0 when no draft layers)
  uint32_t kda_heads = 0;           // H
  uint32_t kda_conv_rows = 0;       // W - 1
  uint64_t kda_conv_head_bytes = 0; // D * sizeof(conv): one head's channels of q (or k, or v) in one conv row
  uint64_t kda_state_head_bytes = 0;// D * D * sizeof(state)

  // Layer kinds from cfg.layer_kind, sizes from the config and `dtypes`. `num_draft_layers` draft layers
  // of `draft_row_bytes` each follow the main layers. Errors name the field.
  static Result<CacheLayout> from_config(const ModelConfig& cfg, const CacheDtypes& dtypes,
                                         uint32_t num_draft_layers = 0, uint64_t draft_row_bytes = 0);
  Status validate() const;  // names the bad field

  uint32_t num_main_layers() const;   // layers before the first Draft
  std::vector<uint32_t> layer_ids(LayerCache kind) const;  // ascending
  uint32_t kda_proj_dim() const { return kda_heads * kda_head_dim; }  // P (element layouts only)
  uint64_t kda_conv_bytes() const { return uint64_t(kda_conv_rows) * 3 * kda_heads * kda_conv_head_bytes; }
  uint64_t kda_state_bytes() const { return uint64_t(kda_heads) * kda_state_head_bytes; }
  uint64_t row_bytes(LayerCache c) const { return c == LayerCache::Draft ? draft_row_bytes : mla_row_bytes; }

  // The packed image of `layer_ids` (ascending) holding `num_tokens` tokens.
  PackedImage pack(const std::vector<uint32_t>& layer_ids, uint64_t num_tokens) const;
  // The same for the contiguous range [begin, end).
  PackedImage pack_range(uint32_t begin, uint32_t end, uint64_t num_tokens) const;

  // Flat row (page * page_size + offset) of token p in a paged cache whose page table is `pages`.
  template <class Pages>  // a vector or span of page ids
  static uint64_t paged_row(const Pages& pages, uint64_t page_size, uint64_t p) {
    return uint64_t(pages[p / page_size]) * page_size + p % page_size;
  }
};

}  // namespace k3
