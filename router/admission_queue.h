// Admission for the cluster router (pure logic: no sockets, no threads, the time passed in):
//  - DecodeCapacity / demand_of / never_fits: what one decode rank can hold, what a request needs of it,
//    and why a request can never run on it (refused up front with HTTP 400, naming the numbers);
//  - CapacityLedger: the room the router has handed out on each decode rank (its own bookkeeping: the
//    rank's heartbeats lag behind, the router knows every request it placed);
//  - AdmissionQueue: the bounded FIFO of requests waiting for room (full = HTTP 429 at submit).
//
// A request is admitted onto a rank when the rank's unreserved room holds its prompt in the transfer
// pool (pages + one KDA slot) and its prompt plus a generation reserve in the decode cache (pages + one
// sequence slot). Tokens past the reserve are not reserved: when the decode cache runs out mid-decode the
// rank preempts (decode_node/decode_batch.h) instead of failing a stream.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

namespace k3::router {

using AdmissionClock = std::chrono::steady_clock;

// A decode rank's fixed capacity (from its heartbeat's room totals).
struct DecodeCapacity {
  uint32_t pool_page_size = 0, pool_pages = 0, pool_slots = 0;      // transfer pool
  uint32_t cache_page_size = 0, cache_pages = 0, cache_seqs = 0;    // decode engine cache
  bool known() const { return pool_page_size > 0 && cache_page_size > 0; }
  bool operator==(const DecodeCapacity&) const = default;
};

// What one request takes of a rank: transfer pool pages for its prompt and decode cache pages for its
// prompt plus `reserve` generated tokens (one pool slot and one cache sequence slot besides).
struct Demand {
  uint32_t pool_pages = 0;
  uint32_t cache_pages = 0;
  bool operator==(const Demand&) const = default;
};
Demand demand_of(const DecodeCapacity& cap, int64_t prompt_len, int64_t reserve_tokens);

// Empty when a request of this size can run on a rank of capacity `cap` (alone, at worst); otherwise
// why not, naming the limit and the numbers.
std::string never_fits(const DecodeCapacity& cap, int64_t prompt_len, int64_t max_tokens);

class CapacityLedger {
 public:
  void set_capacity(const std::string& rank, const DecodeCapacity& cap) { ranks_[rank].cap = cap; }
  std::optional<DecodeCapacity> capacity(const std::string& rank) const;
  // True when the unreserved room of `rank` holds `d` plus one pool slot and one cache sequence.
  bool fits(const std::string& rank, const Demand& d) const;
  // Reserves `d` on `rank` for request `id` (an id holds at most one reservation; a second replaces it).
  void take(uint64_t id, const std::string& rank, const Demand& d);
  // Returns what `id` reserved (no-op when it holds nothing).
  void give_back(uint64_t id);
  struct Used {
    uint32_t pool_pages = 0, cache_pages = 0, requests = 0;
  };
  Used used(const std::string& rank) const;

 private:
  struct Rank {
    DecodeCapacity cap;
    Used used;
  };
  std::map<std::string, Rank> ranks_;
  std::map<uint64_t, std::pair<std::string, Demand>> held_;
};

// Requests waiting for room, oldest first. Bounded: push() refuses past `capacity`; a request sent
// back (its rank could not take it after all) returns to the head, over the bound, keeping its place.
class AdmissionQueue {
 public:
  explicit AdmissionQueue(size_t capacity) : capacity_(capacity) {}
  bool full() const { return q_.size() >= capacity_; }
  size_t size() const { return q_.size(); }
  size_t capacity() const { return capacity_; }
  bool push(uint64_t id, AdmissionClock::time_point now);
  void push_front(uint64_t id, AdmissionClock::time_point since);
  bool remove(uint64_t id);
  // Admits from the head while `try_place(id)` says the request left the queue (placed, or failed for
  // good); stops at the first request that must wait, so a large request is not overtaken forever by
  // small ones. Returns how many left.
  template <class TryPlace>
  size_t drain(TryPlace&& try_place) {
    size_t placed = 0;
    while (!q_.empty()) {
      const Entry head = q_.front();
      if (!try_place(head.id)) break;
      // try_place may have removed entries (e.g. a request that failed while being placed).
      if (!q_.empty() && q_.front().id == head.id) q_.pop_front();
      ++placed;
    }
    return placed;
  }

 private:
  struct Entry {
    uint64_t id;
    AdmissionClock::time_point since;
  };
  size_t capacity_;
  std::deque<Entry> q_;
};

}  // namespace k3::router
