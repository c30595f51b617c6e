// Decode pool accounting: region geometry without overlap, all-or-nothing allocation, handles that free
// exactly once, a random alloc/free run against a reference set, concurrency, and ADDRS generation.
#include <catch2/catch.hpp>

#include <random>
#include <set>
#include <thread>

#include "transfer/plan.h"
#include "transfer/pool.h"

using namespace k3;
using namespace k3::transfer;
using protocol::EntryKind;

namespace {

CacheLayout small_model() {
  CacheLayout m;
  m.layers = {LayerCache::Kda, LayerCache::Mla, LayerCache::Kda, LayerCache::Kda, LayerCache::Mla, LayerCache::Draft};
  m.mla_row_bytes = 10;
  m.draft_row_bytes = 6;
  m.kda_heads = 4;
  m.kda_conv_rows = 3;
  m.kda_conv_head_bytes = 2;
  m.kda_state_head_bytes = 5;
  return m;
}

std::unique_ptr<RankPool> make_pool(uint32_t pages, uint32_t slots, uint32_t rank_index = 0,
                                    DecodeLayout layout = {{0}, true}) {
  auto g = RankPoolGeometry::for_rank(small_model(), layout, rank_index, 3, 0x10000, 4, pages, slots);
  REQUIRE(g.is_ok());
  auto p = RankPool::create(g.value());
  REQUIRE(p.is_ok());
  return std::move(p).value();
}

}  // namespace

TEST_CASE("region geometry tiles the region exactly", "[pool]") {
  const DecodeLayout layout{{4, 5}, true};
  auto g = RankPoolGeometry::for_rank(small_model(), layout, 1, 3, 0x10000, 4, 7, 3).value();
  CHECK(g.rank == 5);
  CHECK(g.mla_layer_ids == std::vector<uint32_t>{1, 4});
  CHECK(g.draft_layer_ids == std::vector<uint32_t>{5});
  CHECK(g.kda_layer_ids == std::vector<uint32_t>{0, 2, 3});
  CHECK(g.kda_conv_bytes == 3 * 3 * 2 * 2);  // [W-1, 3P/N], 2 of 4 heads
  CHECK(g.kda_state_bytes == 2 * 5);
  CHECK(g.page_bytes() == 4 * (2 * 10 + 6));
  CHECK(g.slot_bytes() == 3 * (g.kda_conv_bytes + g.kda_state_bytes));
  CHECK(g.region_bytes() == 7 * g.page_bytes() + 3 * g.slot_bytes());

  std::vector<int> cover(g.region_bytes(), 0);
  const auto mark = [&](uint64_t addr, uint64_t len) {
    REQUIRE(addr >= g.base);
    REQUIRE(addr - g.base + len <= cover.size());
    for (uint64_t b = 0; b < len; ++b) cover[addr - g.base + b]++;
  };
  for (uint32_t l : {1u, 4u, 5u}) mark(g.layer_pages_addr(l).value(), g.layer_pages_length(l));
  for (uint32_t s = 0; s < 3; ++s)
    for (uint32_t l : g.kda_layer_ids) {
      mark(g.kda_conv_addr(s, l).value(), g.kda_conv_bytes);
      mark(g.kda_state_addr(s, l).value(), g.kda_state_bytes);
    }
  CHECK(std::all_of(cover.begin(), cover.end(), [](int c) { return c == 1; }));
  CHECK_FALSE(g.layer_pages_addr(0).is_ok());
  CHECK(g.kda_conv_addr(3, 0).status().code() == Code::OutOfRange);
  CHECK(g.kda_conv_addr(0, 1).status().code() == Code::NotFound);
  RankPoolGeometry bad = g;
  bad.page_size = 0;
  CHECK_FALSE(RankPool::create(bad).is_ok());
}

