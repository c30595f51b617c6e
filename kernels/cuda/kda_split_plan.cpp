#include "kernels/cuda/kda_split_plan.h"

#include <algorithm>

namespace k3::cuda {

KdaSplitPlan plan_kda_split(const std::vector<int32_t>& seq_chunk0, int H, int num_sms) {
  KdaSplitPlan plan;
  const int N = int(seq_chunk0.size()) - 1;
  if (N <= 0 || H <= 0) return plan;
  int longest = 0;
  for (int n = 0; n < N; ++n) longest = std::max(longest, seq_chunk0[n + 1] - seq_chunk0[n]);
  // Step 1 runs 2P - 3 jobs per split sequence, at 2 blocks per head (128-row V tiles of 64) and two
  // resident blocks per SM: P ~ (num_sms / (H N) + 3) / 2 fills the GPU once.
  const bool idle = int64_t(4) * H * N * 2 <= num_sms;
  int P = idle ? (num_sms / (H * N) + 3) / 2 : 1;
  P = std::min(P, longest / kKdaMinSegmentChunks);
  if (P < 3) P = 1;
  const int seg = P >= 3 ? (longest + P - 1) / P : longest;  // chunks per segment
  auto whole = [](int c0, int c1, int n) {
    KdaScanJob j;
    j.c_begin = c0;
    j.c_end = c1;
    j.seq = n;
    return j;
  };
  for (int n = 0; n < N; ++n) {
    const int c0 = seq_chunk0[n], c1 = seq_chunk0[n + 1];
    const int p_n = P >= 3 && c1 - c0 >= 3 * kKdaMinSegmentChunks ? (c1 - c0 + seg - 1) / seg : 1;
    if (p_n < 3) {  // as the plain scan: from its slot, output, back to its slot
      plan.pass1.push_back(whole(c0, c1, n));
      continue;
    }
    const KdaSplitSlots slots{p_n, plan.carry_slots};
    plan.carry_slots += KdaSplitSlots::count(p_n);
    plan.max_segments = std::max(plan.max_segments, p_n);
    plan.fixup.insert(plan.fixup.end(), {p_n, slots.base});
    auto seg_begin = [&](int p) { return c0 + p * seg; };
    auto seg_end = [&](int p) { return std::min(c1, c0 + (p + 1) * seg); };
    KdaScanJob first = whole(seg_begin(0), seg_end(0), n);
    first.out = KdaScanJob::kToCarry;
    first.out_slot = slots.start(1);
    plan.pass1.push_back(first);
    for (int p = 1; p <= p_n - 2; ++p) {
      KdaScanJob b = whole(seg_begin(p), seg_end(p), n);
      b.init = KdaScanJob::kZeros;
      b.out = KdaScanJob::kToCarry;
      b.out_slot = slots.b(p);
      b.flags = 0;
      KdaScanJob a = b;
      a.init = KdaScanJob::kIdentity;
      a.out_slot = slots.a(p);
      a.flags = KdaScanJob::kZeroU;
      plan.pass1.push_back(b);
      plan.pass1.push_back(a);
    }
    for (int p = 1; p <= p_n - 1; ++p) {
      KdaScanJob j = whole(seg_begin(p), seg_end(p), n);
      j.init = KdaScanJob::kFromCarry;
      j.in_slot = slots.start(p);
      j.out = p == p_n - 1 ? KdaScanJob::kToSeq : KdaScanJob::kDiscard;
      plan.pass3.push_back(j);
    }
  }
  if (plan.pass3.empty()) plan = KdaSplitPlan{};
  return plan;
}

int64_t kda_split_carry_floats(const KdaSplitPlan& plan, int H) { return int64_t(plan.carry_slots) * H * 128 * 128; }

}  // namespace k3::cuda
