// Counters of the HTTP server's connections for /metrics: open connections, accepted ones, and the
// connections the server refused or closed on its own, by reason. Lock-free; written by the server's
// I/O threads, rendered by the /metrics handler.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace k3::router {

// Why the server refused a new connection or closed an open one.
enum class CloseReason {
  PerClientLimit,  // the client (source address) had --max-connections-per-client open
  GlobalLimit,     // --max-connections were open
  FdLimit,         // the process ran out of file descriptors
  HeaderTimeout,   // request header not complete within --header-timeout-ms
  BodyTimeout,     // request body not complete within --body-timeout-ms
  IdleTimeout,     // keep-alive connection without a new request within --idle-timeout-ms
  WriteTimeout,    // the client did not take a response write within --write-timeout-ms
};
inline constexpr int kCloseReasons = 7;
const char* close_reason_label(CloseReason r);

class ConnectionMetrics {
 public:
  void count_accepted() { accepted_.fetch_add(1, std::memory_order_relaxed); }
  void count_refused(CloseReason r) { refused_[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed); }
  void count_closed(CloseReason r) { closed_[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed); }
  void set_open(int64_t n) { open_.store(n, std::memory_order_relaxed); }

  int64_t open() const { return open_.load(std::memory_order_relaxed); }
  uint64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  uint64_t refused(CloseReason r) const { return refused_[static_cast<int>(r)].load(std::memory_order_relaxed); }
  uint64_t closed(CloseReason r) const { return closed_[static_cast<int>(r)].load(std::memory_order_relaxed); }

  // k3_router_open_connections, k3_router_connections_accepted_total,
  // k3_router_connections_refused_total{reason}, k3_router_connections_closed_total{reason}.
  std::string prometheus_text() const;

 private:
  std::atomic<int64_t> open_{0};
  std::atomic<uint64_t> accepted_{0};
  std::array<std::atomic<uint64_t>, kCloseReasons> refused_{}, closed_{};
};

}  // namespace k3::router
