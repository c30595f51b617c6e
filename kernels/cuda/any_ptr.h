// Float tensors reach the simple kernels as (pointer, is_bf16): weights arrive as F32 or BF16
// depending on the checkpoint, so these kernels read and write either without a template per mix.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace k3::cuda {

struct FIn {
  const void* p = nullptr;
  bool bf16 = false;
  __device__ __forceinline__ float operator[](int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
  }
};

struct FOut {
  void* p = nullptr;
  bool bf16 = false;
  __device__ __forceinline__ void set(int64_t i, float v) const {
    if (bf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
    else static_cast<float*>(p)[i] = v;
  }
  __device__ __forceinline__ float get(int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
  }
};

}  // namespace k3::cuda
