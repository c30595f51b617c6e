// Tensor names, shapes and dtypes the model reads (docs/MODEL.md names, HF style, per layer), loading
// with validation, and random initialisation for generated models.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/core/tensor.h"
#include "common/config/config.h"

namespace k3 {

struct TensorSpec {
  std::string name;
  Shape shape;
  bool f32_only = false;  // must be stored F32 (A_log, dt_bias, conv weights, router bias); else F32/BF16/F16
};

// Every tensor the model reads for layers [layer_begin, layer_end) (+ embedding / head / final
// mix when the range includes the first / last layer). Default: the whole model.
std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg, int layer_begin = 0, int layer_end = -1);

// The name prefix of a MoE layer's tensors under "model.layers.N.": "mlp." (K3) or "block_sparse_moe."
// (Kimi Linear checkpoints; dense layers use "mlp." in both).
std::string moe_prefix(const ModelConfig& cfg);

// Host tensors by name, kept alive by the mapped files.
class WeightStore {
 public:
  const Tensor& get(const std::string& name) const;   // throws k3::Error naming a missing tensor
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  void put(const std::string& name, Tensor t) { tensors_[name] = std::move(t); }
  const std::map<std::string, Tensor>& all() const { return tensors_; }

 private:
  std::map<std::string, Tensor> tensors_;
};

// Loads <dir>/model.safetensors (or the shards named by model.safetensors.index.json) and checks
// every expected tensor for the layer range: missing, misshapen or wrongly typed tensors are errors
// naming the tensor, the expected and the actual shape/dtype. Unexpected extra tensors are ignored.
Result<WeightStore> load_weights(const std::string& model_dir, const ModelConfig& cfg,
                                 int layer_begin = 0, int layer_end = -1);

// Random weights for a config (see docs/MODEL_INIT.md for the scheme); dtype of matrices: F32 or BF16.
WeightStore random_weights(const ModelConfig& cfg, uint64_t seed, DType matrix_dtype);

}  // namespace k3
