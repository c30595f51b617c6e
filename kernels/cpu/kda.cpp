// KDA gate and the token recurrence (docs/MODEL.md §2.2, §2.3): the oracle the chunked form and the
// device kernels are checked against.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kda_common.h"

namespace k3::cpu {

KdaDims check_kda(const char* op, const ops::KdaParams& p) {
  KdaDims d;
  check_tensor(op, "q", p.q, DType::F32, {kAny, kAny, kAny});
  d.T = p.q.dim(0);
  d.H = p.q.dim(1);
  d.K = p.q.dim(2);
  check_tensor(op, "k", p.k, DType::F32, {d.T, d.H, d.K});
  check_tensor(op, "v", p.v, DType::F32, {d.T, d.H, kAny});
  d.V = p.v.dim(2);
  check_tensor(op, "g", p.g, DType::F32, {d.T, d.H, d.K});
  check_tensor(op, "beta", p.beta, DType::F32, {d.T, d.H});
  check_tensor(op, "state", p.state, DType::F32, {kAny, d.H, d.V, d.K});
  d.num_slots = p.state.dim(0);
  check_tensor(op, "o", p.o, DType::F32, {d.T, d.H, d.V});
  d.N = check_varlen(op, p.cu_seqlens, p.slots, d.T, d.num_slots);
  d.cu = p.cu_seqlens.i32();
  if (!p.seq_rows.empty()) {
    check_tensor(op, "seq_rows", p.seq_rows, DType::I32, {d.N, 2});
    d.seq_rows = p.seq_rows.i32();
    for (int64_t n = 0; n < d.N; ++n)
      check_arg(d.cu[n] <= d.begin(n) && d.begin(n) <= d.end(n) && d.end(n) <= d.cu[n + 1], op,
                "seq_rows[" + std::to_string(n) + "] = [" + std::to_string(d.begin(n)) + ", " +
                    std::to_string(d.end(n)) + ") is not an ordered range inside the sequence's rows [" +
                    std::to_string(d.cu[n]) + ", " + std::to_string(d.cu[n + 1]) + ")");
  }
  return d;
}

KdaCheckpoints check_kda_checkpoints(const char* op, const ops::KdaParams& p, const KdaDims& d, int64_t multiple_of) {
  KdaCheckpoints c;
  if (p.checkpoint_interval == 0) return c;
  const int64_t I = p.checkpoint_interval;
  check_arg(I > 0 && I % multiple_of == 0, op,
            "checkpoint_interval must be a positive multiple of " + std::to_string(multiple_of) + ", got " +
                std::to_string(I));
  check_tensor(op, "checkpoints", p.checkpoints, DType::F32, {kAny, d.H, d.V, d.K});
  check_tensor(op, "checkpoint_slots", p.checkpoint_slots, DType::I32, {d.N, kAny});
  const int64_t num = p.checkpoints.dim(0);
  c.M = p.checkpoint_slots.dim(1);
  c.slots = p.checkpoint_slots.i32();
  std::vector<bool> used(static_cast<size_t>(num), false);
  for (int64_t i = 0; i < d.N * c.M; ++i) {
    const int32_t s = c.slots[i];
    if (s < 0) continue;
    check_arg(s < num, op,
              "checkpoint_slots[" + std::to_string(i / c.M) + ", " + std::to_string(i % c.M) + "] = " +
                  std::to_string(s) + " is outside [0, " + std::to_string(num) + ")");
    check_arg(!used[s], op, "checkpoint_slots: slot " + std::to_string(s) + " appears twice");
    used[s] = true;
  }
  c.base = p.checkpoints.f32();
  c.interval = I;
  c.H = d.H;
  c.head_floats = d.V * d.K;
  return c;
}

void KdaCheckpoints::write(int64_t n, int64_t h, int64_t done, const float* S) const {
  if (!base || done % interval != 0) return;
  const int64_t j = done / interval - 1;
  if (j < 0 || j >= M || slots[n * M + j] < 0) return;
  std::copy(S, S + head_floats, base + (int64_t(slots[n * M + j]) * H + h) * head_floats);
}

void kda_token_step(float* S, const float* q, const float* k, const float* v, const float* g, float beta,
                    float* o, int64_t K, int64_t V) {
  // Rows of S (one per v index) are independent: decay, delta update and readout row by row.
  float small[256];
  std::unique_ptr<float[]> big(K > 256 ? new float[K] : nullptr);
  float* a = big ? big.get() : small;
  for (int64_t i = 0; i < K; ++i) a[i] = std::exp(g[i]);
  for (int64_t j = 0; j < V; ++j) {
    float* s = S + j * K;
    float sk = 0.f;
    for (int64_t i = 0; i < K; ++i) {
      s[i] *= a[i];
      sk += s[i] * k[i];
    }
    const float u = beta * (v[j] - sk);
    float sq = 0.f;
    for (int64_t i = 0; i < K; ++i) {
      s[i] += k[i] * u;
      sq += s[i] * q[i];
    }
    o[j] = sq;
  }
}

void kda_recurrent(ThreadPool& pool, const ops::KdaParams& p) {
  const KdaDims d = check_kda("kda_recurrent", p);
  const KdaCheckpoints ckpt = check_kda_checkpoints("kda_recurrent", p, d, 1);
  const float *q = p.q.f32(), *k = p.k.f32(), *v = p.v.f32(), *g = p.g.f32(), *beta = p.beta.f32();
  float* state = p.state.f32();
  float* o = p.o.f32();
  const int32_t* slots = p.slots.i32();
  // Work item = (sequence, head): each owns one state matrix and its output columns.
  pool.parallel_for(d.N * d.H, [&](int64_t i0, int64_t i1) {
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t n = item / d.H, h = item % d.H;
      float* S = state + (static_cast<int64_t>(slots[n]) * d.H + h) * d.V * d.K;
      for (int64_t t = d.begin(n); t < d.end(n); ++t) {
        const int64_t qk = (t * d.H + h) * d.K;
        kda_token_step(S, q + qk, k + qk, v + (t * d.H + h) * d.V, g + qk, beta[t * d.H + h],
                       o + (t * d.H + h) * d.V, d.K, d.V);
        ckpt.write(n, h, t + 1 - d.begin(n), S);
      }
    }
  });
}

