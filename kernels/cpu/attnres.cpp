// Block AttnRes mix (docs/MODEL.md §4.1, §8.3 A1), fp32 math per row:
// l_j = query·V_j / sqrt(mean(V_j²) + eps), p = softmax_j(l), y = Σ_j p_j V_j.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {

void attnres_mix(ThreadPool& pool, const ops::AttnResMixParams& p) {
  const char* op = "attnres_mix";
  const int64_t J = static_cast<int64_t>(p.candidates.size());
  check_arg(J >= 1, op, "candidates: need at least one tensor");
  check_tensor(op, "candidates[0]", p.candidates[0], DType::F32, {kAny, kAny});
  const int64_t M = p.candidates[0].dim(0), D = p.candidates[0].dim(1);
  for (int64_t j = 1; j < J; ++j) {
    const std::string field = "candidates[" + std::to_string(j) + "]";
    check_tensor(op, field.c_str(), p.candidates[j], DType::F32, {M, D});
  }
  check_tensor(op, "query", p.query, DType::F32, {D});
  check_tensor(op, "y", p.y, DType::F32, {M, D});
  std::vector<const float*> cand(J);
  for (int64_t j = 0; j < J; ++j) cand[j] = p.candidates[j].f32();
  const float* w = p.query.f32();
  float* y = p.y.f32();
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    std::vector<float> logit(J), out(D);
    for (int64_t m = m0; m < m1; ++m) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < J; ++j) {
        const float* vj = cand[j] + m * D;
        double ss = 0, dot = 0;
        for (int64_t i = 0; i < D; ++i) {
          ss += static_cast<double>(vj[i]) * vj[i];
          dot += static_cast<double>(w[i]) * vj[i];
        }
        logit[j] = static_cast<float>(dot / std::sqrt(ss / static_cast<double>(D) + p.eps));
        mx = std::max(mx, logit[j]);
      }
      float denom = 0.f;
      for (int64_t j = 0; j < J; ++j) {
        logit[j] = std::exp(logit[j] - mx);
        denom += logit[j];
      }
      std::fill(out.begin(), out.end(), 0.f);
      for (int64_t j = 0; j < J; ++j) {
        const float pj = logit[j] / denom;
        const float* vj = cand[j] + m * D;
        for (int64_t i = 0; i < D; ++i) out[i] += pj * vj[i];
      }
      // Written last: y may alias a candidate.
      std::copy(out.begin(), out.end(), y + m * D);
    }
  }, 4);
}

}  // namespace k3::cpu
