// The recurrence of one KDA layer's heads for a batch of rows (docs/MODEL.md §2.3-2.4): from the
// projections (qkv, the gate's f, the β logits) to each head's output, advancing the conv windows and
// states in the layer's caches. The model's forward and a decode rank (its heads of a DCP group) both run
// it, so a rank computes each head by the same arithmetic as the whole model on the same backend.
#pragma once
#include <functional>
#include <span>
#include <vector>

#include "engine/model_weights.h"
#include "kernels/backend.h"

namespace k3 {

ops::GateForm gate_form(const ModelConfig& cfg);

// Whether a decode step of one token per item takes the backend's fused decode kernel: where it has one
// for this head shape, and either does not promise chunk invariance or says the fused kernel gives the
// separate steps' bits (Backend::kda_decode_matches_steps). Otherwise a token decoded by it would not
// match the same token computed as a prompt row.
bool kda_takes_fused_decode(const Backend& be, int64_t heads, int64_t head_dim);

struct KdaHeadsStep {
  const ModelConfig& cfg;
  const LayerWeights& lw;    // conv_w, a_log, dt_bias of these heads
  int64_t heads = 0;         // H of this call: the model's, or a DCP rank's share
  Tensor qkv, f, blog;       // [R, 3 H D], [R, H D], [R, H]
  Tensor conv_cache, state;  // the layer's pools (updated in place)
  Tensor slots, conv_slots;  // [n] I32: each item's state and conv rows
  Tensor cu_seqlens;         // [n + 1] I32 row offsets of the items; may be empty for single_token_decode
  bool single_token_decode = false;  // every item one new token after a prompt
  // Host copies for a chunk-invariant backend (below): each item's position of its first row (tokens
  // already cached) and its row count. Empty for single_token_decode.
  std::vector<int64_t> positions, lengths;
  // The chunked form's checkpoints ([n, width] state rows, -1 = none; empty: none). On a chunk-invariant
  // backend only items whose first row sits at a multiple of 64 tokens may have any.
  Tensor checkpoint_slots;
  int64_t checkpoint_interval = 0;
  Tensor o;                  // [R, H, D] out
  // Where the step's temporaries come from: the caller's (a recorded step's workspace, or the backend).
  std::function<Tensor(Shape, DType)> alloc;
};

// On a chunk-invariant backend (Backend::chunk_invariant) a row's arithmetic must not depend on how the
// calls cut its sequence. The chunked form's blocks are therefore aligned to absolute positions: the
// rows of each whole 64-token block [64 i, 64 i + 64) inside this call go through kda_chunk, and the rows
// before the call's first such block or after its last (a block the call holds only part of) through
// the token recurrence. So a prompt cut at multiples of 64 tokens, or fed whole, gives the same bits;
// a cut elsewhere moves that block's rows to the recurrence (the same math, other rounding).
void run_kda_heads(Backend& be, const KdaHeadsStep& s);

// Row ranges of the chunk-invariant rule for items at `positions` with `lengths` rows, packed one after
// another from row 0: [n][2] I32 pairs for the rows before the first whole block, the whole blocks, and
// the rows after them. Exposed for tests.
struct KdaAlignedRows {
  std::vector<int32_t> head, blocks, tail;
  bool any_head = false, any_blocks = false, any_tail = false;
};
KdaAlignedRows kda_aligned_rows(std::span<const int64_t> positions, std::span<const int64_t> lengths);

}  // namespace k3
