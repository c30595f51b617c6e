// FFN pieces: SiTU, the noaux_tc router and the LatentMoE routed experts (docs/MODEL.md §5, §8.4).
#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {

void situ(ThreadPool& pool, const ops::SituParams& p) {
  check_tensor("situ", "g", p.g, DType::F32, {kAny, kAny});
  check_tensor("situ", "u", p.u, DType::F32, {p.g.dim(0), p.g.dim(1)});
  check_tensor("situ", "y", p.y, DType::F32, {p.g.dim(0), p.g.dim(1)});
  check_arg(p.act == ops::GluAct::Silu || (p.beta > 0.f && p.beta_linear > 0.f), "situ",
            "beta and beta_linear must be > 0");
  const float *g = p.g.f32(), *u = p.u.f32();
  float* y = p.y.f32();
  pool.parallel_for(p.g.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = gluf(p.act, g[i], u[i], p.beta, p.beta_linear);
  }, 4096);
}

void router_topk(ThreadPool& pool, const ops::RouterTopkParams& p) {
  const char* op = "router_topk";
  check_tensor(op, "logits", p.logits, DType::F32, {kAny, kAny});
  const int64_t M = p.logits.dim(0), E = p.logits.dim(1), k = p.k;
  check_arg(k >= 1 && k <= E, op, "k must be in [1, E = " + std::to_string(E) + "], got " + std::to_string(k));
  check_tensor(op, "bias", p.bias, DType::F32, {E});
  check_tensor(op, "ids", p.ids, DType::I32, {M, k});
  check_tensor(op, "weights", p.weights, DType::F32, {M, k});
  const float *logits = p.logits.f32(), *bias = p.bias.f32();
  int32_t* ids = p.ids.i32();
  float* weights = p.weights.f32();
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    std::vector<float> s(E), key(E);
    std::vector<int32_t> order(E);
    for (int64_t m = m0; m < m1; ++m) {
      for (int64_t e = 0; e < E; ++e) {
        s[e] = sigmoidf(logits[m * E + e]);
        key[e] = s[e] + bias[e];
      }
      std::iota(order.begin(), order.end(), 0);
      // Descending key, ties toward the lower id: a strict total order, so the pick is unique.
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return key[a] > key[b] || (key[a] == key[b] && a < b);
      });
      float sum = 0.f;
      for (int64_t j = 0; j < k; ++j) sum += s[order[j]];
      const float norm = p.scale / (sum + 1e-20f);
      for (int64_t j = 0; j < k; ++j) {
        ids[m * k + j] = order[j];
        weights[m * k + j] = s[order[j]] * norm;
      }
    }
  }, 8);
}

// Rows are grouped by expert so each expert's weights are streamed once for all its rows, through
// gemm_rows (row-independent): a row's output is the same whichever other rows share the batch.
// The weighted sum over a row's k experts runs in slot order j = 0..k-1.
void moe_experts(ThreadPool& pool, const ops::MoeExpertsParams& p) {
  const char* op = "moe_experts";
  check_tensor(op, "z", p.z, DType::F32, {kAny, kAny});
  const int64_t M = p.z.dim(0), Dl = p.z.dim(1);
  check_tensor(op, "ids", p.ids, DType::I32, {M, kAny});
  const int64_t k = p.ids.dim(1);
  check_tensor(op, "weights", p.weights, DType::F32, {M, k});
  check_tensor(op, "w1", p.w1, DType::F32, {kAny, kAny, Dl});
  const int64_t E = p.w1.dim(0), F = p.w1.dim(1);
  check_tensor(op, "w3", p.w3, DType::F32, {E, F, Dl});
  check_tensor(op, "w2", p.w2, DType::F32, {E, Dl, F});
  check_tensor(op, "y", p.y, DType::F32, {M, Dl});
  check_arg(p.y.data() != p.z.data(), op, "y must not alias z");
  const int32_t* ids = p.ids.i32();
  for (int64_t i = 0; i < M * k; ++i)
    check_arg(ids[i] >= 0 && ids[i] < E, op,
              "ids[" + std::to_string(i / k) + ", " + std::to_string(i % k) + "] = " + std::to_string(ids[i]) +
                  " is outside [0, E = " + std::to_string(E) + ")");

  // Bucket (row, slot) pairs by expert, rows ascending within a bucket.
  std::vector<std::vector<int64_t>> bucket(E);
  for (int64_t i = 0; i < M * k; ++i) bucket[ids[i]].push_back(i);
  std::vector<float> expert_out(M * k * Dl);  // h_{e(m,j)}(z_m) at row m*k + j
  const float *z = p.z.f32(), *w1 = p.w1.f32(), *w3 = p.w3.f32(), *w2 = p.w2.f32();
  std::vector<float> zg, h1, h3, h2;
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = bucket[e];
    const int64_t n = static_cast<int64_t>(rows.size());
    if (n == 0) continue;
    zg.resize(n * Dl);
    h1.resize(n * F);
    h3.resize(n * F);
    h2.resize(n * Dl);
    // The gathers, the activation and the scatter are element-wise or copies: split over the pool
    // (any split gives the same bits); left serial they bound a many-core prefill (Amdahl).
    pool.parallel_for(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy_n(z + (rows[r] / k) * Dl, Dl, zg.data() + r * Dl);
    }, 16);
    gemm_rows(pool, zg.data(), w1 + e * F * Dl, h1.data(), n, F, Dl);
    gemm_rows(pool, zg.data(), w3 + e * F * Dl, h3.data(), n, F, Dl);
    pool.parallel_for(n * F, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) h1[i] = gluf(p.act, h1[i], h3[i], p.beta, p.beta_linear);
    }, 4096);
    gemm_rows(pool, h1.data(), w2 + e * Dl * F, h2.data(), n, Dl, F);
    pool.parallel_for(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy_n(h2.data() + r * Dl, Dl, expert_out.data() + rows[r] * Dl);
    }, 16);
  }
  const float* wts = p.weights.f32();
  float* y = p.y.f32();
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      float* yr = y + m * Dl;
      std::fill(yr, yr + Dl, 0.f);
      for (int64_t j = 0; j < k; ++j) {
        const float wj = wts[m * k + j];
        const float* h = expert_out.data() + (m * k + j) * Dl;
        for (int64_t i = 0; i < Dl; ++i) yr[i] += wj * h[i];
      }
    }
  }, 4);
}

}  // namespace k3::cpu
