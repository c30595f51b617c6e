#include "kernels/cuda/kda_piece_plan.h"

#include <algorithm>

namespace k3::cuda {

KdaPiecePlan plan_kda_pieces(const std::vector<int32_t>& seq_chunk0, int pieces) {
  KdaPiecePlan plan;
  const int N = int(seq_chunk0.size()) - 1;
  if (N <= 0) return plan;
  const int total = seq_chunk0[N];
  int longest = 0;
  for (int n = 0; n < N; ++n) longest = std::max(longest, seq_chunk0[n + 1] - seq_chunk0[n]);
  int P = pieces;
  if (P <= 0) P = longest < 4 * kKdaMinPieceChunks ? 1 : std::min(16, longest / kKdaMinPieceChunks);
  P = std::clamp(P, 1, std::max(total, 1));
  if (P < 2) return plan;
  for (int i = 0; i <= P; ++i) plan.bounds.push_back(int32_t(int64_t(total) * i / P));
  // Sequences are contiguous runs of the table, in order: walk them once beside the pieces.
  int n = 0;
  for (int i = 0; i < P; ++i) {
    plan.job0.push_back(int32_t(plan.jobs.size()));
    const int b0 = plan.bounds[size_t(i)], b1 = plan.bounds[size_t(i) + 1];
    while (n < N && seq_chunk0[n + 1] <= b0) ++n;
    for (int m = n; m < N && seq_chunk0[m] < b1; ++m) {
      const int c0 = std::max(seq_chunk0[m], b0), c1 = std::min(seq_chunk0[m + 1], b1);
      if (c0 >= c1) continue;  // empty sequences: nothing to scan, the slot keeps its state
      KdaScanJob j;
      j.c_begin = c0;
      j.c_end = c1;
      j.seq = m;
      plan.jobs.push_back(j);
    }
  }
  plan.job0.push_back(int32_t(plan.jobs.size()));
  return plan;
}

}  // namespace k3::cuda
