// The prefix caches that prefill stages report with their heartbeats: stage 0's block hashes are what
// KV-aware placement scores a prefill instance by (deepest_cached_pair); every stage's counters go on
// the router's /metrics labelled by node (k3_prefill_prefix_cache_*), and the instances' stage-0 sums
// are the cluster's k3_prefix_cache_* (the families the local engine reports too). The worker thread updates and reads the hashes;
// prometheus_text() may run on any thread.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "common/protocol/messages.h"

namespace k3::router {

class PrefillCacheReports {
 public:
  // A prefill stage's heartbeat (`node`: its control name prefill/<instance>/<stage>).
  void update(const std::string& node, const protocol::Heartbeat& hb);
  // A node went down: its report no longer describes anything placement could use.
  void forget(const std::string& node);
  // The hashes `node` reported (null when none or its cache is off); valid until the next update or
  // forget on the calling (worker) thread. `block_tokens` gets their block size.
  const std::set<uint64_t>* blocks(const std::string& node, int& block_tokens) const;
  std::string prometheus_text() const;
  // Counters summed over every instance's stage 0 (each request is looked up once per instance).
  protocol::PrefixCacheReport instance_totals() const;

 private:
  struct Entry {
    protocol::PrefixCacheReport report;   // without its hashes (they are in `blocks`)
    std::set<uint64_t> blocks;
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry> by_node_;
};

}  // namespace k3::router
