// The lazy-alloc protocol driven in-process (tests/transfer/lazy_alloc_harness.h): the happy path,
// ABORT at every state, deadlines and peer death.
#include "tests/transfer/lazy_alloc_harness.h"

using namespace k3;
using namespace k3::transfer;
using namespace k3::protocol;
using namespace k3::transfer::lazy_alloc_test;
using std::chrono::milliseconds;

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
  const bool streaming = GENERATE(false, true);   // whole-prompt writes, or chunk by chunk
  Harness h;
  h.streaming = streaming;
  for (int k = 0; k < k_stop; ++k) h.step(k);
  INFO("abort after step " << k_stop - 1 << ", delivery " << where << (streaming ? ", streaming" : ""));
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
  const bool streaming = GENERATE(false, true);
  SECTION("decode learns the prefill instance died") {
    Harness h;
    h.streaming = streaming;
    for (int k = 0; k < k_stop; ++k) h.step(k);
    h.take(h.decode->on_peer_dead(Peer{Role::Prefill, "prefill-a", 0}, h.now), true);
    CHECK(h.decode->state(kId) == RequestState::Failed);
    h.deliver_all();
    CHECK(router_got_failed(h));
    for (const auto& [to, m] : h.sent_log)  // nobody talks to the dead
      if (std::holds_alternative<Abort>(m)) CHECK(to.role != Role::Prefill);
    // Streaming, a stage holds ADDRS from step 3 on even with nothing posted yet: decode waits the quarantine.
    if ((h.posted.empty() && !streaming) || k_stop <= 3) {
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
    h.streaming = streaming;
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
