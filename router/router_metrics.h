// The router's Prometheus metrics: request counts by endpoint and outcome, TTFT / inter-token /
// end-to-end latency histograms, token counters; queue and engine gauges are read from the service at
// scrape time. Owned by the ApiHandlers object (no globals); thread-safe.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "router/generation_service.h"

namespace k3::router {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends "<name>_bucket{le=..}", "_sum", "_count" lines.
  void render(std::string& out, const std::string& name) const;
  uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> buckets_;  // per bound, non-cumulative; +Inf is count_
  double sum_ = 0;
  uint64_t count_ = 0;
};

class RouterMetrics {
 public:
  RouterMetrics();
  // endpoint: "chat" | "completions" | "models" | "health" | "metrics" | "other"; status: the HTTP status.
  void count_request(const std::string& endpoint, int status);
  // A stream that ended after being accepted: "stop" | "length" | "error" | "cancelled".
  void count_finish(const std::string& outcome);
  void add_tokens(int64_t prompt, int64_t completion);
  Histogram& ttft() { return ttft_; }
  Histogram& itl() { return itl_; }
  Histogram& e2e() { return e2e_; }

  std::string prometheus_text(const ServiceStats& s, bool ready) const;
  uint64_t request_count(const std::string& endpoint, int status) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finishes_;
  std::atomic<int64_t> prompt_tokens_{0}, completion_tokens_{0};
  Histogram ttft_, itl_, e2e_;
};

}  // namespace k3::router
