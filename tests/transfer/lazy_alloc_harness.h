// In-process harness of the lazy-alloc protocol (no sockets), shared by test_lazy_alloc.cpp and
// test_lazy_alloc_faults.cpp: one DecodeSide (DCP2, two rank pools) and three PrefillSide stages
// talk through a message queue the test controls. Writes "land" whenever the test says so between
// StartWrites and the flush, and every landing asserts decode still holds the memory.
#pragma once
#include <catch2/catch.hpp>

#include <deque>
#include <utility>
#include <functional>
#include <map>
#include <random>

#include "common/protocol/frame.h"
#include "transfer/lazy_alloc_decode.h"
#include "transfer/lazy_alloc_prefill.h"

namespace k3::transfer::lazy_alloc_test {

using namespace k3::protocol;
using std::chrono::milliseconds;


constexpr uint64_t kId = 42;
constexpr uint32_t kTokens = 11;

inline CacheLayout model() {
  CacheLayout m;
  m.layers = {LayerCache::Kda, LayerCache::Kda, LayerCache::Mla, LayerCache::Kda, LayerCache::Mla, LayerCache::Kda};
  m.mla_row_bytes = 16;
  m.kda_heads = 4;
  m.kda_conv_rows = 3;
  m.kda_conv_head_bytes = 4;
  m.kda_state_head_bytes = 8;
  return m;
}

inline ProtocolTimeouts timeouts() {
  ProtocolTimeouts t;
  t.compute_wait = milliseconds(1000);
  t.transfer_wait = milliseconds(2000);
  t.addrs_wait = milliseconds(1500);
  t.quarantine = milliseconds(5000);
  t.tombstone_ttl = milliseconds(100000);
  return t;
}

struct Harness {
  static constexpr uint32_t kStages = 3;
  MetricsRegistry decode_metrics, prefill_metrics;
  std::vector<std::unique_ptr<RankPool>> pools;
  std::unique_ptr<DecodeSide> decode;
  std::vector<std::unique_ptr<PrefillSide>> stages;
  std::deque<std::pair<Peer, Message>> queue;
  std::vector<std::pair<Peer, Message>> sent_log;   // everything ever sent (for duplicate replays)
  std::vector<Message> router_inbox;
  std::map<uint32_t, std::vector<WriteOp>> posted;  // stage -> writes in flight
  std::map<uint32_t, int> batches;                  // stage -> StartWrites in flight (several when streaming)
  bool streaming = false;                           // step() runs the streaming schedule
  std::map<uint32_t, bool> cancelled;
  int decode_released = 0, prefill_released = 0, decode_ended = 0, prefill_ended = 0, ready = 0;
  std::vector<RequestState> decode_end_states;
  uint64_t start_free = 0;
  Millis now{0};

  // share (optional): where rank i's pool takes its ids from (8 pages, 2 slots), e.g. a decode engine's
  // cache pools (tests/cluster/test_cache_in_pool_faults.cpp).
  explicit Harness(const std::function<std::shared_ptr<PoolIds>(uint32_t)>& share = {}) {
    const DecodeLayout layout{{0, 1}, true};
    for (uint32_t i = 0; i < 2; ++i) {
      auto g = RankPoolGeometry::for_rank(model(), layout, i, /*region*/ i, 0x1000000 * (i + 1), 4, 8, 2).value();
      pools.push_back(RankPool::create(g).value());
      if (share) REQUIRE(pools.back()->share_ids(share(i)).is_ok());
      start_free += pools.back()->free_bytes();
    }
    decode = std::make_unique<DecodeSide>(
        DecodeSideConfig{.instance_id = "decode-a", .model = model(), .kda_head_sliced = true, .timeouts = timeouts()},
        std::vector<RankPool*>{pools[0].get(), pools[1].get()}, &decode_metrics);
    for (uint32_t s = 0; s < kStages; ++s)
      stages.push_back(std::make_unique<PrefillSide>(
          PrefillSideConfig{.instance_id = "prefill-a", .stage = s, .model = model(), .prefill = {{2, 2, 2}},
                            .decode_kda_head_sliced = true, .timeouts = timeouts()},
          &prefill_metrics));
  }

  uint64_t free_bytes() const {
    uint64_t f = 0;
    for (const auto& p : pools) f += p->free_bytes();
    return f;
  }

  void take(const Actions& actions, bool from_decode) {
    for (const Action& a : actions) {
      if (auto* s = std::get_if<SendAction>(&a)) {
        // Every message crosses the wire codec, as it would between processes.
        auto back = decode_frame(encode(s->message));
        queue.emplace_back(s->to, back);
        sent_log.emplace_back(s->to, back);
      } else if (auto* w = std::get_if<StartWritesAction>(&a)) {
        REQUIRE_FALSE(from_decode);
        REQUIRE(decode->holds_memory(w->request_id));
        const uint32_t stage = w->ops.empty() ? 0 : w->ops.front().src_stage;
        auto& p = posted[stage];
        p.insert(p.end(), w->ops.begin(), w->ops.end());
        ++batches[stage];
      } else if (std::get_if<CancelWritesAction>(&a)) {
        REQUIRE_FALSE(from_decode);
      } else if (std::get_if<ReadyAction>(&a)) {
        REQUIRE(from_decode);
        ++ready;
      } else if (std::get_if<ReleasedAction>(&a)) {
        (from_decode ? decode_released : prefill_released)++;
      } else if (auto* e = std::get_if<RequestEndedAction>(&a)) {
        if (from_decode) {
          ++decode_ended;
          decode_end_states.push_back(e->state);
        } else {
          ++prefill_ended;
        }
      }
    }
  }

  static Message decode_frame(const std::vector<uint8_t>& bytes) {
    auto m = protocol::decode(bytes);
    REQUIRE(m.is_ok());
    return m.value();
  }

