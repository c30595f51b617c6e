#include "router/admission_queue.h"

#include <algorithm>

namespace k3::router {

namespace {
uint64_t pages_for(int64_t tokens, uint32_t page_size) {
  return page_size == 0 ? 0 : static_cast<uint64_t>((std::max<int64_t>(tokens, 0) + page_size - 1) / page_size);
}
}  // namespace

Demand demand_of(const DecodeCapacity& cap, int64_t prompt_len, int64_t reserve_tokens) {
  return {.pool_pages = static_cast<uint32_t>(pages_for(prompt_len, cap.pool_page_size)),
          .cache_pages = static_cast<uint32_t>(pages_for(prompt_len + std::max<int64_t>(reserve_tokens, 0),
                                                         cap.cache_page_size))};
}

std::string never_fits(const DecodeCapacity& cap, int64_t prompt_len, int64_t max_tokens) {
  if (!cap.known()) return "";
  const uint64_t pool_pages = pages_for(prompt_len, cap.pool_page_size);
  if (pool_pages > cap.pool_pages)
    return "prompt (" + std::to_string(prompt_len) + " tokens) needs " + std::to_string(pool_pages) +
           " transfer pool pages of " + std::to_string(cap.pool_page_size) + " tokens; a decode rank has " +
           std::to_string(cap.pool_pages) + " (" + std::to_string(uint64_t(cap.pool_pages) * cap.pool_page_size) +
           " tokens)";
  const uint64_t cache_pages = pages_for(prompt_len + max_tokens, cap.cache_page_size);
  if (cache_pages > cap.cache_pages)
    return "prompt (" + std::to_string(prompt_len) + " tokens) + max_tokens (" + std::to_string(max_tokens) +
           ") needs " + std::to_string(cache_pages) + " decode cache pages of " + std::to_string(cap.cache_page_size) +
           " tokens; a decode rank holds " + std::to_string(cap.cache_pages) + " (" +
           std::to_string(uint64_t(cap.cache_pages) * cap.cache_page_size) + " tokens)";
  if (cap.pool_slots == 0 || cap.cache_seqs == 0) return "the decode rank has no request slots";
  return "";
}

std::optional<DecodeCapacity> CapacityLedger::capacity(const std::string& rank) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || !it->second.cap.known()) return std::nullopt;
  return it->second.cap;
}

bool CapacityLedger::fits(const std::string& rank, const Demand& d) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || !it->second.cap.known()) return false;
  const DecodeCapacity& c = it->second.cap;
  const Used& u = it->second.used;
  return u.requests < std::min(c.pool_slots, c.cache_seqs) && u.pool_pages + uint64_t(d.pool_pages) <= c.pool_pages &&
         u.cache_pages + uint64_t(d.cache_pages) <= c.cache_pages;
}

void CapacityLedger::take(uint64_t id, const std::string& rank, const Demand& d) {
  give_back(id);
  Used& u = ranks_[rank].used;
  u.pool_pages += d.pool_pages;
  u.cache_pages += d.cache_pages;
  ++u.requests;
  held_[id] = {rank, d};
}

void CapacityLedger::give_back(uint64_t id) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  Used& u = ranks_[it->second.first].used;
  u.pool_pages -= it->second.second.pool_pages;
  u.cache_pages -= it->second.second.cache_pages;
  --u.requests;
  held_.erase(it);
}

CapacityLedger::Used CapacityLedger::used(const std::string& rank) const {
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? Used{} : it->second.used;
}

bool AdmissionQueue::push(uint64_t id, AdmissionClock::time_point now) {
  if (full()) return false;
  q_.push_back({id, now});
  return true;
}

void AdmissionQueue::push_front(uint64_t id, AdmissionClock::time_point since) { q_.push_front({id, since}); }

bool AdmissionQueue::remove(uint64_t id) {
  auto it = std::find_if(q_.begin(), q_.end(), [&](const Entry& e) { return e.id == id; });
  if (it == q_.end()) return false;
  q_.erase(it);
  return true;
}

}  // namespace k3::router
