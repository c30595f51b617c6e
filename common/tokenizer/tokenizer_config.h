// Fields of a Hugging Face tokenizer_config.json shared by the tokenizer and the chat format.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace k3 {

// A token field ("bos_token", ...) is either "text" or {"content": "text", ...}; nullopt otherwise.
std::optional<std::string> config_token_text(const nlohmann::json& config, const char* key);

}  // namespace k3
