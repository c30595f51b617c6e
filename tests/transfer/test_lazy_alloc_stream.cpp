// The lazy-alloc protocol with streaming stages (tests/transfer/lazy_alloc_harness.h, stream_step):
// addresses at a stage's first chunk, one write batch per computed chunk, the states last, and
// TRANSFER_DONE only once everything is computed and every batch has flushed. Aborts and peer deaths
// on the streaming path run in test_lazy_alloc.cpp and test_lazy_alloc_faults.cpp.
#include "tests/transfer/lazy_alloc_harness.h"

using namespace k3;
using namespace k3::transfer;
using namespace k3::protocol;
using namespace k3::transfer::lazy_alloc_test;

namespace {

// The bytes a stage writes when it writes its whole prompt at once (the reference).
uint64_t whole_plan_bytes(uint32_t s) {
  Harness ref;
  for (int k = 0; k < Harness::kSteps; ++k) {
    ref.step(k);
    if (k == 5) return total_bytes(ref.posted.at(s));
  }
  return 0;
}

}  // namespace

TEST_CASE("streaming stages write chunk by chunk and finish after their last flush", "[lazy_alloc][stream]") {
  Harness h;
  h.streaming = true;
  h.step(0);
  h.step(1);
  h.step(2);   // stage 0 asked for addresses at its first chunk: COMPUTE_DONE(streaming)
  REQUIRE(h.queue.size() == 1);
  const auto* cd = std::get_if<ComputeDone>(&h.queue.front().second);
  REQUIRE(cd);
  CHECK(cd->streaming);
  CHECK_FALSE(cd->has_first_token);
  CHECK(h.stages[0]->state(kId) == RequestState::Prefilling);
  h.step(3);   // decode allocates at once; stage 0 (two KDA layers) has no rows to write
  CHECK(h.decode->holds_memory(kId));
  CHECK(h.stages[0]->state(kId) == RequestState::Transferring);
  CHECK(h.stages[0]->write_batches_in_flight(kId) == 0);
  h.step(4);   // stage 1 (MLA + KDA) gets ADDRS and writes the rows of its first chunk
  CHECK(h.stages[1]->write_batches_in_flight(kId) == 1);
  h.rows_computed(1, 8);   // its next chunk is a second batch in flight
  CHECK(h.stages[1]->write_batches_in_flight(kId) == 2);
  CHECK(total_bytes(h.posted.at(1)) == 8 * model().mla_row_bytes);
  // Flushing what is in flight before the stage has computed everything sends no TRANSFER_DONE.
  h.flush(1);
  h.deliver_all();
  CHECK(h.stages[1]->state(kId) == RequestState::Transferring);
  for (const auto& [to, m] : h.sent_log) CHECK_FALSE(std::holds_alternative<TransferDone>(m));
  h.step(5);   // every stage computed: states and remaining rows go out; stage 2 got ADDRS after it computed
  CHECK(h.stages[0]->write_batches_in_flight(kId) == 1);
  CHECK(h.stages[1]->write_batches_in_flight(kId) == 1);
  CHECK(h.stages[2]->write_batches_in_flight(kId) == 1);
  CHECK(h.decode->state(kId) == RequestState::Transferring);
  h.step(6);
  h.step(7);
  CHECK(h.ready == 0);
  h.step(8);
  CHECK(h.ready == 1);
  CHECK(h.decode->state(kId) == RequestState::Decoding);
  h.step(9);
  h.check_clean(true);
  CHECK(h.prefill_released == 3);
  // Every stage wrote exactly the bytes of its whole-prompt plan, and decode counted them.
  uint64_t sum = 0;
  for (const auto& [to, m] : h.sent_log)
    if (const auto* td = std::get_if<TransferDone>(&m)) {
      CHECK(td->bytes == whole_plan_bytes(td->stage));
      sum += td->bytes;
    }
  CHECK(sum == h.decode_metrics.counter_value(metric::kBytes));
  // The first token came with the last stage's final COMPUTE_DONE.
  int finals = 0;
  for (const auto& [to, m] : h.sent_log)
    if (const auto* c = std::get_if<ComputeDone>(&m); c && !c->streaming) {
      ++finals;
      CHECK(c->stage == 2);
      CHECK(c->first_token == 77);
    }
  CHECK(finals == 1);
  h.replay_everything();
}

TEST_CASE("a streaming stage's bad inputs are ignored with a reason", "[lazy_alloc][stream]") {
  Harness h;
  h.streaming = true;
  for (int k = 0; k < 4; ++k) h.step(k);
  const auto ignored = [](const Actions& a) {
    return a.size() == 1 && std::holds_alternative<IgnoredAction>(a[0]);
  };
  CHECK(ignored(h.stages[0]->on_rows_computed(kId, 2, h.now)));            // rows go backwards
  CHECK(ignored(h.stages[0]->on_rows_computed(kId, kTokens + 1, h.now)));  // past the prompt
  CHECK(ignored(h.stages[1]->on_rows_computed(kId, 3, h.now)));            // not streaming
  h.stream_started(0);                                                       // twice
  CHECK(h.queue.empty());
  CHECK(h.stages[0]->state(kId) == RequestState::Transferring);
}

TEST_CASE("decode's transfer deadline covers a streaming request from its first chunk", "[lazy_alloc][stream][deadline]") {
  Harness h;
  h.streaming = true;
  for (int k = 0; k < 5; ++k) h.step(k);   // allocated at stage 0's first chunk; stage 1 writing
  h.now += std::chrono::milliseconds(2000);
  h.take(h.decode->tick(h.now), true);
  CHECK(h.decode->state(kId) == RequestState::Expired);
  h.deliver_all();
  CHECK(h.decode->holds_memory(kId));    // stage 1's first batch may still land
  h.flush_all();
  h.deliver_all();
  CHECK_FALSE(h.decode->holds_memory(kId));
  CHECK(h.free_bytes() == h.start_free);
}