TEST_CASE("allocation is all-or-nothing and handles free exactly once", "[pool]") {
  auto pool = make_pool(10, 2);
  const uint64_t start = pool->free_bytes();
  CHECK(start == pool->capacity_bytes());
  {
    auto a = pool->allocate_pages(4);
    REQUIRE(a.is_ok());
    CHECK(a->page_ids() == std::vector<uint32_t>{0, 1, 2, 3});
    CHECK(pool->free_bytes() == start - 4 * pool->geometry().page_bytes());
    auto too_many = pool->allocate_pages(7);
    CHECK(too_many.status().code() == Code::ResourceExhausted);
    CHECK(pool->free_pages() == 6);  // untouched by the refusal

    PageHandle moved = std::move(a).value();
    CHECK(moved.page_ids().size() == 4);
    PageHandle other = std::move(moved);
    CHECK(moved.empty());          // NOLINT: moved-from owns nothing
    moved.release();               // and releasing it frees nothing
    CHECK(pool->free_pages() == 6);
    other.release();
    other.release();               // idempotent
    CHECK(pool->free_pages() == 10);

    auto s1 = pool->allocate_slot();
    auto s2 = pool->allocate_slot();
    REQUIRE((s1.is_ok() && s2.is_ok()));
    CHECK(pool->allocate_slot().status().code() == Code::ResourceExhausted);
    SlotHandle keep = std::move(s1).value();
    keep = std::move(s2).value();  // move-assign frees the slot it held
    CHECK(pool->free_slots() == 1);
    auto zero = pool->allocate_pages(0);
    REQUIRE(zero.is_ok());
    CHECK(zero->empty());
  }
  CHECK(pool->free_bytes() == start);
  const PoolStats st = pool->stats();
  CHECK(st.page_allocs == st.page_frees);
  CHECK(st.slot_allocs == st.slot_frees);
  CHECK(st.slot_allocs == 2);
}

TEST_CASE("random alloc/free matches a reference set", "[pool]") {
  auto pool = make_pool(64, 8);
  const uint64_t start = pool->free_bytes();
  std::mt19937_64 rng(11);
  std::vector<PageHandle> pages;
  std::vector<SlotHandle> slots;
  for (int step = 0; step < 5000; ++step) {
    const int op = int(rng() % 4);
    if (op == 0) {
      auto h = pool->allocate_pages(uint32_t(rng() % 9));
      if (h.is_ok()) pages.push_back(std::move(h).value());
    } else if (op == 1 && !pages.empty()) {
      pages.erase(pages.begin() + long(rng() % pages.size()));
    } else if (op == 2) {
      auto s = pool->allocate_slot();
      if (s.is_ok()) slots.push_back(std::move(s).value());
      else CHECK(slots.size() == 8);
    } else if (!slots.empty()) {
      slots.erase(slots.begin() + long(rng() % slots.size()));
    }
    // Reference: live ids are distinct and the free counts are what is left.
    std::set<uint32_t> live;
    size_t n = 0;
    for (const auto& h : pages) {
      live.insert(h.page_ids().begin(), h.page_ids().end());
      n += h.page_ids().size();
    }
    REQUIRE(live.size() == n);
    REQUIRE(pool->free_pages() == 64 - n);
    REQUIRE(pool->free_slots() == 8 - slots.size());
    REQUIRE(pool->free_bytes() ==
            start - n * pool->geometry().page_bytes() - slots.size() * pool->geometry().slot_bytes());
  }
  pages.clear();
  slots.clear();
  CHECK(pool->free_bytes() == start);
}

TEST_CASE("concurrent allocation and release", "[pool]") {
  auto pool = make_pool(200, 16);
  const uint64_t start = pool->free_bytes();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 2000; ++i) {
        auto h = pool->allocate_pages(1 + uint32_t(rng() % 5));
        auto s = pool->allocate_slot();
        // handles die here: free once each
      }
    });
  for (auto& th : threads) th.join();
  CHECK(pool->free_bytes() == start);
  CHECK(pool->stats().page_allocs == pool->stats().page_frees);
}

