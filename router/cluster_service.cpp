#include "router/cluster_service.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "common/protocol/frame.h"
#include "common/protocol/messages.h"
#include "router/text_stream.h"
#include "router/wire_ids.h"
#include "transfer/zmq_channel.h"

namespace k3::router {

using Clock = std::chrono::steady_clock;
namespace proto = k3::protocol;

// ---------------------------------------------------------------------------------------------------
// Request and worker state.

struct ClusterService::Request {
  RequestHandle id = 0;
  GenerationParams params;
  EventSink sink;
  enum class Phase { New, Claiming, Running } phase = Phase::New;
  int pair = -1;
  uint64_t wire_id = 0;             // this attempt's protocol request id
  int attempts = 0;
  Clock::time_point claim_sent;
  int64_t generated = 0;
  bool streamed = false;            // a token reached the sink: no retry any more
  std::unique_ptr<TextStream> text;
};

struct ClusterService::Worker {
  zmq::context_t ctx;
  std::unique_ptr<transfer::ControlServer> server;
  std::map<RequestHandle, std::unique_ptr<Request>> requests;
  std::map<uint64_t, RequestHandle> by_wire;
  WireIds wire_ids;  // unguessable protocol request ids
  std::set<std::string> live;
  std::map<std::string, proto::Heartbeat> heartbeats;  // by control name
  std::unique_ptr<PlacementPolicy> policy;
};

// The worker's request logic, as member functions of a helper that sees the service's privates.
class ClusterWorkerOps {
 public:
  explicit ClusterWorkerOps(ClusterService& s) : s_(s), w_(*s.w_) {}

  bool pair_ready(const ClusterPair& p) const {
    for (const auto& n : pair_control_names(p))
      if (!w_.live.count(n)) return false;
    return true;
  }
  std::vector<int> ready_pairs() const {
    std::vector<int> r;
    for (size_t i = 0; i < s_.opts_.pairs.size(); ++i)
      if (pair_ready(s_.opts_.pairs[i])) r.push_back(static_cast<int>(i));
    return r;
  }

  void send(const std::string& peer, const proto::Message& m) {
    if (Status st = w_.server->send(peer, proto::encode(m)); !st.is_ok())
      spdlog::debug("router: {} to {} not sent: {}", proto::msg_type_name(proto::type_of(m)), peer, st.message());
  }
  void abort_parties(ClusterService::Request& r, proto::AbortReason why) {
    if (r.pair < 0 || r.wire_id == 0) return;
    const proto::Abort a{.request_id = r.wire_id, .reason = why, .origin_role = proto::Role::Router};
    for (const auto& n : pair_control_names(s_.opts_.pairs[r.pair]))
      if (w_.live.count(n)) send(n, a);
  }

  // Calls the sink unless the request was cancelled (cancel() waits on sink_mu_ for a call in progress).
  void emit(ClusterService::Request& r, GenerationEvent&& ev) {
    std::lock_guard sink_lk(s_.sink_mu_);
    {
      std::lock_guard lk(s_.mu_);
      if (s_.cancelled_.count(r.id)) return;
    }
    r.sink(std::move(ev));
  }
  // Ends a request: the final event, then its state goes.
  void end(ClusterService::Request& r, GenerationEvent&& ev) {
    emit(r, std::move(ev));
    const RequestHandle id = r.id;
    w_.by_wire.erase(r.wire_id);
    {
      std::lock_guard lk(s_.mu_);
      s_.live_.erase(id);
      s_.cancelled_.erase(id);
    }
    w_.requests.erase(id);  // r is gone now
  }
  void fail(ClusterService::Request& r, Status why, const std::string& cause) {
    {
      std::lock_guard lk(s_.pub_mu_);
      ++s_.request_failures_[cause];
    }
    end(r, {.kind = GenerationEvent::Kind::Failed, .error = std::move(why)});
  }

