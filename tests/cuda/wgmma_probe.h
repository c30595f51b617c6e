// Host entry of the wgmma probe (wgmma_probe.cu): one block runs exactly the wgmma instruction
// sequence of the MLA decode kernel (kernels/cuda/mla_decode_wgmma.cu) on given operands.
// q [64 x 576], kv [64 x 576], p [64 x 64]: bf16 bit patterns, row major. Results: s [64 x 64]
// = q · kvᵀ, o [64 x 512] = p · kv[:, :512], fp32 row major; o_wide [2][64 x 512]: the same product
// with m64n256k16 and the N-direction atom stride in LBO ([0]) or SBO ([1]): one of them is wrong.
// Returns "" or the CUDA error.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3::cudatest {
std::string run_wgmma_probe(const std::vector<uint16_t>& q, const std::vector<uint16_t>& kv,
                            const std::vector<uint16_t>& p, std::vector<float>& s, std::vector<float>& o,
                            std::vector<float>& o_wide);
}
