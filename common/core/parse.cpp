#include "common/core/parse.h"

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

}  // namespace k3
