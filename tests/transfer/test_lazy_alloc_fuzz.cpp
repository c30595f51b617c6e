// Hostile inputs to both protocol sides: random messages (random fields, small id and stage ranges so
// they collide with live requests), random local events and times. Nothing may throw, and once every
// request is aborted and every write flushed, the pools are whole again.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "tests/protocol/random_messages.h"
#include "transfer/lazy_alloc_decode.h"
#include "transfer/lazy_alloc_prefill.h"

using namespace k3;
using namespace k3::transfer;
using namespace k3::protocol;
using std::chrono::milliseconds;

namespace {

CacheLayout model() {
  CacheLayout m;
  m.layers = {LayerCache::Kda, LayerCache::Mla, LayerCache::Kda, LayerCache::Mla};
  m.mla_row_bytes = 8;
  m.kda_heads = 2;
  m.kda_conv_rows = 1;
  m.kda_conv_head_bytes = 2;
  m.kda_state_head_bytes = 4;
  return m;
}

// Pulls random fields toward values that hit live state: ids 1..4, stages 0..2, ranks 0..1.
void steer(Message& m, std::mt19937_64& rng) {
  const uint64_t id = 1 + rng() % 4;
  const uint32_t stage = uint32_t(rng() % 3);
  std::visit([&](auto& x) {
    using T = std::decay_t<decltype(x)>;
    if constexpr (requires { x.request_id; }) x.request_id = id;
    if constexpr (requires { x.stage; }) x.stage = stage;
    if constexpr (std::is_same_v<T, Claim>) {
      x.decode_ranks = rng() % 4 ? std::vector<uint32_t>{0, 1} : x.decode_ranks;
      x.prefill_instance = "p";
      x.num_prefill_stages = rng() % 4 ? 1 : 1 + uint32_t(rng() % 3);
      x.prompt_len = rng() % 2 ? 5 : 9;
      x.timeout_ms = rng() % 3 ? 0 : rng() % 500;
    }
    if constexpr (std::is_same_v<T, Prefill>) {
      x.decode_instance = "d";
      x.decode_ranks = rng() % 4 ? std::vector<uint32_t>{0, 1} : x.decode_ranks;
      if (rng() % 4) x.token_ids.assign(5, 1);
    }
    if constexpr (std::is_same_v<T, ComputeDone>) x.prompt_len = rng() % 2 ? 5 : 9;
    if constexpr (std::is_same_v<T, Abort>) {
      x.origin_instance = rng() % 2 ? "p" : "d";
      x.origin_stage = stage;
    }
    if constexpr (std::is_same_v<T, Addrs>)
      for (auto& e : x.entries) e.dest_rank = uint32_t(rng() % 2), e.layer_id = uint32_t(rng() % 4);
  }, m);
}

}  // namespace

TEST_CASE("random messages and events never throw and never leak", "[lazy_alloc][fuzz]") {
  std::mt19937_64 rng(7);
  testing::RandomMessages rnd(8);
  const DecodeLayout layout{{0, 1}, true};
  int total_posted = 0, total_ready = 0;
  for (int run = 0; run < 900; ++run) {
    std::vector<std::unique_ptr<RankPool>> pools;
    uint64_t start = 0;
    for (uint32_t i = 0; i < 2; ++i) {
      pools.push_back(RankPool::create(RankPoolGeometry::for_rank(model(), layout, i, /*region*/ i, 0, 4, 6, 2).value()).value());
      start += pools.back()->free_bytes();
    }
    ProtocolTimeouts t;
    t.compute_wait = t.transfer_wait = t.addrs_wait = milliseconds(3000);
    t.quarantine = milliseconds(10000);
    DecodeSide decode({.instance_id = "d", .model = model(), .kda_head_sliced = true, .timeouts = t},
                      {pools[0].get(), pools[1].get()}, nullptr);
    PrefillSide stage({.instance_id = "p", .stage = 0, .model = model(), .prefill = {{4}},
                       .decode_kda_head_sliced = true, .timeouts = t}, nullptr);
    Millis now{0};
    std::set<uint64_t> posted;
    for (int k = 0; k < 200; ++k) {
      Message m = rnd.of(static_cast<MsgType>(1 + rng() % kMaxMsgType));
      steer(m, rng);
      const int what = int(rng() % 10);
      Actions out;
      REQUIRE_NOTHROW(out = what < 5 ? decode.on_message(m, now) : stage.on_message(m, now));
      if (what == 6) {
        const uint64_t id = 1 + rng() % 4;
        REQUIRE_NOTHROW(out = stage.on_stage_computed(id, pack_stage_source(model(), {{4}}, 0, rng() % 2 ? 5 : 9),
                                                      rng() % 2 ? std::optional<int32_t>(3) : std::nullopt, now));
      } else if (what == 7 && !posted.empty()) {
        const uint64_t id = *posted.begin();
        posted.erase(posted.begin());
        REQUIRE_NOTHROW(out = stage.on_writes_flushed(id, rng() % 2 ? Status::ok() : io_error("x"), now));
      } else if (what == 8) {
        now += milliseconds(rng() % 400);
        REQUIRE_NOTHROW(decode.tick(now));
        REQUIRE_NOTHROW(stage.tick(now));
        REQUIRE_NOTHROW(decode.on_finished(1 + rng() % 4, now));
      } else if (what == 9 && rng() % 10 == 0) {
        REQUIRE_NOTHROW(decode.on_peer_dead(Peer{Role::Prefill, "p", 0}, now));
      }
      // Route most of what the sides send to each other, so real protocol paths interleave with noise.
      for (size_t i = 0; i < out.size(); ++i) {
        if (auto* w = std::get_if<StartWritesAction>(&out[i])) {
          posted.insert(w->request_id);
          ++total_posted;
        }
        if (std::holds_alternative<ReadyAction>(out[i])) ++total_ready;
        auto* send = std::get_if<SendAction>(&out[i]);
        if (!send || rng() % 10 < 3 || out.size() > 64) continue;
        Actions more;
        if (send->to.role == Role::Decode) REQUIRE_NOTHROW(more = decode.on_message(send->message, now));
        if (send->to.role == Role::Prefill && send->to.stage == 0)
          REQUIRE_NOTHROW(more = stage.on_message(send->message, now));
        out.insert(out.end(), more.begin(), more.end());
      }
    }
    // Settle: flush what the stage posted, abort everything, let the quarantine pass.
    for (uint64_t id : posted) REQUIRE_NOTHROW(stage.on_writes_flushed(id, Status::ok(), now));
    for (uint64_t id = 1; id <= 4; ++id) {
      REQUIRE_NOTHROW(decode.on_abort(Abort{.request_id = id, .reason = AbortReason::Shutdown}, now));
      REQUIRE_NOTHROW(stage.on_abort(Abort{.request_id = id, .reason = AbortReason::Shutdown}, now));
    }
    now += milliseconds(20000);
    REQUIRE_NOTHROW(decode.tick(now));
    CHECK(decode.num_live() == 0);
    CHECK(stage.num_live() == 0);
    CHECK(pools[0]->free_bytes() + pools[1]->free_bytes() == start);
  }
  CHECK(total_posted > 0);  // the noise still reaches the deep states
  CHECK(total_ready > 0);
}