TEST_CASE("append_addrs describes the allocation and feeds a valid plan", "[pool]") {
  const CacheLayout model = small_model();
  const DecodeLayout layout{{0, 1}, true};
  std::vector<std::unique_ptr<RankPool>> pools;
  for (uint32_t i = 0; i < 2; ++i) {
    auto g = RankPoolGeometry::for_rank(model, layout, i, 7, 0x100000 * (i + 1), 4, 16, 2).value();
    pools.push_back(RankPool::create(g).value());
  }
  const uint32_t T = 13;
  std::vector<RankAllocation> alloc;
  protocol::Addrs addrs{.request_id = 1};
  for (uint32_t i = 0; i < 2; ++i) {
    auto burn = pools[i]->allocate_pages(1 + i);  // so the request's pages do not start at 0
    const uint32_t rows = layout.rows_on(i, T);
    alloc.push_back({.rank = i, .pages = pools[i]->allocate_pages((rows + 3) / 4).value(),
                     .slot = pools[i]->allocate_slot().value()});
    append_addrs(pools[i]->geometry(), alloc.back(), addrs);
  }
  // Per rank: 2 MLA + 1 draft + 3 KDA * 2 entries, one page table.
  CHECK(addrs.entries.size() == 2 * (2 + 1 + 3 * 2));
  REQUIRE(addrs.page_tables.size() == 2);
  CHECK(addrs.page_tables[1].page_ids == alloc[1].pages.page_ids());
  for (const auto& e : addrs.entries) {
    const auto& g = pools[e.dest_rank]->geometry();
    CHECK(e.region_id == 7);
    CHECK(e.remote_addr >= g.base);
    CHECK(e.remote_addr + e.length <= g.base + g.region_bytes());
    if (e.kind == EntryKind::KdaState)
      CHECK(e.remote_addr == g.kda_state_addr(alloc[e.dest_rank].slot.slot().value(), e.layer_id).value());
  }
  auto dest = DecodeDestinations::from_addrs(addrs);
  REQUIRE(dest.is_ok());
  const PrefillLayout prefill{{2, 3}};
  for (uint32_t s = 0; s < 2; ++s) {
    auto ops = plan_stage_writes(model, prefill, layout, pack_stage_source(model, prefill, s, T), dest.value());
    REQUIRE(ops.is_ok());
    CHECK_FALSE(ops->empty());
  }
}

// Pages that come back are handed out lowest first, so a request placed on reused pages gets them ascending
// and adjacent as a fresh pool's first request does, and its plan coalesces into as few puts.
TEST_CASE("reused pages go out lowest first, and a later request's plan coalesces like the first's", "[pool]") {
  const CacheLayout model = small_model();
  const DecodeLayout layout{{0}, true};
  auto g = RankPoolGeometry::for_rank(model, layout, 0, 7, 0x100000, 4, 32, 4).value();
  auto pool = RankPool::create(g).value();
  const uint32_t T = 29;  // 8 pages of 4 rows
  const PrefillLayout prefill{{5}};  // one stage: every main layer, and the draft layer
  const auto plan_for = [&](const RankAllocation& a) {
    protocol::Addrs addrs{.request_id = 1};
    append_addrs(pool->geometry(), a, addrs);
    auto dest = DecodeDestinations::from_addrs(addrs);
    REQUIRE(dest.is_ok());
    auto ops = plan_stage_writes(model, prefill, layout, pack_stage_source(model, prefill, 0, T), dest.value());
    REQUIRE(ops.is_ok());
    return ops->size();
  };
  size_t fresh_ops = 0;
  {
    auto a = pool->allocate_pages(4).value();  // three requests; all end (the last one first)
    auto b = pool->allocate_pages(4).value();
    RankAllocation first{.rank = 0, .pages = pool->allocate_pages(8).value(), .slot = pool->allocate_slot().value()};
    CHECK(first.pages.page_ids() == std::vector<uint32_t>{8, 9, 10, 11, 12, 13, 14, 15});
    fresh_ops = plan_for(first);
  }
  RankAllocation later{.rank = 0, .pages = pool->allocate_pages(8).value(), .slot = pool->allocate_slot().value()};
  CHECK(later.pages.page_ids() == std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(later.slot.slot().value() == 0);
  CHECK(plan_for(later) == fresh_ops);
  // One put per MLA and draft layer (their pages adjacent), one per KDA entry.
  CHECK(fresh_ops == 2 + 1 + 3 * 2);
}
