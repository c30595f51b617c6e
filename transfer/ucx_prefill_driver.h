// A prefill stage's transfer endpoint: runs the lazy-alloc PrefillSide against real sockets and
// executes its writes with UCX. Connects a ControlClient to every decode instance it may feed (REGISTER
// both ways: ours carries the compat info, decode's carries its worker address and one packed rkey per
// rank region) and one to the router (PREFILL, ABORT). Each PREFILL names its decode instance, so the
// router chooses the decode target per request: any prefill instance can feed any decode instance.
//
// The host computes: step() hands back each PREFILL the side accepted; the host fills the stage's
// source bytes and calls stage_computed(). Or it streams: stream_started() at the request's first chunk
// (the driver holds a source buffer of the whole image, stream_buffer(), that the host fills as chunks
// compute), rows_computed() after each chunk, stream_computed() after the last. Every StartWrites becomes
// one job of per-region runs for AsyncWrites, which puts them with UcxWriter (direct or staged) and
// flushes them on its own thread; step() polls its completion fd with the control sockets and reports
// each finished job to the side, which sends TRANSFER_DONE once the last one has flushed.
#pragma once
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "transfer/async_writes.h"
#include "transfer/lazy_alloc_prefill.h"
#include "transfer/source_arena.h"
#include "transfer/source_image.h"
#include "transfer/ucx_driver_common.h"
#include "transfer/ucx_writer.h"
#include "transfer/zmq_channel.h"

namespace k3::transfer {

// One decode instance a prefill stage may write to: its control name decode/<instance> and endpoint.
struct DecodeTarget {
  std::string instance;
  std::string endpoint;
};

struct PrefillDriverConfig {
  PrefillSideConfig side;            // instance id, stage, model, partition, timeouts
  protocol::CompatInfo compat;
  std::vector<DecodeTarget> decodes; // the decode instances this stage may feed (at least one)
  std::string router_endpoint;       // empty: no router connection (the host injects PREFILLs)
  HeartbeatConfig heartbeat;
  std::optional<ControlKeys> control_keys;  // CURVE on both connections; nullopt = plaintext (opt-out)
  std::string ucx_net_devices;       // UCX_NET_DEVICES for the data plane (e.g. "lo"); empty = UCX's choice
  WriterOptions writer;
  // Where the stage's source images live. Cuda: device memory of cuda_device (a stage computing on a GPU
  // copies its cache rows there and the puts read the GPU); stage_computed's host bytes are copied in.
  MemoryType source_memory = MemoryType::Host;
  int cuda_device = 0;
  // Bytes of source_memory allocated and registered once, which the requests' source images are carved
  // from (transfer/source_arena.h); an image that does not fit gets memory of its own. 0: every image
  // gets its own.
  size_t source_arena_bytes = 0;
  StateHook on_state;                // may be empty; may call inject_abort() for the request
  // May be empty: when one StartWrites' puts ran (steady clock, microseconds), called from step().
  std::function<void(uint64_t request_id, int64_t begin_us, int64_t end_us, uint64_t bytes)> on_write_span;
};

class PrefillDriver {
 public:
  static Result<std::unique_ptr<PrefillDriver>> create(PrefillDriverConfig cfg, zmq::context_t& zctx,
                                                       protocol::MetricsRegistry* metrics);
  ~PrefillDriver();

  struct StepResult {
    Actions actions;
    std::vector<protocol::Prefill> accepted;  // PREFILLs the host must now compute
  };
  Result<StepResult> step(Millis max_wait);
  // The stage's layers for the request are final in `bytes` (laid out as `source` says).
  Actions stage_computed(uint64_t request_id, StageSource source, std::vector<uint8_t> bytes,
                         std::optional<int32_t> first_token, std::vector<protocol::TokenLogprobs> first_logprobs = {},
                         std::vector<int32_t> choice_first_tokens = {});
  // Streaming (see the top): the request's image is laid out as `source`; returns false when the side did
  // not take the request (then nothing is held). stream_buffer(): the held image (nullptr when none), in
  // source_memory (device memory for Cuda: fill it with device copies).
  Actions stream_started(uint64_t request_id, StageSource source);
  uint8_t* stream_buffer(uint64_t request_id);
  Actions rows_computed(uint64_t request_id, uint32_t rows);
  Actions stream_computed(uint64_t request_id, StageSource source, std::optional<int32_t> first_token,
                          std::vector<protocol::TokenLogprobs> first_logprobs = {},
                          std::vector<int32_t> choice_first_tokens = {});
  uint32_t write_batches_in_flight(uint64_t request_id) const { return side_->write_batches_in_flight(request_id); }
  size_t write_jobs_in_flight() const { return jobs_in_flight_; }   // every request's, posted and not yet done
  // Acts as if the router's ABORT for the request arrived now (failure injection and local cancel).
  Actions inject_abort(uint64_t request_id, AbortReason reason = AbortReason::ClientCancelled);
  // Sends a message to the router (e.g. FAILED for a request the stage itself could not compute).
  Status send_to_router(const protocol::Message& m);
  // Sends the heartbeats now due on every control connection and reads nothing (no state changes):
  // the host calls it while a long compute keeps it from step().
  void heartbeat_if_due();

