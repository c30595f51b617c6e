// The prefill side feeds a DCP group through the existing layer-indexed transfer plan: a PP2 prefill's
// stage images, planned (transfer/plan.h) against the ADDRS of every rank of a DCP group and applied to
// the ranks' regions (transfer/pool.h layout), read back with each rank's own cache layout
// (decode_node/region_image.h + rank_cache_config), are exactly the slices the rank forward imports
// (rank_image, the independent restatement the decode tests use), and imported in place from the
// region's tables (import_caches_from) they are the same bytes in the rank's caches. Byte for byte, for
// DCP1/2/4 and prompts whose length does not divide evenly over the ranks.
#include <catch2/catch.hpp>

#include <cstring>

#include "decode_node/region_image.h"
#include "tests/ranks/rank_scenario.h"
#include "transfer/plan.h"
#include "transfer/pool.h"

using namespace k3;
using namespace k3::test::ranks;

TEST_CASE("PP2 prefill writes every rank of a DCP group through the transfer plan", "[ranks][transfer]") {
  const int dcp = GENERATE(1, 2, 4);
  const Scenario sc = make_scenario(4, 70 + dcp, 2, 0);
  auto be = make_cpu_backend({.threads = 1});
  auto eng = Engine::create(*be, sc.cfg, sc.weights, reference_options()).value();
  const CacheLayout full = cache_layout(sc.cfg, *be).value();
  const transfer::PrefillLayout pre{.partition = {4, 4}};
  REQUIRE(pre.validate(full).is_ok());
  transfer::DecodeLayout dec;
  for (int i = 0; i < dcp; ++i) dec.ranks.push_back(static_cast<uint32_t>(i));
  dec.kda_head_sliced = true;

  for (const auto& prompt : sc.prompts) {
    const uint32_t T = static_cast<uint32_t>(prompt.size());
    SeqCache seq = eng->open().value();
    REQUIRE(eng->prefill(seq, prompt).is_ok());
    std::vector<uint8_t> whole;
    export_caches(*be, eng->caches(), seq, 0, sc.cfg.num_hidden_layers, whole);

    // Every rank: geometry, pool, allocation, its ADDRS entries, a poisoned region.
    std::vector<std::unique_ptr<transfer::RankPool>> pools;
    std::vector<transfer::RankAllocation> allocs(dcp);
    std::vector<std::vector<uint8_t>> regions(dcp);
    protocol::Addrs addrs{.request_id = 7};
    for (int i = 0; i < dcp; ++i) {
      const uint64_t base = 0x100000ull * (i + 1);
      auto geo = transfer::RankPoolGeometry::for_rank(full, dec, i, 1, base, 4, 64, 2);
      REQUIRE(geo.is_ok());
      pools.push_back(transfer::RankPool::create(*geo).value());
      const uint32_t rows = dec.rows_on(i, T);
      allocs[i].rank = i;
      allocs[i].pages = pools[i]->allocate_pages((rows + 3) / 4).value();
      allocs[i].slot = pools[i]->allocate_slot().value();
      transfer::append_addrs(pools[i]->geometry(), allocs[i], addrs);
      regions[i].assign(geo->region_bytes(), 0xA5);
    }
    auto dest = transfer::DecodeDestinations::from_addrs(addrs);
    REQUIRE(dest.is_ok());

    // Each stage plans and applies its own writes from the packed image of its layers.
    for (uint32_t s = 0; s < pre.num_stages(); ++s) {
      const auto layers = pre.stage_layers(full, s);
      std::vector<uint8_t> image;
      export_caches(*be, eng->caches(), seq, static_cast<int>(layers.front()), static_cast<int>(layers.back()) + 1, image);
      const auto source = transfer::pack_stage_source(full, pre, s, T);
      REQUIRE(image.size() == source.total_bytes);
      auto ops = transfer::plan_stage_writes(full, pre, dec, source, *dest);
      INFO(ops.status().to_string());
      REQUIRE(ops.is_ok());
      for (const auto& op : *ops) {
        const uint64_t base = pools[op.dst_rank]->geometry().base;
        REQUIRE(op.dst_addr >= base);
        REQUIRE(op.dst_addr - base + op.length <= regions[op.dst_rank].size());
        std::memcpy(regions[op.dst_rank].data() + (op.dst_addr - base), image.data() + op.src_offset, op.length);
      }
    }
    eng->close(seq);

    for (int i = 0; i < dcp; ++i) {
      const RankLayout g{.dcp = dcp, .kv_partitions = dcp, .rank = i};
      const CacheLayout mine = cache_layout(rank_cache_config(sc.cfg, g), *be).value();
      auto got = decode::packed_image_from_region(mine, pools[i]->geometry(), allocs[i], regions[i],
                                                  static_cast<uint32_t>(dcp_rows_on(g, T)));
      INFO("DCP" << dcp << " rank " << i << " T " << T << ": " << got.status().to_string());
      REQUIRE(got.is_ok());
      CHECK(*got == rank_image(full, mine, g, T, whole));

      // Read in place from the region's tables (what a GPU rank does on the device), the same bytes land in
      // the rank's caches: exported again, they are the image.
      const auto rows = static_cast<uint32_t>(dcp_rows_on(g, T));
      const int L = sc.cfg.num_hidden_layers;
      CachePools caches(*be, rank_cache_config(sc.cfg, g), 0, L, reference_options().cache);
      const decode::RegionEntries entries{.pages = allocs[i].pages.page_ids(), .slot = allocs[i].slot.slot()};
      auto tables = decode::region_tables(mine, pools[i]->geometry(), entries, regions[i],
                                          transfer::MemoryType::Host, rows);
      INFO(tables.status().to_string());
      REQUIRE(tables.is_ok());
      CHECK(tables->image.total_bytes == got->size());
      SeqCache s = caches.open().value();
      REQUIRE(caches.reserve(s, rows).is_ok());
      Status st = import_caches_from(*be, caches, s, 0, L, rows, tables->tables);
      INFO(st.to_string());
      REQUIRE(st.is_ok());
      s.num_tokens = rows;
      std::vector<uint8_t> back;
      export_caches(*be, caches, s, 0, L, back);
      CHECK(back == *got);
      // Tables in another memory than the caches are refused, naming it.
      CacheTables elsewhere = tables->tables;
      elsewhere.device = Device::Cuda;
      Status refused = import_caches_from(*be, caches, s, 0, L, rows, elsewhere);
      CHECK(refused.message().find("another memory than the pools") != std::string::npos);
      caches.close(s);
    }
  }
}
