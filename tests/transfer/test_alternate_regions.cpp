// A rank with alternate regions (an EP decode group: every rank owns a region, each able to hold whole
// requests): the decode side allocates a request in the region its region_order puts first that has
// room, its ADDRS name that region (the plan still addresses the rank), and ending the request gives the
// memory back to that region's pool.
#include "tests/transfer/lazy_alloc_harness.h"

using namespace k3;
using namespace k3::transfer;
using namespace k3::protocol;
using namespace k3::transfer::lazy_alloc_test;

namespace {

struct AlternateSide {
  // Region 0 is rank 0's own; 5 and 6 are its alternates. 8 pages of 4 tokens and 2 slots each.
  std::vector<std::unique_ptr<RankPool>> pools;
  std::unique_ptr<DecodeSide> decode;
  std::vector<uint32_t> order{6, 0, 5};
  std::vector<std::vector<uint32_t>> asked;   // the candidates each call of region_order got

  AlternateSide() {
    const DecodeLayout layout{{0}, true};
    for (uint32_t region : {0u, 5u, 6u})
      pools.push_back(RankPool::create(RankPoolGeometry::for_rank(model(), layout, 0, region, 0x1000000ull * (region + 1),
                                                                  4, 8, 2)
                                           .value())
                          .value());
    DecodeSideConfig cfg{.instance_id = "d", .model = model(), .kda_head_sliced = true, .timeouts = timeouts()};
    cfg.region_order = [this](const Claim& c, std::vector<uint32_t> regions) {
      CHECK(c.prompt_len == kTokens);
      asked.push_back(regions);
      return order;
    };
    decode = std::make_unique<DecodeSide>(cfg, std::vector<RankPool*>{pools[0].get(), pools[1].get(), pools[2].get()},
                                          nullptr);
  }
  RankPool& pool(uint32_t region) {
    for (auto& p : pools)
      if (p->geometry().region_id == region) return *p;
    FAIL("no region " << region);
    return *pools[0];
  }
  // CLAIM + the only stage's COMPUTE_DONE: the ADDRS sent back (none when the request failed).
  std::optional<Addrs> start(uint64_t id) {
    const Millis now{0};
    decode->on_claim({.request_id = id, .prompt_len = kTokens, .decode_ranks = {0}, .prefill_instance = "p",
                      .num_prefill_stages = 1, .timeout_ms = 0},
                     now);
    for (const Action& a : decode->on_compute_done({.request_id = id, .stage = 0, .prompt_len = kTokens}, now))
      if (const auto* s = std::get_if<SendAction>(&a))
        if (const auto* addrs = std::get_if<Addrs>(&s->message)) return *addrs;
    return std::nullopt;
  }
};

}  // namespace

TEST_CASE("alternate regions: a request is allocated whole in the first region of region_order with room",
          "[lazy_alloc][ranks]") {
  AlternateSide s;
  const uint32_t pages = (kTokens + 3) / 4;
  auto first = s.start(1);
  REQUIRE(first);
  REQUIRE(s.asked.size() == 1);
  CHECK(s.asked[0] == std::vector<uint32_t>{0, 5, 6});  // the rank's own region first, then its alternates
  const auto* alloc = s.decode->allocation(1);
  REQUIRE(alloc);
  REQUIRE(alloc->size() == 1);
  CHECK((*alloc)[0].rank == 0);
  CHECK((*alloc)[0].region_id == 6);
  // Every entry addresses rank 0 in region 6, inside region 6's bytes; one page table, rank 0's.
  const RankPoolGeometry& g6 = s.pool(6).geometry();
  for (const AddrEntry& e : first->entries) {
    CHECK(e.dest_rank == 0);
    CHECK(e.region_id == 6);
    CHECK(e.remote_addr >= g6.base);
    CHECK(e.remote_addr + e.length <= g6.base + g6.region_bytes());
  }
  REQUIRE(first->page_tables.size() == 1);
  CHECK(first->page_tables[0].rank == 0);
  CHECK(s.pool(6).free_pages() == 8 - pages);
  CHECK(s.pool(6).free_slots() == 1);
  CHECK(s.pool(0).free_pages() == 8);
  CHECK(s.pool(5).free_pages() == 8);

  // Region 6 has one slot left: the second request takes it, the third falls through to region 0.
  REQUIRE(s.start(2));
  CHECK((*s.decode->allocation(2))[0].region_id == 6);
  REQUIRE(s.start(3));
  CHECK((*s.decode->allocation(3))[0].region_id == 0);
  CHECK(s.pool(6).free_slots() == 0);
  CHECK(s.pool(0).free_slots() == 1);

  // Ending a request gives its memory back to its own region's pool.
  const Millis now{0};
  s.decode->on_abort({.request_id = 1, .reason = AbortReason::ClientCancelled, .origin_role = Role::Router}, now);
  s.decode->tick(Millis{100000});
  CHECK(!s.decode->holds_memory(1));
  CHECK(s.pool(6).free_slots() == 1);
  CHECK(s.pool(6).free_pages() == 8 - pages);
  CHECK(s.pool(0).free_pages() == 8 - pages);
  CHECK(s.pool(5).free_pages() == 8);
}

TEST_CASE("alternate regions: no region with room fails the request and holds nothing", "[lazy_alloc][ranks]") {
  AlternateSide s;
  s.order = {5};  // an order may leave regions out: only those listed are tried
  auto hog = s.pool(5).allocate_pages(8);
  REQUIRE(hog.is_ok());
  CHECK(!s.start(7));
  CHECK(s.decode->state(7) == RequestState::Failed);
  CHECK(!s.decode->holds_memory(7));
  CHECK(s.pool(0).free_pages() == 8);
  CHECK(s.pool(6).free_pages() == 8);
}