  // Places a new or retried request: CLAIM to the chosen pair's decode (PREFILL follows CLAIM_ACK).
  void place(ClusterService::Request& r) {
    if (r.attempts >= s_.opts_.max_attempts) {
      fail(r, Status(Code::Unavailable, "no prefill/decode pair could take the request after " +
                                            std::to_string(r.attempts) + " attempt(s)"),
           "placement");
      return;
    }
    std::vector<PairLoad> load(s_.opts_.pairs.size());
    for (auto& [id, q] : w_.requests)
      if (q->pair >= 0) ++load[q->pair].in_flight;
    for (size_t i = 0; i < s_.opts_.pairs.size(); ++i) {
      auto hb = w_.heartbeats.find(decode_control_name(s_.opts_.pairs[i]));
      if (hb != w_.heartbeats.end()) load[i].reported_running = hb->second.num_running;
    }
    const int chosen = w_.policy->pick(ready_pairs(), load, r.params.prompt);
    if (chosen < 0) {
      fail(r, Status(Code::Unavailable, "no prefill/decode pair is ready (nodes down or not registered)"), "no_pair");
      return;
    }
    const ClusterPair& p = s_.opts_.pairs[chosen];
    {
      std::lock_guard lk(s_.pub_mu_);
      ++s_.placements_[decode_control_name(p)];
    }
    ++r.attempts;
    r.pair = chosen;
    r.wire_id = w_.wire_ids.next([&](uint64_t id) { return w_.by_wire.count(id) != 0; });
    w_.by_wire[r.wire_id] = r.id;
    r.phase = ClusterService::Request::Phase::Claiming;
    r.claim_sent = Clock::now();
    send(decode_control_name(p), proto::Claim{.request_id = r.wire_id, .prompt_len = static_cast<uint32_t>(r.params.prompt.size()),
                                      .decode_ranks = {p.decode_rank}, .prefill_instance = p.prefill_instance,
                                      .num_prefill_stages = p.stages, .timeout_ms = s_.opts_.request_timeout_ms,
                                      .sampling = sampling_of(r.params)});
  }

  static proto::SamplingParams sampling_of(const GenerationParams& g) {
    return {.temperature = g.sampling.temperature, .top_p = g.sampling.top_p, .top_k = g.sampling.top_k,
            .seed = g.sampling.seed, .max_tokens = static_cast<uint32_t>(g.max_tokens), .stop_token_ids = g.stop_ids};
  }

  // This attempt failed: abort it everywhere, then place the request again if nothing was streamed.
  void retry_or_fail(ClusterService::Request& r, const Status& why, proto::AbortReason cause) {
    abort_parties(r, cause);
    w_.by_wire.erase(r.wire_id);
    r.wire_id = 0;
    r.pair = -1;
    if (!r.streamed && r.attempts < s_.opts_.max_attempts && !ready_pairs().empty()) {
      spdlog::info("router: request {} retried after: {}", r.id, why.message());
      {
        std::lock_guard lk(s_.pub_mu_);
        ++s_.retries_;
      }
      place(r);
      return;
    }
    fail(r, why, proto::abort_reason_name(cause));
  }

  ClusterService::Request* by_wire(uint64_t wire) {
    auto it = w_.by_wire.find(wire);
    if (it == w_.by_wire.end()) return nullptr;
    auto r = w_.requests.find(it->second);
    return r == w_.requests.end() ? nullptr : r->second.get();
  }

  void on_claim_ack(const proto::ClaimAck& a) {
    ClusterService::Request* r = by_wire(a.request_id);
    if (!r || r->phase != ClusterService::Request::Phase::Claiming) return;
    if (!a.ok) {
      retry_or_fail(*r, Status(Code::Unavailable, "decode refused the request: " + a.reason), proto::AbortReason::Rejected);
      return;
    }
    const ClusterPair& p = s_.opts_.pairs[r->pair];
    const proto::Prefill m{.request_id = r->wire_id, .token_ids = r->params.prompt, .sampling = sampling_of(r->params),
                           .decode_instance = p.decode_instance, .decode_ranks = {p.decode_rank},
                           .timeout_ms = s_.opts_.request_timeout_ms};
    for (uint32_t st = 0; st < p.stages; ++st) send(stage_control_name(p, st), m);
    r->phase = ClusterService::Request::Phase::Running;
  }

