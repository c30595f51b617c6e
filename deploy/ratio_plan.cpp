#include "deploy/ratio_plan.h"

#include <algorithm>
#include <cmath>
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
  } catch (const nlohmann::json::exception& e) {
    return bad("(entries)", std::string("each prefill entry needs input_tokens and seconds, each decode entry batch and itl_ms: ") + e.what());
  }
  if (p.decode_max_requests < 1) return bad("decode_max_requests", "must be >= 1");
  return p;
}

Result<RatioPrediction> predict_ratio(const CapacityProfile& profile, const RatioWorkload& w, int prefill, int decode) {
  K3_TRY(check_workload(w));
  if (prefill < 1 || decode < 1) return invalid_argument("P and D must both be >= 1");
  RatioPrediction r;
  r.prefill = prefill;
  r.decode = decode;
  const double S = prefill_seconds(profile, w.input_tokens * (1 - w.prefix_hit));
  const double T = w.ttft_seconds;
  r.prefill_seconds = S;
  // Prefill: the utilisation the TTFT SLA allows, M/D/1 per instance.
  const double rho_max = S < T ? 2 * (T - S) / (2 * T - S) : 0;
  r.prefill_capacity = prefill * rho_max / S;
  // Decode: the best requests/s per rank over the batches whose ITL meets the SLA.
  double best = 0;
  int best_b = 0;
  for (int b = 1; b <= profile.decode_max_requests; ++b) {
    const double itl = itl_at(profile, b);
    if (itl > w.itl_seconds * (1 + 1e-9)) break;  // a profile point exactly at the SLA meets it
    const double cap = b / (w.output_tokens * itl);
    if (cap >= best) best = cap, best_b = b;
  }
  r.decode_batch = best_b;
  r.decode_capacity = decode * best;
  r.goodput = std::min({w.rate, r.prefill_capacity, r.decode_capacity});
  if (r.prefill_capacity <= 0) r.binding = "prefill TTFT: one request alone takes longer than the TTFT SLA";
  else if (r.decode_capacity <= 0) r.binding = "decode ITL: one request alone is slower than the ITL SLA";
  else if (r.goodput >= w.rate) r.binding = "offered load";
  else if (r.prefill_capacity <= r.decode_capacity) r.binding = "prefill TTFT";
  else if (best_b == profile.decode_max_requests)
    r.binding = "decode KV capacity";
  else r.binding = "decode ITL";
  const double rho = r.goodput * S / prefill;
  r.ttft_seconds = rho < 1 ? S + rho * S / (2 * (1 - rho)) : INFINITY;
  return r;
}

Result<RatioPrediction> recommend_ratio(const CapacityProfile& profile, const RatioWorkload& w, int total) {
  K3_TRY(check_workload(w));
  if (total == 1) return invalid_argument("--total must be >= 2 (one prefill instance and one decode rank at least)");
  if (total >= 2) {
    std::optional<RatioPrediction> best;
    for (int p = 1; p < total; ++p) {
      K3_ASSIGN_OR_RETURN(RatioPrediction r, predict_ratio(profile, w, p, total - p));
      // The most goodput; among splits that serve the same, the one with the most headroom on its weaker side.
      auto headroom = [](const RatioPrediction& x) { return std::min(x.prefill_capacity, x.decode_capacity); };
      if (!best || r.goodput > best->goodput * (1 + 1e-9) ||
          (r.goodput >= best->goodput * (1 - 1e-9) && headroom(r) > headroom(*best) * (1 + 1e-9)))
        best = r;
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
          {"binding", p.binding}};
}

}  // namespace k3::deploy
