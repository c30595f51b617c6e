// The cluster spec k3-cluster reads (JSON), validated at load with errors that name the field:
//
// {
//   "model": "models/k3-tiny",          model dir (relative paths: to the current directory)
//   "generate": {"preset": "k3-tiny", "seed": 0},   how to make the model when the dir is missing
//   "router": {"host": "127.0.0.1", "port": 8000, "placement": "round-robin", "affinity_tokens": 16, "served_model_name": "",
//              "api_key": "..."},        optional; see resolve_api_key for --api-key / K3_API_KEY
//   "prefill": [{"id": "p", "stages": 2, "partition": [2, 2], "chunk_size": 256, "max_requests": 8,
//                "stream": true, "max_inflight_chunks": 4,     k3-prefill --no-stream / --max-inflight-chunks
//                "cache_region_mib": 0,         k3-prefill --cache-region-mib (0: room for every slot and page)
//                "source_arena_mib": 1024,      k3-prefill --source-arena-mib (absent: its default; 0: none)
//                "prefix_cache": {"slots": 8, "block_tokens": 64, "checkpoint_every": 1, "budget_mb": 0}}],
//                                        prefix_cache: optional, off without it (k3-prefill --prefix-* flags)
//   "decode": [{"id": "d", "ranks": 1, "max_requests": 8}],
//                                        a rank group per DP rank (docs/RANKS.md): {"id": "d", "dp": 2, "dcp": 8}
//                                        or {"dp": 2, "ep": 4} ("dp" is "ranks"), optional "kv_partitions"
//                                        (DCP; default dcp), "step_deadline_ms" (default 2000), "collectives":
//                                        "ucx" (default: host memory; the ranks of a group share its GPU) or
//                                        "nccl" (backend cuda, one GPU per rank: rank i on gpu + i), and "gpu":
//                                        the CUDA device of each DP rank's first process (default 0)
//   "network": {"bind_host": "127.0.0.1", "advertise_host": ""},
//                                        every node's control/activation sockets bind bind_host (0.0.0.0: every
//                                        interface) and are announced to peers at advertise_host (default
//                                        bind_host), which is also the UCX data plane's interface
//   "threads": 1,                        CPU threads per node process (0 = all cores)
//   "backend": "cpu",                    node compute backend: "cpu" (fp32) or "cuda" (bf16, GPU 0);
//                                        every node uses the same one (the cache bytes must agree)
//   "kernels": "invariant",              cuda kernels: "invariant" (a request's tokens depend neither on its
//                                        batch nor on its prompt's cuts at multiples of 64: k3-generate's
//                                        tokens) or "fast" (about 1.25x the prefill and 1.2x the large-batch
//                                        decode speed; tokens may change with the batch)
//   "timeouts": {"heartbeat_ms": 200, "heartbeat_misses": 3, "claim_ms": 5000, "startup_s": 180,
//                "shutdown_ms": 5000},
//   "restart": {"enabled": true, "initial_backoff_ms": 200, "max_backoff_ms": 10000, "stable_ms": 30000,
//               "max_restarts": 5}      how dead nodes are started again (restart_policy.h)
// }
// Only "model", "prefill" and "decode" are required. Decode processes are numbered by global rank over
// the "decode" list; every prefill instance can feed every decode process (the router chooses the decode
// target of each request), so any number of each serves.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "deploy/restart_policy.h"

