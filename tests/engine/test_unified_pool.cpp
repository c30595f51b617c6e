// The unified pool over a real host byte region: KDA slots from the low end and MLA pages from the
// high end share the same bytes, a hole is closed by moving the end block (its bytes and handle follow),
// a pinned block is never moved, and a writer that pins blocks while compaction runs never writes into
// a moved block.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <random>
#include <optional>
#include <thread>

#include "engine/unified_pool.h"

using namespace k3;
using Kind = UnifiedPool::Kind;

namespace {

struct Region {
  std::vector<uint8_t> bytes;
  explicit Region(uint64_t n) : bytes(n, 0) {}
  UnifiedPool::Mover mover() {
    return [this](uint64_t from, uint64_t to, uint64_t n) { std::memmove(bytes.data() + to, bytes.data() + from, n); };
  }
  void fill(uint64_t off, uint64_t n, uint8_t v) { std::memset(bytes.data() + off, v, n); }
  bool all(uint64_t off, uint64_t n, uint8_t v) const {
    for (uint64_t i = 0; i < n; ++i)
      if (bytes[off + i] != v) return false;
    return true;
  }
};

constexpr uint64_t kSlot = 64, kPage = 8, kRegion = 1024;

}  // namespace

TEST_CASE("slots and pages draw on the same bytes from opposite ends", "[pool]") {
  Region r(kRegion);
  UnifiedPool p({.region_bytes = kRegion, .slot_bytes = kSlot, .page_bytes = kPage}, r.mover());
  // All slots: 16 fit.
  std::vector<UnifiedPool::Handle> slots;
  while (auto h = p.alloc(Kind::Slot)) slots.push_back(*h);
  REQUIRE(slots.size() == kRegion / kSlot);
  REQUIRE_FALSE(p.alloc(Kind::Page));
  REQUIRE(p.offset(slots[0]) == 0);
  // Give back half: the pages take that room (the boundary moved).
  for (size_t i = 8; i < slots.size(); ++i) p.free(slots[i]);
  slots.resize(8);
  std::vector<UnifiedPool::Handle> pages;
  while (auto h = p.alloc(Kind::Page)) pages.push_back(*h);
  REQUIRE(pages.size() == (kRegion - 8 * kSlot) / kPage);
  REQUIRE(p.offset(pages[0]) == kRegion - kPage);
  REQUIRE(p.free_bytes() == 0);
  for (auto h : pages) p.free(h);
  for (auto h : slots) p.free(h);
  REQUIRE(p.free_bytes() == kRegion);
  REQUIRE(p.gap_bytes() == kRegion);
}

TEST_CASE("a free leaves a hole that the next block of its kind fills without a move", "[pool]") {
  Region r(kRegion);
  UnifiedPool p({.region_bytes = kRegion, .slot_bytes = kSlot, .page_bytes = kPage}, r.mover());
  std::vector<UnifiedPool::Handle> s;
  for (int i = 0; i < 4; ++i) s.push_back(*p.alloc(Kind::Slot));
  p.free(s[1]);
  REQUIRE(p.offset(s[3]) == 3 * kSlot);          // nothing moved
  REQUIRE(p.hole_bytes() == kSlot);
  auto again = *p.alloc(Kind::Slot);
  REQUIRE(p.offset(again) == 1 * kSlot);         // the hole, not the gap
  REQUIRE(p.hole_bytes() == 0);
  p.free(s[3]);                                  // the end's last block: the gap grows, no hole
  REQUIRE(p.hole_bytes() == 0);
  REQUIRE(p.gap_bytes() == kRegion - 3 * kSlot);
  REQUIRE(p.moves() == 0);
}

TEST_CASE("when slot holes block a page, the last slots move into them, bytes and handle with them", "[pool]") {
  Region r(kRegion);
  UnifiedPool p({.region_bytes = kRegion, .slot_bytes = kSlot, .page_bytes = kPage}, r.mover());
  std::vector<UnifiedPool::Handle> s;
  for (int i = 0; i < 4; ++i) {
    s.push_back(*p.alloc(Kind::Slot));
    r.fill(p.offset(s.back()), kSlot, static_cast<uint8_t>(10 + i));
  }
  p.free(s[1]);
  std::vector<UnifiedPool::Handle> pages;
  while (pages.size() < (kRegion - 4 * kSlot) / kPage) pages.push_back(*p.alloc(Kind::Page));
  REQUIRE(p.gap_bytes() == 0);
  REQUIRE(p.moves() == 0);
  // The gap is gone; a slot hole holds the bytes the next page needs.
  auto page = p.alloc(Kind::Page);
  REQUIRE(page);
  REQUIRE(p.moves() == 1);
  REQUIRE(p.offset(s[3]) == 1 * kSlot);          // the last slot now sits in the hole
  REQUIRE(r.all(p.offset(s[3]), kSlot, 13));     // with its bytes
  REQUIRE(r.all(p.offset(s[2]), kSlot, 12));
  REQUIRE(p.offset(*page) == 3 * kSlot + kSlot - kPage);   // the top of the bytes the slot left
}

