// The three layouts a transfer plan relates: the model's caches (k3::CacheLayout), the prefill pipeline,
// the decode group. Pure data + validation; no memory is touched here.
//
// Byte layouts (all row-major, innermost last):
//   prefill stage: the packed image of its layers (common/config/cache_layout.h; StageSource gives each
//     region's offset): MLA/draft rows [T, row_bytes]; KDA conv [W-1, 3P] (columns [q | k | v], channel c
//     of head h at h*D + c) then state [H, V, K]
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

#include "common/config/cache_layout.h"
#include "common/core/status.h"
#include "common/protocol/messages.h"

namespace k3::transfer {

using protocol::EntryKind;

// The cache layout (kinds per layer id, byte sizes, packed images) is k3::CacheLayout, defined once in
// common/config/cache_layout.h; the transfer adds the prefill and decode parallel layouts around it.
using k3::CacheLayout;
using k3::LayerCache;
using k3::PackedEntry;

// Entry kinds a layer contributes (MLA: {MlaKv}; Draft: {DraftKv}; KDA: {KdaConv, KdaState}).
std::vector<EntryKind> kinds_of(LayerCache c);

struct PrefillLayout {
  std::vector<uint32_t> partition;  // layers per PP stage, each > 0, sum = num_main_layers
  uint32_t num_stages() const { return uint32_t(partition.size()); }
  // Global layer ids of `stage`: its contiguous main-layer range; the last stage also owns every
  // draft layer (the draft head runs after the last main layer).
  std::vector<uint32_t> stage_layers(const CacheLayout& model, uint32_t stage) const;
  Status validate(const CacheLayout& model) const;
};

struct DecodeLayout {
  std::vector<uint32_t> ranks;      // global ranks of the request's group, DCP order; size N >= 1
  bool kda_head_sliced = true;      // false: every rank gets the whole KDA conv/state (replication)
  uint32_t group_size() const { return uint32_t(ranks.size()); }
  // Rows of a T-token prompt that rank index i holds: count of p < T with p % N == i.
  uint32_t rows_on(uint32_t rank_index, uint32_t num_tokens) const;
  uint32_t kda_heads_per_rank(const CacheLayout& m) const;
  uint64_t kda_conv_bytes_per_rank(const CacheLayout& m) const;
  uint64_t kda_state_bytes_per_rank(const CacheLayout& m) const;
  Status validate(const CacheLayout& model) const;  // N > 0, unique ranks, H % N == 0 if sliced
};

// Where one prefill stage's source regions are, as offsets in the stage's source buffer space
// (the UCX layer adds its registered base; the tests index a byte array): the packed image of the
// stage's layers (CacheLayout::pack).
struct StageSource {
  uint32_t stage = 0;
  uint32_t num_tokens = 0;                      // T
  std::map<uint32_t, PackedEntry> layers;        // by global layer id: exactly the stage's layers
  uint64_t total_bytes = 0;                     // extent of the buffer space used (for packed sources)
};

// The packed image of the stage's layers (ascending layer id; rows, or conv then state).
StageSource pack_stage_source(const CacheLayout& model, const PrefillLayout& prefill,
                              uint32_t stage, uint32_t num_tokens);

}  // namespace k3::transfer
