// Chunkwise KDA (docs/MODEL.md §2.4, the WY / UT-transform form) in fp32. Per (sequence, head), chunks
// of C tokens (the last one partial); inside a chunk with entering state S0 and local index r:
//   Γ_r = Σ_{s<=r} g_s;  A[r,s] = Σ_i k_r[i] k_s[i] e^{Γ_r[i]-Γ_s[i]} (s<r),  B[r,s] = same with q_r (s<=r)
//   (I + Diag(β) A) W = Diag(β)(K ⊙ e^Γ),  (I + Diag(β) A) U = Diag(β) V    (forward substitution)
//   V' = U - W S0;  O = (Q ⊙ e^Γ) S0 + B V';  S_C = Diag(e^{Γ_C}) S0 + (K ⊙ e^{Γ_C - Γ})^T V'.
// Safe for any gate g <= 0, bounded (K3, g > -5) or not (Kimi Linear's softplus, any g < 0):
//  * Range: every exponent formed is a sum of gates over a run of tokens, so <= 0, and no factor
//    exceeds 1. e^{-Γ} is never formed (with g = -5 a 64-token chunk reaches Γ = -320, whose
//    negation overflows fp32; an unbounded gate overflows it within one token).
//  * Precision: each such sum is accumulated from the run's fixed end (prefix sums from the chunk
//    start, suffix sums from its end, sums from a tile's first row), never as a difference Γ_r - Γ_s
//    of two cumulative sums: after one very negative gate both are large and their difference would
//    keep only ulp(Γ) of absolute precision.
//  * A and B in tiles of kTile rows, the layout a tensor-core kernel uses: a tile below the diagonal
//    (s < n <= r, n the row tile's first row) is the product of two scaled operands,
//    e^{Γ_r-Γ_s} = e^{Γ_r-Γ_n} · e^{Γ_n-Γ_s}, both factors <= 1 (a GEMM of (K ⊙ e^{Γ-Γ_n}) rows and
//    (K ⊙ e^{Γ_n-Γ}) columns); the diagonal tiles take e^{Γ_r-Γ_s} per pair. A factoring with the
//    reference inside the diagonal tile, as the bounded-gate CUDA kernel does, needs e^{Γ_n-Γ_s}
//    with s > n, which only a lower bound on g keeps finite.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kda_common.h"

