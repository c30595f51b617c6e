#include "decode_node/rank_metrics.h"

#include <cmath>

namespace k3::decode {
namespace {

constexpr const char* kCollectiveUs = "k3_rank_collective_microseconds_total";
constexpr const char* kCollectiveHelp = "time in the group's collectives, by kind (rank-sliced decode steps)";

// Whole microseconds of the seconds between two running totals (totals only grow).
uint64_t micros(double now, double before) { return static_cast<uint64_t>(std::llround(std::max(0.0, now - before) * 1e6)); }

}  // namespace

RankMetrics::RankMetrics(protocol::MetricsRegistry& m)
    : steps_(m.counter("k3_rank_steps_total", {}, "rank-sliced decode steps this rank ran")),
      step_us_(m.counter("k3_rank_step_microseconds_total", {}, "time in those steps, collectives included")),
      gather_us_(m.counter(kCollectiveUs, {{"op", "all_gather"}}, kCollectiveHelp)),
      a2a_us_(m.counter(kCollectiveUs, {{"op", "all_to_all"}}, kCollectiveHelp)),
      a2av_us_(m.counter(kCollectiveUs, {{"op", "all_to_allv"}}, kCollectiveHelp)),
      reduce_us_(m.counter(kCollectiveUs, {{"op", "all_reduce"}}, kCollectiveHelp)),
      bytes_(m.counter("k3_rank_collective_bytes_total", {}, "bytes this rank handed the group's collectives")) {}

void RankMetrics::publish(const CollectiveTimes& now) {
  if (now.steps < last_.steps || now.bytes < last_.bytes) last_ = {};  // the totals were reset (a bench's warm-up)
  steps_.add(now.steps - last_.steps);
  step_us_.add(micros(now.step, last_.step));
  gather_us_.add(micros(now.all_gather, last_.all_gather));
  a2a_us_.add(micros(now.all_to_all, last_.all_to_all));
  a2av_us_.add(micros(now.all_to_allv, last_.all_to_allv));
  reduce_us_.add(micros(now.all_reduce, last_.all_reduce));
  bytes_.add(now.bytes - last_.bytes);
  last_ = now;
}

}  // namespace k3::decode
