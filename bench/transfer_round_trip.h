// The fixed cost of one request's protocol round trip through the real transfer drivers, the third part
// of `k3-bench transfer`: COMPUTE_DONE -> ADDRS -> puts (tiny model) + flush -> TRANSFER_DONE -> decode
// ready -> TOKENS, with the decode instance in a forked child process.
#pragma once
#include <vector>

#include "common/core/status.h"

namespace k3::bench {

// COMPUTE_DONE -> TOKENS of `iters` requests (after 10 untimed warm-up ones), in microseconds, sorted.
// Forks its decode child: call it before this process makes threads or a CUDA context.
Result<std::vector<double>> protocol_round_trip(int iters);

}  // namespace k3::bench
