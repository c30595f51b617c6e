// The Hugging Face Kimi Linear family ("model_type": "kimi_linear"): the keys of its config.json (as the
// released checkpoints and transformers' save_pretrained write them), its rules, and its JSON form.
// Used by config.cpp, which dispatches on model_type.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "common/config/config.h"

namespace k3 {

// Reads one kimi_linear object (prefix names its path in errors) into cfg, setting the variant fields
// the family fixes (softplus gate, plain residual, full-width SiLU experts, no MLA output gate).
Status parse_kimi_linear_fields(const nlohmann::json& obj, const std::string& prefix, ModelConfig& cfg);
// The rules of the family; each failure names the field.
Status validate_kimi_linear(const ModelConfig& cfg);
// config.json as the released checkpoints write it (1-based layer lists, q_lora_rank null when unset).
std::string kimi_linear_config_to_json(const ModelConfig& cfg);

}  // namespace k3
