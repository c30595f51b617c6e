// A thread-safe registry of counters and gauges, passed around as an object (no globals), with a
// Prometheus text exposition. Names follow Prometheus rules ([a-zA-Z_:][a-zA-Z0-9_:]*); label values
// are escaped on output. Counter/gauge handles are stable references valid for the registry's life, so
// hot paths look a metric up once and then only do an atomic add.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/protocol/messages.h"
#include "common/protocol/request_state.h"

namespace k3::protocol {

using Labels = std::vector<std::pair<std::string, std::string>>;  // kept in the given order

class Counter {
 public:
  void add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }
 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void set(int64_t v) { v_.store(v, std::memory_order_relaxed); }
  void add(int64_t d) { v_.fetch_add(d, std::memory_order_relaxed); }
  int64_t value() const { return v_.load(std::memory_order_relaxed); }
 private:
  std::atomic<int64_t> v_{0};
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Get-or-create. `help` is recorded on first creation of the family. Throws k3::Error for an invalid
  // name, or when a name is reused with the other metric type (programming errors).
  Counter& counter(const std::string& name, const Labels& labels = {}, const std::string& help = "");
  Gauge& gauge(const std::string& name, const Labels& labels = {}, const std::string& help = "");

  // Current value; nullopt-like 0 when absent (tests and the router's /metrics read these).
  uint64_t counter_value(const std::string& name, const Labels& labels = {}) const;
  int64_t gauge_value(const std::string& name, const Labels& labels = {}) const;

  // Prometheus text format 0.0.4: "# HELP", "# TYPE", then one sample line per label set, families
  // sorted by name, samples sorted by label text.
  std::string prometheus_text() const;

 private:
  struct Family;
  Family& family(const std::string& name, bool is_counter, const std::string& help);
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Family>> families_;
};

// The transfer-layer metrics by name, so every role counts the same things the same way.
// All functions are thread-safe; `m` may be nullptr (then they do nothing).
namespace metric {
inline constexpr const char* kBytes = "k3_transfer_bytes_total";
inline constexpr const char* kTransfers = "k3_transfers_total";
inline constexpr const char* kFailures = "k3_request_failures_total";      // label cause
inline constexpr const char* kTransitions = "k3_request_transitions_total"; // labels from,to
inline constexpr const char* kRejectedFrames = "k3_rejected_frames_total";
inline constexpr const char* kActiveRequests = "k3_active_requests";        // gauge
inline constexpr const char* kPoolFreeBytes = "k3_pool_free_bytes";         // gauge, label rank
inline constexpr const char* kRegionBytes = "k3_transfer_region_bytes";     // gauge, labels region,memory
inline constexpr const char* kSourceBytes = "k3_transfer_source_bytes_total"; // label memory
inline constexpr const char* kPlannedPuts = "k3_transfer_planned_puts_total";
inline constexpr const char* kGatheredPuts = "k3_transfer_gathered_puts_total";
// gauge, label backend: 1 where the node's kernels are batch-invariant (--kernels invariant; the cpu
// backend always), 0 under --kernels fast. Set once at start by k3-prefill and k3-decode.
inline constexpr const char* kKernelsInvariant = "k3_kernels_invariant";
inline void report_kernels(MetricsRegistry& m, const std::string& backend, bool invariant) {
  m.gauge(kKernelsInvariant, {{"backend", backend}}, "1: batch-invariant kernels, 0: --kernels fast").set(invariant ? 1 : 0);
}

void count_bytes(MetricsRegistry* m, uint64_t bytes);
void count_transfer(MetricsRegistry* m);
void count_failure(MetricsRegistry* m, AbortReason cause);
void count_transition(MetricsRegistry* m, RequestState from, RequestState to);
void count_rejected_frame(MetricsRegistry* m);
void set_active_requests(MetricsRegistry* m, int64_t n);
void set_pool_free_bytes(MetricsRegistry* m, uint32_t rank, uint64_t bytes);
// A registered region peers write into, with where it lives (memory "host" or "cuda").
void set_region_bytes(MetricsRegistry* m, uint32_t region, const std::string& memory, uint64_t bytes);
// Bytes a prefill stage posted for writing, by where their source lives (memory "host" or "cuda").
void count_source_bytes(MetricsRegistry* m, const std::string& memory, uint64_t bytes);
// A write list gathered through a staging image: the puts the plan had and the puts that went instead.
void count_gathered_puts(MetricsRegistry* m, uint64_t planned, uint64_t posted);
}  // namespace metric

}  // namespace k3::protocol
