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

// "5GB", "500MB", "64KiB", "123" (bytes). Decimal units (KB, MB, GB, TB) are powers of 1000 as in
// Hugging Face's max_shard_size; KiB, MiB, GiB, TiB are powers of 1024. Case-insensitive, no sign,
// must be > 0 and fit in 64 bits. Errors name `what` (e.g. the flag) and the bad text.
Result<uint64_t> parse_byte_size(const std::string& text, const std::string& what);

}  // namespace k3
