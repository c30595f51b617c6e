#include "deploy/ratio_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

namespace k3::deploy {
namespace {

Status bad(const std::string& field, const std::string& what) { return invalid_argument("profile: " + field + ": " + what); }

// Linear interpolation over (x, y) points sorted by x; linear extrapolation past either end (one point:
// y proportional to x when `proportional`, else constant).
double interpolate(const std::vector<std::pair<double, double>>& pts, double x, bool proportional) {
  if (pts.size() == 1) return proportional ? pts[0].second * x / pts[0].first : pts[0].second;
  size_t i = 1;
  while (i + 1 < pts.size() && pts[i].first < x) ++i;
  const auto& [x0, y0] = pts[i - 1];
  const auto& [x1, y1] = pts[i];
  return std::max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0));
}

double prefill_seconds(const CapacityProfile& p, double tokens) {
  std::vector<std::pair<double, double>> pts;
  for (const auto& q : p.prefill) pts.emplace_back(q.input_tokens, q.seconds);
  return interpolate(pts, tokens, true);
}

double itl_at(const CapacityProfile& p, double batch) {
  std::vector<std::pair<double, double>> pts;
  for (const auto& q : p.decode) pts.emplace_back(q.batch, q.itl_seconds);
  return interpolate(pts, batch, false);
}

Status check_workload(const RatioWorkload& w) {
  if (!(w.rate > 0)) return invalid_argument("--rate must be > 0");
  if (!(w.input_tokens >= 1)) return invalid_argument("--input must be >= 1");
  if (!(w.output_tokens >= 1)) return invalid_argument("--output must be >= 1");
  if (!(w.prefix_hit >= 0 && w.prefix_hit < 1)) return invalid_argument("--prefix-hit must be in [0, 1)");
  if (!(w.ttft_seconds > 0)) return invalid_argument("--ttft-ms must be > 0");
  if (!(w.itl_seconds > 0)) return invalid_argument("--itl-ms must be > 0");
  return Status::ok();
}


// Both sides' SLA-respecting capacities when a busy process runs at `speed` times its profiled speed.
struct Sides {
  int prefill = 0, decode = 0;
  double prefill_seconds = 0, prefill_capacity = 0, decode_batch = 0, decode_itl = 0, decode_capacity = 0, goodput = 0,
         output_tokens = 0;
};

Sides sides_at(const CapacityProfile& profile, const RatioWorkload& w, int prefill, int decode, double S_profiled, double speed) {
  Sides r{.prefill = prefill, .decode = decode, .output_tokens = w.output_tokens};
  const double S = S_profiled / speed;
  const double T = w.ttft_seconds;
  r.prefill_seconds = S;
  // Prefill: the utilisation the TTFT SLA allows, M/D/1 per instance.
  const double rho_max = S < T ? 2 * (T - S) / (2 * T - S) : 0;
  r.prefill_capacity = prefill * rho_max / S;
  // Decode: the best requests/s per rank over the batches whose ITL meets the SLA.
  double best = 0;
  int best_b = 0;
  for (int b = 1; b <= profile.decode_max_requests; ++b) {
    const double itl = itl_at(profile, b) / speed;
    if (itl > w.itl_seconds * (1 + 1e-9)) break;  // a profile point exactly at the SLA meets it
    const double cap = b / (w.output_tokens * itl);
    if (cap >= best) best = cap, best_b = b, r.decode_itl = itl;
  }
  r.decode_batch = best_b;
  r.decode_capacity = decode * best;
  r.goodput = std::min({w.rate, r.prefill_capacity, r.decode_capacity});
  return r;
}

// Node processes busy on average while serving `s.goodput`: a prefill instance is busy rate x S / P of
// the time; a decode rank holding n requests on average (Little: rate / D x output x ITL) has none
// e^-n of the time (Poisson occupancy), so is busy 1 - e^-n.
double busy_processes(const CapacityProfile& profile, const RatioWorkload& w, const Sides& s) {
  const double prefill_busy = std::min<double>(s.prefill, s.goodput * s.prefill_seconds);
  const double per_rank = s.goodput / s.decode * w.output_tokens;
  const double itl = s.decode_itl > 0 ? s.decode_itl : itl_at(profile, 1);
  const double n = per_rank * itl;
  return prefill_busy + s.decode * (1 - std::exp(-n));
}

// A busy process's speed relative to the profile when `busy` node processes share the cores: a runnable
// thread runs on one core at a time, and the busy threads split the cores evenly.
double share(const CapacityProfile& p, const SharedCompute& c, double busy) {
  const double per_thread = c.share * std::min(1.0, c.cores / (p.threads_per_process * std::max(1.0, busy)));
  return p.threads_per_process * per_thread / p.cores_per_process;
}

}  // namespace

