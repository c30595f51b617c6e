#include "router/request_id.h"

#include <cstdio>
#include <random>

#include "router/api_error.h"

namespace k3::router {

std::string new_request_id() {
  thread_local std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "req-%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

std::string request_id_for(const HttpRequest& rq) {
  auto it = rq.headers.find("x-request-id");
  if (it == rq.headers.end()) return new_request_id();
  const std::string& id = it->second;
  if (id.empty() || id.size() > kMaxRequestIdLength)
    throw ApiError(400, "X-Request-Id must be 1 to " + std::to_string(kMaxRequestIdLength) + " characters (got " +
                            std::to_string(id.size()) + ")", "X-Request-Id", "invalid_request_id");
  for (char c : id)
    if (c < 0x21 || c > 0x7e)
      throw ApiError(400, "X-Request-Id may hold printable ASCII only (no spaces or control characters)", "X-Request-Id",
                     "invalid_request_id");
  return id;
}

}  // namespace k3::router
