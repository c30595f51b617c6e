#include "router/request_deadlines.h"

#include <algorithm>

namespace k3::router {

const char* request_phase_name(RequestPhase p) {
  switch (p) {
    case RequestPhase::Queued: return "queued";
    case RequestPhase::Claimed: return "claimed";
    case RequestPhase::Prefilling: return "prefilling";
    case RequestPhase::Decoding: return "decoding";
  }
  return "?";
}

std::chrono::milliseconds PhaseTimeouts::of(RequestPhase p) const {
  switch (p) {
    case RequestPhase::Queued: return queued;
    case RequestPhase::Claimed: return claimed;
    case RequestPhase::Prefilling: return prefilling;
    case RequestPhase::Decoding: return decoding;
  }
  return decoding;
}

void RequestDeadlines::enter(uint64_t id, RequestPhase p, Clock::time_point now) {
  by_id_[id] = {p, now + t_.of(p)};
}

void RequestDeadlines::progress(uint64_t id, Clock::time_point now) {
  auto it = by_id_.find(id);
  if (it != by_id_.end()) it->second.deadline = now + t_.of(it->second.phase);
}

void RequestDeadlines::forget(uint64_t id) { by_id_.erase(id); }

std::optional<RequestPhase> RequestDeadlines::phase(uint64_t id) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second.phase;
}

std::vector<RequestDeadlines::Expired> RequestDeadlines::take_expired(Clock::time_point now) {
  std::vector<std::pair<Clock::time_point, Expired>> late;
  for (const auto& [id, e] : by_id_)
    if (now >= e.deadline) late.push_back({e.deadline, Expired{id, e.phase, t_.of(e.phase)}});
  std::stable_sort(late.begin(), late.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Expired> out;
  for (const auto& [at, x] : late) {
    by_id_.erase(x.id);
    out.push_back(x);
  }
  return out;
}

std::optional<RequestDeadlines::Clock::time_point> RequestDeadlines::next_deadline() const {
  std::optional<Clock::time_point> best;
  for (const auto& [id, e] : by_id_)
    if (!best || e.deadline < *best) best = e.deadline;
  return best;
}

}  // namespace k3::router
