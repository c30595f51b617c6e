#include "router/decode_choice.h"

#include <algorithm>
#include <tuple>

namespace k3::router {

int least_loaded_decode(const std::vector<DecodeLoad>& candidates, size_t start) {
  const size_t n = candidates.size();
  int best = -1;
  auto key = [](const DecodeLoad& l) {
    // Smaller is better in every position.
    return std::make_tuple(std::max(l.reserved_requests, l.reported_running), -l.free_cache_pages, -l.free_pool_pages);
  };
  for (size_t k = 0; k < n; ++k) {
    const int i = static_cast<int>((start + k) % n);
    if (best < 0 || key(candidates[i]) < key(candidates[best])) best = i;
  }
  return best;
}

}  // namespace k3::router
