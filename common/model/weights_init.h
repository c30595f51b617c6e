// Random initialisation of one weight tensor, deterministic per (seed, tensor name): a tensor's
// values never depend on which other tensors exist, so a PP stage that generates only its layer
// range gets the same numbers as the whole model. Scheme and reasoning: docs/MODEL_INIT.md.
#pragma once
#include <cstdint>
#include <optional>

#include "common/core/tensor.h"
#include "common/config/config.h"
#include "common/model/weights.h"

namespace k3 {

// How one tensor is initialised (chosen from its name and shape).
struct InitRule {
  // Uniform: zero mean, standard deviation `std` (counter_random::uniform); KdaDtBias: FLA's dt range.
  enum class Kind { Uniform, Constant, KdaDtBias } kind = Kind::Uniform;
  float std = 0.f;    // Uniform
  float value = 0.f;  // Constant
};
InitRule init_rule(const ModelConfig& cfg, const TensorSpec& spec);

// Storage dtype of a spec: F32 for F32-only tensors, else `matrix_dtype` (F32, BF16 or F16).
DType init_dtype(const TensorSpec& spec, DType matrix_dtype);

// A Uniform tensor's draw, for backends that fill it on their device: element i is
// counter_random::uniform(seed, i, scale), rounded to `round_to` (the storage dtype a file would have).
struct UniformDraw {
  uint64_t seed = 0;
  float scale = 0.f;
};
// The draw of `spec` when its rule is Uniform; nullopt for the host-computed rules.
std::optional<UniformDraw> uniform_draw(const ModelConfig& cfg, const TensorSpec& spec, uint64_t seed);

// A fresh host tensor of spec.shape in init_dtype(spec, matrix_dtype).
Tensor random_tensor(const ModelConfig& cfg, const TensorSpec& spec, uint64_t seed, DType matrix_dtype);

}  // namespace k3
