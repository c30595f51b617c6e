// Random initialisation of one weight tensor, deterministic per (seed, tensor name): a tensor's
// values never depend on which other tensors exist, so a PP stage that generates only its layer
// range gets the same numbers as the whole model. Scheme and reasoning: docs/MODEL_INIT.md.
#pragma once
#include <cstdint>

#include "common/core/tensor.h"
#include "common/config/config.h"
#include "common/model/weights.h"

namespace k3 {

// How one tensor is initialised (chosen from its name and shape).
struct InitRule {
  enum class Kind { Normal, Constant, KdaDtBias } kind = Kind::Normal;
  float std = 0.f;    // Normal: N(0, std^2)
  float value = 0.f;  // Constant
};
InitRule init_rule(const ModelConfig& cfg, const TensorSpec& spec);

// Storage dtype of a spec: F32 for F32-only tensors, else `matrix_dtype` (F32, BF16 or F16).
DType init_dtype(const TensorSpec& spec, DType matrix_dtype);

// A fresh host tensor of spec.shape in init_dtype(spec, matrix_dtype).
Tensor random_tensor(const ModelConfig& cfg, const TensorSpec& spec, uint64_t seed, DType matrix_dtype);

}  // namespace k3
