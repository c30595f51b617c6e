// The lazy-alloc protocol driven in-process (tests/transfer/lazy_alloc_harness.h): write and
// allocation failures, protocol violations, a mismatched ADDRS and 3,000 random interleavings.
#include "tests/transfer/lazy_alloc_harness.h"

using namespace k3;
using namespace k3::transfer;
using namespace k3::protocol;
using namespace k3::transfer::lazy_alloc_test;
using std::chrono::milliseconds;

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
    // Odd runs stream: a stage asks for ADDRS at its first chunk and reports rows chunk by chunk.
    const bool streaming = run % 2 == 1;
    std::vector<bool> computed(Harness::kStages, false);
    std::vector<int> rows(Harness::kStages, -1);   // streaming: -1 not started, else rows reported
    const auto progress = [&](uint32_t s) {
      if (computed[s]) return;
      if (streaming && rows[s] < 0) {
        h.stream_started(s);
        rows[s] = 0;
      } else if (streaming && rows[s] < int(kTokens)) {
        rows[s] = std::min<int>(int(kTokens), rows[s] + 1 + int(rng() % 5));
        h.rows_computed(s, uint32_t(rows[s]));
      } else {
        computed[s] = true;
        h.stage_computed(s);
      }
    };
    for (int t = 0; t < 60; ++t) {
      const int what = int(rng() % 100);
      if (what < 45 && !h.queue.empty()) {
        const size_t k = rng() % h.queue.size();  // any order
        auto [to, m] = h.queue[k];
        h.queue.erase(h.queue.begin() + long(k));
        h.deliver(to, m);
      } else if (what < 60) {
        progress(uint32_t(rng() % Harness::kStages));
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
        while (!computed[s]) progress(s);
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

TEST_CASE("a stage that took decode for dead still answers decode's ABORT, so decode frees at once", "[lazy_alloc][peer]") {
  // A restarted decode rank claimed the request; stage 1 had not heard the new incarnation yet and, on
  // learning of the restart, failed it as peer_dead (telling decode nothing) after ADDRS had reached it.
  // When the router's ABORT reaches decode, decode asks the stages holding its ADDRS: stage 1 must answer
  // ABORT_ACK from its tombstone, or decode keeps the memory for the whole quarantine.
  Harness h;
  for (int k = 0; k <= 4; ++k) h.step(k);  // ADDRS at stages 0 and 1, both posted writes
  REQUIRE(h.posted.count(1));
  h.take(h.stages[1]->on_peer_dead(Peer{Role::Decode, "decode-a", 0}, h.now), false);
  h.flush(1, Status(Code::Aborted, "cancelled"));  // stage 1 released the request (its record is gone)
  REQUIRE(h.stages[1]->num_live() == 0);
  h.deliver_all();
  h.take(h.decode->on_abort(Abort{.request_id = kId, .reason = AbortReason::PeerDead, .origin_role = Role::Router}, h.now),
         true);
  h.deliver_all();
  h.flush_all();
  h.deliver_all();
  CHECK_FALSE(h.decode->holds_memory(kId));  // no quarantine wait: every stage with ADDRS answered
  CHECK(h.free_bytes() == h.start_free);
  bool acked_by_stage1 = false;
  for (const auto& [to, m] : h.sent_log)
    if (auto* a = std::get_if<AbortAck>(&m); a && to.role == Role::Decode && a->stage == 1) acked_by_stage1 = true;
  CHECK(acked_by_stage1);
}
