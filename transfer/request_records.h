// The bookkeeping both lazy-alloc sides keep per request id: live records, and tombstones of ended
// requests (their terminal state, remembered until a forget-at time) so that late or duplicate messages
// are recognised instead of starting a new request.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "transfer/lazy_alloc.h"

namespace k3::transfer {

using Tombstones = std::map<uint64_t, std::pair<RequestState, Millis>>;  // id -> (terminal state, forget-at)

template <class Record>
using LiveRecords = std::map<uint64_t, std::unique_ptr<Record>>;

// True when the id is live or remembered as ended (a CLAIM/PREFILL for it is a duplicate or late).
template <class Record>
bool seen_before(const LiveRecords<Record>& records, const Tombstones& tombstones, uint64_t id) {
  return records.count(id) || tombstones.count(id);
}

// The live record of `id`, or nullptr with an IgnoredAction naming `what` (the message) and why.
template <class Record>
Record* find_live(const LiveRecords<Record>& records, const Tombstones& tombstones, uint64_t id, const char* what,
                  Actions& out) {
  auto it = records.find(id);
  if (it != records.end()) return it->second.get();
  out.push_back(IgnoredAction{id, std::string(what) + ": " +
                                      (tombstones.count(id) ? "request already ended" : "unknown request")});
  return nullptr;
}

// An ABORT for an id neither live nor remembered overtook its request (reordering): remember the id
// as aborted until `forget_at`, so a late CLAIM/PREFILL is refused. False when the id is known.
template <class Record>
bool tombstone_unknown_abort(const LiveRecords<Record>& records, Tombstones& tombstones, uint64_t id, Millis forget_at,
                             Actions& out) {
  if (seen_before(records, tombstones, id)) return false;
  tombstones[id] = {RequestState::Aborted, forget_at};
  out.push_back(IgnoredAction{id, "ABORT: unknown request, remembered as aborted"});
  return true;
}

// Drops the tombstones whose forget-at time has come.
inline void forget_expired(Tombstones& tombstones, Millis now) {
  std::erase_if(tombstones, [&](const auto& t) { return now >= t.second.second; });
}

// The state of a live request, else the terminal state of a remembered one.
template <class Record>
std::optional<RequestState> state_of(const LiveRecords<Record>& records, const Tombstones& tombstones, uint64_t id) {
  if (auto it = records.find(id); it != records.end()) return it->second->state;
  if (auto it = tombstones.find(id); it != tombstones.end()) return it->second.first;
  return std::nullopt;
}

}  // namespace k3::transfer
