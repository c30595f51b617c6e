// The lazy-alloc protocol driven in-process (no sockets): one DecodeSide (DCP2, two rank pools) and three
// PrefillSide stages talk through a message queue the test controls. Writes "land" whenever the test
// says so between StartWrites and the flush, and every landing asserts decode still holds the memory.
#include <catch2/catch.hpp>

#include <deque>
#include <map>
#include <random>

#include "common/protocol/frame.h"
#include "transfer/lazy_alloc_decode.h"
#include "transfer/lazy_alloc_prefill.h"

using namespace k3;
using namespace k3::transfer;
using namespace k3::protocol;
using std::chrono::milliseconds;

namespace {

constexpr uint64_t kId = 42;
constexpr uint32_t kTokens = 11;

TransferModelLayout model() {
  TransferModelLayout m;
  m.layers = {LayerCache::Kda, LayerCache::Kda, LayerCache::Mla, LayerCache::Kda, LayerCache::Mla, LayerCache::Kda};
  m.mla_row_bytes = 16;
  m.kda_heads = 4;
  m.kda_conv_rows = 3;
  m.kda_conv_head_bytes = 4;
  m.kda_state_head_bytes = 8;
  return m;
}

ProtocolTimeouts timeouts() {
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
  std::map<uint32_t, bool> cancelled;
  int decode_released = 0, prefill_released = 0, decode_ended = 0, prefill_ended = 0, ready = 0;
  std::vector<RequestState> decode_end_states;
  uint64_t start_free = 0;
  Millis now{0};

  Harness() {
    const DecodeLayout layout{{0, 1}, true};
    for (uint32_t i = 0; i < 2; ++i) {
      auto g = RankPoolGeometry::for_rank(model(), layout, i, 1, 0x1000000 * (i + 1), 4, 8, 2).value();
      pools.push_back(RankPool::create(g).value());
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
        posted[stage] = w->ops;
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
    take(stages[stage]->on_writes_flushed(kId, result, now), false);
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

  // The happy path as numbered steps, so faults can be injected after any prefix.
  static constexpr int kSteps = 10;
  void step(int k) {
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

bool router_got_failed(const Harness& h) {
  for (const auto& m : h.router_inbox)
    if (std::holds_alternative<Failed>(m)) return true;
  return false;
}

}  // namespace

TEST_CASE("happy path walks every state on both sides", "[lazy_alloc]") {
  Harness h;
  const std::vector<std::optional<RequestState>> decode_after = {
      RequestState::Claimed,      RequestState::Claimed,      RequestState::Claimed,  RequestState::Transferring,
      RequestState::Transferring, RequestState::Transferring, RequestState::Transferring,
      RequestState::Transferring, RequestState::Decoding,     RequestState::Finished};
  for (int k = 0; k < Harness::kSteps; ++k) {
    h.step(k);
    INFO("after step " << k);
    CHECK(h.decode->state(kId) == decode_after[k]);
    if (k == 1) CHECK(h.stages[0]->state(kId) == RequestState::Prefilling);
    if (k == 2) CHECK(h.stages[0]->state(kId) == RequestState::ComputeDone);
    if (k == 3) {
      CHECK(h.stages[0]->state(kId) == RequestState::Transferring);
      CHECK(h.stages[0]->writes_in_flight(kId));
      CHECK(h.decode->holds_memory(kId));
      CHECK(h.free_bytes() < h.start_free);
      // Only the first COMPUTE_DONE allocates: pages for ceil(6/4) and ceil(5/4) rows + one slot each.
      CHECK(h.pools[0]->free_pages() == 8 - 2);
      CHECK(h.pools[1]->free_pages() == 8 - 2);
      CHECK(h.pools[0]->free_slots() == 1);
    }
    if (k == 6) CHECK(h.stages[0]->state(kId) == RequestState::Finished);
  }
  CHECK(h.ready == 1);
  CHECK(h.decode_released == 1);
  CHECK(h.prefill_released == 3);
  CHECK(h.prefill_ended == 3);
  CHECK(h.decode_end_states == std::vector<RequestState>{RequestState::Finished});
  h.check_clean(true);
  CHECK(h.router_inbox.empty());
  CHECK(h.decode_metrics.counter_value(metric::kTransfers) == 3);
  CHECK(h.decode_metrics.counter_value(metric::kTransitions, {{"from", "TRANSFERRING"}, {"to", "DECODING"}}) == 1);
  CHECK(h.prefill_metrics.counter_value(metric::kBytes) == h.decode_metrics.counter_value(metric::kBytes));
  CHECK(h.decode_metrics.counter_value(metric::kBytes) > 0);
  CHECK(h.decode_metrics.gauge_value(metric::kPoolFreeBytes, {{"rank", "1"}}) == int64_t(h.pools[1]->free_bytes()));
  CHECK(h.decode_metrics.gauge_value(metric::kActiveRequests) == 0);
  h.replay_everything();
}

TEST_CASE("ABORT injected at every state, on either side, frees exactly once", "[lazy_alloc][abort]") {
  const int k_stop = GENERATE(range(1, Harness::kSteps));  // steps 0..k_stop-1 happened
  const int where = GENERATE(0, 1, 2, 3);
  // 0: router ABORT reaches decode first, then every stage; 1: stages first, then decode;
  // 2: only decode hears it (it must propagate); 3: only the last stage hears it (it must propagate).
  Harness h;
  for (int k = 0; k < k_stop; ++k) h.step(k);
  INFO("abort after step " << k_stop - 1 << ", delivery " << where);
  const Abort abort{.request_id = kId, .reason = AbortReason::ClientCancelled, .origin_role = Role::Router};
  if (where == 0 || where == 2) h.deliver({Role::Decode, "decode-a", 0}, abort);
  if (where == 0 || where == 1)
    for (uint32_t s = 0; s < Harness::kStages; ++s) h.deliver({Role::Prefill, "prefill-a", s}, abort);
  if (where == 1) h.deliver({Role::Decode, "decode-a", 0}, abort);
  if (where == 3) h.deliver({Role::Prefill, "prefill-a", 2}, abort);
  h.deliver_all();
  if (!h.posted.empty()) CHECK(h.decode->holds_memory(kId));  // writes may still land: memory stays
  h.flush_all();  // CancelWrites -> the flush completes -> ABORT_ACK / ABORT reaches decode
  h.deliver_all();

  // The last stage had not heard of the request (k_stop 1) or had already finished (k_stop 9): an ABORT
  // to it alone reaches nobody else, which is correct; the request then runs its normal course.
  const bool unreachable = where == 3 && (k_stop == 1 || k_stop == 9);
  if (unreachable) {
    CHECK(h.decode->state(kId) == (k_stop == 1 ? RequestState::Claimed : RequestState::Decoding));
    if (k_stop == 9) h.take(h.decode->on_finished(kId, h.now), true);
    else h.take(h.decode->on_abort(abort, h.now), true);
    h.deliver_all();
  } else {
    CHECK(h.decode->state(kId) == RequestState::Aborted);
    CHECK(h.decode_metrics.counter_value(metric::kFailures, {{"cause", "client_cancelled"}}) == 1);
  }
  h.check_clean(h.pools[0]->stats().page_allocs > 0);
  for (auto& st : h.stages) {
    const auto s = st->state(kId);
    if (k_stop == 1) continue;  // stages never got PREFILL
    REQUIRE(s.has_value());
    CHECK(is_terminal(*s));
  }
  CHECK(h.prefill_released == (k_stop >= 2 ? 3 : 0));  // each stage held its source KV from PREFILL on
  CHECK(h.ready == (k_stop == 9 ? 1 : 0));
  h.replay_everything();
}

TEST_CASE("decode waits for flushes after an abort during TRANSFERRING", "[lazy_alloc][abort]") {
  Harness h;
  for (int k = 0; k < 5; ++k) h.step(k);  // stages 0 and 1 are writing
  REQUIRE(h.posted.size() == 2);
  h.deliver({Role::Decode, "decode-a", 0},
            Abort{.request_id = kId, .reason = AbortReason::ClientCancelled, .origin_role = Role::Router});
  h.deliver_all();  // decode -> ABORT to stages; they cancel, acks wait for the flushes
  CHECK(h.decode->state(kId) == RequestState::Aborted);
  CHECK(h.decode->holds_memory(kId));
  h.flush(0);
  h.deliver_all();
  CHECK(h.decode->holds_memory(kId));  // stage 1 still has writes in flight
  h.flush(1);
  h.deliver_all();
  CHECK_FALSE(h.decode->holds_memory(kId));
  h.check_clean(true);
}

TEST_CASE("a silent stage holds memory until the quarantine passes", "[lazy_alloc][abort]") {
  Harness h;
  for (int k = 0; k < 4; ++k) h.step(k);  // stage 0 writing
  h.take(h.decode->on_abort(Abort{.request_id = kId, .reason = AbortReason::Shutdown, .origin_role = Role::Router},
                            h.now),
         true);
  h.queue.clear();  // the ABORT to the stages is lost
  h.now += milliseconds(4999);
  h.take(h.decode->tick(h.now), true);
  CHECK(h.decode->holds_memory(kId));
  h.now += milliseconds(1);
  h.take(h.decode->tick(h.now), true);
  CHECK_FALSE(h.decode->holds_memory(kId));
  CHECK(h.free_bytes() == h.start_free);
  CHECK(h.decode_released == 1);
}

TEST_CASE("deadline at decode's compute wait and transfer wait", "[lazy_alloc][deadline]") {
  SECTION("no COMPUTE_DONE within compute_wait") {
    Harness h;
    h.step(0);
    h.step(1);
    h.now = milliseconds(999);
    h.take(h.decode->tick(h.now), true);
    CHECK(h.decode->state(kId) == RequestState::Claimed);
    h.now = milliseconds(1000);
    h.take(h.decode->tick(h.now), true);
    CHECK(h.decode->state(kId) == RequestState::Expired);
    h.deliver_all();  // ABORT to the stages, FAILED to the router
    CHECK(router_got_failed(h));
    for (auto& st : h.stages) CHECK(st->state(kId) == RequestState::Aborted);
    h.check_clean(false);
    CHECK(h.decode_metrics.counter_value(metric::kFailures, {{"cause", "deadline"}}) == 1);
    h.replay_everything();
  }
  SECTION("claim timeout overrides the default") {
    Harness h;
    Claim c = h.claim();
    c.timeout_ms = 10;
    h.take(h.decode->on_claim(c, h.now), true);
    h.now = milliseconds(10);
    h.take(h.decode->tick(h.now), true);
    CHECK(h.decode->state(kId) == RequestState::Expired);
  }
  SECTION("not every TRANSFER_DONE within transfer_wait") {
    Harness h;
    for (int k = 0; k < 7; ++k) h.step(k);  // stage 0 done, stages 1-2 writing
    h.now = milliseconds(2000);
    h.take(h.decode->tick(h.now), true);
    CHECK(h.decode->state(kId) == RequestState::Expired);
    h.deliver_all();
    CHECK(h.decode->holds_memory(kId));  // stages 1 and 2 still flushing
    h.flush_all();
    h.deliver_all();
    h.check_clean(true);
    h.replay_everything();
  }
}

TEST_CASE("deadline at the prefill stage's ADDRS wait", "[lazy_alloc][deadline]") {
  Harness h;
  h.step(0);
  h.step(1);
  h.now = milliseconds(100);
  h.stage_computed(2);
  h.queue.clear();  // COMPUTE_DONE lost: ADDRS never comes
  h.now = milliseconds(1599);
  h.take(h.stages[2]->tick(h.now), false);
  CHECK(h.stages[2]->state(kId) == RequestState::ComputeDone);
  h.now = milliseconds(1600);
  h.take(h.stages[2]->tick(h.now), false);
  CHECK(h.stages[2]->state(kId) == RequestState::Expired);
  CHECK(h.prefill_released == 1);
  h.deliver_all();  // ABORT(origin stage 2) to decode, FAILED to router
  CHECK(router_got_failed(h));
  CHECK(h.decode->state(kId) == RequestState::Aborted);
  h.deliver_all();
  for (uint32_t s = 0; s < 2; ++s) CHECK(h.stages[s]->state(kId) == RequestState::Aborted);
  h.check_clean(false);
  h.replay_everything();
}

TEST_CASE("peer death fails every request of that peer", "[lazy_alloc][peer]") {
  const int k_stop = GENERATE(range(1, 9));
  SECTION("decode learns the prefill instance died") {
    Harness h;
    for (int k = 0; k < k_stop; ++k) h.step(k);
    h.take(h.decode->on_peer_dead(Peer{Role::Prefill, "prefill-a", 0}, h.now), true);
    CHECK(h.decode->state(kId) == RequestState::Failed);
    h.deliver_all();
    CHECK(router_got_failed(h));
    for (const auto& [to, m] : h.sent_log)  // nobody talks to the dead
      if (std::holds_alternative<Abort>(m)) CHECK(to.role != Role::Prefill);
    if (h.posted.empty() || k_stop <= 3) {
      CHECK(h.free_bytes() == h.start_free);
    } else {
      CHECK(h.decode->holds_memory(kId));  // a dead stage's posted writes might still land
      h.now += milliseconds(5000);
      h.take(h.decode->tick(h.now), true);
      CHECK(h.free_bytes() == h.start_free);
    }
    CHECK(h.decode_released == (k_stop > 3 ? 1 : 0));
    CHECK(h.decode_metrics.counter_value(metric::kFailures, {{"cause", "peer_dead"}}) == 1);
  }
  SECTION("the stages learn decode died") {
    Harness h;
    for (int k = 0; k < k_stop; ++k) h.step(k);
    const size_t mark = h.sent_log.size();
    int live = 0;
    std::vector<bool> was_live;
    for (auto& st : h.stages) {
      const auto s = st->state(kId);
      was_live.push_back(s && !is_terminal(*s));
      live += was_live.back();
    }
    for (auto& st : h.stages) h.take(st->on_peer_dead(Peer{Role::Decode, "decode-a", 0}, h.now), false);
    h.flush_all();  // cancelled writes complete or fail
    for (uint32_t s = 0; s < Harness::kStages; ++s)
      if (was_live[s]) CHECK(h.stages[s]->state(kId) == RequestState::Failed);
    CHECK(h.prefill_released == (k_stop >= 2 ? 3 : 0));
    for (auto& st : h.stages) CHECK(st->num_live() == 0);
    int failed_to_router = 0;
    for (size_t i = mark; i < h.sent_log.size(); ++i) {
      const auto& [to, m] = h.sent_log[i];
      CHECK(to.role != Role::Decode);  // nothing is sent to the dead
      failed_to_router += to.role == Role::Router && std::holds_alternative<Failed>(m);
    }
    CHECK(failed_to_router == live);
    CHECK(h.prefill_metrics.counter_value(metric::kFailures, {{"cause", "peer_dead"}}) == uint64_t(live));
  }
}

TEST_CASE("router death fails everything not finished", "[lazy_alloc][peer]") {
  Harness h;
  for (int k = 0; k < 9; ++k) h.step(k);  // DECODING
  h.take(h.decode->on_peer_dead(Peer{.role = Role::Router}, h.now), true);
  CHECK(h.decode->state(kId) == RequestState::Failed);
  h.check_clean(true);
}

TEST_CASE("write failure fails the request and releases everything", "[lazy_alloc]") {
  Harness h;
  for (int k = 0; k < 6; ++k) h.step(k);
  h.flush(1, io_error("ucp_put_nbx: connection reset"));
  h.deliver_all();
  CHECK(h.stages[1]->state(kId) == RequestState::Failed);
  CHECK(h.decode->state(kId) == RequestState::Aborted);
  CHECK(router_got_failed(h));
  h.flush_all();
  h.deliver_all();
  h.check_clean(true);
  // Stage 1 failed; decode forwarded the cause to stages 0 and 2 (all three share this registry).
  CHECK(h.prefill_metrics.counter_value(metric::kFailures, {{"cause", "transfer_failed"}}) == 3);
  CHECK(h.decode_metrics.counter_value(metric::kFailures, {{"cause", "transfer_failed"}}) == 1);
}

TEST_CASE("allocation failure refuses cleanly", "[lazy_alloc]") {
  Harness h;
  auto hog = h.pools[1]->allocate_pages(8);  // rank 1 has no page left
  h.step(0);
  h.step(1);
  h.step(2);
  h.deliver_all();
  CHECK(h.decode->state(kId) == RequestState::Failed);
  CHECK(h.pools[0]->free_pages() == 8);  // rank 0's partial allocation was returned
  CHECK(h.pools[0]->free_slots() == 2);
  CHECK(router_got_failed(h));
  h.deliver_all();
  for (auto& st : h.stages) CHECK(is_terminal(*st->state(kId)));
  CHECK(h.decode_metrics.counter_value(metric::kFailures, {{"cause", "alloc_failed"}}) == 1);
}

TEST_CASE("protocol violations and bad inputs are ignored with a reason", "[lazy_alloc]") {
  Harness h;
  const auto ignored = [](const Actions& a) {
    return a.size() == 1 && std::holds_alternative<IgnoredAction>(a[0]);
  };
  CHECK(ignored(h.decode->on_compute_done(ComputeDone{.request_id = 9}, h.now)));   // unknown id
  CHECK(ignored(h.decode->on_message(Tokens{}, h.now)));                           // not decode's message
  h.step(0);
  CHECK(ignored(h.decode->on_claim(h.claim(), h.now)));                            // duplicate claim
  CHECK(ignored(h.decode->on_compute_done(ComputeDone{.request_id = kId, .stage = 7, .prompt_len = kTokens},
                                          h.now)));                                 // stage out of range
  CHECK(ignored(h.decode->on_transfer_done(TransferDone{.request_id = kId, .stage = 0}, h.now)));  // before ADDRS
  CHECK(ignored(h.decode->on_finished(kId, h.now)));                               // not decoding
  CHECK(h.decode->state(kId) == RequestState::Claimed);
  Claim bad = h.claim();
  bad.request_id = 5;
  bad.decode_ranks = {0, 9};  // rank 9 is not served here
  Actions a = h.decode->on_claim(bad, h.now);
  CHECK(std::holds_alternative<SendAction>(a.at(0)));
  CHECK(h.decode->state(5) == RequestState::Failed);
  h.step(1);
  CHECK(ignored(h.stages[0]->on_addrs(Addrs{.request_id = kId}, h.now)));           // ADDRS before COMPUTE_DONE
  CHECK(ignored(h.stages[0]->on_writes_flushed(kId, Status::ok(), h.now)));        // nothing posted
}

TEST_CASE("ADDRS that does not fit the plan fails the stage and decode releases", "[lazy_alloc]") {
  Harness h;
  for (int k = 0; k < 3; ++k) h.step(k);
  auto [to, m] = h.queue.front();  // stage 0's COMPUTE_DONE
  h.queue.pop_front();
  h.deliver(to, m);  // decode allocates and queues ADDRS
  REQUIRE(h.queue.size() == 1);
  Addrs addrs = std::get<Addrs>(h.queue.front().second);
  h.queue.clear();
  const size_t before = addrs.entries.size();
  std::erase_if(addrs.entries, [](const AddrEntry& e) {  // lose layer 0's conv on rank 0
    return e.layer_id == 0 && e.kind == EntryKind::KdaConv && e.dest_rank == 0;
  });
  REQUIRE(addrs.entries.size() == before - 1);
  h.take(h.stages[0]->on_addrs(addrs, h.now), false);
  CHECK(h.stages[0]->state(kId) == RequestState::Failed);
  h.deliver_all();
  CHECK(h.decode->state(kId) == RequestState::Aborted);
  h.deliver_all();
  h.check_clean(true);
}

// Random interleavings: messages delivered in any order (and sometimes twice), stages computing and
// flushing whenever, aborts and deadline ticks at random times. Invariants: a write never lands after
// decode released the memory, and at the end every pool is whole with exactly one release per holder.
TEST_CASE("random interleavings keep the release guarantees", "[lazy_alloc][chaos]") {
  std::mt19937_64 rng(2024);
  int finished = 0, aborted = 0, expired = 0;
  for (int run = 0; run < 3000; ++run) {
    Harness h;
    // A long quarantine: nothing may be released on time alone while a write is posted.
    h.decode = std::make_unique<DecodeSide>(
        DecodeSideConfig{.instance_id = "decode-a", .model = model(), .kda_head_sliced = true,
                         .timeouts = [] {
                           auto t = timeouts();
                           t.quarantine = milliseconds(1'000'000'000);
                           return t;
                         }()},
        std::vector<RankPool*>{h.pools[0].get(), h.pools[1].get()}, &h.decode_metrics);
    h.step(0);
    h.step(1);
    std::vector<bool> computed(Harness::kStages, false);
    for (int t = 0; t < 60; ++t) {
      const int what = int(rng() % 100);
      if (what < 45 && !h.queue.empty()) {
        const size_t k = rng() % h.queue.size();  // any order
        auto [to, m] = h.queue[k];
        h.queue.erase(h.queue.begin() + long(k));
        h.deliver(to, m);
      } else if (what < 60) {
        const uint32_t s = uint32_t(rng() % Harness::kStages);
        if (!computed[s]) {
          computed[s] = true;
          h.stage_computed(s);
        }
      } else if (what < 75 && !h.posted.empty()) {
        auto it = h.posted.begin();
        std::advance(it, long(rng() % h.posted.size()));
        h.flush(it->first, rng() % 10 == 0 ? io_error("injected") : Status::ok());  // asserts memory held
      } else if (what < 78) {
        const Abort a{.request_id = kId, .reason = AbortReason::ClientCancelled, .origin_role = Role::Router};
        const uint32_t target = uint32_t(rng() % (Harness::kStages + 1));
        if (target == Harness::kStages) h.deliver({Role::Decode, "decode-a", 0}, a);
        else h.deliver({Role::Prefill, "prefill-a", target}, a);
      } else if (what < 82) {
        h.now += milliseconds(rng() % 1200);
        h.take(h.decode->tick(h.now), true);
        for (auto& st : h.stages) h.take(st->tick(h.now), false);
      } else if (what < 85 && !h.sent_log.empty()) {
        const auto [to, m] = h.sent_log[rng() % h.sent_log.size()];  // a duplicate
        h.deliver(to, m);
      }
    }
    // Settle: deliver everything, flush everything, finish or abort what is left.
    for (int round = 0; round < 4; ++round) {
      h.deliver_all();
      h.flush_all();
      h.deliver_all();
      for (uint32_t s = 0; s < Harness::kStages; ++s)
        if (!computed[s]) {
          computed[s] = true;
          h.stage_computed(s);
        }
    }
    h.deliver_all();
    if (h.decode->state(kId) == RequestState::Decoding) h.take(h.decode->on_finished(kId, h.now), true);
    if (h.decode->num_live()) {  // e.g. claimed, but every stage's COMPUTE_DONE was ignored after an abort
      h.take(h.decode->on_abort(Abort{.request_id = kId, .reason = AbortReason::Shutdown}, h.now), true);
      h.deliver_all();
      h.flush_all();
      h.deliver_all();
    }
    INFO("run " << run);
    h.check_clean(h.pools[0]->stats().page_allocs > 0);
    CHECK(h.prefill_released == 3);
    CHECK(h.decode_ended == 1);
    CHECK(h.prefill_ended == 3);
    const RequestState end = h.decode_end_states.at(0);
    finished += end == RequestState::Finished;
    aborted += end == RequestState::Aborted || end == RequestState::Failed;
    expired += end == RequestState::Expired;
  }
  // The generator reaches every ending.
  CHECK(finished > 0);
  CHECK(aborted > 0);
  CHECK(expired > 0);
}
