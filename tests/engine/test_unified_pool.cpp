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

TEST_CASE("freeing inside an end moves the end block into the hole, bytes and handle with it", "[pool]") {
  Region r(kRegion);
  UnifiedPool p({.region_bytes = kRegion, .slot_bytes = kSlot, .page_bytes = kPage}, r.mover());
  std::vector<UnifiedPool::Handle> s;
  for (int i = 0; i < 4; ++i) {
    s.push_back(*p.alloc(Kind::Slot));
    r.fill(p.offset(s.back()), kSlot, static_cast<uint8_t>(10 + i));
  }
  p.free(s[1]);
  REQUIRE(p.offset(s[3]) == 1 * kSlot);          // the last slot now sits in the hole
  REQUIRE(r.all(p.offset(s[3]), kSlot, 13));     // with its bytes
  REQUIRE(r.all(p.offset(s[2]), kSlot, 12));
  REQUIRE(p.hole_bytes() == 0);
  REQUIRE(p.gap_bytes() == kRegion - 3 * kSlot);
  REQUIRE(p.moves() == 1);
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
  constexpr uint64_t region = 64 * 1024;
  Region r(region);
  UnifiedPool p({.region_bytes = region, .slot_bytes = 256, .page_bytes = 32}, r.mover());
  // Live blocks and the byte each must hold throughout (its tag).
  std::mutex mu;
  std::vector<std::pair<UnifiedPool::Handle, uint8_t>> live;
  std::optional<UnifiedPool::Handle> writing;   // the block the writer holds pinned (its owner keeps it)
  std::atomic<bool> stop{false};
  uint64_t writes = 0;              // under mu
  std::condition_variable wrote;
  auto size_of = [](Kind k) { return k == Kind::Slot ? 256u : 32u; };
  // The writer stands for a transfer writing into the pool: it pins a block, writes its tag over the
  // block at the pinned offset, and unpins.
  std::thread writer([&] {
    std::mt19937 rng(1);
    while (!stop) {
      std::pair<UnifiedPool::Handle, uint8_t> pick;
      std::unique_lock lk(mu);
      if (live.empty()) {
        lk.unlock();
        std::this_thread::yield();
        continue;
      }
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
  for (int step = 0; step < 20000; ++step) {
    const Kind k = rng() % 3 == 0 ? Kind::Slot : Kind::Page;
    std::unique_lock lk(mu);
    // Every 50 steps let the writer in: wait until it has written again (interleaves the two).
    if (step % 50 == 0 && !live.empty()) {
      const uint64_t seen = writes;
      wrote.wait_for(lk, std::chrono::seconds(10), [&] { return writes > seen; });
    }
    if (live.size() < 40 || rng() % 2) {
      if (auto h = p.alloc(k)) {
        const uint8_t tag = next_tag;
        next_tag = next_tag == 255 ? 1 : next_tag + 1;
        r.fill(p.offset(*h), size_of(k), tag);
        live.emplace_back(*h, tag);
      }
    } else {
      const size_t i = rng() % live.size();
      if (writing && live[i].first == *writing) continue;   // a transfer is writing it: not ours to free
      p.free(live[i].first);
      live.erase(live.begin() + static_cast<long>(i));
    }
  }
  stop = true;
  writer.join();
  INFO("writes " << writes << ", moves " << p.moves());
  p.compact();
  REQUIRE(p.moves() > 100);
  REQUIRE(writes >= 300);
  for (const auto& [h, tag] : live) REQUIRE(r.all(p.offset(h), size_of(h.kind), tag));
  for (const auto& [h, tag] : live) p.free(h);
  REQUIRE(p.free_bytes() == region);
}