Result<CapacityProfile> parse_capacity_profile(const nlohmann::json& j) {
  CapacityProfile p;
  if (!j.is_object()) return bad("(top level)", "must be a JSON object");
  for (const char* key : {"prefill", "decode"})
    if (!j.contains(key) || !j.at(key).is_array() || j.at(key).empty()) return bad(key, "must be a non-empty array");
  try {
    for (size_t i = 0; i < j.at("prefill").size(); ++i) {
      const auto& e = j.at("prefill")[i];
      const std::string at = "prefill[" + std::to_string(i) + "]";
      p.prefill.push_back({e.at("input_tokens").get<double>(), e.at("seconds").get<double>()});
      if (!(p.prefill.back().input_tokens > 0) || !(p.prefill.back().seconds > 0)) return bad(at, "input_tokens and seconds must be > 0");
      if (i > 0 && !(p.prefill[i].input_tokens > p.prefill[i - 1].input_tokens)) return bad(at, "input_tokens must ascend");
    }
    for (size_t i = 0; i < j.at("decode").size(); ++i) {
      const auto& e = j.at("decode")[i];
      const std::string at = "decode[" + std::to_string(i) + "]";
      p.decode.push_back({e.at("batch").get<double>(), e.at("itl_ms").get<double>() / 1000.0});
      if (!(p.decode.back().batch >= 1) || !(p.decode.back().itl_seconds > 0)) return bad(at, "batch must be >= 1 and itl_ms > 0");
      if (i > 0 && !(p.decode[i].batch > p.decode[i - 1].batch)) return bad(at, "batch must ascend");
    }
    p.decode_max_requests = j.value("decode_max_requests", 0);
    p.threads_per_process = j.value("threads_per_process", 1.0);
    p.cores_per_process = j.value("cores_per_process", p.threads_per_process);
  } catch (const nlohmann::json::exception& e) {
    return bad("(entries)", std::string("each prefill entry needs input_tokens and seconds, each decode entry batch and itl_ms: ") + e.what());
  }
  if (p.decode_max_requests < 1) return bad("decode_max_requests", "must be >= 1");
  if (!(p.threads_per_process >= 1)) return bad("threads_per_process", "must be >= 1");
  if (!(p.cores_per_process > 0 && p.cores_per_process <= p.threads_per_process * (1 + 1e-9)))
    return bad("cores_per_process", "must be > 0 and at most threads_per_process (a process uses at most one core per thread)");
  return p;
}

Result<RatioPrediction> predict_ratio(const CapacityProfile& profile, const RatioWorkload& w, int prefill, int decode,
                                      const SharedCompute& compute) {
  K3_TRY(check_workload(w));
  if (prefill < 1 || decode < 1) return invalid_argument("P and D must both be >= 1");
  if (!(compute.cores >= 0)) return invalid_argument("--cores must be >= 0 (0: each process has its own compute)");
  if (!(compute.share > 0 && compute.share <= 1)) return invalid_argument("--core-share must be in (0, 1]");
  const double S = prefill_seconds(profile, w.input_tokens * (1 - w.prefix_hit));
  const Sides free = sides_at(profile, w, prefill, decode, S, 1);
  double speed = 1;
  if (compute.cores > 0) {
    // The share is the fixed point of share(busy(share)); share falls as busy rises and busy rises as the
    // share falls, so share(busy(s)) - s changes sign once between all busy and one busy: bisect.
    // A busy prefill instance (the side whose compute dominates) shares the cores with the others busy at
    // that moment: with busy fractions u_j independent, itself plus the sum of the others' u_j.
    auto share_at = [&](double s) {
      const Sides at = sides_at(profile, w, prefill, decode, S, s);
      const double busy = busy_processes(profile, w, at), own = std::min(1.0, at.goodput * at.prefill_seconds / prefill);
      return share(profile, compute, 1 + busy - own);
    };
    double lo = share(profile, compute, prefill + decode), hi = share(profile, compute, 1);
    if (share_at(hi) >= hi) {
      lo = hi;
    } else {
      for (int i = 0; i < 60; ++i) {
        const double mid = (lo + hi) / 2;
        (share_at(mid) >= mid ? lo : hi) = mid;
      }
    }
    speed = lo;
  }
  const Sides at = sides_at(profile, w, prefill, decode, S, speed);
  RatioPrediction r;
  r.prefill = prefill;
  r.decode = decode;
  r.prefill_seconds = at.prefill_seconds;
  r.prefill_capacity = at.prefill_capacity;
  r.decode_batch = at.decode_batch;
  r.decode_capacity = at.decode_capacity;
  r.goodput = at.goodput;
  r.compute_speed = speed;
  r.busy_processes = busy_processes(profile, w, at);
  if (r.prefill_capacity <= 0) r.binding = "prefill TTFT: one request alone takes longer than the TTFT SLA";
  else if (r.decode_capacity <= 0) r.binding = "decode ITL: one request alone is slower than the ITL SLA";
  else if (r.goodput >= w.rate) r.binding = "offered load";
  else if (r.prefill_capacity <= r.decode_capacity) r.binding = "prefill TTFT";
  else if (at.decode_batch == profile.decode_max_requests)
    r.binding = "decode KV capacity";
  else r.binding = "decode ITL";
  // Sharing binds when a process with its profiled compute to itself would have served more.
  if (compute.cores > 0 && r.goodput < free.goodput * (1 - 1e-9)) {
    char why[200];
    std::snprintf(why, sizeof why, "compute sharing (%d processes on %g cores%s: a busy one runs at %.2f of its profiled speed), then ",
                  prefill + decode, compute.cores, compute.share < 1 ? " shared with other work" : "", speed);
    r.binding = why + r.binding;
  }
  const double rho = r.goodput * r.prefill_seconds / prefill;
  r.ttft_seconds = rho < 1 ? r.prefill_seconds + rho * r.prefill_seconds / (2 * (1 - rho)) : INFINITY;
  return r;
}

