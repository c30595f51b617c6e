#include "common/model/weights_init.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "common/core/counter_random.h"

namespace k3 {
namespace {

constexpr int64_t kChunk = 1 << 20;  // values per task when big tensors fill in parallel
constexpr float kAttnResLogitStd = 0.5f;  // std of the AttnRes pseudo-query logits at init
constexpr float kRouterBiasStd = 0.01f;
constexpr double kDtMin = 1e-3, kDtMax = 1e-1, kDtFloor = 1e-4;  // FLA's dt_bias init range

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// dt ~ logU(kDtMin, kDtMax), floored, then dt_bias = softplus^{-1}(dt) = dt + log(1 - e^{-dt}).
// Double precision throughout, rounded once to float.
float dt_bias_value(uint64_t ts, int64_t i) {
  const double u = counter_random::unit_open(ts, static_cast<uint64_t>(i));
  const double dt = std::max(kDtFloor, std::exp(std::log(kDtMin) + u * (std::log(kDtMax) - std::log(kDtMin))));
  return static_cast<float>(dt + std::log(-std::expm1(-dt)));
}

void fill_chunk(const InitRule& rule, uint64_t ts, float* out, int64_t begin, int64_t n) {
  switch (rule.kind) {
    case InitRule::Kind::Uniform: {
      const float scale = counter_random::uniform_scale(rule.std);
      for (int64_t i = 0; i < n; ++i) out[i] = counter_random::uniform(ts, static_cast<uint64_t>(begin + i), scale);
      break;
    }
    case InitRule::Kind::Constant: std::fill(out, out + n, rule.value); break;
    case InitRule::Kind::KdaDtBias:
      for (int64_t i = 0; i < n; ++i) out[i] = dt_bias_value(ts, begin + i);
      break;
  }
}

void store_chunk(const float* src, Tensor& t, int64_t offset, int64_t n) {
  switch (t.dtype()) {
    case DType::F32: std::copy(src, src + n, t.ptr<float>() + offset); break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) t.ptr<uint16_t>()[offset + i] = f32_to_bf16(src[i]);
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) t.ptr<uint16_t>()[offset + i] = f32_to_f16(src[i]);
      break;
    default: throw Error(std::string("random_tensor: unsupported dtype ") + dtype_name(t.dtype()));
  }
}

}  // namespace

InitRule init_rule(const ModelConfig& cfg, const TensorSpec& spec) {
  const std::string& n = spec.name;
  const double d = cfg.hidden_size;
  // Output projections write into the AttnRes partial sum P. A block sums 2*S sublayer outputs
  // (attention + FFN per layer), so 1/sqrt(2S) keeps a finished block at O(1) RMS whatever L is.
  // A plain residual stream sums all 2L of them.
  const int block = cfg.uses_attn_res() ? cfg.attn_res_block_size : cfg.num_hidden_layers;
  const double out_scale = 1.0 / std::sqrt(2.0 * block);
  auto normal = [](double s) { return InitRule{InitRule::Kind::Uniform, static_cast<float>(s), 0.f}; };
  auto constant = [](float v) { return InitRule{InitRule::Kind::Constant, 0.f, v}; };

  if (n == "model.embed_tokens.weight") return normal(1.0);
  if (n == "lm_head.weight") return normal(1.0 / std::sqrt(d));
  if (ends_with(n, "norm.weight")) return constant(1.f);
  if (ends_with(n, "_res_proj.weight")) return normal(kAttnResLogitStd / std::sqrt(d));
  if (ends_with(n, "_conv1d.weight")) return normal(1.0 / std::sqrt(cfg.kda.short_conv_kernel_size));
  if (ends_with(n, ".A_log")) return constant(0.f);
  if (ends_with(n, ".dt_bias")) return {InitRule::Kind::KdaDtBias, 0.f, 0.f};
  if (ends_with(n, ".e_score_correction_bias")) return normal(kRouterBiasStd);
  K3_CHECK(spec.shape.size() == 2, "no init rule for weight '" + n + "' of shape " + shape_str(spec.shape));
  const double fan_in_std = 1.0 / std::sqrt(static_cast<double>(spec.shape[1]));
  const bool writes_residual = ends_with(n, "self_attn.o_proj.weight") || ends_with(n, "mlp.down_proj.weight") ||
                               ends_with(n, "routed_expert_up_proj.weight") ||
                               ends_with(n, "shared_experts.down_proj.weight") ||
                               (!cfg.uses_latent_moe() && ends_with(n, ".w2.weight"));
  return normal(writes_residual ? fan_in_std * out_scale : fan_in_std);
}

std::optional<UniformDraw> uniform_draw(const ModelConfig& cfg, const TensorSpec& spec, uint64_t seed) {
  const InitRule rule = init_rule(cfg, spec);
  if (rule.kind != InitRule::Kind::Uniform) return std::nullopt;
  return UniformDraw{counter_random::tensor_seed(seed, spec.name), counter_random::uniform_scale(rule.std)};
}

DType init_dtype(const TensorSpec& spec, DType matrix_dtype) { return spec.f32_only ? DType::F32 : matrix_dtype; }

Tensor random_tensor(const ModelConfig& cfg, const TensorSpec& spec, uint64_t seed, DType matrix_dtype) {
  K3_CHECK(matrix_dtype == DType::F32 || matrix_dtype == DType::BF16 || matrix_dtype == DType::F16,
           std::string("random weights: matrix dtype must be F32, BF16 or F16, got ") + dtype_name(matrix_dtype));
  const InitRule rule = init_rule(cfg, spec);
  Tensor t = Tensor::zeros(spec.shape, init_dtype(spec, matrix_dtype));
  const int64_t numel = t.numel();
  const int64_t chunks = (numel + kChunk - 1) / kChunk;
  const uint64_t ts = counter_random::tensor_seed(seed, spec.name);
  auto run = [&](int64_t first, int64_t step) {
    std::vector<float> buf(static_cast<size_t>(std::min(numel, kChunk)));
    for (int64_t c = first; c < chunks; c += step) {
      const int64_t begin = c * kChunk, n = std::min(kChunk, numel - begin);
      fill_chunk(rule, ts, buf.data(), begin, n);
      store_chunk(buf.data(), t, begin, n);
    }
  };
  const int64_t workers = std::min<int64_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  if (workers <= 1) {
    run(0, 1);
  } else {
    std::vector<std::jthread> pool;
    for (int64_t w = 0; w < workers; ++w) pool.emplace_back(run, w, workers);
  }
  return t;
}

WeightStore random_weights(const ModelConfig& cfg, uint64_t seed, DType matrix_dtype) {
  WeightStore store;
  for (const TensorSpec& spec : expected_tensors(cfg)) store.put(spec.name, random_tensor(cfg, spec, seed, matrix_dtype));
  return store;
}

}  // namespace k3
