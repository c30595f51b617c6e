#include "bench/moe_table.h"

#include <cstdio>
#include <functional>
#include <vector>

#include "bench/kernel_timing.h"

namespace k3::bench {

#ifdef K3_HAVE_CUDA
namespace {

// Token m's k experts in routing variant v: distinct, spread over all E so that the variants, replayed
// round robin, touch every expert and one variant's weights are out of L2 by its next turn.
std::vector<int32_t> routing(int M, int k, int E, int v) {
  std::vector<int32_t> ids;
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < k; ++j) ids.push_back(int32_t((int64_t(v) * k + int64_t(m) * 7 * k + j) % E));
  return ids;
}

}  // namespace

void print_moe_table(Backend& be, const ModelConfig& cfg, double copy_bytes_per_us) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&be);
  if (cb == nullptr || cfg.num_experts <= 0 || cfg.num_experts_per_token <= 0) return;
  const int E = cfg.num_experts, k = cfg.num_experts_per_token, F = cfg.moe_intermediate_size;
  const int Dl = cfg.uses_latent_moe() ? cfg.routed_expert_hidden_size : cfg.hidden_size;
  const int variants = std::max(1, (E + k - 1) / k);
  std::printf("| MoE M x k=%d of E=%d (F %d, Dl %d), graph (us) | default mode | invariant, by the grid | "
              "invariant, wide | invariant, narrow | expert bytes at copy rate | copy / invariant |\n"
              "|---:|---:|---:|---:|---:|---:|---:|\n",
              k, E, F, Dl);
  Tensor w1 = be.alloc({E, F, Dl}, DType::BF16), w3 = be.alloc({E, F, Dl}, DType::BF16),
         w2 = be.alloc({E, Dl, F}, DType::BF16);
  fill(*cb, w1, -0.05f, 0.05f, 1);
  fill(*cb, w3, -0.05f, 0.05f, 2);
  fill(*cb, w2, -0.05f, 0.05f, 3);
  const int form_was = cb->moe_grouped_form();
  const bool inv_was = be.batch_invariant();
  for (int M : {1, 8, 64, 256}) {
    Tensor z = be.alloc({M, Dl}, DType::BF16), wt = be.alloc({M, k}, DType::F32), y = be.alloc({M, Dl}, DType::BF16);
    fill(*cb, z, -1.f, 1.f, 4);
    fill(*cb, wt, 0.1f, 1.f, 5);
    std::vector<Tensor> ids;
    std::vector<bool> touched(size_t(E), false);
    for (int v = 0; v < variants; ++v) {
      const std::vector<int32_t> r = routing(M, k, E, v);
      if (v == 0)
        for (int32_t e : r) touched[size_t(e)] = true;
      ids.push_back(be.from_host(Tensor::from_i32({M, k}, r), DType::I32));
    }
    double experts = 0;
    for (bool t : touched) experts += t;
    const double floor_us = experts * 3.0 * F * Dl * 2 / copy_bytes_per_us;
    auto time = [&](bool invariant, int form) {
      be.set_batch_invariant(invariant);
      cb->set_moe_grouped_form(form);
      std::vector<std::function<void()>> calls;
      for (const Tensor& id : ids)
        calls.push_back([&, id] { be.moe_experts({.z = z, .ids = id, .weights = wt, .w1 = w1, .w3 = w3, .w2 = w2, .y = y}); });
      return time_graphs(cb->stream(), 20 * variants, calls);
    };
    const double dflt = time(false, 0), by_grid = time(true, 0), wide = time(true, 1), narrow = time(true, 2);
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", M, dflt, by_grid, wide, narrow, floor_us,
                floor_us / by_grid);
    std::fflush(stdout);
  }
  cb->set_moe_grouped_form(form_was);
  be.set_batch_invariant(inv_was);
  std::printf("\n");
}
#else
void print_moe_table(Backend&, const ModelConfig&, double) {}
#endif  // K3_HAVE_CUDA

}  // namespace k3::bench
