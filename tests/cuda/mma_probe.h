// Host entry of the mma.cuh fragment probe (mma_probe.cu). Inputs are 16x16 bf16 bit patterns,
// row major; out gets three 16x16 fp32 results (see the kernel). Returns "" or the CUDA error.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3::cudatest {
std::string run_mma_probe(const std::vector<uint16_t>& a_mk, const std::vector<uint16_t>& b_kn, std::vector<float>& out);
}
