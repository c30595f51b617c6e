// Merge of partial attention results over disjoint key sets, as the state (o, m, d):
// m = max_n lse_n (natural log), d = sum_n exp(lse_n - m), o = sum_n exp(lse_n - m) o_n / d,
// lse = m + log d. Guards: a partition with lse = -inf has no keys and is skipped outright (its o
// may be garbage, and 0 * NaN would poison the sum); if every partition is empty, m stays -inf,
// d = 0, and the result is o = 0, lse = -inf instead of 0/0.
#include <cmath>
#include <limits>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {

void lse_merge(ThreadPool& pool, const ops::LseMergeParams& p) {
  const char* op = "lse_merge";
  check_tensor(op, "o_parts", p.o_parts, DType::F32, {kAny, kAny, kAny, kAny});
  const int64_t N = p.o_parts.dim(0), B = p.o_parts.dim(1), H = p.o_parts.dim(2), D = p.o_parts.dim(3);
  check_tensor(op, "lse_parts", p.lse_parts, DType::F32, {N, B, H});
  check_tensor(op, "o", p.o, DType::F32, {B, H, D});
  const bool has_lse = check_optional(op, "lse", p.lse, DType::F32, {B, H});
  const float *op_ = p.o_parts.f32(), *lp = p.lse_parts.f32();
  float* o = p.o.f32();
  float* lse = has_lse ? p.lse.f32() : nullptr;
  const int64_t rows = B * H;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float m = kNegInf;
      for (int64_t n = 0; n < N; ++n) m = std::fmax(m, lp[n * rows + r]);  // fmax: a NaN lse never wins
      float* orow = o + r * D;
      for (int64_t c = 0; c < D; ++c) orow[c] = 0.f;
      if (m == kNegInf) {  // all partitions empty
        if (lse) lse[r] = kNegInf;
        continue;
      }
      float d = 0.f;
      for (int64_t n = 0; n < N; ++n) {
        const float l = lp[n * rows + r];
        if (l == kNegInf) continue;  // empty partition: contributes nothing
        const float e = std::exp(l - m);
        d += e;
        const float* part = op_ + (n * rows + r) * D;
        for (int64_t c = 0; c < D; ++c) orow[c] += e * part[c];
      }
      // d >= 1 here: the partition attaining m contributes exp(0).
      for (int64_t c = 0; c < D; ++c) orow[c] /= d;
      if (lse) lse[r] = m + std::log(d);
    }
  });
}

}  // namespace k3::cpu
