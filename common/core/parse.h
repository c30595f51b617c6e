// Parsing of small command-line values shared by the tools and node binaries.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3 {

// "1,2,3" -> {1, 2, 3}. Each item must be a non-negative 32-bit integer; errors name `what` (e.g. the
// flag) and the bad item. An empty text gives an empty list unless `allow_empty` is false.
Result<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& what, bool allow_empty = true);

}  // namespace k3
