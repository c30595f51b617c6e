// How one decode group cuts the model over its rank processes (docs/RANKS.md):
//   DCP (decode context parallel): every rank runs every request of the group. KDA heads are split
//     (rank i owns heads i*H/N .. (i+1)*H/N - 1: projections, conv cache, state); MLA token p of a request
//     lives on rank p % N at local row p / N, every rank attends its tokens with the replicated query and
//     the partial (O, LSE) are merged; the FFN runs sequence-parallel (each rank its slice of the rows).
//   EP (expert parallel): each rank runs its own requests; the routed experts are split (rank i owns
//     experts i*E/N .. (i+1)*E/N - 1) and tokens travel to their experts' ranks and back.
// A group is DCP or EP (or a single rank), never both at once.
#pragma once
#include <cstdint>
#include <string>

#include "common/config/config.h"
#include "common/core/status.h"

namespace k3 {

struct RankLayout {
  int dcp = 1;            // ranks sharing each request's context
  int ep = 1;             // ranks sharing the routed experts
  // V: the MLA partial attentions of a request, token p in partition p % V, merged in partition order.
  // Fixed per deployment (a multiple of dcp) so that the result does not depend on dcp: DCP8 gives the
  // bits DCP1 gives with the same V. V = 1 on one rank is the monolithic engine's attention, bit for bit.
  int kv_partitions = 1;
  int rank = 0;           // this process's index in the group
  int size() const { return dcp * ep; }
  // This rank's index among the ranks sharing a request's context (0 in an EP group or alone).
  int dcp_rank() const { return dcp > 1 ? rank : 0; }
  int ep_rank() const { return ep > 1 ? rank : 0; }
};

// Refuses, naming the field, a layout the model cannot be cut into: dcp and ep both > 1, a rank outside
// the group, heads (KDA or MLA) or experts that do not split evenly, kv_partitions not a multiple of dcp.
Status validate_rank_layout(const RankLayout& g, const ModelConfig& cfg);

// MLA rows a DCP rank holds of a request with `num_tokens` tokens: #{p < num_tokens : p % dcp == rank}.
int64_t dcp_rows_on(const RankLayout& g, int64_t num_tokens);
// True when the token at `position` is stored on this rank.
inline bool dcp_owns(const RankLayout& g, int64_t position) { return position % g.dcp == g.dcp_rank(); }

// The config one rank's cache pools are built from: KDA heads divided by dcp (everything else equal),
// so the pools, the cache layout and the packed images are the rank's slice (the transfer plan's
// per-rank layout).
ModelConfig rank_cache_config(const ModelConfig& cfg, const RankLayout& g);

std::string to_string(const RankLayout& g);

}  // namespace k3
