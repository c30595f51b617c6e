// The request id that traces one API request through every process: the client's X-Request-Id when it
// sends one (so its own logs and ours share the id), else a fresh random one. Returned in the response's
// X-Request-Id header, carried in CLAIM and PREFILL, and named by every log line about the request.
#pragma once
#include <string>

#include "router/http_types.h"

namespace k3::router {

inline constexpr size_t kMaxRequestIdLength = 128;

// The id for `rq`. Throws ApiError 400 when the client's X-Request-Id is empty, longer than
// kMaxRequestIdLength or holds anything but printable ASCII without spaces (it goes into log lines).
std::string request_id_for(const HttpRequest& rq);
// "req-" and 32 random hex digits.
std::string new_request_id();

}  // namespace k3::router