namespace k3::deploy {

struct PrefillSpec {
  std::string id;
  int stages = 1;
  std::vector<int> partition;  // empty: the even split (k3-prefill's default)
  int chunk_size = 256;
  int max_requests = 8;
  bool stream = true;              // write each chunk's KV while the next computes (false: --no-stream)
  int max_inflight_chunks = 4;     // streaming: write batches in flight before compute waits
  int prefix_slots = 0;            // prefix cache checkpoint slots (0: off)
  int prefix_block_tokens = 64;
  int prefix_checkpoint_every = 1;
  int prefix_budget_mb = 0;
  double cache_region_mib = 0;     // the stages' unified cache region in MiB (0: every slot and page at once)
  double source_arena_mib = -1;    // the stages' source arena in MiB (-1: k3-prefill's default; 0: none)
};
// The k3-prefill flags of an instance's prefix cache (none when it is off); every stage gets the same.
std::vector<std::string> prefix_cache_args(const PrefillSpec& p);
// The k3-prefill flags sizing the stages' memory: the cache region (none at 0, the full size) and the
// source arena (none when the spec leaves k3-prefill's default).
std::vector<std::string> prefill_memory_args(const PrefillSpec& p);
// The k3-prefill flags of an instance's transfer streaming (--no-stream or --max-inflight-chunks N).
std::vector<std::string> stream_args(const PrefillSpec& p);

struct DecodeSpec {
  std::string id;
  int ranks = 1;           // DP ranks ("ranks" or "dp")
  int max_requests = 8;
  int dcp = 1;             // rank processes per DP rank sharing each request's context
  int ep = 1;              // rank processes per DP rank sharing the routed experts
  int kv_partitions = 0;   // DCP: MLA partials merged per request (0: dcp)
  int step_deadline_ms = 2000;
  std::string collectives = "ucx";  // a group's forward: "ucx" | "nccl" (k3-decode --group-collectives)
  int gpu = 0;             // CUDA device of each DP rank's first process (DecodeProcess::device_of)
};

struct ClusterSpec {
  std::string model;
  std::string preset = "k3-tiny";
  uint64_t seed = 0;
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = pick a free one
  std::string placement = "round-robin";
  int affinity_tokens = 0;         // prefix-affinity: leading prompt tokens of the sticky hash (0: the router's default)
  std::string served_model_name;
  std::string api_key;  // empty: /v1 is open. A secret: never logged, never on a command line.
  std::vector<PrefillSpec> prefill;
  std::vector<DecodeSpec> decode;
  int threads = 1;
  std::string backend = "cpu";  // "cpu" | "cuda": passed to every k3-prefill / k3-decode as --backend
  std::string kernels = "invariant";  // "invariant" | "fast": every node's --kernels (passed when "fast")
  std::string bind_host = "127.0.0.1";  // what node sockets bind (network.bind_host)
  std::string advertise_host;           // what peers are told (network.advertise_host); empty: bind_host
  // The address peers reach nodes at, which is also the UCX interface.
  const std::string& reachable_host() const { return advertise_host.empty() ? bind_host : advertise_host; }
  int heartbeat_ms = 200;
  int heartbeat_misses = 3;
  int claim_ms = 5000;
  int startup_s = 180;
  int shutdown_ms = 5000;
  RestartPolicy restart;
};

// One decode DP rank as the launcher starts it: one process, or a rank group of group_size() processes
// (the leader decode/<instance>, members decode/<instance>/<i>).
struct DecodeProcess {
  std::string instance;  // control name decode/<instance>
  uint32_t rank = 0;     // global rank of the leader; a DCP group's ranks are rank .. rank + dcp - 1
  int max_requests = 8;
  int dcp = 1, ep = 1, kv_partitions = 0, step_deadline_ms = 2000;
  std::string collectives = "ucx";
  int gpu = 0;  // --device of the group's rank 0
  int group_size() const { return dcp * ep; }
  // Whether k3-decode runs the rank-sliced forward: a group of several processes, or one process with
  // kv_partitions > 1 (what a DCP group of that size computes, on one rank).
  bool rank_sliced() const { return group_size() > 1 || kv_partitions > 1; }
  // The CUDA device of rank i: NCCL moves data between GPUs, one per rank (gpu + i); over UCX the ranks
  // share the group's GPU.
  int device_of(int i) const { return collectives == "nccl" ? gpu + i : gpu; }
};
// The decode DP ranks of a spec, in rank order ("<id>" for one rank, "<id>-<r>" for several); global
// ranks advance by each group's size.
std::vector<DecodeProcess> decode_processes(const ClusterSpec& spec);
// k3-decode's rank group flags of a decode DP rank, which its leader and every member get alike (none
// for a single process of the monolithic engine; a single process with kv_partitions > 1 is a DCP group
// of one).
std::vector<std::string> group_args(const DecodeProcess& d);
// The --kernels flag every k3-prefill / k3-decode of the spec gets: none for the default, invariant (so
// command lines stay as they were), else {"--kernels", kernels}.
std::vector<std::string> kernels_flags(const ClusterSpec& spec);

Result<ClusterSpec> parse_cluster_spec(const nlohmann::json& j);
Result<ClusterSpec> load_cluster_spec(const std::string& path);
// An API key is non-empty printable ASCII without leading/trailing spaces. The error names `source`
// (e.g. "spec: router.api_key", "--api-key", "K3_API_KEY") and never the key itself.
Status check_api_key(const std::string& key, const std::string& source);
// The router's API key by precedence: the spec's router.api_key, else --api-key (`flag`), else the
// environment variable K3_API_KEY (`env`, null when unset); empty when none is given (/v1 open).
Result<std::string> resolve_api_key(const ClusterSpec& spec, const std::string& flag, const char* env);

// Checks what needs the model: each partition sums to `num_layers`.
Status check_against_model(const ClusterSpec& spec, int num_layers);

}  // namespace k3::deploy
