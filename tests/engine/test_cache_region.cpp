// The unified cache region on the CPU backend: its layout (every entry on a whole row of its layer's
// view), the real kernels on its views giving the bits they give on separate pools, before and after
// slots move, and a writer standing for a transfer that pins slots and writes through the views while
// allocations compact the region: no write lands in a moved slot.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "engine/cache_region.h"
#include "engine/kv_cache.h"
#include "tests/engine/model_fixture.h"
#include "tests/kernels/kda_test_util.h"

using namespace k3;
using namespace k3::test;

namespace {

struct Rig {
  ModelConfig cfg = tiny_config();
  std::unique_ptr<Backend> be = make_cpu_backend({.threads = 2});
  CacheLayout cache = cache_layout(cfg, *be).value();
  uint32_t layers = cache.num_main_layers();
  std::vector<uint32_t> kda = cache.layer_ids(LayerCache::Kda), mla = cache.layer_ids(LayerCache::Mla);
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("region layout: every entry on a whole row of its layer's view, blocks apart", "[region]") {
  Rig r;
  REQUIRE(!r.kda.empty());
  REQUIRE(!r.mla.empty());
  auto u = UnifiedRegionLayout::make(r.cache, 0, r.layers, 16, 10'000'000).value();
  REQUIRE(u.slot_block_bytes % u.state_bytes == 0);
  REQUIRE(u.slot_block_bytes % u.conv_bytes == 0);
  REQUIRE(u.region_bytes % u.page_bytes == 0);
  REQUIRE(u.page_block_bytes == r.mla.size() * u.page_bytes);
  REQUIRE(u.slot_block_bytes == r.kda.size() * (u.state_bytes + u.conv_bytes) + u.slot_padding_bytes());
  REQUIRE(u.slot_padding_bytes() < u.slot_block_bytes);
  // Entries of one block do not overlap and stay inside it.
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto [l, off] : u.state_offset) spans.emplace_back(off, off + u.state_bytes);
  for (auto [l, off] : u.conv_offset) spans.emplace_back(off, off + u.conv_bytes);
  std::sort(spans.begin(), spans.end());
  for (size_t i = 0; i < spans.size(); ++i) {
    REQUIRE(spans[i].second <= u.slot_block_bytes);
    if (i) REQUIRE(spans[i - 1].second <= spans[i].first);
  }
  // Block k of either end is row k * (block / entry) of every layer's view.
  for (uint64_t k : {0u, 1u, 5u}) {
    REQUIRE(uint64_t(u.state_row(k * u.slot_block_bytes)) * u.state_bytes == k * u.slot_block_bytes);
    REQUIRE(uint64_t(u.conv_row(k * u.slot_block_bytes)) * u.conv_bytes == k * u.slot_block_bytes);
    const uint64_t top = u.region_bytes - (k + 1) * u.page_block_bytes;
    REQUIRE(uint64_t(u.page_id(top)) * u.page_bytes == top);
  }
  // Bad input names what is wrong.
  REQUIRE_THAT(UnifiedRegionLayout::make(r.cache, 0, r.layers, 0, 1 << 20).status().message(), Catch::Contains("page_size"));
  REQUIRE_THAT(UnifiedRegionLayout::make(r.cache, 0, r.layers, 16, 100).status().message(), Catch::Contains("region_bytes"));
  REQUIRE_THAT(UnifiedRegionLayout::make(r.cache, 0, r.layers + 5, 16, 1 << 20).status().message(),
               Catch::Contains("layer range"));
  CacheLayout with_draft = CacheLayout::from_config(r.cfg, r.cache.dtypes, 1, r.cache.mla_row_bytes).value();
  REQUIRE_THAT(UnifiedRegionLayout::make(with_draft, 0, r.layers + 1, 16, 1 << 24).status().message(),
               Catch::Contains("draft"));
}

TEST_CASE("kernels on the region's views give the bits of separate pools, before and after slots move", "[region]") {
  Rig r;
  std::mt19937 rng(7);
  const uint64_t slot_block = UnifiedRegionLayout::make(r.cache, 0, r.layers, 16, 1 << 30).value().slot_block_bytes;
  const uint64_t page_block = UnifiedRegionLayout::make(r.cache, 0, r.layers, 16, 1 << 30).value().page_block_bytes;
  CacheRegion region(*r.be, r.cache, 0, r.layers, 16, 6 * slot_block + 24 * page_block);
  const uint32_t k0 = r.kda.front(), m0 = r.mla.front();
  const int64_t H = r.cache.kda_heads, D = r.cache.kda_head_dim, P = r.cache.kda_proj_dim(),
                rows = r.cache.kda_conv_rows, W = r.cache.mla_row_width;

  // Five slots, then two freed in the middle: holes the next pages cannot use without a move.
  std::vector<CacheRegion::Handle> slots;
  for (int i = 0; i < 5; ++i) slots.push_back(*region.alloc_slot());
  region.free(slots[1]);
  region.free(slots[2]);
  const std::vector<CacheRegion::Handle> live = {slots[0], slots[3], slots[4]};
  // Reference pools: slot i of the sequence is row i there.
  Tensor ref_state = randn({3, H, D, D}, rng, 0.5f), ref_conv = randn({3, rows, 3 * P}, rng);
  auto load = [&] {
    for (int i = 0; i < 3; ++i) {
      std::memcpy(region.state(k0).slice_rows(region.state_row(live[i]), region.state_row(live[i]) + 1).data(),
                  ref_state.slice_rows(i, i + 1).data(), ref_state.nbytes() / 3);
      std::memcpy(region.conv(k0).slice_rows(region.conv_row(live[i]), region.conv_row(live[i]) + 1).data(),
                  ref_conv.slice_rows(i, i + 1).data(), ref_conv.nbytes() / 3);
    }
  };
  load();
  auto rows_of = [&](auto row) {
    std::vector<int32_t> v;
    for (auto h : live) v.push_back((region.*row)(h));
    return i32({3}, v);
  };
  // One step of both ops over the three sequences, on the region and on the reference pools.
  auto step = [&](int round) {
    INFO("round " << round);
    const std::vector<int32_t> lens = {5, 9, 3};
    KdaCase c = make_case(rng, lens, {0, 1, 2}, 3, H, D, D, false, -2.f, -0.1f);
    Tensor o_ref = Tensor::zeros({c.T, H, D}), o_reg = Tensor::zeros({c.T, H, D});
    r.be->kda_chunk(params(c, ref_state, o_ref, 64));
    auto p = params(c, region.state(k0), o_reg, 64);
    p.slots = rows_of(&CacheRegion::state_row);
    r.be->kda_chunk(p);
    REQUIRE(same_bytes(o_reg, o_ref));
    Tensor x = randn({c.T, 3 * P}, rng), w = randn({3 * P, rows + 1}, rng, 0.3f);
    Tensor y_ref = Tensor::zeros({c.T, 3 * P}), y_reg = Tensor::zeros({c.T, 3 * P});
    r.be->short_conv({.x = x, .w = w, .cache = ref_conv, .slots = i32({3}, {0, 1, 2}), .cu_seqlens = c.cu, .y = y_ref});
    r.be->short_conv({.x = x, .w = w, .cache = region.conv(k0), .slots = rows_of(&CacheRegion::conv_row),
                      .cu_seqlens = c.cu, .y = y_reg});
    REQUIRE(same_bytes(y_reg, y_ref));
    for (int i = 0; i < 3; ++i) {
      REQUIRE(same_bytes(region.state(k0).slice_rows(region.state_row(live[i]), region.state_row(live[i]) + 1),
                         ref_state.slice_rows(i, i + 1)));
      REQUIRE(same_bytes(region.conv(k0).slice_rows(region.conv_row(live[i]), region.conv_row(live[i]) + 1),
                         ref_conv.slice_rows(i, i + 1)));
    }
  };
  step(0);
  // Pages until the gap is gone; the next one needs the slot holes, so the last slots move down.
  std::vector<CacheRegion::Handle> pages;
  const std::vector<int32_t> before = {region.state_row(live[1]), region.state_row(live[2])};
  while (auto pg = region.alloc_page()) pages.push_back(*pg);
  REQUIRE(region.moves() == 2);
  REQUIRE(region.state_row(live[1]) != before[0]);
  REQUIRE(region.state_row(live[2]) != before[1]);
  step(1);   // the moved slots carried their state and conv window

  // MLA decode over pages of the region against the same rows in a separate page pool.
  const int64_t n = 4;
  Tensor ref_pages = randn({n, 16, W}, rng);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = region.page_id(pages[size_t(i) * 3]);
    ids.push_back(id);
    std::memcpy(region.pages(m0).slice_rows(id, id + 1).data(), ref_pages.slice_rows(i, i + 1).data(), ref_pages.nbytes() / n);
  }
  const int64_t Hm = r.cfg.num_attention_heads, R = r.cfg.kv_lora_rank, Dr = W - R;
  Tensor ql = randn({2, Hm, R}, rng), qr = randn({2, Hm, Dr}, rng);
  auto decode = [&](const Tensor& cache, std::vector<int32_t> table) {
    Tensor o = Tensor::zeros({2, Hm, R}), lse = Tensor::zeros({2, Hm});
    r.be->mla_decode({.q_lat = ql, .q_rope = qr, .kv_cache = cache, .block_table = i32({2, 2}, table),
                      .seq_lens = i32({2}, {30, 19}), .o = o, .lse = lse, .scale = 0.1f});
    return std::make_pair(o, lse);
  };
  auto want = decode(ref_pages, {0, 1, 2, 3});
  auto got = decode(region.pages(m0), ids);
  REQUIRE(same_bytes(got.first, want.first));
  REQUIRE(same_bytes(got.second, want.second));

