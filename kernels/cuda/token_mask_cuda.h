// Device half of apply_token_mask (kernels/token_mask.h): one thread per logit of the masked rows.
#pragma once
#include <cstdint>
#include <vector>

namespace k3::cuda {

// logits: device [B, V] F32. Synchronizes the device before (the logits' producer may run on any
// stream) and after (the caller samples next); only called when some row is masked.
void apply_token_mask_device(float* logits, int64_t V, const std::vector<int64_t>& rows,
                             const std::vector<uint32_t>& bits, int64_t words);

}  // namespace k3::cuda
