// HTTP/1.1 server with keep-alive over Boost.Beast; the only file that includes Beast (pimpl), so the
// rest of the router compiles fast and is tested without sockets. One thread per connection, each with
// its own io_context so reads and writes have deadlines while the code stays sequential; a blocking
// SSE generator runs on that thread between writes.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/core/status.h"
#include "router/http_types.h"

namespace k3::router {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                                   // 0: the OS picks a free port
  size_t max_body_bytes = 4 << 20;                     // larger bodies get 413 without being buffered
  size_t max_header_bytes = 16 << 10;
  int max_connections = 256;                           // beyond: 503 and close
  std::chrono::seconds idle_timeout{60};               // keep-alive wait for the next request
  std::chrono::seconds io_timeout{30};                 // one request body read / one response write
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> start(const HttpServerOptions& opts, HttpHandler handler);
  ~HttpServer();  // stop()
  uint16_t port() const;
  // Stops accepting, lets each connection finish its current response, then closes what remains
  // after `grace`; joins every thread.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  int open_connections() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::router
