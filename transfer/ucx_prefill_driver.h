// A prefill stage's transfer endpoint: runs the lazy-alloc PrefillSide against real sockets and
// executes its writes with UCX. Connects a ControlClient to its decode instance (REGISTER both ways:
// ours carries the compat info, decode's carries its worker address and one packed rkey per rank
// region) and one to the router (PREFILL, ABORT).
//
// The host computes: step() hands back each PREFILL the side accepted; the host fills the stage's
// source bytes and calls stage_computed(). Writes run inside step(): every StartWrites is planned
// into per-region runs, put with UcxWriter (direct or staged) and flushed before TRANSFER_DONE.
#pragma once
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "transfer/lazy_alloc_prefill.h"
#include "transfer/ucx_driver_common.h"
#include "transfer/ucx_writer.h"
#include "transfer/zmq_channel.h"

namespace k3::transfer {

struct PrefillDriverConfig {
  PrefillSideConfig side;            // instance id, stage, model, partition, timeouts
  protocol::CompatInfo compat;
  std::string decode_instance;       // the decode instance this stage feeds
  std::string decode_endpoint;
  std::string router_endpoint;       // empty: no router connection (the host injects PREFILLs)
  HeartbeatConfig heartbeat;
  std::optional<ControlKeys> control_keys;  // CURVE on both connections; nullopt = plaintext (opt-out)
  std::string ucx_net_devices;       // UCX_NET_DEVICES for the data plane (e.g. "lo"); empty = UCX's choice
  WriterOptions writer;
  StateHook on_state;                // may be empty; may call inject_abort() for the request
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
                         std::optional<int32_t> first_token, std::vector<protocol::TokenLogprobs> first_logprobs = {});
  // Acts as if the router's ABORT for the request arrived now (failure injection and local cancel).
  Actions inject_abort(uint64_t request_id, AbortReason reason = AbortReason::ClientCancelled);
  // Sends a message to the router (e.g. FAILED for a request the stage itself could not compute).
  Status send_to_router(const protocol::Message& m);

  PrefillSide& side() { return *side_; }
  // True once decode's REGISTER arrived and its regions are usable.
  bool decode_ready() const { return !rkeys_.empty(); }
  size_t sources_held() const { return sources_.size(); }
  const WriteStats& write_stats() const { return writer_->stats(); }

 private:
  PrefillDriver(PrefillDriverConfig cfg, protocol::MetricsRegistry* m) : cfg_(std::move(cfg)), metrics_(m) {}
  void execute(const Actions& actions, Actions& all);
  Status run_writes(const StartWritesAction& w);
  void on_message(const ControlEvent& e, bool from_router, StepResult& out);
  void note_states(const Actions& actions);
  void note_request(uint64_t request_id);
  void send_to(const Peer& p, const protocol::Message& m);
  void forget_decode();

  PrefillDriverConfig cfg_;
  protocol::MetricsRegistry* metrics_;
  std::shared_ptr<UcxContext> ctx_;
  std::shared_ptr<UcxWorker> worker_;
  std::unique_ptr<UcxWriter> writer_;
  std::unique_ptr<PrefillSide> side_;
  std::unique_ptr<ControlClient> decode_;
  std::unique_ptr<ControlClient> router_;
  std::map<uint32_t, std::unique_ptr<RemoteKey>> rkeys_;  // by region id (= decode global rank)
  std::map<uint64_t, std::vector<uint8_t>> sources_;      // held source bytes by request
  std::set<uint64_t> abort_requested_;                    // set by inject_abort from a state hook
  std::map<uint64_t, protocol::RequestState> seen_;
  bool in_hook_ = false;
};

}  // namespace k3::transfer
