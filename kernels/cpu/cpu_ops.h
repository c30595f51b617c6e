// The CPU implementations of kernels/ops.h, one free function per op (grouped in files by op
// family). All take the backend's pool; each parallel loop gives every output element to exactly
// one chunk and computes it in a fixed order, so results are bitwise identical for any pool size.
#pragma once
#include <cmath>

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops.h"

namespace k3::cpu {

void gemm(ThreadPool& pool, const ops::GemmParams& p);                // gemm.cpp
void rmsnorm(ThreadPool& pool, const ops::RmsNormParams& p);          // norms.cpp
void l2norm(ThreadPool& pool, const ops::L2NormParams& p);            // norms.cpp
void short_conv(ThreadPool& pool, const ops::ShortConvParams& p);     // short_conv.cpp
void kda_gate(ThreadPool& pool, const ops::KdaGateParams& p);         // kda.cpp
void kda_recurrent(ThreadPool& pool, const ops::KdaParams& p);        // kda.cpp
void kda_chunk(ThreadPool& pool, const ops::KdaParams& p);            // kda_chunk.cpp
void kda_decode(ThreadPool& pool, const ops::KdaDecodeParams& p);     // kda_decode.cpp
void mla_prefill(ThreadPool& pool, const ops::MlaPrefillParams& p);   // mla.cpp
void mla_decode(ThreadPool& pool, const ops::MlaDecodeParams& p);     // mla.cpp
void lse_merge(ThreadPool& pool, const ops::LseMergeParams& p);       // lse_merge.cpp
void attnres_mix(ThreadPool& pool, const ops::AttnResMixParams& p);   // attnres.cpp
void situ(ThreadPool& pool, const ops::SituParams& p);                // moe.cpp
void router_topk(ThreadPool& pool, const ops::RouterTopkParams& p);   // moe.cpp
void moe_experts(ThreadPool& pool, const ops::MoeExpertsParams& p);   // moe.cpp
void add(ThreadPool& pool, const ops::AddParams& p);                  // elementwise.cpp
void sigmoid_mul(ThreadPool& pool, const ops::SigmoidMulParams& p);   // elementwise.cpp
void sigmoid(ThreadPool& pool, const Tensor& x, Tensor& y);           // elementwise.cpp
void embedding(ThreadPool& pool, const ops::EmbeddingParams& p);      // elementwise.cpp
void sample(ThreadPool& pool, const ops::SampleParams& p);            // sampling.cpp

// y[m, n] = sum_k x[m, k] * w[n, k] for raw row-major buffers (ldx = ldw = K, ldy = N), with
// alpha/beta as in GemmParams. Each element is a fixed-order dot product that depends only on
// its own row of x and row of w: a row's result never depends on the other rows in the batch.
void gemm_rows(ThreadPool& pool, const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K,
               float alpha = 1.f, float beta = 0.f);

// Scalar helpers shared by several ops.
inline float sigmoidf(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float siluf(float x) { return x / (1.f + std::exp(-x)); }
inline float situf(float g, float u, float beta, float beta_linear) {
  return beta * std::tanh(g / beta) * sigmoidf(g) * (beta_linear * std::tanh(u / beta_linear));
}
// act(g, u) of a gated MLP: SiTU or SiLU(g) * u.
inline float gluf(ops::GluAct act, float g, float u, float beta, float beta_linear) {
  return act == ops::GluAct::Silu ? siluf(g) * u : situf(g, u, beta, beta_linear);
}
// softplus with the overflow guard of the reference implementations (x for x > 20).
inline float softplusf(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace k3::cpu
