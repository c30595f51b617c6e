// The three layouts a transfer plan relates: the model's layers, the prefill pipeline, the decode group.
// Pure data + validation; no memory is touched here.
//
// Byte layouts (all row-major, innermost last):
//   prefill stage, per owned layer (StageSource gives each region's offset):
//     MLA_KV / DRAFT_KV  rows  [T, row_bytes]                      token p at p*row_bytes
//     KDA_CONV           conv  [W-1, 3P] elements  (P = H*D)       columns [q(P) | k(P) | v(P)],
//                                                                  channel c of head h = h*D + c'
//     KDA_STATE          state [H, V, K] elements                  head-major
//   decode rank i of a group of N (DecodeLayout):
//     MLA_KV / DRAFT_KV  token p goes to rank p mod N, local row p div N, in the rank's pages
//                        (N = 1: plain DP, every token on the one rank)
//     KDA_CONV           kda_head_sliced: [W-1, 3P/N], columns [q heads of i | k heads of i | v heads of i]
//                        else replicated: [W-1, 3P] on every rank
//     KDA_STATE          kda_head_sliced: [H/N, V, K] = heads i*H/N .. (i+1)*H/N-1; else [H, V, K] on every rank
// Decision: MLA is never replicated (DCP interleaves tokens, each token lives on
// exactly one rank); KDA is head-sliced by default (attention-TP over the DCP group) and replicated when
// the decode group runs KDA redundantly (kda_head_sliced = false).
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "common/core/status.h"
#include "common/config/config.h"
#include "common/protocol/messages.h"

namespace k3::transfer {

using protocol::EntryKind;

// Which cache a global layer id carries.
enum class LayerCache : uint8_t { Kda, Mla, Draft };

struct TransferModelLayout {
  // Indexed by global layer id: main layers 0..L-1 (Kda or Mla), then draft layers (Draft).
  std::vector<LayerCache> layers;
  uint64_t mla_row_bytes = 0;       // (kv_lora_rank + qk_rope_head_dim) * kv dtype size (576*2 for K3 bf16)
  uint64_t draft_row_bytes = 0;     // one token row of a draft layer's KV (0 when no draft layers)
  uint32_t kda_heads = 0;           // H
  uint32_t kda_conv_rows = 0;       // W - 1
  uint64_t kda_conv_head_bytes = 0; // D * conv dtype size: one head's channels of q (or k, or v) in one row
  uint64_t kda_state_head_bytes = 0;// V * K * state dtype size

  uint32_t num_main_layers() const;   // layers before the first Draft
  uint64_t kda_conv_bytes() const { return uint64_t(kda_conv_rows) * 3 * kda_heads * kda_conv_head_bytes; }
  uint64_t kda_state_bytes() const { return uint64_t(kda_heads) * kda_state_head_bytes; }
  uint64_t row_bytes(LayerCache c) const { return c == LayerCache::Draft ? draft_row_bytes : mla_row_bytes; }

  // Layer kinds from the config (via cfg.layer_kind), sizes from the config and the dtype sizes.
  // `num_draft_layers` draft layers with `draft_row_bytes` each are appended after the main layers.
  static Result<TransferModelLayout> from_config(const ModelConfig& cfg, uint32_t kv_dtype_bytes,
                                                 uint32_t conv_dtype_bytes, uint32_t state_dtype_bytes,
                                                 uint32_t num_draft_layers = 0, uint64_t draft_row_bytes = 0);
  Status validate() const;  // names the bad field
};

// Entry kinds a layer contributes (MLA: {MlaKv}; Draft: {DraftKv}; KDA: {KdaConv, KdaState}).
std::vector<EntryKind> kinds_of(LayerCache c);

struct PrefillLayout {
  std::vector<uint32_t> partition;  // layers per PP stage, each > 0, sum = num_main_layers
  uint32_t num_stages() const { return uint32_t(partition.size()); }
  // Global layer ids of `stage`: its contiguous main-layer range; the last stage also owns every
  // draft layer (the draft head runs after the last main layer).
  std::vector<uint32_t> stage_layers(const TransferModelLayout& model, uint32_t stage) const;
  Status validate(const TransferModelLayout& model) const;
};

struct DecodeLayout {
  std::vector<uint32_t> ranks;      // global ranks of the request's group, DCP order; size N >= 1
  bool kda_head_sliced = true;      // false: every rank gets the whole KDA conv/state (replication)
  uint32_t group_size() const { return uint32_t(ranks.size()); }
  // Rows of a T-token prompt that rank index i holds: count of p < T with p % N == i.
  uint32_t rows_on(uint32_t rank_index, uint32_t num_tokens) const;
  uint32_t kda_heads_per_rank(const TransferModelLayout& m) const;
  uint64_t kda_conv_bytes_per_rank(const TransferModelLayout& m) const;
  uint64_t kda_state_bytes_per_rank(const TransferModelLayout& m) const;
  Status validate(const TransferModelLayout& model) const;  // N > 0, unique ranks, H % N == 0 if sliced
};

// Where one prefill stage's source regions are, as offsets in the stage's source buffer space
// (the UCX layer adds its registered base; the tests index a byte array).
struct LayerSource {
  uint64_t rows = 0;   // MLA/draft: [T, row_bytes]
  uint64_t conv = 0;   // KDA: [W-1, 3P]
  uint64_t state = 0;  // KDA: [H, V, K]
};
struct StageSource {
  uint32_t stage = 0;
  uint32_t num_tokens = 0;                      // T
  std::map<uint32_t, LayerSource> layers;       // by global layer id: exactly the stage's layers
  uint64_t total_bytes = 0;                     // extent of the buffer space used (for packed sources)
};

// Lays a stage's layers out back to back in ascending layer id (rows; or conv then state).
StageSource pack_stage_source(const TransferModelLayout& model, const PrefillLayout& prefill,
                              uint32_t stage, uint32_t num_tokens);

}  // namespace k3::transfer
