// CUDA and cuBLASLt return codes become k3::Error naming the call (docs/STYLE.md habit 11: no abort).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "common/core/status.h"

namespace k3::cuda {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLASLt: ") + what + ": status " + std::to_string(int(s)));
}

}  // namespace k3::cuda

#define K3_CUDA_OK(expr) ::k3::cuda::check_cuda((expr), #expr)
#define K3_CUBLAS_OK(expr) ::k3::cuda::check_cublas((expr), #expr)
