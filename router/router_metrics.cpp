#include "router/router_metrics.h"

#include <cstdio>

namespace k3::router {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), buckets_(bounds_.size(), 0) {}

void Histogram::observe(double v) {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < bounds_.size(); ++i)
    if (v <= bounds_[i]) {
      ++buckets_[i];
      break;
    }
  sum_ += v;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard lk(mu_);
  return count_;
}

static std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void Histogram::render(std::string& out, const std::string& name) const {
  std::lock_guard lk(mu_);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += buckets_[i];
    out += name + "_bucket{le=\"" + fmt(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + fmt(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

static std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

RouterMetrics::RouterMetrics() : ttft_(latency_bounds()), itl_(latency_bounds()), e2e_(latency_bounds()) {}

void RouterMetrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{endpoint, status}];
}

void RouterMetrics::count_finish(const std::string& outcome) {
  std::lock_guard lk(mu_);
  ++finishes_[outcome];
}

void RouterMetrics::add_tokens(int64_t prompt, int64_t completion) {
  prompt_tokens_ += prompt;
  completion_tokens_ += completion;
}

uint64_t RouterMetrics::request_count(const std::string& endpoint, int status) const {
  std::lock_guard lk(mu_);
  auto it = requests_.find({endpoint, status});
  return it == requests_.end() ? 0 : it->second;
}

std::string RouterMetrics::prometheus_text(const ServiceStats& s, bool ready) const {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  family("k3_router_requests_total", "counter", "HTTP requests by endpoint and status code");
  {
    std::lock_guard lk(mu_);
    for (const auto& [key, n] : requests_)
      out += "k3_router_requests_total{endpoint=\"" + key.first + "\",code=\"" + std::to_string(key.second) + "\"} " +
             std::to_string(n) + "\n";
    family("k3_router_request_finish_total", "counter", "accepted generations by how they ended");
    for (const auto& [outcome, n] : finishes_)
      out += "k3_router_request_finish_total{outcome=\"" + outcome + "\"} " + std::to_string(n) + "\n";
  }
  family("k3_router_prompt_tokens_total", "counter", "prompt tokens of accepted requests");
  out += "k3_router_prompt_tokens_total " + std::to_string(prompt_tokens_.load()) + "\n";
  family("k3_router_generation_tokens_total", "counter", "generated tokens");
  out += "k3_router_generation_tokens_total " + std::to_string(completion_tokens_.load()) + "\n";
  family("k3_router_time_to_first_token_seconds", "histogram", "request arrival to first token");
  ttft_.render(out, "k3_router_time_to_first_token_seconds");
  family("k3_router_inter_token_latency_seconds", "histogram", "time between consecutive tokens of a request");
  itl_.render(out, "k3_router_inter_token_latency_seconds");
  family("k3_router_e2e_request_latency_seconds", "histogram", "request arrival to last token");
  e2e_.render(out, "k3_router_e2e_request_latency_seconds");
  family("k3_router_queue_depth", "gauge", "requests waiting for an engine slot");
  out += "k3_router_queue_depth " + std::to_string(s.waiting) + "\n";
  family("k3_router_running_requests", "gauge", "requests holding engine state");
  out += "k3_router_running_requests " + std::to_string(s.running) + "\n";
  family("k3_engine_free_slots", "gauge", "sequence slots free in the engine");
  out += "k3_engine_free_slots " + std::to_string(s.free_slots) + "\n";
  family("k3_engine_free_kv_pages", "gauge", "KV cache pages free in the engine");
  out += "k3_engine_free_kv_pages " + std::to_string(s.free_pages) + "\n";
  family("k3_prefix_cache_lookup_tokens_total", "counter", "prompt tokens looked up in the prefix cache");
  out += "k3_prefix_cache_lookup_tokens_total " + std::to_string(s.prefix_lookup_tokens) + "\n";
  family("k3_prefix_cache_hit_tokens_total", "counter", "prompt tokens restored from the prefix cache (prefill skipped)");
  out += "k3_prefix_cache_hit_tokens_total " + std::to_string(s.prefix_hit_tokens) + "\n";
  family("k3_prefix_cache_checkpoints_stored_total", "counter", "KDA checkpoints the prefix cache took in");
  out += "k3_prefix_cache_checkpoints_stored_total " + std::to_string(s.prefix_checkpoints_stored) + "\n";
  family("k3_prefix_cache_checkpoints_evicted_total", "counter", "KDA checkpoints the prefix cache evicted");
  out += "k3_prefix_cache_checkpoints_evicted_total " + std::to_string(s.prefix_checkpoints_evicted) + "\n";
  family("k3_prefix_cache_bytes", "gauge", "bytes the prefix cache holds (checkpoints + MLA pages)");
  out += "k3_prefix_cache_bytes " + std::to_string(s.prefix_cache_bytes) + "\n";
  // Fragmentation of the unified cache region: 1 - largest free run / free bytes (0: one run).
  const double frag = s.cache_free_bytes == 0 ? 0.0
                                               : 1.0 - double(s.cache_largest_free_extent_bytes) / double(s.cache_free_bytes);
  family("k3_cache_pool_fragmentation", "gauge", "1 - largest free extent / free bytes of the engine's unified cache region (0: one free run)");
  out += "k3_cache_pool_fragmentation " + std::to_string(frag) + "\n";
  family("k3_cache_pool_free_bytes", "gauge", "free bytes of the engine's unified cache region (KDA slots and MLA pages share them)");
  out += "k3_cache_pool_free_bytes " + std::to_string(s.cache_free_bytes) + "\n";
  family("k3_cache_pool_free_extents", "gauge", "runs of adjacent free bytes in the engine's unified cache region");
  out += "k3_cache_pool_free_extents " + std::to_string(s.cache_free_extents) + "\n";
  family("k3_cache_pool_slot_moves_total", "counter", "KDA slots compaction moved to make room for MLA pages");
  out += "k3_cache_pool_slot_moves_total " + std::to_string(s.cache_slot_moves) + "\n";
  family("k3_prompts_prefilled_total", "counter", "prompts prefilled (n choices of one prompt share one prefill)");
  out += "k3_prompts_prefilled_total " + std::to_string(s.prompts_prefilled) + "\n";
  family("k3_router_ready", "gauge", "1 when the generation service accepts requests");
  out += std::string("k3_router_ready ") + (ready ? "1" : "0") + "\n";
  return out;
}

}  // namespace k3::router
