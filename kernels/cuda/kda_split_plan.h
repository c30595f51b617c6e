// Plan of the split chunked KDA scan (host side, no device code): which sequences are cut into
// segments, and the job tables of the three steps that run them.
//
// The state after a chunk is an affine function of the state before it, S' = S A_c + B_c (docs/MODEL.md
// §2.4), so a segment of chunks maps its start state to its end state by S_end = S_start A + B, where
// B is the segment's end state from zeros and A its end state from the identity with U = 0. A long
// sequence of P segments then runs as:
//   1. at once: segment 0 from the sequence's state (output written), and for every middle segment
//      p = 1 .. P-2 its B and its A;
//   2. the fix-up chain, per sequence and head: S_start[p+1] = S_start[p] A_p + B_p (fp32, P-2 steps
//      of one 128 x 128 product);
//   3. at once: segments 1 .. P-1 from their true start states (output written), the last one
//      leaving the sequence's final state.
// Steps 1 and 3 are chains of one segment instead of the whole sequence; the price is the scan of
// the middle segments twice more (B and A) and the fix-up. Worth it only when the sequences' plain
// scan leaves most of the GPU idle: few heads (tensor parallelism) and long sequences.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cuda/launch.h"

namespace k3::cuda {

struct KdaSplitPlan {
  std::vector<KdaScanJob> pass1, pass3;  // steps 1 and 3 (pass1 also holds every unsplit sequence)
  // Step 2, per split sequence: (segments P, first carry slot), laid out as KdaSplitSlots says.
  std::vector<int32_t> fixup;
  int carry_slots = 0;
  int max_segments = 1;  // the most segments of one sequence (the fix-up chain's length + 2)
  bool split() const { return !pass3.empty(); }
};

// Segments shorter than this many chunks cost more in fixed work than their parallelism returns.
constexpr int kKdaMinSegmentChunks = 16;

// `seq_chunk0` [N+1] as for launch_kda_chunk. Splits only while the plain scan's grid (4 blocks per
// sequence and head) would fill at most half of `num_sms`; then every sequence of at least
// 3 * kKdaMinSegmentChunks chunks is cut into segments of one common length, chosen so that step 1
// roughly fills the GPU once. Returns a plan with split() false when no sequence is cut.
KdaSplitPlan plan_kda_split(const std::vector<int32_t>& seq_chunk0, int H, int num_sms);

// Floats of the carry buffer: carry_slots states of H heads, 128 x 128 each.
int64_t kda_split_carry_floats(const KdaSplitPlan& plan, int H);

}  // namespace k3::cuda
