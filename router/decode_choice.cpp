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

int pair_with_least_loaded_decode(const std::vector<ClusterPair>& pairs, const std::vector<int>& fitting,
                                  const std::string& prefill, const CapacityLedger& ledger,
                                  const std::map<std::string, protocol::Heartbeat>& heartbeats, size_t& cursor) {
  std::vector<int> candidates;
  std::vector<DecodeLoad> loads;
  for (int i : fitting) {
    const ClusterPair& p = pairs[i];
    if (p.prefill_instance != prefill) continue;
    const std::string rank = decode_control_name(p);
    const DecodeCapacity cap = ledger.capacity(rank).value_or(DecodeCapacity{});
    const CapacityLedger::Used used = ledger.used(rank);
    DecodeLoad l{.reserved_requests = used.requests,
                 .free_cache_pages = int64_t(cap.cache_pages) - used.cache_pages,
                 .free_pool_pages = int64_t(cap.pool_pages) - used.pool_pages};
    if (auto hb = heartbeats.find(rank); hb != heartbeats.end()) {
      l.reported_running = hb->second.num_running;
      l.free_cache_pages = std::min<int64_t>(l.free_cache_pages, hb->second.room.cache_free_pages);
      l.free_pool_pages = std::min<int64_t>(l.free_pool_pages, hb->second.room.pool_free_pages);
    }
    candidates.push_back(i);
    loads.push_back(l);
  }
  const int best = least_loaded_decode(loads, cursor++);
  return best < 0 ? -1 : candidates[best];
}

}  // namespace k3::router
