// The process's open-file limit (RLIMIT_NOFILE): every HTTP connection is a descriptor, and the default
// soft limit (often 1024) would cap the router far below its --max-connections.
#pragma once
#include <cstdint>
#include <string>

namespace k3::router {

struct OpenFileLimit {
  uint64_t before = 0;  // soft limit found
  uint64_t soft = 0;    // soft limit now
  uint64_t hard = 0;
  std::string error;    // set when the limit could not be read or raised
};

// When the soft limit is below `wanted`, raises it to the hard limit (all an unprivileged process may).
OpenFileLimit raise_open_file_limit(uint64_t wanted);

// A line for the log when the limit was raised or is still below `wanted`; "" when nothing to say.
std::string describe_open_file_limit(const OpenFileLimit& l, uint64_t wanted);

}  // namespace k3::router
