// Latency samples → p50/p90/p99/mean, for the serving bench's report.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace k3::bench {

struct LatencySummary {
  size_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// Nearest-rank percentiles (p in (0, 100]): the smallest sample with at least p% of samples at or below it,
// so p99 of few samples is the max rather than an interpolated value no request saw.
inline double nearest_rank(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

inline LatencySummary summarize(std::vector<double> samples) {
  LatencySummary s;
  s.count = samples.size();
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  double sum = 0;
  for (double v : samples) sum += v;
  s.mean = sum / static_cast<double>(samples.size());
  s.p50 = nearest_rank(samples, 50);
  s.p90 = nearest_rank(samples, 90);
  s.p99 = nearest_rank(samples, 99);
  s.max = samples.back();
  return s;
}

}  // namespace k3::bench
