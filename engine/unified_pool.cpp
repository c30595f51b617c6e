#include "engine/unified_pool.h"

#include <algorithm>
#include <string>

#include "common/core/status.h"

namespace k3 {

UnifiedPool::UnifiedPool(const UnifiedPoolOptions& opts, Mover mover) : opts_(opts), mover_(std::move(mover)) {
  K3_CHECK(opts.slot_bytes > 0, "UnifiedPoolOptions.slot_bytes must be > 0");
  K3_CHECK(opts.page_bytes > 0, "UnifiedPoolOptions.page_bytes must be > 0");
  K3_CHECK(opts.region_bytes >= std::max(opts.slot_bytes, opts.page_bytes),
           "UnifiedPoolOptions.region_bytes (" + std::to_string(opts.region_bytes) + ") holds no block");
  K3_CHECK(static_cast<bool>(mover_), "UnifiedPool needs a mover");
  slots_.unit = opts.slot_bytes;
  pages_.unit = opts.page_bytes;
}

uint64_t UnifiedPool::offset_at(Kind k, int64_t pos) const {
  return k == Kind::Slot ? uint64_t(pos) * opts_.slot_bytes : opts_.region_bytes - uint64_t(pos + 1) * opts_.page_bytes;
}

uint64_t UnifiedPool::gap_bytes() const {
  std::lock_guard lk(mu_);
  return opts_.region_bytes - slots_.at.size() * slots_.unit - pages_.at.size() * pages_.unit;
}

uint64_t UnifiedPool::hole_bytes() const {
  std::lock_guard lk(mu_);
  uint64_t b = 0;
  for (const End* e : {&slots_, &pages_}) b += uint64_t(std::count(e->at.begin(), e->at.end(), -1)) * e->unit;
  return b;
}

uint64_t UnifiedPool::free_bytes() const { return gap_bytes() + hole_bytes(); }

uint64_t UnifiedPool::room(Kind kind) const {
  std::lock_guard lk(mu_);
  auto holes = [](const End& e) { return uint64_t(std::count(e.at.begin(), e.at.end(), -1)); };
  uint64_t gap = opts_.region_bytes - slots_.at.size() * slots_.unit - pages_.at.size() * pages_.unit;
  if (kind == Kind::Slot) return holes(slots_) + gap / slots_.unit;
  gap += holes(slots_) * slots_.unit;
  return holes(pages_) + gap / pages_.unit;
}

UnifiedPool::Fragmentation UnifiedPool::fragmentation() const {
  std::lock_guard lk(mu_);
  Fragmentation f;
  auto extent = [&f](uint64_t bytes) {
    if (bytes == 0) return;
    ++f.extents;
    f.free_bytes += bytes;
    f.largest_extent_bytes = std::max(f.largest_extent_bytes, bytes);
  };
  // Ends are trimmed, so no hole touches the gap: each run of holes is an extent of its own.
  for (const End* e : {&slots_, &pages_}) {
    uint64_t run = 0;
    for (int64_t id : e->at) {
      if (id < 0) {
        ++run;
        continue;
      }
      extent(run * e->unit);
      run = 0;
    }
    extent(run * e->unit);
  }
  extent(opts_.region_bytes - slots_.at.size() * slots_.unit - pages_.at.size() * pages_.unit);
  return f;
}

int UnifiedPool::live(Kind kind) const {
  std::lock_guard lk(mu_);
  const End& e = end(kind);
  return static_cast<int>(std::count_if(e.at.begin(), e.at.end(), [](int64_t id) { return id >= 0; }));
}

uint64_t UnifiedPool::offset(Handle h) const {
  std::lock_guard lk(mu_);
  const End& e = end(h.kind);
  K3_CHECK(h.id < e.pos_of.size() && e.pos_of[h.id] >= 0, "UnifiedPool: handle " + std::to_string(h.id) + " is not live");
  return offset_at(h.kind, e.pos_of[h.id]);
}

void UnifiedPool::trim(End& e) {
  while (!e.at.empty() && e.at.back() < 0) e.at.pop_back();
}

std::optional<UnifiedPool::Handle> UnifiedPool::take(Kind k) {
  End& e = end(k);
  const uint64_t gap = opts_.region_bytes - slots_.at.size() * slots_.unit - pages_.at.size() * pages_.unit;
  auto hole = std::find(e.at.begin(), e.at.end(), -1);
  int64_t pos;
  if (hole != e.at.end()) {
    pos = hole - e.at.begin();   // a hole inside this end: no move needed
  } else if (gap >= e.unit) {
    pos = static_cast<int64_t>(e.at.size());
    e.at.push_back(-1);
  } else {
    return std::nullopt;
  }
  uint32_t id;
  if (!e.free_ids.empty()) {
    id = e.free_ids.back();
    e.free_ids.pop_back();
  } else {
    id = static_cast<uint32_t>(e.pos_of.size());
    e.pos_of.push_back(-1);
    e.pins.push_back(0);
  }
  e.at[pos] = id;
  e.pos_of[id] = pos;
  return Handle{k, id};
}

std::optional<UnifiedPool::Handle> UnifiedPool::alloc(Kind kind) {
  std::lock_guard lk(mu_);
  if (auto h = take(kind)) return h;
  if (kind == Kind::Slot) return std::nullopt;   // pages never move (see the header)
  compact_end(Kind::Slot);                        // the slot holes hold the bytes: pack them, try the gap again
  return take(kind);
}

void UnifiedPool::free(Handle h) {
  std::lock_guard lk(mu_);
  End& e = end(h.kind);
  K3_CHECK(h.id < e.pos_of.size() && e.pos_of[h.id] >= 0, "UnifiedPool::free of handle " + std::to_string(h.id) + " not live");
  K3_CHECK(e.pins[h.id] == 0, "UnifiedPool::free of a pinned block");
  e.at[e.pos_of[h.id]] = -1;
  e.pos_of[h.id] = -1;
  e.free_ids.push_back(h.id);
  trim(e);
}

int UnifiedPool::compact() {
  std::lock_guard lk(mu_);
  return compact_end(Kind::Slot);
}

// Moves the end's last block into its lowest hole until no hole is left or the last block is pinned.
int UnifiedPool::compact_end(Kind k) {
  End& e = end(k);
  int moved = 0;
  for (;;) {
    trim(e);
    auto hole = std::find(e.at.begin(), e.at.end(), -1);
    if (hole == e.at.end()) return moved;
    const int64_t to = hole - e.at.begin(), from = static_cast<int64_t>(e.at.size()) - 1;
    const int64_t id = e.at[from];
    if (e.pins[id] > 0) return moved;   // in use outside the pool: its hole waits
    mover_(offset_at(k, from), offset_at(k, to), e.unit);
    e.at[to] = id;
    e.pos_of[id] = to;
    e.at.pop_back();
    ++moves_;
    ++moved;
  }
}

UnifiedPool::Pin::Pin(UnifiedPool& pool, Handle h) : pool_(pool), h_(h) {
  std::lock_guard lk(pool_.mu_);
  End& e = pool_.end(h.kind);
  K3_CHECK(h.id < e.pos_of.size() && e.pos_of[h.id] >= 0, "UnifiedPool::Pin of handle " + std::to_string(h.id) + " not live");
  ++e.pins[h.id];
  offset_ = pool_.offset_at(h.kind, e.pos_of[h.id]);
}

UnifiedPool::Pin::~Pin() {
  std::lock_guard lk(pool_.mu_);
  --pool_.end(h_.kind).pins[h_.id];
}

}  // namespace k3
