// transfer/gathered_writes: the puts of a real transfer plan to a DCP group (rows interleaved over the
// ranks, one put per row) gathered through a staging image write exactly the bytes the plan's puts write,
// with at least halved puts; plans whose runs are already coalesced (one rank) are left alone.
#include <catch2/catch.hpp>

#include <map>
#include <random>

#include "tests/transfer/pd_scenario.h"
#include "transfer/gathered_writes.h"
#include "transfer/plan.h"

using namespace k3;
using namespace k3::transfer;

namespace {

struct Planned {
  std::map<uint32_t, std::vector<WriteOp>> by_region;   // plan order within each region
  std::map<uint32_t, uint64_t> base, bytes;             // each region's base address and size
  std::vector<uint8_t> source;
};

// One stage of `layers` (pattern) writing `tokens` tokens to a decode layout of `ranks` DCP ranks, each
// rank's pool fragmented so its pages are not 0..n-1.
Planned plan_for(const std::string& pattern, uint32_t ranks, uint32_t tokens, uint32_t page_size) {
  const auto model = test::pd::model_from_pattern(pattern, 4);
  DecodeLayout decode;
  for (uint32_t r = 0; r < ranks; ++r) decode.ranks.push_back(r);
  decode.kda_head_sliced = true;
  Planned p;
  protocol::Addrs addrs{.request_id = 1};
  std::vector<std::unique_ptr<RankPool>> pools;
  std::vector<RankAllocation> allocs(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    const uint64_t base = 0x1000000ull * (r + 1);
    auto geo = RankPoolGeometry::for_rank(model, decode, r, r, base, page_size, 64, 2);
    REQUIRE(geo.is_ok());
    pools.push_back(RankPool::create(*geo).value());
    auto hole = pools[r]->allocate_pages(2).value();
    auto keep = pools[r]->allocate_pages(1).value();
    hole.release();
    keep.release();
    const uint32_t rows = decode.rows_on(r, tokens);
    allocs[r] = {.rank = r, .pages = pools[r]->allocate_pages((rows + page_size - 1) / page_size).value(),
                 .slot = pools[r]->allocate_slot().value()};
    append_addrs(*geo, allocs[r], addrs);
    p.base[r] = base;
    p.bytes[r] = geo->region_bytes();
  }
  auto dest = DecodeDestinations::from_addrs(addrs);
  REQUIRE(dest.is_ok());
  const PrefillLayout prefill{.partition = {static_cast<uint32_t>(pattern.size())}};
  const StageSource src = pack_stage_source(model, prefill, 0, tokens);
  p.source = test::pd::fill_source(model, src);
  auto ops = plan_stage_writes(model, prefill, decode, src, *dest);
  REQUIRE(ops.is_ok());
  for (const WriteOp& op : *ops) p.by_region[op.region_id].push_back(op);
  return p;
}

}  // namespace

TEST_CASE("gathered puts of a DCP plan write the plan's bytes with fewer puts", "[transfer]") {
  std::mt19937 rng(41);
  for (int trial = 0; trial < 10; ++trial) {
    const uint32_t ranks = trial % 4 == 3 ? 4 : 2;   // the model has 4 KDA heads: DCP2 or DCP4
    const uint32_t tokens = std::uniform_int_distribution<uint32_t>(40, 300)(rng);
    const uint32_t page_size = trial % 2 ? 16 : 4;
    std::string pattern = "KKKM";
    if (trial % 3 == 0) pattern = "MKKM";
    INFO("DCP" << ranks << ", " << tokens << " tokens, pages of " << page_size << ", layers " << pattern);
    const Planned p = plan_for(pattern, ranks, tokens, page_size);
    for (const auto& [region, ops] : p.by_region) {
      INFO("region " << region << ": " << ops.size() << " puts planned");
      const auto g = gather_writes(ops);
      REQUIRE(g.has_value());
      CHECK(g->writes.size() * 2 <= ops.size());
      uint64_t covered = 0;
      for (const RowGather& r : g->gathers) covered += r.rows * r.row_bytes;
      CHECK(covered == g->staged_bytes);
      std::vector<uint8_t> want(p.bytes.at(region), 0xEE), got(p.bytes.at(region), 0xEE), staging(g->staged_bytes);
      apply_writes(ops, p.source.data(), want.data(), p.base.at(region));
      apply_gathered(*g, p.source.data(), staging.data(), got.data(), p.base.at(region));
      CHECK(got == want);
    }
  }
}

TEST_CASE("gathering leaves already coalesced puts and short lists alone", "[transfer]") {
  // One rank: the plan's runs are whole pages already.
  const Planned p = plan_for("KKKMKKKM", 1, 200, 16);
  for (const auto& [region, ops] : p.by_region) CHECK_FALSE(gather_writes(ops).has_value());
  // Fewer than 8 puts.
  std::vector<WriteOp> few;
  for (uint64_t i = 0; i < 7; ++i) few.push_back({.src_offset = 64 * i, .dst_addr = 0x1000 + 16 * i, .length = 16});
  CHECK_FALSE(gather_writes(few).has_value());
}
