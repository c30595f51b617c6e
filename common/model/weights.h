// Tensor names, shapes and dtypes the model reads (docs/MODEL.md names, HF style, per layer), loading
// with validation, and random initialisation for generated models.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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

// Whether a stored tensor is one of the attention weights with a block of rows per head, of which a
// process running a share of the heads (a DCP rank) keeps its share's rows only: in a KDA layer
// q/k/v_proj, their conv1d taps, f_b_proj, A_log, dt_bias, b_proj and the full-rank g_proj; in an MLA
// layer the output gate g_proj. (The engine's upload cuts them; the memory planner counts them.)
bool is_per_head_weight(const ModelConfig& cfg, const std::string& name);

// The name prefix of a MoE layer's tensors under "model.layers.N.": "mlp." (K3) or "block_sparse_moe."
// (Kimi Linear checkpoints; dense layers use "mlp." in both).
std::string moe_prefix(const ModelConfig& cfg);

// A generated model that exists only where its weights are uploaded (`--model synthetic:...`):
// every tensor is random_tensor(cfg, spec, seed, matrix_dtype), the numbers k3-genweights would
// write with the same seed and dtype.
struct SyntheticSource {
  ModelConfig cfg;
  uint64_t seed = 0;
  DType matrix_dtype = DType::BF16;
};

// Told, after each weight a backend upload takes from a store, the bytes uploaded so far and the
// upload's expected total (engine/model_weights.h; for a progress display: done may pass the total by
// the few tensors uploaded in two forms).
using UploadObserver = std::function<void(uint64_t done, uint64_t total)>;

// Host tensors by name, kept alive by the mapped files; or a synthetic source, whose tensors are
// drawn when asked for (get() draws on the host and keeps the result; the upload fills the large
// ones on the backend's device instead, engine/model_weights.cpp).
class WeightStore {
 public:
  static WeightStore synthetic(SyntheticSource src);
  const Tensor& get(const std::string& name) const;   // throws k3::Error naming a missing tensor
  bool has(const std::string& name) const;
  void put(const std::string& name, Tensor t) { tensors_[name] = std::move(t); }
  // The stored tensors (for a synthetic source: only those get() has drawn so far).
  const std::map<std::string, Tensor>& all() const { return tensors_; }
  const std::optional<SyntheticSource>& synthetic_source() const { return synthetic_; }
  // Who hears of an upload's progress from this store (none by default).
  void set_upload_observer(UploadObserver f) { upload_observer_ = std::move(f); }
  const UploadObserver& upload_observer() const { return upload_observer_; }

 private:
  mutable std::map<std::string, Tensor> tensors_;
  std::optional<SyntheticSource> synthetic_;
  std::map<std::string, TensorSpec> specs_;  // synthetic: every tensor of the model
  UploadObserver upload_observer_;
};

// "synthetic:PRESET[:SEED]" names a generated model instead of a directory (docs/MODELS.md).
bool is_synthetic_model(const std::string& model);
struct SyntheticModelName {
  std::string preset;
  uint64_t seed = 0;
};
Result<SyntheticModelName> parse_synthetic_model(const std::string& model);
// The config of a --model argument: the preset's for a synthetic model, else DIR/config.json.
Result<ModelConfig> load_model_config_of(const std::string& model);

// Loads <dir>/model.safetensors (a synthetic model name gives a synthetic store with bf16 matrices) (or the shards named by model.safetensors.index.json) and checks
// every expected tensor for the layer range: missing, misshapen or wrongly typed tensors are errors
// naming the tensor, the expected and the actual shape/dtype. Unexpected extra tensors are ignored.
Result<WeightStore> load_weights(const std::string& model_dir, const ModelConfig& cfg,
                                 int layer_begin = 0, int layer_end = -1);

// Random weights for a config (see docs/MODEL_INIT.md for the scheme); dtype of matrices: F32 or BF16.
WeightStore random_weights(const ModelConfig& cfg, uint64_t seed, DType matrix_dtype);

}  // namespace k3