  void on_tokens(const proto::Tokens& t) {
    ClusterService::Request* r = by_wire(t.request_id);
    if (!r || r->phase != ClusterService::Request::Phase::Running) return;
    GenerationEvent ev;
    ev.kind = GenerationEvent::Kind::Tokens;
    std::string reason;
    for (int32_t id : t.token_ids) {
      ++r->generated;
      ev.token_ids.push_back(id);
      auto text = r->text->push(id);
      if (!text.is_ok()) {
        abort_parties(*r, proto::AbortReason::Internal);
        fail(*r, text.status(), "internal");
        return;
      }
      ev.text += *text;
      const auto& stops = r->params.stop_ids;
      if (std::find(stops.begin(), stops.end(), id) != stops.end() || r->text->stopped()) {
        reason = "stop";
        break;
      }
      if (r->generated >= r->params.max_tokens) {
        reason = "length";
        break;
      }
    }
    if (reason.empty() && t.finish == proto::FinishReason::Stop) reason = "stop";
    if (reason.empty() && t.finish == proto::FinishReason::Length) reason = "length";
    if (reason.empty() && t.finish == proto::FinishReason::Aborted) {
      retry_or_fail(*r, Status(Code::Unavailable, "decode aborted the request"), proto::AbortReason::Internal);
      return;
    }
    if (!reason.empty()) {
      // A stop string (or a cap) decided here: decode may still be generating.
      if (t.finish == proto::FinishReason::None) abort_parties(*r, proto::AbortReason::ClientCancelled);
      ev.text += r->text->flush();
    }
    if (!ev.token_ids.empty()) {
      r->streamed = true;
      emit(*r, std::move(ev));
    }
    if (!reason.empty())
      end(*r, {.kind = GenerationEvent::Kind::Finished, .finish_reason = reason,
               .prompt_tokens = static_cast<int64_t>(r->params.prompt.size()), .completion_tokens = r->generated});
  }

  void on_failed(const proto::Failed& f, const std::string& from) {
    ClusterService::Request* r = by_wire(f.request_id);
    if (!r) return;
    const Code code = f.cause == proto::AbortReason::Internal || f.cause == proto::AbortReason::PlanFailed
                          ? Code::Internal : Code::Unavailable;
    retry_or_fail(*r, Status(code, from + " failed the request (" + proto::abort_reason_name(f.cause) + "): " + f.detail),
                  f.cause);
  }

  void on_peer_down(const std::string& name) {
    w_.live.erase(name);
    w_.heartbeats.erase(name);
    {
      std::lock_guard lk(s_.pub_mu_);
      ++s_.node_failures_[name];
    }
    std::vector<RequestHandle> hit;
    for (auto& [id, r] : w_.requests)
      if (r->pair >= 0) {
        const auto names = pair_control_names(s_.opts_.pairs[r->pair]);
        if (std::find(names.begin(), names.end(), name) != names.end()) hit.push_back(id);
      }
    for (RequestHandle id : hit) {
      auto it = w_.requests.find(id);
      if (it != w_.requests.end())
        retry_or_fail(*it->second, Status(Code::Unavailable, "node " + name + " is down"), proto::AbortReason::PeerDead);
    }
  }

  void on_event(const transfer::ControlEvent& e) {
    using transfer::ControlEventKind;
    if (e.kind == ControlEventKind::PeerUp) {
      spdlog::info("router: node {} up", e.peer);
      w_.live.insert(e.peer);
      return;
    }
    if (e.kind == ControlEventKind::PeerDown) {
      spdlog::warn("router: node {} down ({})", e.peer, transfer::peer_down_reason_name(e.reason));
      on_peer_down(e.peer);
      return;
    }
    auto m = proto::decode(e.payload);
    if (!m.is_ok()) {
      spdlog::warn("router: bad frame from {}: {}", e.peer, m.status().message());
      return;
    }
    auto placed_on = [&](uint64_t w) -> const ClusterPair* { auto* r = by_wire(w); return r && r->pair >= 0 ? &s_.opts_.pairs[r->pair] : nullptr; };
    if (!s_.auth_->accept(e.peer, m.value(), placed_on)) return;  // not from the request's own nodes
    std::visit([&](const auto& x) {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, proto::ClaimAck>) on_claim_ack(x);
      else if constexpr (std::is_same_v<T, proto::Tokens>) on_tokens(x);
      else if constexpr (std::is_same_v<T, proto::Failed>) on_failed(x, e.peer);
      else if constexpr (std::is_same_v<T, proto::Heartbeat>) {
        w_.heartbeats[e.peer] = x;
        std::lock_guard lk(s_.pub_mu_);
        s_.node_load_[e.peer] = {.pool_free_bytes = x.free_bytes, .running = x.num_running};
      }
    }, m.value());
  }

