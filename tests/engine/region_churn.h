// The owner's side of the tests where a transfer writes pinned slots of a unified region while page
// allocations compact it (an in-process writer thread in engine.test_cache_pools_region, real UCX puts in
// cluster.test_region_compaction_ucx). The writer thread waits on `changed`, picks a slot of `live` under
// `mu`, pins it, writes it with the lock released, records the slot's new tag, bumps `writes` and
// notifies `wrote`; the owner never frees the slot in `writing`.
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "engine/kv_cache.h"

namespace k3::test {

// Every KDA layer's state and conv window of a slot, read at its rows now.
inline std::vector<uint8_t> slot_image(CachePools& pools, const ModelConfig& cfg, int slot) {
  std::vector<uint8_t> out;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    if (cfg.layer_kind(l) != LayerKind::Kda) continue;
    for (bool conv : {false, true}) {
      const int32_t r = conv ? pools.conv_row(slot) : pools.state_row(slot);
      Tensor row = (conv ? pools.kda_conv(l) : pools.kda_state(l)).slice_rows(r, r + 1);
      const auto* p = static_cast<const uint8_t*>(row.data());
      out.insert(out.end(), p, p + row.nbytes());
    }
  }
  return out;
}

struct SlotChurn {
  std::mutex mu;
  std::condition_variable changed, wrote;
  std::vector<std::pair<int, uint8_t>> live;   // slots the writer may write, and the tag each must hold
  std::optional<int> writing;                  // the slot the writer holds pinned now
  bool stop = false;
  uint64_t writes = 0;

  // `cycles` rounds of: slots into the free room (each filled with a fresh tag by `fill`), about half of
  // them freed (holes), pages until none fits (the last ones move slots into the holes), the pages freed.
  // After each change the owner lets the writer finish one more write.
  void run(CachePools& pools, int cycles, const std::function<void(int slot, uint8_t tag)>& fill) {
    auto let_writer_in = [&](std::unique_lock<std::mutex>& lk) {
      if (live.empty()) return;
      const uint64_t seen = writes;
      wrote.wait_for(lk, std::chrono::seconds(30), [&] { return writes > seen; });
    };
    std::mt19937 rng(4);
    uint8_t next = 1;
    std::vector<int32_t> pages;
    for (int cycle = 0; cycle < cycles; ++cycle) {
      std::unique_lock lk(mu);
      while (auto s = pools.alloc_slot()) {
        fill(*s, next);
        live.emplace_back(*s, next);
        next = next == 255 ? 1 : next + 1;
        changed.notify_all();
        let_writer_in(lk);
      }
      for (size_t i = 0; i < live.size();) {
        if (rng() % 2 == 0 && writing != live[i].first) {   // the writer's slot is not ours to free
          pools.free_slot(live[i].first);
          live.erase(live.begin() + static_cast<long>(i));
          let_writer_in(lk);
        } else {
          ++i;
        }
      }
      while (auto p = pools.alloc_pages(1)) {
        pages.push_back(p->at(0));
        let_writer_in(lk);
      }
      for (int32_t p : pages) pools.release_page(p);
      pages.clear();
    }
    {
      std::lock_guard lk(mu);
      stop = true;
    }
    changed.notify_all();
  }

  // Whether every live slot holds its tag in every byte.
  bool all_hold(CachePools& pools, const ModelConfig& cfg) {
    for (const auto& [slot, tag] : live) {
      const auto img = slot_image(pools, cfg, slot);
      for (uint8_t v : img)
        if (v != tag) return false;
    }
    return true;
  }
};

}  // namespace k3::test
