// HTTP/1.1 server with keep-alive over Boost.Beast; the only file that includes Beast (pimpl), so the
// rest of the router compiles fast and is tested without sockets.
//
// Asynchronous: a few I/O threads serve every connection, so an idle or slow client costs a socket, a
// timer and a few hundred bytes, not a thread. Handlers run as HandlerRunner (handler_runner.h) says:
// on a bounded pool of handler threads, except the cheap `inline_paths`.
//
// Deadlines: a new connection must complete its first request header within header_timeout of being
// accepted; a keep-alive connection may wait idle_timeout for the first byte of its next request,
// then has header_timeout to complete the header; the body has body_timeout after the header; each
// response write (an SSE chunk is one write) has write_timeout. A connection past its deadline is
// closed without an answer. Limits: see ConnectionTable (connection_table.h): at the limit the oldest
// idle connection (no request being answered; per client, else of all) is closed to make room, and
// only when none is idle is the new one refused (429 per-client, 503 global).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "router/connection_metrics.h"
#include "router/http_types.h"

namespace k3::router {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                                   // 0: the OS picks a free port
  size_t max_body_bytes = 4 << 20;                     // larger bodies get 413 without being buffered
  size_t max_header_bytes = 16 << 10;                  // larger headers get 431
  int max_connections = 10000;                         // open connections in all
  int max_connections_per_client = 1024;               // per source address; 0 = no per-client limit
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds idle_timeout{60000};       // keep-alive wait for the next request
  std::chrono::milliseconds write_timeout{30000};      // one response write (one SSE chunk)
  int io_threads = 2;
  int handler_threads = 128;                           // most handlers (requests) running at once
  std::vector<std::string> inline_paths = {"/health", "/metrics"};  // answered on an I/O thread: must not block
  std::shared_ptr<ConnectionMetrics> metrics;          // where connections are counted; the server makes one if null
};

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> start(const HttpServerOptions& opts, HttpHandler handler);
  ~HttpServer();  // stop()
  uint16_t port() const;
  // Stops accepting and closes idle connections at once; busy ones finish their current response
  // (without keep-alive); what remains after `grace` is closed. Joins every thread.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  int open_connections() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::router
