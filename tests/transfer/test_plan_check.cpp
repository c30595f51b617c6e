// End to end without a network: real pools -> ADDRS (through the wire codec) -> plans -> bytes applied to
// decode memory -> the independent checker. Also: the checker catches a corrupted or a missing write.
#include <catch2/catch.hpp>

#include <random>

#include "common/protocol/frame.h"
#include "transfer/plan_check.h"
#include "transfer/pool.h"

using namespace k3;
using namespace k3::transfer;

namespace {

CacheLayout model(uint32_t layers) {
  CacheLayout m;
  for (uint32_t l = 0; l < layers; ++l) m.layers.push_back(l % 4 == 3 ? LayerCache::Mla : LayerCache::Kda);
  m.layers.push_back(LayerCache::Draft);
  m.mla_row_bytes = 24;
  m.draft_row_bytes = 16;
  m.kda_heads = 8;
  m.kda_conv_rows = 3;
  m.kda_conv_head_bytes = 4;
  m.kda_state_head_bytes = 32;
  return m;
}

struct Run {
  CacheLayout m;
  PrefillLayout prefill;
  DecodeLayout decode;
  uint32_t tokens;
  std::vector<std::unique_ptr<RankPool>> pools;
  std::vector<RankAllocation> alloc;
  std::vector<std::vector<uint8_t>> memory;  // per rank index
  DecodeDestinations dest;
  std::vector<std::vector<WriteOp>> plans;   // per stage
  std::vector<std::vector<uint8_t>> sources; // per stage

  Run(uint32_t layers, std::vector<uint32_t> partition, DecodeLayout d, uint32_t T, uint64_t request)
      : m(model(layers)), prefill{std::move(partition)}, decode(std::move(d)), tokens(T) {
    protocol::Addrs addrs{.request_id = request};
    for (uint32_t i = 0; i < decode.group_size(); ++i) {
      auto g = RankPoolGeometry::for_rank(m, decode, i, 2, 0x7f0000000000ull + (uint64_t(i) << 32), 16, 64, 4);
      REQUIRE(g.is_ok());
      pools.push_back(RankPool::create(g.value()).value());
      auto burn = pools.back()->allocate_pages(3);  // the request's pages do not start at 0
      auto keep = pools.back()->allocate_pages(1);
      burn.value().release();
      const uint32_t rows = decode.rows_on(i, T);
      alloc.push_back({.rank = decode.ranks[i], .pages = pools.back()->allocate_pages((rows + 15) / 16).value(),
                       .slot = pools.back()->allocate_slot().value()});
      append_addrs(pools.back()->geometry(), alloc.back(), addrs);
      memory.emplace_back(pools.back()->geometry().region_bytes(), uint8_t(0xA5));
      keep.value().release();
    }
    auto wire = protocol::decode(protocol::encode(addrs));
    REQUIRE(wire.is_ok());
    dest = DecodeDestinations::from_addrs(std::get<protocol::Addrs>(wire.value())).value();
    for (uint32_t s = 0; s < prefill.num_stages(); ++s) {
      const StageSource src = pack_stage_source(m, prefill, s, T);
      sources.emplace_back(src.total_bytes);
      REQUIRE(fill_stage_source(m, src, request, sources.back()).is_ok());
      auto ops = plan_stage_writes(m, prefill, decode, src, dest);
      REQUIRE(ops.is_ok());
      plans.push_back(ops.value());
    }
  }

  void apply(const WriteOp& op) {
    for (uint32_t i = 0; i < decode.group_size(); ++i) {
      if (decode.ranks[i] != op.dst_rank) continue;
      const uint64_t off = op.dst_addr - pools[i]->geometry().base;
      REQUIRE(off + op.length <= memory[i].size());
      std::copy_n(sources[op.src_stage].begin() + long(op.src_offset), op.length, memory[i].begin() + long(off));
    }
  }
  void apply_all() {
    for (const auto& plan : plans)
      for (const auto& op : plan) apply(op);
  }
  Status verify(uint32_t i, uint64_t request) const {
    return verify_rank_region(m, decode, i, tokens, dest, request, pools[i]->geometry().base, memory[i]);
  }
};

}  // namespace

TEST_CASE("pools, ADDRS, plans and bytes agree with the independent checker", "[plan_check]") {
  std::mt19937_64 rng(99);
  const std::vector<DecodeLayout> layouts = {{{0}, true}, {{0, 1}, true}, {{3, 2, 1, 0}, true},
                                             {{0, 1, 2, 3, 4, 5, 6, 7}, true}, {{0, 1, 2, 3}, false}};
  for (const auto& d : layouts)
    for (const auto& partition : std::vector<std::vector<uint32_t>>{{20}, {5, 6, 9}, {1, 1, 1, 17}}) {
      const uint32_t T = 1 + uint32_t(rng() % 70);
      INFO("N=" << d.group_size() << " stages=" << partition.size() << " T=" << T);
      Run run(20, partition, d, T, 1000 + T);
      run.apply_all();
      for (uint32_t i = 0; i < d.group_size(); ++i) {
        const Status s = run.verify(i, 1000 + T);
        INFO(s.message());
        CHECK(s.is_ok());
        CHECK_FALSE(run.verify(i, 1001 + T).is_ok());  // another request's pattern does not match
      }
    }
}

TEST_CASE("the checker names a corrupted and a missing write", "[plan_check]") {
  Run run(8, {3, 5}, {{0, 1}, true}, 9, 7);
  SECTION("corrupted byte") {
    run.apply_all();
    REQUIRE(run.verify(1, 7).is_ok());
    // Flip the first byte of the first write to rank 1 from stage 1.
    for (const auto& op : run.plans[1])
      if (op.dst_rank == 1) {
        run.memory[1][op.dst_addr - run.pools[1]->geometry().base] ^= 0xFF;
        break;
      }
    const Status s = run.verify(1, 7);
    REQUIRE_FALSE(s.is_ok());
    CHECK(s.message().find("verify rank 1 layer") != std::string::npos);
    CHECK(s.message().find("expected") != std::string::npos);
  }
  SECTION("missing write") {
    for (uint32_t s = 0; s < run.plans.size(); ++s)
      for (size_t k = 0; k < run.plans[s].size(); ++k)
        if (!(s == 0 && k == run.plans[0].size() - 1)) run.apply(run.plans[s][k]);
    const WriteOp last = run.plans[0].back();
    const uint32_t i = last.dst_rank;
    CHECK_FALSE(run.verify(i, 7).is_ok());
    CHECK(run.verify(1 - i, 7).is_ok());
  }
}
