// Internal to the rank-sliced forward (engine/rank_model.h): one decode step's context (backend, layout,
// communicator, timers) and the pieces rank_model.cpp composes per layer. Not a public interface.
#pragma once
#include <span>

#include "common/core/comm.h"
#include "engine/model_weights.h"
#include "engine/rank_model.h"

namespace k3::rank {

struct Step {
  Backend& be;
  const ModelConfig& cfg;
  const RankLayout& g;
  Comm& comm;
  CollectiveTimes& times;

  Tensor alloc(Shape shape) { return be.alloc(shape, be.compute_dtype()); }
  Tensor alloc(Shape shape, DType dtype) { return be.alloc(shape, dtype); }
  Tensor gemm(const Tensor& x, const Tensor& w);
  Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps);

  // The collectives over whole tensors (contiguous, any dtype), timed into `times`. A tensor may be the
  // backend's (device memory on a GPU) or a host view of small control values; where the communicator
  // takes the other kind of memory (comm.h), the bytes are staged through that kind, so one forward
  // serves CPU ranks over UCX, GPU ranks over NCCL and GPU ranks over host UCX.
  Status all_gather(const Tensor& mine, Tensor& all);
  Status all_to_all(const Tensor& in, Tensor& out);
  // Byte counts per rank, as Comm::all_to_allv.
  Status all_to_allv(const Tensor& in, std::span<const size_t> send, Tensor& out, std::span<const size_t> recv);
  Status all_reduce(Tensor& data);  // F32, in place

  // A host copy of a backend tensor, byte for byte (no widening of bf16, unlike Backend::to_host).
  Tensor host_bytes(const Tensor& t);
};

// Each DCP rank's [R, c] block of head outputs, gathered into [R, dcp * c] (rank-major columns = head
// order). dcp = 1: returns `mine`.
Result<Tensor> gather_heads(Step& s, const Tensor& mine);

// The gated outputs of all heads of one attention layer, [R, P] (KDA) or [R, H * dv] (MLA), before the
// output projection. Each DCP rank computes its own heads; MLA appends the new rows on their owners.
Result<Tensor> kda_heads(Step& s, int layer, const LayerWeights& lw, std::span<const RankItem> batch, const Tensor& x,
                         CachePools& caches);
Result<Tensor> mla_heads(Step& s, int layer, const LayerWeights& lw, std::span<const RankItem> batch, const Tensor& x,
                         CachePools& caches);

// The FFN of rows `x` into `out` ([rows, d]); rows may be 0. Routed experts are local (dcp groups and
// single ranks) or exchanged with the EP ranks (every EP rank calls it for every MoE layer, in lockstep).
Status ffn(Step& s, int layer, const LayerWeights& lw, const Tensor& x, Tensor& out);

// The expert combine: y[m] = sum over slots j (in order) of weights[m, j] * h[m * k + j], from zero, as
// moe_experts sums: each product rounded (the CPU kernels, compiled without FMA contraction) or, with
// `fused_multiply_add`, y = fma(w, h, y) (the CUDA kernels' combine, which nvcc contracts).
void combine_slots(const float* h, const float* weights, int64_t rows, int64_t k, int64_t width, float* y,
                   bool fused_multiply_add);

}  // namespace k3::rank