  void check_claim_timeouts() {
    const auto now = Clock::now();
    std::vector<RequestHandle> late;
    for (auto& [id, r] : w_.requests)
      if (r->phase == ClusterService::Request::Phase::Claiming && now - r->claim_sent > s_.opts_.claim_timeout)
        late.push_back(id);
    for (RequestHandle id : late) {
      auto it = w_.requests.find(id);
      if (it != w_.requests.end())
        retry_or_fail(*it->second, Status(Code::Unavailable, "decode did not acknowledge the CLAIM in time"),
                      proto::AbortReason::Deadline);
    }
  }

  void publish() {
    s_.auth_->set_socket_rejections(w_.server->rejections());
    bool any = false;
    for (const auto& p : s_.opts_.pairs) any = any || pair_ready(p);
    std::lock_guard lk(s_.pub_mu_);
    s_.live_nodes_ = w_.live;
    s_.any_ready_ = any;
    s_.running_ = static_cast<int64_t>(w_.requests.size());
  }

 private:
  ClusterService& s_;
  ClusterService::Worker& w_;
};

// ---------------------------------------------------------------------------------------------------
// The service.

Result<std::unique_ptr<ClusterService>> ClusterService::create(const ModelConfig& cfg,
                                                               std::shared_ptr<const Tokenizer> tokenizer,
                                                               ClusterOptions opts) {
  if (!tokenizer) return invalid_argument("tokenizer is required");
  if (opts.pairs.empty()) return invalid_argument("cluster: at least one prefill/decode pair is required (--pair)");
  if (opts.max_in_flight < 1) return invalid_argument("cluster: max_in_flight must be >= 1");
  if (opts.max_attempts < 1) return invalid_argument("cluster: max_attempts must be >= 1");
  if (opts.heartbeat.count() < 1 || opts.heartbeat_misses < 1) return invalid_argument("cluster: heartbeat must be positive");
  std::set<std::string> prefill_seen;
  for (const auto& p : opts.pairs)
    if (!prefill_seen.insert(p.prefill_instance).second)
      return invalid_argument("cluster: prefill instance '" + p.prefill_instance + "' is in two pairs");
  std::unique_ptr<ClusterService> s(new ClusterService());
  s->cfg_ = cfg;
  s->tokenizer_ = std::move(tokenizer);
  s->opts_ = std::move(opts);
  s->w_ = std::make_unique<Worker>();
  s->w_->policy = std::make_unique<PlacementPolicy>(s->opts_.placement, s->opts_.affinity_tokens);
  transfer::ControlOptions co;
  co.name = "router";
  co.heartbeat = {s->opts_.heartbeat, s->opts_.heartbeat_misses};
  co.keys = s->opts_.control_keys;
  K3_ASSIGN_OR_RETURN(s->w_->server, transfer::ControlServer::bind(s->w_->ctx, s->opts_.endpoint, co));
  s->endpoint_ = s->w_->server->endpoint();
  s->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->wake_fd_ < 0) return internal_error("eventfd failed");
  s->worker_ = std::thread([p = s.get()] { p->worker_loop(); });
  return s;
}

ClusterService::~ClusterService() {
  shutdown();
  if (worker_.joinable()) worker_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void ClusterService::wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

Result<RequestHandle> ClusterService::submit(GenerationParams params, EventSink sink) {
  // TOKENS carries ids only: say so instead of answering without the logprobs that were asked for.
  K3_TRY(check_generation_params(params, bool(sink), cfg_.vocab_size, cfg_.max_position_embeddings,
                                 "not supported in cluster mode (decode nodes stream token ids only)"));
  if (!ready()) return Status(Code::Unavailable, "no prefill/decode pair is ready");
  auto r = std::make_unique<Request>();
  std::shared_ptr<const Tokenizer> tok = tokenizer_;
  const std::vector<int32_t> stop_ids = params.stop_ids;
  // The same text rules as the local engine: specials and stop ids add no text.
  r->text = std::make_unique<TextStream>(
      [tok](int32_t id) { return tok->decode_bytes(std::span<const int32_t>(&id, 1)); }, params.stop_strings,
      [tok, stop_ids](int32_t id) {
        return tok->is_special(id) || std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
      });
  r->params = std::move(params);
  r->sink = std::move(sink);
  RequestHandle id;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return Status(Code::Unavailable, "the router is shutting down");
    if (static_cast<int>(live_.size()) >= opts_.max_in_flight)
      return Status(Code::ResourceExhausted, "too many requests in flight (" + std::to_string(opts_.max_in_flight) + ")");
    id = next_id_++;
    r->id = id;
    live_.insert(id);
    submitted_.push_back(std::move(r));
  }
  wake();
  return id;
}

