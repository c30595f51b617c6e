// A tiny blocking HTTP/1.0 GET for the launcher's readiness checks (no keep-alive, no TLS).
#pragma once
#include <chrono>
#include <string>

#include "common/core/status.h"

namespace k3::deploy {

struct ProbeReply {
  int status = 0;
  std::string body;
};

// GET http://host:port<path>; Unavailable when nothing answers within `timeout`.
Result<ProbeReply> http_get(const std::string& host, int port, const std::string& path, std::chrono::milliseconds timeout);

}  // namespace k3::deploy
