// The prefill stage's streaming of a request's KV/state to decode while it computes (see the flow in
// prefill_stage.h): the stream starts once the stage has the PREFILL and a computed chunk, each chunk's
// rows go to the driver's writer after its forward (on a prefix-cache hit the first export also carries
// the restored prefix's rows, read from the shared pages); and the write spans for --timing.
#include "engine/cache_io.h"
#include "prefill_node/prefill_stage.h"

namespace k3::prefill {

bool PrefillStage::may_stream(const Request& r) const {
  return opts_.stream && r.prefill && !r.reported && r.open && r.computed > 0;
}

void PrefillStage::stream_rows(Request& r) {
  if (!may_stream(r)) return;
  const uint64_t id = r.id;
  if (!r.streaming) {
    transfer::StageSource src =
        transfer::pack_stage_source(layout_, prefill_layout_, static_cast<uint32_t>(opts_.stage), r.prompt_len);
    const uint64_t image = packed_cache_bytes(cfg_, *pools_, begin_, end_, r.prompt_len);
    if (src.total_bytes != image)
      return fail_request(id, "cache image is " + std::to_string(image) + " bytes, the transfer layout expects " +
                                  std::to_string(src.total_bytes));
    r.streaming = true;
    absorb(driver_->stream_started(id, std::move(src)));
  }
  auto it = requests_.find(id);
  uint8_t* image = driver_->stream_buffer(id);
  if (it == requests_.end() || !image) return;   // ended (aborted, failed) meanwhile
  Request& q = it->second;
  // After a recompute (prefix-cache drift) the new try passes rows it already sent: they are the same
  // bytes (a resumed prefill computes bitwise what a cold one does), so only rows past them go.
  if (q.computed <= q.rows_exported) return;
  export_cache_part(backend_, *pools_, q.seq, begin_, end_, q.prompt_len, q.rows_exported, q.computed, false, image);
  q.rows_exported = q.computed;
  absorb(driver_->rows_computed(id, static_cast<uint32_t>(q.computed)));
}

void PrefillStage::note_writes_timing(uint64_t id, protocol::RequestState st) {
  // The driver reports TRANSFERRING when ADDRS arrives (before its first put; streaming: while the stage
  // still computes) and the end after the last flush.
  if (st == protocol::RequestState::Transferring) {
    writes_begin_us_[id] = steady_us();
  } else if (protocol::is_terminal(st)) {
    auto it = writes_begin_us_.find(id);
    if (it == writes_begin_us_.end()) return;
    const StageTiming t{.request_id = id, .span = StageTiming::Span::WritesDone, .begin_us = it->second, .end_us = steady_us()};
    writes_begin_us_.erase(it);
    opts_.on_timing(t);
  }
}

}  // namespace k3::prefill
