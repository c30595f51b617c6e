#include "common/core/parse.h"

#include <cctype>
#include <climits>
#include <sstream>

namespace k3 {

Result<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& what, bool allow_empty) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      return invalid_argument(what + ": '" + item + "' is not a token id (a non-negative 32-bit integer)");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty() && !allow_empty) return invalid_argument(what + ": no ids given");
  return ids;
}

Result<uint64_t> parse_byte_size(const std::string& text, const std::string& what) {
  const std::string bad = what + " '" + text + "': ";
  size_t digits = 0;
  uint64_t value = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
    const uint64_t d = static_cast<uint64_t>(text[digits] - '0');
    if (value > (UINT64_MAX - d) / 10) return invalid_argument(bad + "too large");
    value = value * 10 + d;
    ++digits;
  }
  if (digits == 0) return invalid_argument(bad + "expected a size such as 5GB, 500MB or a byte count");
  std::string unit;
  for (size_t i = digits; i < text.size(); ++i) unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},
      {"B", 1},
      {"KB", 1000ull},
      {"MB", 1000ull * 1000},
      {"GB", 1000ull * 1000 * 1000},
      {"TB", 1000ull * 1000 * 1000 * 1000},
      {"KIB", 1ull << 10},
      {"MIB", 1ull << 20},
      {"GIB", 1ull << 30},
      {"TIB", 1ull << 40},
  };
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    if (value == 0) return invalid_argument(bad + "must be greater than 0");
    if (value > UINT64_MAX / scale) return invalid_argument(bad + "too large");
    return value * scale;
  }
  return invalid_argument(bad + "unknown unit '" + text.substr(digits) + "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
}

}  // namespace k3
