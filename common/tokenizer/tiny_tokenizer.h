// Writes a small tiktoken-format tokenizer (bytes + a few hundred merges learned from a built-in
// corpus + the Kimi special tokens) for the tiny presets.
#pragma once
#include <string>

#include "common/core/status.h"

namespace k3 {

// Writes <dir>/tiktoken.model and <dir>/tokenizer_config.json; returns the vocab size (specials included).
Result<int> write_tiny_tokenizer(const std::string& dir);

}  // namespace k3
