// A node's Prometheus endpoint (k3-prefill and k3-decode `--metrics-listen HOST:PORT`): GET /metrics
// answers its registry's text, GET /health answers "ok"; anything else is a 404, a method other than GET
// a 405. The router's /metrics shows what the nodes' heartbeats carry (k3_cluster_node_*); this shows
// everything the node counts (transfer bytes and latencies, pools, source arena, prefix cache), scraped
// where it runs.
//
// Small on purpose: one thread sleeping in poll(), one request per connection (Connection: close, which
// scrapers handle), a request header of at most 8 KiB that must arrive within 5 s, so a stuck or hostile
// client holds the thread for at most that long. Read-only, and no label carries request content, so no
// key: bind it where only the scraper reaches it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "common/core/status.h"
#include "common/protocol/metrics.h"

namespace k3::protocol {

struct ListenAddress {
  std::string host;   // an IPv4 address (0.0.0.0: every interface)
  uint16_t port = 0;  // 0: a free one
};

// "HOST:PORT" (PORT 0..65535). Errors name `what` and the text.
Result<ListenAddress> parse_listen_address(const std::string& text, const std::string& what);

class MetricsEndpoint {
 public:
  // Binds and starts serving `registry` (which must outlive the endpoint). Errors name the address.
  static Result<std::unique_ptr<MetricsEndpoint>> start(const ListenAddress& at, const MetricsRegistry& registry);
  ~MetricsEndpoint();   // stops serving and joins
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  uint16_t port() const { return port_; }   // the bound one
  // "http://HOST:PORT/metrics", what a node prints so its supervisor (or a person) can find it.
  std::string url() const;

 private:
  MetricsEndpoint(int listen_fd, int wake_fd, std::string host, uint16_t port, const MetricsRegistry& registry)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), host_(std::move(host)), port_(port), registry_(registry) {}
  void loop();
  void serve_one(int fd) const;

  int listen_fd_;
  int wake_fd_;   // an eventfd: written once to stop the loop
  std::string host_;
  uint16_t port_;
  const MetricsRegistry& registry_;
  std::thread thread_;
};

}  // namespace k3::protocol
