// The token mask applied to device logits (kernels/cuda/token_mask.cu) against the CPU rule: the masked
// logits are bit for bit the same, and the GPU sampler's greedy and temperature picks on masked rows
// equal the CPU sampler's. Prints SKIPPED where no GPU is visible.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "kernels/token_mask.h"
#include "tests/cuda/cuda_test_util.h"

using namespace k3;

TEST_CASE("CUDA token mask equals the CPU mask; masked sampling agrees", "[cuda][token_mask]") {
  K3_GPU_OR_SKIP(bk);
  std::mt19937 rng(5);
  const int64_t B = 5, V = 4099;
  Tensor host = cudatest::randn({B, V}, rng, 2.f);
  TokenMask mask(V);
  for (int64_t b : {0, 2, 3}) {
    const size_t k = mask.add_row(b);
    for (int32_t id = 0; id < V; ++id)
      if (rng() % 11 == 0) mask.allow(k, id);
  }
  Tensor dev = bk.gpu->from_host(host, DType::F32);
  apply_token_mask(host, mask);
  apply_token_mask(dev, mask);
  const Tensor back = bk.gpu->to_host(dev);
  CHECK(std::memcmp(back.f32(), host.f32(), size_t(B * V) * sizeof(float)) == 0);
  std::vector<ops::SamplingRow> rows;
  for (int64_t b = 0; b < B; ++b)
    rows.push_back({.temperature = b % 2 ? 0.7f : 0.f, .top_k = 0, .top_p = 0.95f, .seed = uint64_t(b) + 9, .step = 4});
  std::vector<int32_t> cpu, gpu;
  bk.cpu->sample({.logits = host, .rows = rows, .out = &cpu});
  bk.gpu->sample({.logits = dev, .rows = rows, .out = &gpu});
  CHECK(gpu == cpu);
  for (size_t k = 0; k < mask.rows().size(); ++k) CHECK(mask.allowed(k, cpu[mask.rows()[k]]));
}
