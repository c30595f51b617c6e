// Argument checks of CudaBackend's ops at the host boundary: every error names the op and the
// field; the checked tensors come back as the raw pointers the launchers take.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/core/tensor.h"
#include "kernels/cuda/any_ptr.h"
#include "kernels/cuda/cuda_check.h"

namespace k3::cuda::args {

inline std::string where(const char* op, const char* field) { return std::string(op) + ": " + field; }

inline void need_device(const char* op, const char* field, const Tensor& t) {
  if (t.device() != Device::Cuda && t.numel() > 0)
    throw Error(where(op, field) + " must be a CUDA tensor (use Backend::alloc / from_host)");
}
// Float tensor (F32 or BF16) on the device with the given rank.
inline FIn fin(const char* op, const char* field, const Tensor& t, int rank = -1) {
  need_device(op, field, t);
  if (t.dtype() != DType::F32 && t.dtype() != DType::BF16)
    throw Error(where(op, field) + ": expected F32 or BF16, got " + dtype_name(t.dtype()));
  if (rank >= 0 && t.ndim() != rank)
    throw Error(where(op, field) + ": expected rank " + std::to_string(rank) + ", got " + shape_str(t.shape()));
  return FIn{t.data(), t.dtype() == DType::BF16};
}
inline FOut fout(const char* op, const char* field, const Tensor& t, int rank = -1) {
  const FIn f = fin(op, field, t, rank);
  return FOut{const_cast<void*>(f.p), f.bf16};
}
inline float* f32(const char* op, const char* field, const Tensor& t) {
  need_device(op, field, t);
  if (t.dtype() != DType::F32) throw Error(where(op, field) + ": expected F32, got " + dtype_name(t.dtype()));
  return t.ptr<float>();
}
inline const __nv_bfloat16* bf16(const char* op, const char* field, const Tensor& t) {
  need_device(op, field, t);
  if (t.dtype() != DType::BF16) throw Error(where(op, field) + ": expected BF16, got " + dtype_name(t.dtype()));
  return t.ptr<const __nv_bfloat16>();
}
inline void need_shape(const char* op, const char* field, const Tensor& t, const Shape& want) {
  if (t.shape() != want)
    throw Error(where(op, field) + ": expected shape " + shape_str(want) + ", got " + shape_str(t.shape()));
}
inline void need_i32(const char* op, const char* field, const Tensor& t, int64_t n) {
  if (t.dtype() != DType::I32) throw Error(where(op, field) + ": expected I32, got " + dtype_name(t.dtype()));
  if (n >= 0 && t.numel() != n)
    throw Error(where(op, field) + ": expected " + std::to_string(n) + " entries, got " + shape_str(t.shape()));
}
// Host copy of a small I32 tensor that may live on either side.
inline std::vector<int32_t> host_ints(const Tensor& t, cudaStream_t s) {
  std::vector<int32_t> v(size_t(t.numel()));
  if (v.empty()) return v;
  if (t.device() == Device::Cpu) {
    std::memcpy(v.data(), t.data(), v.size() * 4);
  } else {
    K3_CUDA_OK(cudaMemcpyAsync(v.data(), t.data(), v.size() * 4, cudaMemcpyDeviceToHost, s));
    K3_CUDA_OK(cudaStreamSynchronize(s));
  }
  return v;
}

}  // namespace k3::cuda::args
