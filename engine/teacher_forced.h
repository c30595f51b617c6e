// Teacher-forced logits: every position of several prompts in one batched prefill, for comparing
// the model with another implementation position by position (k3-generate --logits-out).
#pragma once
#include <cstdint>
#include <vector>

#include "common/model/weights.h"
#include "kernels/backend.h"

namespace k3 {

// Host F32 [sum of prompt lengths, vocab]: row r is the logits after token r of the prompts laid
// end to end (prompt 0's tokens first). The model is uploaded for this call and freed after it.
Result<Tensor> teacher_forced_logits(Backend& backend, const ModelConfig& cfg, const WeightStore& weights,
                                     const std::vector<std::vector<int32_t>>& prompts);

}  // namespace k3
