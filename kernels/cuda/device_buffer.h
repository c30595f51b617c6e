// A device allocation that only grows (workspaces, staged index arrays). Growing synchronizes the
// device (cudaFree), so callers size it before capturing a graph.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_check.h"

namespace k3::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* ensure(size_t bytes) {
    if (bytes > bytes_) {
      if (ptr_) K3_CUDA_OK(cudaFree(ptr_));
      ptr_ = nullptr;
      bytes_ = 0;
      K3_CUDA_OK(cudaMalloc(&ptr_, bytes));
      bytes_ = bytes;
    }
    return ptr_;
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace k3::cuda
