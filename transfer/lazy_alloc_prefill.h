// Prefill side of the lazy-alloc protocol, for one PP stage of one prefill instance.
//
//   PREFILL          -> PREFILLING (the stage computes; its source KV/state is held from now on).
//   on_stage_computed-> send COMPUTE_DONE (with the first token on the last stage) to decode;
//                       COMPUTE_DONE, deadline addrs_wait.
//   ADDRS            -> plan this stage's writes (pairing by global layer id); StartWrites; TRANSFERRING.
//                       A plan error fails the request (ABORT to decode with PlanFailed, FAILED to router).
//   on_writes_flushed-> ok: send TRANSFER_DONE, FINISHED, source released. Error: FAILED, ABORT(TransferFailed)
//                       to decode (a stage sends ABORT only once nothing is in flight), FAILED to router.
//   ABORT            -> ABORTED at once; writes posted: CancelWrites, and the rest waits for
//                       on_writes_flushed. Once nothing is in flight decode hears from this stage:
//                       ABORT_ACK when decode sent the ABORT (and COMPUTE_DONE had gone out), otherwise this
//                       stage's own ABORT (so a router ABORT that reaches the stage first still tells decode
//                       that the stage can no longer write). The source KV is released (ReleasedAction).
//   Streaming (docs/ARCHITECTURE.md §2.2): a stage may instead ask for its addresses at its first chunk.
//   on_stream_started-> send COMPUTE_DONE(streaming) to decode; deadline addrs_wait; still PREFILLING.
//   ADDRS            -> TRANSFERRING; the rows computed so far are planned and written (StartWrites).
//   on_rows_computed -> once ADDRS is here, the new rows are planned and written (one StartWrites each).
//   on_stage_computed-> the last stage sends its final COMPUTE_DONE (first token); the KDA states and any
//                       rows not yet written are written. When every write has flushed: TRANSFER_DONE.
//                       Several StartWrites of one request may be in flight; on_writes_flushed is called
//                       once per StartWrites, and an abort waits for all of them as above.
//   deadline (ADDRS wait) / router death -> EXPIRED / FAILED the same way, FAILED sent to the router
//                       (not to a dead one); decode death -> FAILED, nothing sent to decode.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/protocol/metrics.h"
#include "transfer/lazy_alloc.h"
#include "transfer/request_records.h"

namespace k3::transfer {

struct PrefillSideConfig {
  std::string instance_id;
  uint32_t stage = 0;
  CacheLayout model;
  PrefillLayout prefill;
  bool decode_kda_head_sliced = true;   // must match the decode instance's layout
  ProtocolTimeouts timeouts;
};

class PrefillSide {
 public:
  PrefillSide(PrefillSideConfig config, protocol::MetricsRegistry* metrics);  // metrics may be nullptr
  ~PrefillSide();
  PrefillSide(const PrefillSide&) = delete;
  PrefillSide& operator=(const PrefillSide&) = delete;

  Actions on_prefill(const protocol::Prefill& m, Millis now);
  // This stage's layers of the request are final; `source` says where they are (stage == config.stage,
  // layers == this stage's layers). The last stage passes the sampled first token (and its logprobs
  // when the sampling params ask for them).
  Actions on_stage_computed(uint64_t request_id, StageSource source, std::optional<int32_t> first_token,
                            Millis now, std::vector<protocol::TokenLogprobs> first_logprobs = {},
                            std::vector<int32_t> choice_first_tokens = {});
  // Streaming: the stage began the request; `source` lays out the whole prompt's image (rows fill in
  // chunk by chunk, states last). Sends the streaming COMPUTE_DONE that asks decode for addresses.
  Actions on_stream_started(uint64_t request_id, StageSource source, Millis now);
  // Streaming: rows [0, rows) of the stage's MLA/draft layers are final in the source.
  Actions on_rows_computed(uint64_t request_id, uint32_t rows, Millis now);
  Actions on_addrs(const protocol::Addrs& m, Millis now);
  Actions on_abort(const protocol::Abort& m, Millis now);
  // Dispatches Prefill / Addrs / Abort; others give an Ignored action.
  Actions on_message(const protocol::Message& m, Millis now);
  // Every write of one StartWrites of the request has completed (ok) or failed.
  Actions on_writes_flushed(uint64_t request_id, const Status& result, Millis now);
  Actions on_peer_dead(const Peer& peer, Millis now);
  Actions tick(Millis now);

  std::optional<RequestState> state(uint64_t request_id) const;
  bool writes_in_flight(uint64_t request_id) const;
  uint32_t write_batches_in_flight(uint64_t request_id) const;  // StartWrites not yet reported flushed
  size_t num_live() const;

 private:
  struct Record;
  void set_state(Record& r, RequestState to);
  // tell_decode_abort: decode gets this stage's ABORT (else ABORT_ACK if it may have sent ADDRS).
  Actions end_request(Record& r, RequestState terminal, AbortReason cause, bool notify_router,
                      bool tell_decode_abort, Millis now);
  void finish_release(Record& r, Actions& out);
  Actions stream_computed(Record& r, StageSource source, std::optional<int32_t> first_token, Millis now,
                          std::vector<protocol::TokenLogprobs> first_logprobs, std::vector<int32_t> choice_first_tokens);
  // Streaming: plans and starts the writes of what is computed and not yet written (after ADDRS).
  Actions write_ready_part(Record& r, Millis now);
  // Every write flushed: TRANSFER_DONE, FINISHED, source released.
  void finish_transfer(Record& r, Millis now, Actions& out);
  Record* find(uint64_t id, const char* what, Actions& out);
  Peer decode_peer(const Record& r) const;

  PrefillSideConfig cfg_;
  protocol::MetricsRegistry* metrics_;
  LiveRecords<Record> records_;
  Tombstones tombstones_;
};

}  // namespace k3::transfer
