// decode_node/region_image: reading a request back out of a decode rank's transfer region must give
// exactly the packed image the prefill side sent. The region is filled by the real transfer planner
// (plan_stage_writes over append_addrs of a real RankPool allocation, with fragmented pages and a
// non-zero slot), so the reader is checked against an independent writer, for random layer patterns
// and prompt lengths around page boundaries.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "decode_node/region_image.h"
#include "tests/transfer/pd_scenario.h"
#include "transfer/plan.h"

using namespace k3;
using namespace k3::transfer;

TEST_CASE("packed_image_from_region inverts the planned writes of a one-rank DP group", "[cluster]") {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 12; ++trial) {
    std::string pattern;
    const int layers = std::uniform_int_distribution<int>(2, 9)(rng);
    for (int l = 0; l < layers; ++l) pattern += std::uniform_int_distribution<int>(0, 2)(rng) == 0 ? 'M' : 'K';
    pattern[0] = 'M';
    pattern[layers - 1] = 'K';
    const auto model = test::pd::model_from_pattern(pattern, 4);
    const uint32_t page_size = 4, tokens = std::uniform_int_distribution<uint32_t>(1, 23)(rng);
    INFO("layers " << pattern << " tokens " << tokens);
    const DecodeLayout decode{.ranks = {0}};
    const uint64_t base = 0x10000;  // the region's published address (any value: the test indexes a vector)
    auto geo = RankPoolGeometry::for_rank(model, decode, 0, 0, base, page_size, 16, 3);
    REQUIRE(geo.is_ok());
    auto pool = RankPool::create(*geo);
    REQUIRE(pool.is_ok());
    // Fragment the pool so the request's pages are not 0..n-1 and its slot is not 0.
    auto hole = (*pool)->allocate_pages(3).value();
    auto keep = (*pool)->allocate_pages(1).value();
    auto first_slot = (*pool)->allocate_slot().value();
    hole.release();
    RankAllocation alloc{.rank = 0, .pages = (*pool)->allocate_pages((tokens + page_size - 1) / page_size).value(),
                         .slot = (*pool)->allocate_slot().value()};
    protocol::Addrs addrs{.request_id = 1};
    append_addrs(*geo, alloc, addrs);
    auto dest = DecodeDestinations::from_addrs(addrs);
    REQUIRE(dest.is_ok());

    const PrefillLayout prefill{.partition = {static_cast<uint32_t>(layers)}};
    const StageSource src = pack_stage_source(model, prefill, 0, tokens);
    const std::vector<uint8_t> sent = test::pd::fill_source(model, src);
    auto ops = plan_stage_writes(model, prefill, decode, src, *dest);
    REQUIRE(ops.is_ok());
    std::vector<uint8_t> region(geo->region_bytes(), 0xEE);
    for (const WriteOp& op : *ops) {
      REQUIRE(op.dst_addr >= base);
      REQUIRE(op.dst_addr - base + op.length <= region.size());
      std::memcpy(region.data() + (op.dst_addr - base), sent.data() + op.src_offset, op.length);
    }
    auto image = decode::packed_image_from_region(model, *geo, alloc, region, tokens);
    REQUIRE(image.is_ok());
    CHECK(*image == sent);

    // A region shorter than the geometry says is refused, naming what lies outside it.
    std::vector<uint8_t> short_region(region.begin(), region.begin() + region.size() / 4);
    auto bad = decode::packed_image_from_region(model, *geo, alloc, short_region, tokens);
    REQUIRE_FALSE(bad.is_ok());
    CHECK(bad.status().message().find("outside the region") != std::string::npos);
    // More tokens than the request's pages hold is refused too.
    auto too_many = decode::packed_image_from_region(model, *geo, alloc, region,
                                                     static_cast<uint32_t>(alloc.pages.page_ids().size() * page_size + 1));
    CHECK_FALSE(too_many.is_ok());
  }
}
