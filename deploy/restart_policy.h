// When k3-cluster starts a dead node again (spec "restart", see cluster_spec.h), as pure bookkeeping
// on durations so it is tested without processes or clocks.
//
// Each crash of a node waits a backoff before the next start: initial_backoff_ms, doubling per
// consecutive crash up to max_backoff_ms. A node that ran for stable_ms is healthy again (its
// consecutive count and backoff start over). A node that crashes more than max_restarts times in a row
// (each time within stable_ms of its start) is crash-looping: it is given up as failed and the cluster
// serves with what is left.
#pragma once
#include <chrono>
#include <optional>

namespace k3::deploy {

struct RestartPolicy {
  bool enabled = true;
  int initial_backoff_ms = 200;
  int max_backoff_ms = 10000;
  int stable_ms = 30000;
  int max_restarts = 5;
};

class RestartBackoff {
 public:
  explicit RestartBackoff(const RestartPolicy& policy) : policy_(policy) {}
  // The node exited after running for `lived`. Returns the wait before it is started again, or
  // nullopt when it must not be (restarts disabled, or the crash-loop limit is reached).
  std::optional<std::chrono::milliseconds> on_exit(std::chrono::milliseconds lived);
  // Crashes in a row without a stable run in between.
  int consecutive() const { return consecutive_; }

 private:
  RestartPolicy policy_;
  int consecutive_ = 0;
};

}  // namespace k3::deploy