  void deliver(const Peer& to, const Message& m) {
    if (to.role == Role::Router) router_inbox.push_back(m);
    else if (to.role == Role::Decode) take(decode->on_message(m, now), true);
    else take(stages.at(to.stage)->on_message(m, now), false);
  }

  void deliver_all() {
    while (!queue.empty()) {
      auto [to, m] = queue.front();
      queue.pop_front();
      deliver(to, m);
    }
  }

  // Writes of `stage` land now (decode must still hold the memory), then the flush completes.
  void flush(uint32_t stage, Status result = Status::ok()) {
    auto it = posted.find(stage);
    if (it == posted.end()) return;
    CHECK(decode->holds_memory(kId));  // the deferred-release guarantee
    posted.erase(it);
    const int n = std::exchange(batches[stage], 0);
    for (int b = 0; b < n; ++b) take(stages[stage]->on_writes_flushed(kId, result, now), false);
  }

  void flush_all() {
    while (!posted.empty()) flush(posted.begin()->first);
  }

  Claim claim() const {
    return {.request_id = kId, .prompt_len = kTokens, .decode_ranks = {0, 1}, .prefill_instance = "prefill-a",
            .num_prefill_stages = kStages, .timeout_ms = 0};
  }
  Prefill prefill() const {
    return {.request_id = kId, .token_ids = std::vector<int32_t>(kTokens, 5), .sampling = {},
            .decode_instance = "decode-a", .decode_ranks = {0, 1}, .timeout_ms = 0};
  }
  void stage_computed(uint32_t s) {
    const StageSource src = pack_stage_source(model(), PrefillLayout{{2, 2, 2}}, s, kTokens);
    take(stages[s]->on_stage_computed(kId, src, s + 1 == kStages ? std::optional<int32_t>(77) : std::nullopt, now),
         false);
  }

  // Streaming: stage s begins (asks for ADDRS) / has its first `rows` rows computed.
  void stream_started(uint32_t s) {
    take(stages[s]->on_stream_started(kId, pack_stage_source(model(), PrefillLayout{{2, 2, 2}}, s, kTokens), now), false);
  }
  void rows_computed(uint32_t s, uint32_t rows) { take(stages[s]->on_rows_computed(kId, rows, now), false); }

  // The happy path as numbered steps, so faults can be injected after any prefix. Both schedules
  // allocate at step 3 and are ready after step 8.
  static constexpr int kSteps = 10;
  void step(int k) {
    if (streaming) return stream_step(k);
    switch (k) {
      case 0: take(decode->on_claim(claim(), now), true); break;
      case 1: for (auto& st : stages) take(st->on_prefill(prefill(), now), false); break;
      case 2: stage_computed(0); break;
      case 3: deliver_all(); break;                 // decode allocates, ADDRS -> stage 0 posts writes
      case 4: stage_computed(1); deliver_all(); break;
      case 5: stage_computed(2); deliver_all(); break;
      case 6: flush(0); deliver_all(); break;
      case 7: flush(1); deliver_all(); break;
      case 8: flush(2); deliver_all(); break;       // all TRANSFER_DONE -> DECODING
      case 9: take(decode->on_finished(kId, now), true); break;
    }
  }

  void stream_step(int k) {
    switch (k) {
      case 0: take(decode->on_claim(claim(), now), true); break;
      case 1: for (auto& st : stages) take(st->on_prefill(prefill(), now), false); break;
      case 2: stream_started(0); rows_computed(0, 4); break;
      case 3: deliver_all(); break;                 // decode allocates, ADDRS -> stage 0 writes rows [0, 4)
      case 4: stream_started(1); rows_computed(1, 4); rows_computed(0, 8); deliver_all(); break;
      case 5:                                       // stage 2 computes everything before its ADDRS arrives
        stage_computed(0); stream_started(2); stage_computed(1); rows_computed(2, 4); stage_computed(2);
        deliver_all();
        break;
      case 6: flush(0); deliver_all(); break;
      case 7: flush(1); deliver_all(); break;
      case 8: flush(2); deliver_all(); break;       // all TRANSFER_DONE -> DECODING
      case 9: take(decode->on_finished(kId, now), true); break;
    }
  }

  // After everything settled: memory back, one release and one end per side-record.
  void check_clean(bool decode_allocated) {
    CHECK(free_bytes() == start_free);
    CHECK(decode->num_live() == 0);
    for (auto& st : stages) CHECK(st->num_live() == 0);
    CHECK(decode_released == (decode_allocated ? 1 : 0));
    CHECK(decode_ended <= 1);
    for (const auto& p : pools) CHECK(p->stats().page_allocs == p->stats().page_frees);
  }

  // Replays every message ever sent: nothing may change any more.
  void replay_everything() {
    const uint64_t free_before = free_bytes();
    const int rel_d = decode_released, rel_p = prefill_released, end_d = decode_ended, end_p = prefill_ended;
    const auto log = sent_log;
    for (const auto& [to, m] : log) deliver(to, m);
    deliver_all();
    take(decode->on_claim(claim(), now), true);  // a late CLAIM cannot resurrect the id
    for (auto& st : stages) take(st->on_prefill(prefill(), now), false);
    deliver_all();
    CHECK(posted.empty());
    CHECK(free_bytes() == free_before);
    CHECK(decode_released == rel_d);
    CHECK(prefill_released == rel_p);
    CHECK(decode_ended == end_d);
    CHECK(prefill_ended == end_p);
  }
};

inline bool router_got_failed(const Harness& h) {
  for (const auto& m : h.router_inbox)
    if (std::holds_alternative<Failed>(m)) return true;
  return false;
}


}  // namespace k3::transfer::lazy_alloc_test
