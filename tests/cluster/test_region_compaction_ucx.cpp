// The engine's unified cache region registered with UCX (one registration of the whole region), and a
// transfer that writes pinned slots with real UCX puts from another worker while page allocations compact
// the region: no put lands in a moved slot, every slot keeps the bytes last written to it, and the region's
// bytes all come back. The writer is a UcxWriter on its own context and worker (as a prefill stage's);
// the region's owner sleeps on its worker's events in a progress thread (as a decode rank's loop).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "tests/engine/model_fixture.h"
#include "tests/engine/region_churn.h"
#include "tests/transfer/progressed_worker.h"
#include "transfer/ucx_writer.h"

using namespace k3;
using namespace k3::transfer;
using namespace std::chrono_literals;

namespace {

}  // namespace

TEST_CASE("UCX puts into pinned slots of a registered unified region while pages compact it never land in a moved slot",
          "[cluster][region][ucx]") {
  const ModelConfig cfg = test::tiny_config("k3-tiny");
  const WeightStore weights = random_weights(cfg, 11, DType::F32);
  auto backend = make_cpu_backend({.threads = 1});
  const UnifiedRegionLayout u =
      UnifiedRegionLayout::make(cache_layout(cfg, *backend).value(), 0, cfg.num_hidden_layers, 16, uint64_t(1) << 40).value();
  EngineOptions eo = test::engine_options(0, 4);
  eo.cache.region_bytes = 4 * u.slot_block_bytes + 8 * u.page_block_bytes;   // slots and pages must share
  auto engine = Engine::create(*backend, cfg, weights, eo).value();
  CachePools& pools = engine->caches();
  const Tensor& bytes = pools.region()->bytes();
  const uint64_t start_free = pools.region()->free_bytes();

  // One registration of the whole region; the writer unpacks its rkey once.
  test::ProgressedWorker owner;   // the region's owner, as a decode rank's loop
  auto mem = UcxMemory::map(owner.ctx, bytes.data(), bytes.nbytes()).value();
  auto wctx = UcxContext::create().value();
  auto wworker = UcxWorker::create(wctx).value();
  auto ep = wworker->connect(owner.worker->address(), /*peer_error_handling=*/false).value();
  const uint64_t base = reinterpret_cast<uint64_t>(mem->base());
  auto rkey = RemoteKey::unpack(ep, mem->packed_rkey().value(), base, mem->length()).value();
  auto writer = UcxWriter::create(wworker, std::make_shared<HostSourceReader>()).value();

  const auto kda = pools.layout().layer_ids(LayerCache::Kda);
  std::vector<uint8_t> source(std::max(u.state_bytes, u.conv_bytes));
  // The puts of one slot's rows (every KDA layer's state and conv window), all from `source`.
  auto slot_writes = [&](int32_t srow, int32_t crow) {
    std::vector<RemoteWrite> w;
    for (uint32_t l : kda) {
      w.push_back({source.data(), reinterpret_cast<uint64_t>(pools.kda_state(int(l)).slice_rows(srow, srow + 1).data()), u.state_bytes});
      w.push_back({source.data(), reinterpret_cast<uint64_t>(pools.kda_conv(int(l)).slice_rows(crow, crow + 1).data()), u.conv_bytes});
    }
    return w;
  };
  auto fill_local = [&](int slot, uint8_t tag) {   // the owner's own write of a fresh slot
    for (uint32_t l : kda) {
      std::memset(pools.kda_state(int(l)).slice_rows(pools.state_row(slot), pools.state_row(slot) + 1).data(), tag, u.state_bytes);
      std::memset(pools.kda_conv(int(l)).slice_rows(pools.conv_row(slot), pools.conv_row(slot) + 1).data(), tag, u.conv_bytes);
    }
  };

  test::SlotChurn churn;
  std::string failure;
  std::thread transfer([&] {   // no Catch macro here: Catch2 v2 is not thread-safe
    std::mt19937 rng(3);
    std::unique_lock lk(churn.mu);
    for (;;) {
      churn.changed.wait(lk, [&] { return churn.stop || !churn.live.empty(); });
      if (churn.stop) return;
      const auto [slot, tag] = churn.live[rng() % churn.live.size()];   // a copy: `live` changes while we write
      const uint8_t next = static_cast<uint8_t>(tag == 255 ? 1 : tag + 1);
      {
        auto pin = pools.pin_slot(slot);   // taken while the slot is known held: it cannot move now
        churn.writing = slot;
        const auto w = slot_writes(pin->state_row(), pin->conv_row());
        lk.unlock();
        std::fill(source.begin(), source.end(), next);
        const Status st = writer->write(*rkey, w, {});   // returns after the flush: every byte is in the region
        lk.lock();
        if (!st.is_ok() && failure.empty()) failure = st.to_string();
      }
      // The owner frees no slot while it is being written, so the entry is still there.
      for (auto& e : churn.live)
        if (e.first == slot) e.second = next;
      churn.writing.reset();
      ++churn.writes;
      churn.wrote.notify_all();
    }
  });
  churn.run(pools, 60, fill_local);
  transfer.join();
  INFO("UCX writes " << churn.writes << ", slot moves " << pools.slot_moves() << ", bytes put " << writer->stats().bytes);
  REQUIRE(failure.empty());
  REQUIRE(pools.slot_moves() > 10);
  REQUIRE(churn.writes >= 50);
  REQUIRE(churn.all_hold(pools, cfg));
  for (const auto& [slot, tag] : churn.live) pools.free_slot(slot);
  REQUIRE(pools.free_slots() == pools.total_slots());
  REQUIRE(pools.region()->free_bytes() == start_free);
}
