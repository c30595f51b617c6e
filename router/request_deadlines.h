// The router's deadline per request phase (pure logic: the time is passed in). Each phase has its own
// budget; entering a phase starts its clock, and in the decoding phase every token restarts it (the
// budget there is the longest silence between tokens). An expired request is reported once, with the
// phase it was in; the router then ends its stream with an error event and ABORTs every party.
//
//   queued      submitted, waiting in the admission queue for room on a decode rank
//   claimed     CLAIM sent to decode, waiting for its CLAIM_ACK (expiry: placed again if nothing streamed)
//   prefilling  PREFILL sent, waiting for the first token (prefill compute + KV transfer to decode)
//   decoding    tokens are streaming; expires after this long without one
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace k3::router {

enum class RequestPhase : uint8_t { Queued, Claimed, Prefilling, Decoding };
inline constexpr int kNumRequestPhases = 4;
const char* request_phase_name(RequestPhase p);

struct PhaseTimeouts {
  std::chrono::milliseconds queued{300'000};
  std::chrono::milliseconds claimed{5'000};
  std::chrono::milliseconds prefilling{300'000};
  std::chrono::milliseconds decoding{60'000};  // without a token
  std::chrono::milliseconds of(RequestPhase p) const;
};

class RequestDeadlines {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RequestDeadlines(PhaseTimeouts t) : t_(t) {}

  // `id` is in phase `p` from `now` on (its clock restarts).
  void enter(uint64_t id, RequestPhase p, Clock::time_point now);
  // Progress inside the current phase (a token while decoding): its clock restarts.
  void progress(uint64_t id, Clock::time_point now);
  void forget(uint64_t id);
  std::optional<RequestPhase> phase(uint64_t id) const;
  size_t size() const { return by_id_.size(); }

  struct Expired {
    uint64_t id;
    RequestPhase phase;
    std::chrono::milliseconds budget;
  };
  // The requests whose deadline passed at `now`, oldest deadline first; they are forgotten here.
  std::vector<Expired> take_expired(Clock::time_point now);
  // The earliest deadline (for a poll timeout), if any.
  std::optional<Clock::time_point> next_deadline() const;

 private:
  struct Entry {
    RequestPhase phase;
    Clock::time_point deadline;
  };
  PhaseTimeouts t_;
  std::map<uint64_t, Entry> by_id_;
};

}  // namespace k3::router
