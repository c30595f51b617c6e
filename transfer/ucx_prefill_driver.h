// A prefill stage's transfer endpoint: runs the lazy-alloc PrefillSide against real sockets and
// executes its writes with UCX. Connects a ControlClient to every decode instance it may feed (REGISTER
// both ways: ours carries the compat info, decode's carries its worker address and one packed rkey per
// rank region) and one to the router (PREFILL, ABORT). Each PREFILL names its decode instance, so the
// router chooses the decode target per request: any prefill instance can feed any decode instance.
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
                         std::optional<int32_t> first_token, std::vector<protocol::TokenLogprobs> first_logprobs = {},
                         std::vector<int32_t> choice_first_tokens = {});
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
  Status run_writes(const StartWritesAction& w);
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
  std::unique_ptr<UcxWriter> writer_;
  std::unique_ptr<PrefillSide> side_;
  // One control connection and one set of rkeys per decode instance (region ids are decode global
  // ranks, unique per instance only, so rkeys are kept per link).
  struct DecodeLink {
    std::string instance;
    std::unique_ptr<ControlClient> control;
    std::map<uint32_t, std::unique_ptr<RemoteKey>> rkeys;  // by region id (= decode global rank)
    std::string registered_endpoint;  // the control endpoint its REGISTER announced
  };
  std::vector<DecodeLink> decodes_;
  std::unique_ptr<ControlClient> router_;
  std::map<uint64_t, std::vector<uint8_t>> sources_;      // held source bytes by request
  std::map<uint64_t, std::string> decode_of_;             // accepted request -> the decode instance it names
  std::set<uint64_t> abort_requested_;                    // set by inject_abort from a state hook
  std::map<uint64_t, protocol::RequestState> seen_;
  bool in_hook_ = false;
};

}  // namespace k3::transfer
