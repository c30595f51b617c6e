// Plan of the overlapped chunked KDA prefill (host side, no device code): the chunk table cut into
// pieces so that the scan of one piece runs while the prep launch of the next one still fills the
// GPU.
//
// The two launches of the chunked form have opposite shapes: prep is wide (one block per chunk and
// head, all independent) and the scan is narrow (one chain of dependent chunk steps per sequence
// and head, a few hundred blocks). Run one after the other, the scan's long chain leaves most of the
// GPU idle while prep's work waits for nothing. Cut into pieces, piece i's scan runs on a second
// stream as soon as piece i's prep is done, beside the prep of pieces i+1, i+2, ...; each piece's
// scan continues every sequence from the state the previous piece left in its slot, so the result
// is the unpieced scan's, bit for bit.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cuda/launch.h"

namespace k3::cuda {

struct KdaPiecePlan {
  // Piece i preps chunks [bounds[i], bounds[i+1]) of the chunk table and scans jobs
  // [job0[i], job0[i+1]): one per sequence with chunks in that range, from and back to its slot.
  std::vector<int32_t> bounds, job0;
  std::vector<KdaScanJob> jobs;
  int pieces() const { return bounds.empty() ? 0 : int(bounds.size()) - 1; }
  bool used() const { return pieces() >= 2; }
};

// Pieces of at least this many chunks of the longest sequence: a piece's scan pays a launch, the
// wait for its prep and a state load and store per block, about one chunk step's time.
constexpr int kKdaMinPieceChunks = 8;

// `seq_chunk0` [N+1] as for launch_kda_chunk. `pieces`: the number of pieces, or 0 to choose: one
// piece (used() false) when the longest sequence is shorter than 4 * kKdaMinPieceChunks chunks (its
// scan is short next to its prep), else one piece per kKdaMinPieceChunks chunks of the longest
// sequence, at most 16. The cuts fall at equal numbers of chunks of the table.
KdaPiecePlan plan_kda_pieces(const std::vector<int32_t>& seq_chunk0, int pieces = 0);

}  // namespace k3::cuda