  for (auto h : pages) region.free(h);
  for (auto h : live) region.free(h);
  REQUIRE(region.free_bytes() == region.layout().region_bytes);
}

TEST_CASE("a transfer writing into pinned slots while allocations compact the region: no write lands in a moved slot",
          "[region]") {
  Rig r;
  const auto u = UnifiedRegionLayout::make(r.cache, 0, r.layers, 16, 1 << 30).value();
  CacheRegion region(*r.be, r.cache, 0, r.layers, 16, 8 * u.slot_block_bytes);
  const uint64_t start_free = region.free_bytes();
  // Every KDA entry of a slot holds its tag; the writer rewrites a slot's entries at the pinned rows
  // (what a transfer's put does), the main thread allocates and frees slots and pages around it.
  auto fill = [&](int32_t srow, int32_t crow, uint8_t tag) {
    for (uint32_t l : r.kda) {
      std::memset(region.state(l).slice_rows(srow, srow + 1).data(), tag, u.state_bytes);
      std::memset(region.conv(l).slice_rows(crow, crow + 1).data(), tag, u.conv_bytes);
    }
  };
  auto holds = [&](CacheRegion::Handle h, uint8_t tag) {
    for (uint32_t l : r.kda) {
      const auto* s = static_cast<const uint8_t*>(region.state(l).slice_rows(region.state_row(h), region.state_row(h) + 1).data());
      const auto* c = static_cast<const uint8_t*>(region.conv(l).slice_rows(region.conv_row(h), region.conv_row(h) + 1).data());
      for (uint64_t i = 0; i < u.state_bytes; ++i)
        if (s[i] != tag) return false;
      for (uint64_t i = 0; i < u.conv_bytes; ++i)
        if (c[i] != tag) return false;
    }
    return true;
  };
  std::mutex mu;
  std::condition_variable changed, wrote;
  std::vector<std::pair<CacheRegion::Handle, uint8_t>> live;
  std::optional<CacheRegion::Handle> writing;
  bool stop = false;
  uint64_t writes = 0;
  std::thread writer([&] {
    std::mt19937 rng(3);
    std::unique_lock lk(mu);
    for (;;) {
      changed.wait(lk, [&] { return stop || !live.empty(); });
      if (stop) return;
      const auto [h, tag] = live[rng() % live.size()];
      {
        CacheRegion::Pin pin(region, h);   // taken while the slot is known live
        writing = h;
        lk.unlock();
        fill(pin.state_row(), pin.conv_row(), tag);
        lk.lock();
      }
      writing.reset();
      ++writes;
      wrote.notify_all();
    }
  });
  std::mt19937 rng(4);
  std::vector<CacheRegion::Handle> pages;
  uint8_t next = 1;
  // Cycles of: slots into the free room, a random half of them freed (holes), pages until the region is
  // full (the last pages need the holes: slots move), the pages freed. The writer gets in between steps.
  auto let_writer_in = [&](std::unique_lock<std::mutex>& lk) {
    if (live.empty()) return;
    const uint64_t seen = writes;
    wrote.wait_for(lk, std::chrono::seconds(30), [&] { return writes > seen; });
  };
  for (int cycle = 0; cycle < 40; ++cycle) {
    std::unique_lock lk(mu);
    while (auto h = region.alloc_slot()) {
      fill(region.state_row(*h), region.conv_row(*h), next);
      live.emplace_back(*h, next);
      next = next == 255 ? 1 : next + 1;
      changed.notify_all();
      let_writer_in(lk);
    }
    for (size_t i = 0; i < live.size();) {
      if (rng() % 2 == 0 && !(writing && live[i].first == *writing)) {   // the transfer's slot: not ours to free
        region.free(live[i].first);
        live.erase(live.begin() + static_cast<long>(i));
        let_writer_in(lk);
      } else {
        ++i;
      }
    }
    while (auto pg = region.alloc_page()) {   // moves slots into the holes once the gap is gone
      pages.push_back(*pg);
      let_writer_in(lk);
    }
    for (auto h : pages) region.free(h);
    pages.clear();
  }
  {
    std::lock_guard lk(mu);
    stop = true;
  }
  changed.notify_all();
  writer.join();
  INFO("writes " << writes << ", moves " << region.moves());
  REQUIRE(region.moves() > 15);
  REQUIRE(writes >= 50);
  for (const auto& [h, tag] : live) REQUIRE(holds(h, tag));
  for (const auto& [h, tag] : live) region.free(h);
  for (auto h : pages) region.free(h);
  REQUIRE(region.free_bytes() == start_free);
}
