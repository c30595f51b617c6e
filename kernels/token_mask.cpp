#include "kernels/token_mask.h"

#include <limits>
#include <string>

#include "common/core/status.h"
#if defined(K3_HAVE_CUDA)
#include "kernels/cuda/token_mask_cuda.h"
#endif

namespace k3 {

size_t TokenMask::add_row(int64_t row) {
  if (!rows_.empty() && row <= rows_.back())
    throw Error(invalid_argument("token mask: rows must be added in ascending order (row " + std::to_string(row) +
                                 " after " + std::to_string(rows_.back()) + ")"));
  rows_.push_back(row);
  bits_.resize(bits_.size() + static_cast<size_t>(words_), 0u);
  return rows_.size() - 1;
}

void apply_token_mask(const Tensor& logits, const TokenMask& mask) {
  if (mask.empty()) return;
  if (logits.dtype() != DType::F32 || logits.ndim() != 2)
    throw Error(invalid_argument("token mask: logits must be [B, V] F32"));
  const int64_t B = logits.dim(0), V = logits.dim(1);
  if (V != mask.vocab())
    throw Error(invalid_argument("token mask: built for a vocabulary of " + std::to_string(mask.vocab()) +
                                 ", the logits have " + std::to_string(V)));
  for (size_t k = 0; k < mask.rows().size(); ++k) {
    const int64_t row = mask.rows()[k];
    if (row < 0 || row >= B)
      throw Error(invalid_argument("token mask: row " + std::to_string(row) + " is outside the batch of " + std::to_string(B)));
    bool any = false;
    for (int64_t w = 0; w < mask.words() && !any; ++w) any = mask.bits()[k * mask.words() + w] != 0;
    if (!any) throw Error(invalid_argument("token mask: row " + std::to_string(row) + " allows no token"));
  }
  if (logits.device() != Device::Cpu) {
#if defined(K3_HAVE_CUDA)
    cuda::apply_token_mask_device(static_cast<float*>(logits.data()), V, mask.rows(), mask.bits(), mask.words());
    return;
#else
    throw Error(invalid_argument("token mask: device logits in a build without CUDA"));
#endif
  }
  float* x = logits.f32();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t k = 0; k < mask.rows().size(); ++k) {
    float* row = x + mask.rows()[k] * V;
    for (int64_t id = 0; id < V; ++id)
      if (!mask.allowed(k, static_cast<int32_t>(id))) row[id] = neg_inf;
  }
}

}  // namespace k3
