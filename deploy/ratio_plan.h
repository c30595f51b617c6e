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
};

// {"prefill": [{"input_tokens": 128, "seconds": 0.05}, ...], "decode": [{"batch": 1, "itl_ms": 12}, ...],
//  "decode_max_requests": 8}; errors name the field.
Result<CapacityProfile> parse_capacity_profile(const nlohmann::json& j);

struct RatioWorkload {
  double rate = 0;           // requests per second
  double input_tokens = 0;
  double output_tokens = 0;
  double prefix_hit = 0;     // share of input tokens found in the prefix cache, [0, 1)
  double ttft_seconds = 0;   // SLA
  double itl_seconds = 0;    // SLA
};

struct RatioPrediction {
  int prefill = 0, decode = 0;
  double prefill_seconds = 0;        // S at the effective input length
  double prefill_capacity = 0;       // requests/s the P instances serve within the TTFT SLA
  double decode_batch = 0;           // requests a rank runs at once
  double decode_capacity = 0;        // requests/s the D ranks serve within the ITL SLA
  double goodput = 0;                // requests/s served within the SLA
  double ttft_seconds = 0;           // predicted at min(rate, capacity)
  std::string binding;               // "offered load", "prefill TTFT", "decode ITL", "decode KV capacity",
                                     // or why nothing meets the SLA
};

// The prediction for a given P and D.
Result<RatioPrediction> predict_ratio(const CapacityProfile& profile, const RatioWorkload& w, int prefill, int decode);

// The smallest P and D that serve the whole rate within the SLA (total = 0), or the split of `total`
// processes with the best predicted goodput (ties: the most SLA-respecting capacity on the weaker side,
// i.e. the most headroom for a higher rate).
Result<RatioPrediction> recommend_ratio(const CapacityProfile& profile, const RatioWorkload& w, int total = 0);

nlohmann::json ratio_prediction_json(const RatioPrediction& p);

}  // namespace k3::deploy
