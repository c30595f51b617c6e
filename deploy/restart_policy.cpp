#include "deploy/restart_policy.h"

#include <algorithm>

namespace k3::deploy {

std::optional<std::chrono::milliseconds> RestartBackoff::on_exit(std::chrono::milliseconds lived) {
  if (!policy_.enabled) return std::nullopt;
  if (lived.count() >= policy_.stable_ms) consecutive_ = 0;
  ++consecutive_;
  if (consecutive_ > policy_.max_restarts) return std::nullopt;
  // initial * 2^(n-1), capped; computed in steps so a long crash loop cannot overflow.
  long long delay = policy_.initial_backoff_ms;
  for (int i = 1; i < consecutive_ && delay < policy_.max_backoff_ms; ++i) delay *= 2;
  return std::chrono::milliseconds(std::min<long long>(delay, policy_.max_backoff_ms));
}

}  // namespace k3::deploy