namespace {

// The split of `total` processes with the most goodput; among splits that serve the same, the one with the
// most headroom.
Result<RatioPrediction> best_split(const CapacityProfile& profile, const RatioWorkload& w, int total, const SharedCompute& compute) {
  std::optional<RatioPrediction> best;
  // Headroom: the goodput at an offered rate past every capacity, i.e. the weaker side's capacity with
  // the cores as shared as they get at saturation.
  RatioWorkload flood = w;
  flood.rate = 1e12;
  std::optional<double> best_headroom;
  for (int p = 1; p < total; ++p) {
    K3_ASSIGN_OR_RETURN(RatioPrediction r, predict_ratio(profile, w, p, total - p, compute));
    K3_ASSIGN_OR_RETURN(RatioPrediction saturated, predict_ratio(profile, flood, p, total - p, compute));
    if (!best || r.goodput > best->goodput * (1 + 1e-9) ||
        (r.goodput >= best->goodput * (1 - 1e-9) && saturated.goodput > *best_headroom * (1 + 1e-9)))
      best = r, best_headroom = saturated.goodput;
  }
  return *best;
}

}  // namespace

Result<RatioPrediction> recommend_ratio(const CapacityProfile& profile, const RatioWorkload& w, int total,
                                        const SharedCompute& compute) {
  K3_TRY(check_workload(w));
  if (total == 1) return invalid_argument("--total must be >= 2 (one prefill instance and one decode rank at least)");
  if (total >= 2) return best_split(profile, w, total, compute);
  if (compute.cores > 0) {
    // Shared cores: a side's capacity is not linear in its count, so try totals in turn.
    std::optional<RatioPrediction> best;
    for (int n = 2; n <= 64; ++n) {
      K3_ASSIGN_OR_RETURN(RatioPrediction r, best_split(profile, w, n, compute));
      if (r.goodput >= w.rate * (1 - 1e-9)) return r;
      if (!best || r.goodput > best->goodput * (1 + 1e-9)) best = r;
    }
    return *best;
  }
  // Each side on its own: the smallest count whose SLA-respecting capacity covers the rate.
  K3_ASSIGN_OR_RETURN(RatioPrediction one, predict_ratio(profile, w, 1, 1));
  if (one.prefill_capacity <= 0 || one.decode_capacity <= 0) return one;  // binding says why
  const int p = std::max(1, static_cast<int>(std::ceil(w.rate / one.prefill_capacity - 1e-9)));
  const int d = std::max(1, static_cast<int>(std::ceil(w.rate / one.decode_capacity - 1e-9)));
  return predict_ratio(profile, w, p, d);
}

nlohmann::json ratio_prediction_json(const RatioPrediction& p) {
  return {{"prefill_instances", p.prefill},          {"decode_ranks", p.decode},
          {"prefill_seconds", p.prefill_seconds},    {"prefill_capacity_rps", p.prefill_capacity},
          {"decode_batch", p.decode_batch},          {"decode_capacity_rps", p.decode_capacity},
          {"goodput_rps", p.goodput},                {"ttft_seconds", std::isfinite(p.ttft_seconds) ? nlohmann::json(p.ttft_seconds) : nlohmann::json()},
          {"compute_speed", p.compute_speed},        {"busy_processes", p.busy_processes},
          {"binding", p.binding}};
}

}  // namespace k3::deploy