void ClusterService::cancel(RequestHandle handle) {
  {
    std::lock_guard lk(mu_);
    if (!live_.count(handle)) return;
    cancelled_.insert(handle);
  }
  wake();
  std::lock_guard sink_lk(sink_mu_);  // wait out a callback in progress; later ones see the mark
}

bool ClusterService::ready() const {
  if (stopping_) return false;
  std::lock_guard lk(pub_mu_);
  return any_ready_;
}

ServiceStats ClusterService::stats() const {
  int64_t queued;
  {
    std::lock_guard lk(mu_);
    queued = static_cast<int64_t>(submitted_.size());
  }
  std::lock_guard lk(pub_mu_);
  return {.waiting = queued, .running = running_, .free_slots = std::max<int64_t>(0, opts_.max_in_flight - running_ - queued),
          .free_pages = -1};
}

void ClusterService::shutdown() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  if (wake_fd_ >= 0) wake();
}

std::set<std::string> ClusterService::live_nodes() const {
  std::lock_guard lk(pub_mu_);
  return live_nodes_;
}

void ClusterService::worker_loop() {
  ClusterWorkerOps ops(*this);
  const int fd = wake_fd_;
  while (!stopping_) {
    auto events = w_->server->poll(std::chrono::milliseconds(50), std::span<const int>(&fd, 1));
    uint64_t drained;
    while (::read(wake_fd_, &drained, sizeof drained) > 0) {
    }
    std::vector<std::unique_ptr<Request>> fresh;
    std::vector<RequestHandle> cancelled;
    {
      std::lock_guard lk(mu_);
      fresh.swap(submitted_);
      for (RequestHandle h : cancelled_) cancelled.push_back(h);
    }
    if (events.is_ok())
      for (const auto& e : *events) ops.on_event(e);
    else
      spdlog::warn("router: control poll failed: {}", events.status().message());
    for (auto& r : fresh) {
      const RequestHandle id = r->id;
      w_->requests[id] = std::move(r);
      ops.place(*w_->requests[id]);
    }
    // Cancelled requests: ABORT everywhere, forget them (the sink is never called again).
    for (RequestHandle h : cancelled) {
      auto it = w_->requests.find(h);
      if (it != w_->requests.end()) {
        ops.abort_parties(*it->second, protocol::AbortReason::ClientCancelled);
        w_->by_wire.erase(it->second->wire_id);
        w_->requests.erase(it);
      }
      std::lock_guard lk(mu_);
      cancelled_.erase(h);
      live_.erase(h);
    }
    ops.check_claim_timeouts();
    ops.publish();
  }
  // Shutdown: every request fails and is aborted on its nodes; later submits are refused.
  std::vector<std::unique_ptr<Request>> fresh;
  {
    std::lock_guard lk(mu_);
    fresh.swap(submitted_);
  }
  for (auto& r : fresh) {
    const RequestHandle id = r->id;
    w_->requests[id] = std::move(r);
  }
  std::vector<RequestHandle> ids;
  for (auto& [id, r] : w_->requests) ids.push_back(id);
  for (RequestHandle id : ids) {
    auto it = w_->requests.find(id);
    ops.abort_parties(*it->second, protocol::AbortReason::Shutdown);
    ops.end(*it->second, {.kind = GenerationEvent::Kind::Failed, .error = Status(Code::Unavailable, "the server is shutting down")});
  }
  (void)w_->server->poll(std::chrono::milliseconds(0));  // flush the ABORTs
  ops.publish();
}

}  // namespace k3::router
