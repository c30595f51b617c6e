// Device helper of the NCCL Comm: out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) ..., the serial
// sum in rank order that the Comm interface promises (NCCL's own reductions choose their order).
#pragma once
#include <cstddef>

#include <cuda_runtime.h>

namespace k3::transfer {

// parts: n consecutive blocks of `count` floats (device); out: `count` floats (device). Enqueued on `stream`.
cudaError_t ordered_sum(const float* parts, int n, size_t count, float* out, cudaStream_t stream);

}  // namespace k3::transfer
