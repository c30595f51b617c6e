// Which (prefill instance, decode rank) pair serves a request: the pair type with its control-plane
// names, the parsers of the router's --pair / --placement flags and the placement policy (pure,
// unit-tested without any node).
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3::router {

// One (prefill instance, decode rank) pair: the prefill stages were started with the decode
// process's endpoint, so the pairing is part of the deployment and given to the router.
struct ClusterPair {
  std::string prefill_instance;  // control names prefill/<instance>/<stage>
  uint32_t stages = 1;
  std::string decode_instance;   // control name decode/<instance>
  uint32_t decode_rank = 0;      // the rank that decode process serves (k3-decode --rank)
  uint32_t dcp = 1;              // a DCP decode group: its ranks decode_rank .. decode_rank + dcp - 1
  bool operator==(const ClusterPair&) const = default;
};
// The pairs a router serves: any prefill instance may appear with several decode targets and any decode
// target with several prefill instances (each combination listed is one the router may place on), but
// an instance must be described the same way everywhere (stages; rank and DCP), and no pair twice.
Status check_pairs(const std::vector<ClusterPair>& pairs);
// Parses "PREFILL:STAGES:DECODE:RANK[:DCP]", e.g. "p:2:d:0" or "p:2:d-0:0:8" (a DCP8 group whose leader
// is decode/d-0); errors name the bad part.
Result<ClusterPair> parse_cluster_pair(const std::string& text);
// The ranks a request placed on the pair is written to (CLAIM / PREFILL decode_ranks, in DCP order).
std::vector<uint32_t> decode_group_ranks(const ClusterPair& p);

enum class Placement { RoundRobin, LeastLoaded, PrefixAffinity };
Result<Placement> parse_placement(const std::string& name);  // round-robin | least-loaded | prefix-affinity
const char* placement_name(Placement p);

// Control-plane names of a pair's parties: decode/<instance> and prefill/<instance>/<stage>.
std::string decode_control_name(const ClusterPair& p);
std::string stage_control_name(const ClusterPair& p, uint32_t stage);
std::vector<std::string> pair_control_names(const ClusterPair& p);  // decode first, then the stages

// The pairs of `fitting` (indices into `pairs`) whose prefill instance is not in `failed`, or all of
// `fitting` when none is left: a retry goes to another prefill instance when it can, since the one that
// failed the request may not be declared down yet.
std::vector<int> prefer_other_prefill(const std::vector<int>& fitting, const std::vector<ClusterPair>& pairs,
                                      const std::set<std::string>& failed);

// Which pair the policy picks among `ready` (indices into the pair list); pure, for tests.
struct PairLoad {
  int64_t in_flight = 0;        // requests this router has on the pair's decode
  int64_t reported_running = 0; // decode's last HEARTBEAT num_running (0 when none came)
  // The pair's prefill prefix cache, as reported (null: nothing reported): prefix_block_hashes of the
  // prefixes it can resume from, in blocks of cached_block_tokens.
  const std::set<uint64_t>* cached_blocks = nullptr;
  int cached_block_tokens = 0;
};
// Prefix-affinity with reports: the ready pair whose cache resumes the prompt deepest (ties: least
// loaded); -1 when no pair's report covers even the prompt's first block.
int deepest_cached_pair(const std::vector<int>& ready, const std::vector<PairLoad>& load,
                        const std::vector<int32_t>& prompt);
class PlacementPolicy {
 public:
  PlacementPolicy(Placement p, int affinity_tokens) : p_(p), affinity_tokens_(affinity_tokens) {}
  // -1 when `ready` is empty.
  int pick(const std::vector<int>& ready, const std::vector<PairLoad>& load, const std::vector<int32_t>& prompt);

 private:
  Placement p_;
  int affinity_tokens_;
  uint64_t next_ = 0;                     // round-robin cursor
  std::map<uint64_t, int> sticky_;        // prefix hash -> pair that served it
};

}  // namespace k3::router
