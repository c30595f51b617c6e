// A decode rank's own step and collective times on its /metrics (every rank of a group, leader and
// members: each serves its own endpoint): what the rank-sliced forward spends in whole steps and in each
// kind of collective, and the bytes it handed them. The compute is the steps' time less the collectives';
// a rank whose collectives grow against its peers' waits on a slower one (or on the interconnect).
//   k3_rank_steps_total, k3_rank_step_microseconds_total,
//   k3_rank_collective_microseconds_total{op="all_gather"|"all_to_all"|"all_to_allv"|"all_reduce"},
//   k3_rank_collective_bytes_total
#pragma once
#include "common/protocol/metrics.h"
#include "engine/rank_model.h"

namespace k3::decode {

class RankMetrics {
 public:
  explicit RankMetrics(protocol::MetricsRegistry& m);
  // Adds what `now` (the rank's running totals) holds beyond the totals of the last call.
  void publish(const CollectiveTimes& now);

 private:
  protocol::Counter &steps_, &step_us_, &gather_us_, &a2a_us_, &a2av_us_, &reduce_us_, &bytes_;
  CollectiveTimes last_;
};

}  // namespace k3::decode
