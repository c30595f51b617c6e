// Linked when the build has no CUDA backend.
#include "kernels/backend.h"

namespace k3 {

std::unique_ptr<Backend> make_cuda_backend(int, std::string* why_not) {
  if (why_not) *why_not = "this build has no CUDA backend (nvcc was not found at configure time)";
  return nullptr;
}

}  // namespace k3