  // A PREFILL handed over in-process (benches, tests), with the same checks and decode-target
  // bookkeeping as one from the router. Returns true when the request was accepted for compute.
  bool submit(const protocol::Prefill& p, Actions& actions);

  PrefillSide& side() { return *side_; }
  // True once every decode instance's REGISTER arrived and its regions are usable.
  bool decode_ready() const;
  // Decode instances whose regions are usable now.
  size_t decodes_ready() const;
  // The control endpoint decode `instance` announced in its REGISTER (where peers reach it, which may
  // differ from the address this stage dialed, e.g. through a Service); empty before it registered.
  std::string registered_endpoint(const std::string& instance) const;
  size_t sources_held() const { return sources_.size(); }
  const WriteStats& write_stats() const { return writer_->stats(); }

 private:
  PrefillDriver(PrefillDriverConfig cfg, protocol::MetricsRegistry* m) : cfg_(std::move(cfg)), metrics_(m) {}
  void execute(const Actions& actions, Actions& all);
  Status post_writes(const StartWritesAction& w);
  // Aborts injected from the state hook for requests that had no StartWrites to apply them to.
  void apply_injected_aborts(Actions& all);
  // Holds `image` as the request's source, or, when it could not be made, aborts the request naming why.
  void hold_source(uint64_t request_id, Result<std::shared_ptr<SourceImage>> image, Actions& all);
  // What a write job reads: the request's source image and the staging images of its gathered puts.
  struct HeldSources {
    std::shared_ptr<SourceImage> image;
    std::vector<std::shared_ptr<SourceImage>> staged;
  };
  // A source image of `bytes` in source_memory: in the arena when it has room, else of its own.
  Result<std::shared_ptr<SourceImage>> new_source(size_t bytes);
  // The bytes a stage exported on the host, as a source image (taken over on the host, copied to the device).
  Result<std::shared_ptr<SourceImage>> source_of(std::vector<uint8_t> bytes);
  void take_write_completions(Actions& all);
  void note_states(const Actions& actions);
  void note_request(uint64_t request_id);
  void send_to(const Peer& p, const protocol::Message& m);
  struct DecodeLink;
  DecodeLink* link_of(const std::string& instance);
  void on_decode_register(DecodeLink& link, const protocol::Register& reg);
  void introduce(DecodeLink& link);
  // from_decode: the link the message came on; null when it came from the router.
  void on_message(const ControlEvent& e, DecodeLink* from_decode, StepResult& out);

  PrefillDriverConfig cfg_;
  protocol::MetricsRegistry* metrics_;
  std::shared_ptr<UcxContext> ctx_;
  std::shared_ptr<UcxWorker> worker_;
  std::shared_ptr<SourceArena> arena_;    // held images keep it alive past the driver
  std::mutex ucx_mutex_;                  // every use of worker_ (control loop and the writer thread)
  std::unique_ptr<UcxWriter> writer_;
  std::unique_ptr<AsyncWrites> writes_;   // reset first in the destructor: its thread uses the rest
  std::vector<std::shared_ptr<RemoteKey>> retired_;   // rkeys of a lost decode, dropped under ucx_mutex_
  std::unique_ptr<PrefillSide> side_;
  // One control connection and one set of rkeys per decode instance (region ids are decode global
  // ranks, unique per instance only, so rkeys are kept per link).
  struct DecodeLink {
    std::string instance;
    std::unique_ptr<ControlClient> control;
    std::map<uint32_t, std::shared_ptr<RemoteKey>> rkeys;  // by region id (= decode global rank); jobs share them
    std::string registered_endpoint;  // the control endpoint its REGISTER announced
  };
  std::vector<DecodeLink> decodes_;
  std::unique_ptr<ControlClient> router_;
  std::map<uint64_t, std::shared_ptr<SourceImage>> sources_;  // held source bytes by request
  std::map<uint64_t, std::string> decode_of_;             // accepted request -> the decode instance it names
  size_t jobs_in_flight_ = 0;
  std::set<uint64_t> abort_requested_;                    // set by inject_abort from a state hook
  std::map<uint64_t, protocol::RequestState> seen_;
  bool in_hook_ = false;
};

}  // namespace k3::transfer
