// The prefill:decode sizing behind `k3-plan ratio` (docs/DEPLOY.md "Choosing P:D"): from capacity
// profiles of one prefill instance and one decode rank, an SLA and a workload, how many of each to run,
// the goodput that gives, and which constraint binds.
//
// Model. Prefill: a request of L effective input tokens (input x (1 - prefix hit rate)) takes S(L)
// seconds alone on an instance (profile, interpolated linearly); arrivals spread evenly over P
// instances make each an M/D/1 queue, so TTFT = S + rho S / (2 (1 - rho)) with rho = lambda S / P; the
// TTFT SLA then allows rho <= 2 (T - S) / (2 T - S). Decode: at batch b a rank's inter-token latency is
// ITL(b) (profile); the largest b with ITL(b) <= the ITL SLA and b <= the rank's request capacity
// serves b / (output x ITL(b)) requests per second (Little's law). Goodput = the offered rate, capped
// by each side's SLA-respecting capacity.
//
// Shared compute. A profile is measured with one busy process at a time, which had `cores_per_process`
// cores (its CPU share while measured). When the P + D processes share C cores (several processes per
// host) of which they get a fraction f of the time (f < 1 on a host with other work), each busy thread
// gets f x min(1, C / busy threads) of a core, so service times scale by cores_per_process / the cores
// a busy process gets. A busy prefill instance shares with itself and the others busy at that moment
// (busy fractions taken as independent: 1 + the others' sum). How busy they are depends on the load
// they serve (a prefill instance rate x S / P; a decode rank with n requests in flight on average is
// busy 1 - e^-n of the time), and that on the speed, so the speed is the fixed point of the two. With
// nothing shared (cores = 0, or at least threads x (P + D) cores, f = 1 and a profile measured with a
// whole core per thread) the speed is the profiled one and the model is the one above.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3::deploy {

struct CapacityProfile {
  struct PrefillPoint {
    double input_tokens = 0;
    double seconds = 0;  // one request alone on one instance
  };
  struct DecodePoint {
    double batch = 0;
    double itl_seconds = 0;  // one decode step of a rank running `batch` requests
  };
  std::vector<PrefillPoint> prefill;  // ascending input_tokens
  std::vector<DecodePoint> decode;    // ascending batch
  int decode_max_requests = 0;        // what fits in a rank's KV/state pools (k3-plan memory)
  double threads_per_process = 1;     // compute threads a node process runs
  double cores_per_process = 1;       // cores a busy node process had while the profile was measured
};

// {"prefill": [{"input_tokens": 128, "seconds": 0.05}, ...], "decode": [{"batch": 1, "itl_ms": 12}, ...],
//  "decode_max_requests": 8, "threads_per_process": 1, "cores_per_process": 1}; the last two are optional
// (default 1, and cores = threads); errors name the field.
Result<CapacityProfile> parse_capacity_profile(const nlohmann::json& j);

struct RatioWorkload {
  double rate = 0;           // requests per second
  double input_tokens = 0;
  double output_tokens = 0;
  double prefix_hit = 0;     // share of input tokens found in the prefix cache, [0, 1)
  double ttft_seconds = 0;   // SLA
  double itl_seconds = 0;    // SLA
};

// The compute the deployment's node processes share. cores = 0: each process has its own (one GPU each,
// or dedicated cores), so the profile holds as measured.
struct SharedCompute {
  double cores = 0;  // cores all P + D node processes share
  double share = 1;  // fraction of each core's time they get (1: the host runs nothing else)
};

struct RatioPrediction {
  int prefill = 0, decode = 0;
  double prefill_seconds = 0;        // S at the effective input length
  double prefill_capacity = 0;       // requests/s the P instances serve within the TTFT SLA
  double decode_batch = 0;           // requests a rank runs at once
  double decode_capacity = 0;        // requests/s the D ranks serve within the ITL SLA
  double goodput = 0;                // requests/s served within the SLA
  double ttft_seconds = 0;           // predicted at min(rate, capacity)
  double compute_speed = 1;          // a busy process's speed relative to the profile (1: nothing shared)
  double busy_processes = 0;         // node processes busy on average at the predicted goodput
  std::string binding;               // "offered load", "prefill TTFT", "decode ITL", "decode KV capacity",
                                     // or why nothing meets the SLA; prefixed by "compute sharing" when
                                     // the shared cores are what holds goodput below the rate
};

// The prediction for a given P and D.
Result<RatioPrediction> predict_ratio(const CapacityProfile& profile, const RatioWorkload& w, int prefill, int decode,
                                      const SharedCompute& compute = {});

// The smallest P and D that serve the whole rate within the SLA (total = 0), or the split of `total`
// processes with the best predicted goodput (ties: the most SLA-respecting capacity on the weaker side,
// i.e. the most headroom for a higher rate).
// With shared compute and no total, the smallest total whose best split serves the whole rate (more
// processes than cores add no compute), else the best goodput found up to 64 processes.
Result<RatioPrediction> recommend_ratio(const CapacityProfile& profile, const RatioWorkload& w, int total = 0,
                                        const SharedCompute& compute = {});

nlohmann::json ratio_prediction_json(const RatioPrediction& p);

}  // namespace k3::deploy