TEST_CASE("fragmentation counts the free extents and the share outside the largest", "[pool]") {
  Region r(kRegion);
  UnifiedPool p({.region_bytes = kRegion, .slot_bytes = kSlot, .page_bytes = kPage}, r.mover());
  auto f0 = p.fragmentation();
  REQUIRE(f0.extents == 1);
  REQUIRE(f0.free_bytes == kRegion);
  REQUIRE(f0.ratio() == 0.0);
  std::vector<UnifiedPool::Handle> s, pg;
  for (int i = 0; i < 6; ++i) s.push_back(*p.alloc(Kind::Slot));
  for (int i = 0; i < 8; ++i) pg.push_back(*p.alloc(Kind::Page));
  p.free(s[1]);
  p.free(s[2]);                                  // one run of two slot holes
  p.free(s[4]);
  p.free(pg[3]);
  auto f = p.fragmentation();
  const uint64_t gap = kRegion - 6 * kSlot - 8 * kPage;
  REQUIRE(f.extents == 4);                       // [1,2], [4], page 3, the gap
  REQUIRE(f.free_bytes == p.free_bytes());
  REQUIRE(f.free_bytes == gap + 3 * kSlot + kPage);
  REQUIRE(f.largest_extent_bytes == std::max<uint64_t>(gap, 2 * kSlot));
  REQUIRE(f.ratio() == Approx(1.0 - double(f.largest_extent_bytes) / double(f.free_bytes)));
  REQUIRE(p.compact() == 2);                     // s[5] and s[3] close the slot holes
  auto g = p.fragmentation();
  REQUIRE(g.extents == 2);                       // the page hole stays (pages never move), and the gap
  REQUIRE(g.free_bytes == f.free_bytes);
}

TEST_CASE("a pinned end block is not moved; its hole closes once the pin goes", "[pool]") {
  Region r(kRegion);
  UnifiedPool p({.region_bytes = kRegion, .slot_bytes = kSlot, .page_bytes = kPage}, r.mover());
  auto a = *p.alloc(Kind::Slot), b = *p.alloc(Kind::Slot), c = *p.alloc(Kind::Slot);
  {
    UnifiedPool::Pin pin(p, c);
    p.free(a);
    REQUIRE(p.offset(c) == 2 * kSlot);
    REQUIRE(p.hole_bytes() == kSlot);
    REQUIRE(p.compact() == 0);
  }
  REQUIRE(p.compact() == 1);
  REQUIRE(p.offset(c) == 0);
  REQUIRE(p.offset(b) == kSlot);
  REQUIRE(p.hole_bytes() == 0);
  REQUIRE_THROWS_WITH(p.free(a), Catch::Contains("not live"));
}

TEST_CASE("compaction while a writer pins and writes blocks: no write lands in a moved block", "[pool]") {
  constexpr uint64_t region = 4096;   // small: allocations fail and compaction runs often
  Region r(region);
  UnifiedPool p({.region_bytes = region, .slot_bytes = 256, .page_bytes = 32}, r.mover());
  // Live blocks and the byte each must hold throughout (its tag).
  std::mutex mu;
  std::vector<std::pair<UnifiedPool::Handle, uint8_t>> live;
  std::optional<UnifiedPool::Handle> writing;   // the block the writer holds pinned (its owner keeps it)
  std::atomic<bool> stop{false};
  uint64_t writes = 0;              // under mu
  std::condition_variable wrote, changed;
  auto size_of = [](Kind k) { return k == Kind::Slot ? 256u : 32u; };
  // The writer stands for a transfer writing into the pool: it pins a block, writes its tag over the
  // block at the pinned offset, and unpins.
  std::thread writer([&] {
    std::mt19937 rng(1);
    while (!stop) {
      std::pair<UnifiedPool::Handle, uint8_t> pick;
      std::unique_lock lk(mu);
      changed.wait(lk, [&] { return stop || !live.empty(); });
      if (stop) break;
      pick = live[rng() % live.size()];
      {
        UnifiedPool::Pin pin(p, pick.first);   // taken while the block is known live
        writing = pick.first;
        lk.unlock();
        r.fill(pin.offset(), size_of(pick.first.kind), pick.second);
        lk.lock();
      }
      writing.reset();
      ++writes;
      wrote.notify_all();
    }
  });
  std::mt19937 rng(2);
  uint8_t next_tag = 1;
  uint64_t page_bytes_live = 0;
  for (int step = 0; step < 20000; ++step) {
    // Pages never move, so (as CachePools does) they are capped to leave the slots room.
    const Kind k = rng() % 3 == 0 || page_bytes_live >= region / 2 ? Kind::Slot : Kind::Page;
    std::unique_lock lk(mu);
    // Every 50 steps let the writer in: wait until it has written again (interleaves the two).
    if (step % 50 == 0 && !live.empty()) {
      const uint64_t seen = writes;
      wrote.wait_for(lk, std::chrono::seconds(10), [&] { return writes > seen; });
    }
    bool took = false;
    if (live.size() < 60 || rng() % 2) {   // more than fit: the region stays full
      if (auto h = p.alloc(k)) {
        const uint8_t tag = next_tag;
        next_tag = next_tag == 255 ? 1 : next_tag + 1;
        r.fill(p.offset(*h), size_of(k), tag);
        live.emplace_back(*h, tag);
        if (k == Kind::Page) page_bytes_live += 32;
        changed.notify_all();
        took = true;
      }
    }
    if (!took && !live.empty()) {            // full, or a free was drawn
      const size_t i = rng() % live.size();
      if (writing && live[i].first == *writing) continue;   // a transfer is writing it: not ours to free
      p.free(live[i].first);
      if (live[i].first.kind == Kind::Page) page_bytes_live -= 32;
      live.erase(live.begin() + static_cast<long>(i));
    }
  }
  {
    std::lock_guard lk(mu);
    stop = true;
  }
  changed.notify_all();
  writer.join();
  INFO("writes " << writes << ", moves " << p.moves());
  p.compact();
  REQUIRE(p.moves() > 20);
  REQUIRE(writes >= 300);
  for (const auto& [h, tag] : live) REQUIRE(r.all(p.offset(h), size_of(h.kind), tag));
  for (const auto& [h, tag] : live) p.free(h);
  REQUIRE(p.free_bytes() == region);
}
