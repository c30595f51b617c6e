#include "common/tokenizer/tokenizer_config.h"

namespace k3 {

std::optional<std::string> config_token_text(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace k3