namespace k3::cpu {
namespace {

constexpr int64_t kTile = 16;

struct ChunkScratch {
  std::vector<float> e_prefix, e_suffix, left_k, left_q, right_k, run, A, B, W, U, Vp, decay_to_end;
  void resize(int64_t C, int64_t K, int64_t V) {
    e_prefix.resize(C * K);
    e_suffix.resize(C * K);
    left_k.resize(kTile * K);
    left_q.resize(kTile * K);
    right_k.resize(C * K);
    run.resize(K);
    A.resize(C * C);
    B.resize(C * C);
    W.resize(C * K);
    U.resize(C * V);
    Vp.resize(C * V);
    decay_to_end.resize(K);
  }
};

// Rows [n0, n1) of A and B (see the header): tiles left of the diagonal factored at row n0, the
// diagonal tile pair by pair.
void fill_tile_rows(const float* q, const float* k, const float* g, int64_t n0, int64_t n1, int64_t L, int64_t K,
                    int64_t qk_stride, ChunkScratch& s) {
  float* A = s.A.data();
  float* B = s.B.data();
  float* run = s.run.data();
  // Left operands: rows r of the tile times e^{Γ_r - Γ_n0} = e^{Σ_{n0<t<=r} g_t}.
  std::fill(run, run + K, 0.f);
  for (int64_t r = n0; r < n1; ++r) {
    if (r > n0)
      for (int64_t i = 0; i < K; ++i) run[i] += g[r * qk_stride + i];
    for (int64_t i = 0; i < K; ++i) {
      const float e = std::exp(run[i]);
      s.left_k[(r - n0) * K + i] = k[r * qk_stride + i] * e;
      s.left_q[(r - n0) * K + i] = q[r * qk_stride + i] * e;
    }
  }
  // Right operands: earlier rows s times e^{Γ_n0 - Γ_s} = e^{Σ_{s<t<=n0} g_t}, summed backwards from n0.
  std::fill(run, run + K, 0.f);
  for (int64_t c = n0 - 1; c >= 0; --c) {
    for (int64_t i = 0; i < K; ++i) {
      run[i] += g[(c + 1) * qk_stride + i];
      s.right_k[c * K + i] = k[c * qk_stride + i] * std::exp(run[i]);
    }
  }
  for (int64_t r = n0; r < n1; ++r) {
    const float* lk = s.left_k.data() + (r - n0) * K;
    const float* lq = s.left_q.data() + (r - n0) * K;
    for (int64_t c = 0; c < n0; ++c) {
      const float* rk = s.right_k.data() + c * K;
      float a = 0.f, b = 0.f;
      for (int64_t i = 0; i < K; ++i) {
        a += lk[i] * rk[i];
        b += lq[i] * rk[i];
      }
      A[r * L + c] = a;
      B[r * L + c] = b;
    }
  }
  // Diagonal tile: for each column c, e^{Σ_{c<t<=r} g_t} accumulated down the rows r >= c.
  for (int64_t c = n0; c < n1; ++c) {
    const float* kc = k + c * qk_stride;
    std::fill(run, run + K, 0.f);
    for (int64_t r = c; r < n1; ++r) {
      const float* kr = k + r * qk_stride;
      const float* qr = q + r * qk_stride;
      float a = 0.f, b = 0.f;
      for (int64_t i = 0; i < K; ++i) {
        if (r > c) run[i] += g[r * qk_stride + i];
        const float ke = kc[i] * std::exp(run[i]);
        a += kr[i] * ke;
        b += qr[i] * ke;
      }
      A[r * L + c] = r > c ? a : 0.f;
      B[r * L + c] = b;
    }
    for (int64_t r = n0; r < c; ++r) A[r * L + c] = 0.f;
  }
}

// One chunk of L tokens for one head. q,k: row stride qk_stride; v,o: row stride v_stride;
// g: like k; beta: stride beta_stride. S [V][K] is updated in place.
void run_chunk(float* S, const float* q, const float* k, const float* v, const float* g, const float* beta,
               float* o, int64_t L, int64_t K, int64_t V, int64_t qk_stride, int64_t v_stride,
               int64_t beta_stride, ChunkScratch& s) {
  // 1. e^{Γ_r} from prefix sums, e^{Γ_C - Γ_r} = e^{Σ_{r<t<L} g_t} from suffix sums.
  float* EG = s.e_prefix.data();
  float* ES = s.e_suffix.data();
  float* run = s.run.data();
  std::fill(run, run + K, 0.f);
  for (int64_t r = 0; r < L; ++r)
    for (int64_t i = 0; i < K; ++i) {
      run[i] += g[r * qk_stride + i];
      EG[r * K + i] = std::exp(run[i]);
    }
  std::fill(run, run + K, 0.f);
  for (int64_t r = L - 1; r >= 0; --r)
    for (int64_t i = 0; i < K; ++i) {
      ES[r * K + i] = std::exp(run[i]);
      run[i] += g[r * qk_stride + i];
    }
  // 2 + 6. A (strictly lower, kk) and B (lower incl. diagonal, qk), tile rows at a time.
  for (int64_t n0 = 0; n0 < L; n0 += kTile) fill_tile_rows(q, k, g, n0, std::min(L, n0 + kTile), L, K, qk_stride, s);
  float* A = s.A.data();
  float* B = s.B.data();
  // 3 + 4. Forward substitution: W_r = β_r (k_r ⊙ e^{Γ_r}) - β_r Σ_{c<r} A[r,c] W_c, same for U.
  float* Wm = s.W.data();
  float* U = s.U.data();
  for (int64_t r = 0; r < L; ++r) {
    const float br = beta[r * beta_stride];
    float* wr = Wm + r * K;
    float* ur = U + r * V;
    for (int64_t i = 0; i < K; ++i) wr[i] = k[r * qk_stride + i] * EG[r * K + i];
    for (int64_t j = 0; j < V; ++j) ur[j] = v[r * v_stride + j];
    for (int64_t c = 0; c < r; ++c) {
      const float a = A[r * L + c];
      const float* wc = Wm + c * K;
      const float* uc = U + c * V;
      // wc, uc already carry their β_c; this row's β_r is applied once below.
      for (int64_t i = 0; i < K; ++i) wr[i] -= a * wc[i];
      for (int64_t j = 0; j < V; ++j) ur[j] -= a * uc[j];
    }
    for (int64_t i = 0; i < K; ++i) wr[i] *= br;
    for (int64_t j = 0; j < V; ++j) ur[j] *= br;
  }
  // 5. V' = U - W S0  (S0 stored [V][K]: (W S0)[r][j] = Σ_i W[r][i] S[j][i]).
  float* Vp = s.Vp.data();
  for (int64_t r = 0; r < L; ++r)
    for (int64_t j = 0; j < V; ++j) {
      const float* sj = S + j * K;
      float acc = 0.f;
      for (int64_t i = 0; i < K; ++i) acc += Wm[r * K + i] * sj[i];
      Vp[r * V + j] = U[r * V + j] - acc;
    }
  // 7. O_r = (q_r ⊙ e^{Γ_r}) S0 + Σ_{c<=r} B[r,c] V'_c.
  for (int64_t r = 0; r < L; ++r) {
    const float* qr = q + r * qk_stride;
    float* orow = o + r * v_stride;
    for (int64_t j = 0; j < V; ++j) {
      const float* sj = S + j * K;
      float acc = 0.f;
      for (int64_t i = 0; i < K; ++i) acc += qr[i] * EG[r * K + i] * sj[i];
      orow[j] = acc;
    }
    for (int64_t c = 0; c <= r; ++c) {
      const float b = B[r * L + c];
      const float* vc = Vp + c * V;
      for (int64_t j = 0; j < V; ++j) orow[j] += b * vc[j];
    }
  }
  // 8. S_C[j][i] = e^{Γ_L[i]} S0[j][i] + Σ_c k_c[i] e^{Γ_L[i] - Γ_c[i]} V'_c[j].
  float* decay_to_end = s.decay_to_end.data();
  for (int64_t j = 0; j < V; ++j)
    for (int64_t i = 0; i < K; ++i) S[j * K + i] *= EG[(L - 1) * K + i];
  for (int64_t c = 0; c < L; ++c) {
    const float* kc = k + c * qk_stride;
    for (int64_t i = 0; i < K; ++i) decay_to_end[i] = kc[i] * ES[c * K + i];
    const float* vc = Vp + c * V;
    for (int64_t j = 0; j < V; ++j) {
      float* sj = S + j * K;
      const float vj = vc[j];
      for (int64_t i = 0; i < K; ++i) sj[i] += decay_to_end[i] * vj;
    }
  }
}

}  // namespace

void kda_chunk(ThreadPool& pool, const ops::KdaParams& p) {
  const KdaDims d = check_kda("kda_chunk", p);
  check_arg(p.chunk_size >= 1, "kda_chunk", "chunk_size must be >= 1, got " + std::to_string(p.chunk_size));
  const float *q = p.q.f32(), *k = p.k.f32(), *v = p.v.f32(), *g = p.g.f32(), *beta = p.beta.f32();
  float* state = p.state.f32();
  float* o = p.o.f32();
  const int32_t* slots = p.slots.i32();
  const int64_t C = p.chunk_size;
  const KdaCheckpoints ckpt = check_kda_checkpoints("kda_chunk", p, d, C);
  pool.parallel_for(d.N * d.H, [&](int64_t i0, int64_t i1) {
    ChunkScratch scratch;
    scratch.resize(std::min<int64_t>(C, std::max<int64_t>(1, d.T)), d.K, d.V);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t n = item / d.H, h = item % d.H;
      float* S = state + (static_cast<int64_t>(slots[n]) * d.H + h) * d.V * d.K;
      for (int64_t t0 = d.begin(n); t0 < d.end(n); t0 += C) {
        const int64_t L = std::min<int64_t>(C, d.end(n) - t0);
        const int64_t qk = (t0 * d.H + h) * d.K, vo = (t0 * d.H + h) * d.V;
        run_chunk(S, q + qk, k + qk, v + vo, g + qk, beta + t0 * d.H + h, o + vo, L, d.K, d.V, d.H * d.K,
                  d.H * d.V, d.H, scratch);
        ckpt.write(n, h, t0 + L - d.begin(n), S);
      }
    }
  });
}

}  // namespace k3::cpu