void kda_gate(ThreadPool& pool, const ops::KdaGateParams& p) {
  check_arg(p.heads >= 1, "kda_gate", "heads must be >= 1, got " + std::to_string(p.heads));
  check_tensor("kda_gate", "f", p.f, DType::F32, {kAny, kAny});
  const int64_t T = p.f.dim(0), P = p.f.dim(1), H = p.heads;
  check_arg(P % H == 0, "kda_gate",
            "f: width " + std::to_string(P) + " is not a multiple of heads = " + std::to_string(H));
  const int64_t D = P / H;
  check_tensor("kda_gate", "a_log", p.a_log, DType::F32, {kAny});
  check_arg(p.a_log.dim(0) >= H, "kda_gate",
            "a_log: expected at least heads = " + std::to_string(H) + " values, got " + shape_str(p.a_log.shape()));
  check_tensor("kda_gate", "dt_bias", p.dt_bias, DType::F32, {P});
  check_tensor("kda_gate", "g", p.g, DType::F32, {T, H, D});
  const bool softplus = p.form == ops::GateForm::Softplus;
  check_arg(softplus || p.g_min < 0.f, "kda_gate", "g_min must be < 0");
  const float *f = p.f.f32(), *a_log = p.a_log.f32(), *dt = p.dt_bias.f32();
  float* g = p.g.f32();
  pool.parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float a = std::exp(a_log[h]);
        for (int64_t i = 0; i < D; ++i) {
          const int64_t c = h * D + i;
          const float x = f[t * P + c] + dt[c];
          g[t * P + c] = softplus ? -a * softplusf(x) : p.g_min * sigmoidf(a * x);
        }
      }
  }, 4);
}

}  // namespace k3::cpu
