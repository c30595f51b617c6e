// Which decode target (a decode rank, or a rank group's leader) serves a request, chosen on its own
// once the request's prefill instance is known: every prefill instance can feed every decode target,
// so the choice is by the decode targets' load alone. Pure, unit-tested without any node.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/protocol/messages.h"
#include "router/admission_queue.h"
#include "router/cluster_placement.h"

namespace k3::router {

// One decode target's load as the router knows it when it places a request.
struct DecodeLoad {
  int64_t reserved_requests = 0;  // requests this router placed there and that have not ended
  int64_t reported_running = 0;   // requests decoding there, from its last HEARTBEAT
  int64_t free_cache_pages = 0;   // decode cache pages neither reserved here nor reported in use
  int64_t free_pool_pages = 0;    // transfer pool pages likewise
};

// The index into `candidates` of the least-loaded decode target, -1 when `candidates` is empty.
// Least loaded: fewest requests (the larger of what this router reserved there and what it reported
// running: reservations are current, reports count what other routers or retries left there), then
// the most free cache pages, then the most free pool pages. Among equals the first at or after index
// `start` (cyclically) wins: a caller that advances `start` per request spreads a light load over every
// target instead of filling the first.
int least_loaded_decode(const std::vector<DecodeLoad>& candidates, size_t start = 0);

// The router's use of it: among `fitting` (indices into `pairs`, every decode target with room and a
// known capacity), the pair of prefill instance `prefill` whose decode target is least loaded, from the
// ledger's reservations and each target's last heartbeat (free pages: the smaller of the two views).
// `cursor` is the rotation among equals, advanced per call. -1 when `prefill` has no fitting pair.
int pair_with_least_loaded_decode(const std::vector<ClusterPair>& pairs, const std::vector<int>& fitting,
                                  const std::string& prefill, const CapacityLedger& ledger,
                                  const std::map<std::string, protocol::Heartbeat>& heartbeats, size_t& cursor);

}  // namespace k3::router
