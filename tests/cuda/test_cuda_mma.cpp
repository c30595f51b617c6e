// The warp-level tensor-core helpers (kernels/cuda/mma.cuh) against a CPU product: every loader
// (A from [m][k] and [k][m], B from [n][k] and [k][n]) and the C->A repacking used for P·V.
#include <cmath>

#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/mma_probe.h"

namespace k3::cudatest {
namespace {

TEST_CASE("cuda mma.cuh loaders and m16n8k16 product match a cpu product", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  std::mt19937 rng(7);
  for (int round = 0; round < 3; ++round) {
    Tensor a = randn({16, 16}, rng), b = randn({16, 16}, rng);
    std::vector<uint16_t> ab(256), bb(256);
    for (int i = 0; i < 256; ++i) {
      ab[i] = f32_to_bf16(a.f32()[i]);
      bb[i] = f32_to_bf16(b.f32()[i]);
    }
    std::vector<float> out;
    const std::string err = run_mma_probe(ab, bb, out);
    REQUIRE(err.empty());
    std::vector<double> c(256, 0.0), cb(256, 0.0), d(256, 0.0);
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n)
        for (int k = 0; k < 16; ++k) c[m * 16 + n] += double(a.f32()[m * 16 + k]) * b.f32()[k * 16 + n];
    for (int i = 0; i < 256; ++i) cb[i] = round_bf16(float(c[i]));  // the probe packs C to bf16 first
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n)
        for (int k = 0; k < 16; ++k) d[m * 16 + n] += cb[m * 16 + k] * b.f32()[k * 16 + n];
    for (int i = 0; i < 256; ++i) {
      INFO("element " << i << " round " << round);
      CHECK(std::abs(out[i] - c[i]) <= 1e-3 * (1 + std::abs(c[i])));
      CHECK(std::abs(out[256 + i] - c[i]) <= 1e-3 * (1 + std::abs(c[i])));
      CHECK(std::abs(out[512 + i] - d[i]) <= 1e-2 * (1 + std::abs(d[i])));
    }
  }
}

}  // namespace
}  // namespace k3::cudatest
