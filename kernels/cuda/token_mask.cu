#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/token_mask_cuda.h"

namespace k3::cuda {
namespace {

__global__ void token_mask_kernel(float* logits, int64_t V, const int64_t* rows, const uint32_t* bits, int64_t words,
                                  int64_t n_rows) {
  pdl_enter();
  const int64_t k = blockIdx.y;
  if (k >= n_rows) return;
  float* row = logits + rows[k] * V;
  const uint32_t* m = bits + k * words;
  for (int64_t id = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; id < V; id += int64_t(gridDim.x) * blockDim.x)
    if (!((m[id >> 5] >> (id & 31)) & 1u)) row[id] = -INFINITY;
}

}  // namespace

void apply_token_mask_device(float* logits, int64_t V, const std::vector<int64_t>& rows,
                             const std::vector<uint32_t>& bits, int64_t words) {
  if (rows.empty()) return;
  DeviceBuffer d_rows, d_bits;  // per call: masks change every step and are small next to the logits
  auto* r = static_cast<int64_t*>(d_rows.ensure(rows.size() * sizeof(int64_t)));
  auto* b = static_cast<uint32_t*>(d_bits.ensure(bits.size() * sizeof(uint32_t)));
  K3_CUDA_OK(cudaDeviceSynchronize());
  K3_CUDA_OK(cudaMemcpy(r, rows.data(), rows.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  K3_CUDA_OK(cudaMemcpy(b, bits.data(), bits.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  const unsigned threads = 256;
  const unsigned blocks_x = static_cast<unsigned>(std::min<int64_t>((V + threads - 1) / threads, 1024));
  token_mask_kernel<<<dim3(blocks_x, static_cast<unsigned>(rows.size())), threads>>>(logits, V, r, b, words,
                                                                                    static_cast<int64_t>(rows.size()));
  K3_CUDA_OK(cudaGetLastError());
  K3_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace k3::cuda
