#include "router/cluster_service.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "common/protocol/frame.h"
#include "router/cluster_request.h"
#include "router/cluster_tokens.h"
#include "router/decode_choice.h"
#include "router/wire_ids.h"

namespace k3::router {

using Clock = std::chrono::steady_clock;
namespace proto = k3::protocol;

// The worker's request logic, as member functions of a helper that sees the service's privates.
class ClusterWorkerOps {
 public:
  using Request = ClusterService::Request;
  explicit ClusterWorkerOps(ClusterService& s) : s_(s), w_(*s.w_) {}

  // Every node of the pair is alive and its decode rank told its capacity (first heartbeat).
  bool pair_ready(const ClusterPair& p) const {
    for (const auto& n : pair_control_names(p))
      if (!w_.live.count(n)) return false;
    return w_.ledger.capacity(decode_control_name(p)).has_value();
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
  void abort_parties(Request& r, proto::AbortReason why) {
    if (r.pair < 0 || r.wire_id == 0) return;
    const proto::Abort a{.request_id = r.wire_id, .reason = why, .origin_role = proto::Role::Router};
    for (const auto& n : pair_control_names(s_.opts_.pairs[r.pair]))
      if (w_.live.count(n)) send(n, a);
  }

  // Calls the sink unless the request was cancelled (cancel() waits on sink_mu_ for a call in progress).
  void emit(Request& r, GenerationEvent&& ev) {
    std::lock_guard sink_lk(s_.sink_mu_);
    {
      std::lock_guard lk(s_.mu_);
      if (s_.cancelled_.count(r.id)) return;
    }
    r.sink(std::move(ev));
  }
  // Whatever the request holds on the worker's books: its queue place, reservation, deadline, wire id.
  void release(Request& r) {
    if (r.phase == RequestPhase::Queued && w_.queue.remove(r.id)) {
      std::lock_guard lk(s_.mu_);
      --s_.queued_;
    }
    w_.ledger.give_back(r.id);
    w_.deadlines.forget(r.id);
    w_.by_wire.erase(r.wire_id);
  }
  // Ends a request: the final event, then its state goes.
  void end(Request& r, GenerationEvent&& ev) {
    if (ev.kind == GenerationEvent::Kind::Finished && r.pair >= 0) {
      std::lock_guard lk(s_.pub_mu_);
      ++s_.finished_by_pair_[{s_.opts_.pairs[r.pair].prefill_instance, decode_control_name(s_.opts_.pairs[r.pair])}];
    }
    if (ev.kind == GenerationEvent::Kind::Finished)
      spdlog::info("router: request {} finished: {}, {} tokens", r.params.trace_id, ev.finish_reason, ev.completion_tokens);
    else
      spdlog::warn("router: request {} failed: {}", r.params.trace_id, ev.error.message());
    emit(r, std::move(ev));
    const RequestHandle id = r.id;
    release(r);
    {
      std::lock_guard lk(s_.mu_);
      s_.live_.erase(id);
      s_.cancelled_.erase(id);
    }
    w_.requests.erase(id);  // r is gone now
  }
  void fail(Request& r, Status why, const std::string& cause) {
    {
      std::lock_guard lk(s_.pub_mu_);
      ++s_.request_failures_[cause];
    }
    end(r, {.kind = GenerationEvent::Kind::Failed, .error = std::move(why)});
  }

  // A new request (or one sent back) waits in the queue; `front`: it keeps its place at the head.
  void enqueue(Request& r, bool front) {
    r.phase = RequestPhase::Queued;
    if (front) {
      w_.queue.push_front(r.id, r.queued_since);
      std::lock_guard lk(s_.mu_);
      ++s_.queued_;  // submit() counted it once already when it was new
    } else if (!w_.queue.push(r.id, r.queued_since)) {  // submit() keeps this from happening
      {
        std::lock_guard lk(s_.mu_);
        --s_.queued_;
      }
      fail(r, Status(Code::ResourceExhausted, "the admission queue is full"), "queue_full");
      return;
    }
    w_.deadlines.enter(r.id, RequestPhase::Queued, r.queued_since);
  }

  // Admits from the queue's head while some ready pair has room for the head request.
  void admit() {
    w_.queue.drain([&](RequestHandle id) { return try_place(id); });
  }
  // True when the request left the queue (placed, or failed because it can never be placed).
  bool try_place(RequestHandle id) {
    auto it = w_.requests.find(id);
    if (it == w_.requests.end()) return true;
    Request& r = *it->second;
    const std::vector<int> ready = ready_pairs();
    if (ready.empty() || r.attempts >= s_.opts_.max_attempts) {
      fail(r, Status(Code::Unavailable, ready.empty() ? "no prefill/decode pair is ready (nodes down or not registered)"
                                                      : "no prefill/decode pair could take the request after " +
                                                            std::to_string(r.attempts) + " attempt(s)"),
           ready.empty() ? "no_pair" : "placement");
      return true;
    }
    const auto prompt_len = static_cast<int64_t>(r.params.prompt.size());
    std::vector<int> fitting;
    std::string never;
    int possible = 0;
    for (int i : ready) {
      const std::string rank = decode_control_name(s_.opts_.pairs[i]);
      const DecodeCapacity cap = *w_.ledger.capacity(rank);
      if (const std::string why = never_fits(cap, prompt_len, r.params.max_tokens); !why.empty()) {
        never = why;
        continue;
      }
      ++possible;
      if (w_.ledger.fits(rank, demand(cap, r))) fitting.push_back(i);
    }
    if (possible == 0) {
      fail(r, Status(Code::InvalidArgument, never), "never_fits");
      return true;
    }
    if (fitting.empty()) return false;  // waits for room
    fitting = prefer_other_prefill(fitting, s_.opts_.pairs, r.failed_prefill);
    std::map<std::string, int64_t> prefilling;  // a pair's in-flight count: its prefill instance's, over all its pairs
    for (auto& [rid, q] : w_.requests)
      if (q->pair >= 0 && (q->phase == RequestPhase::Claimed || q->phase == RequestPhase::Prefilling))
        ++prefilling[s_.opts_.pairs[q->pair].prefill_instance];
    std::vector<PairLoad> load(s_.opts_.pairs.size());
    for (size_t i = 0; i < s_.opts_.pairs.size(); ++i) load[i].in_flight = prefilling[s_.opts_.pairs[i].prefill_instance];
    for (size_t i = 0; i < s_.opts_.pairs.size(); ++i) {
      auto hb = w_.heartbeats.find(decode_control_name(s_.opts_.pairs[i]));
      if (hb != w_.heartbeats.end()) load[i].reported_running = hb->second.num_running;
      // KV-aware placement: stage 0 of the pair's prefill instance decides its prefix-cache hits.
      load[i].cached_blocks = s_.prefix_reports_.blocks(stage_control_name(s_.opts_.pairs[i], 0), load[i].cached_block_tokens);
    }
    // The policy picks the prefill instance (through a pair), decode_choice.h the decode target.
    const int picked = w_.policy->pick(fitting, load, r.params.prompt);
    place(r, pair_with_least_loaded_decode(s_.opts_.pairs, fitting, s_.opts_.pairs[picked].prefill_instance, w_.ledger,
                                           w_.heartbeats, w_.decode_cursor));
    return true;
  }
  Demand demand(const DecodeCapacity& cap, const Request& r) const {
    Demand d = demand_of(cap, static_cast<int64_t>(r.params.prompt.size()),
                         std::min<int64_t>(r.params.max_tokens, s_.opts_.generation_reserve));
    d.cache_pages *= static_cast<uint32_t>(r.params.n);   // each choice decodes in caches of its own
    return d;
  }

  // Places a queued request on pair `chosen`: reserves its room, CLAIM to decode (PREFILL follows CLAIM_ACK).
  void place(Request& r, int chosen) {
    const ClusterPair& p = s_.opts_.pairs[chosen];
    const std::string rank = decode_control_name(p);
    {
      std::lock_guard lk(s_.mu_);
      --s_.queued_;
    }
    {
      std::lock_guard lk(s_.pub_mu_);
      ++s_.placements_[rank];
      s_.queue_wait_.observe(std::chrono::duration<double>(Clock::now() - r.queued_since).count());
    }
    w_.ledger.take(r.id, rank, demand(*w_.ledger.capacity(rank), r));
    ++r.attempts;
    r.pair = chosen;
    r.wire_id = w_.wire_ids.next([&](uint64_t id) { return w_.by_wire.count(id) != 0; });
    w_.by_wire[r.wire_id] = r.id;
    r.phase = RequestPhase::Claimed;
    w_.deadlines.enter(r.id, RequestPhase::Claimed, Clock::now());
    spdlog::info("router: request {} placed on {} and {} (attempt {}, wire id {:016x}, {} prompt tokens)", r.params.trace_id,
                 p.prefill_instance, rank, r.attempts, r.wire_id, r.params.prompt.size());
    send(rank, proto::Claim{.request_id = r.wire_id, .prompt_len = static_cast<uint32_t>(r.params.prompt.size()),
                            .decode_ranks = decode_group_ranks(p), .prefill_instance = p.prefill_instance,
                            .num_prefill_stages = p.stages, .timeout_ms = s_.opts_.request_timeout_ms,
                            .sampling = sampling_of(r.params), .trace_id = r.params.trace_id});
  }

  static proto::SamplingParams sampling_of(const GenerationParams& g) {
    return {.temperature = g.sampling.temperature, .top_p = g.sampling.top_p, .top_k = g.sampling.top_k,
            .seed = g.sampling.seed, .max_tokens = static_cast<uint32_t>(g.max_tokens), .stop_token_ids = g.stop_ids,
            .logprobs = g.logprobs, .output_format = g.output_format.encode(), .n = static_cast<uint32_t>(g.n)};
  }

  // This attempt failed: abort it everywhere, then queue the request again if nothing was streamed.
  // A decode rank out of transfer memory sends it back to the queue's head without using an attempt.
  void retry_or_fail(Request& r, const Status& why, proto::AbortReason cause) {
    abort_parties(r, cause);
    release(r);
    const bool room = cause == proto::AbortReason::AllocFailed;
    if (r.pair >= 0 && !room) r.failed_prefill.insert(s_.opts_.pairs[r.pair].prefill_instance);
    r.wire_id = 0;
    r.pair = -1;
    if (room && !r.streamed) --r.attempts;
    if (!r.streamed && r.attempts < s_.opts_.max_attempts && !ready_pairs().empty()) {
      spdlog::info("router: request {} queued again after: {}", r.params.trace_id, why.message());
      {
        std::lock_guard lk(s_.pub_mu_);
        ++(room ? s_.requeued_ : s_.retries_);
      }
      enqueue(r, /*front=*/true);
      return;
    }
    fail(r, why, proto::abort_reason_name(cause));
  }

  Request* by_wire(uint64_t wire) {
    auto it = w_.by_wire.find(wire);
    if (it == w_.by_wire.end()) return nullptr;
    auto r = w_.requests.find(it->second);
    return r == w_.requests.end() ? nullptr : r->second.get();
  }

  void on_claim_ack(const proto::ClaimAck& a) {
    Request* r = by_wire(a.request_id);
    if (!r || r->phase != RequestPhase::Claimed) return;
    if (!a.ok) {
      retry_or_fail(*r, Status(Code::Unavailable, "decode refused the request: " + a.reason), proto::AbortReason::Rejected);
      return;
    }
    const ClusterPair& p = s_.opts_.pairs[r->pair];
    const proto::Prefill m{.request_id = r->wire_id, .token_ids = r->params.prompt, .sampling = sampling_of(r->params),
                           .decode_instance = p.decode_instance, .decode_ranks = decode_group_ranks(p),
                           .timeout_ms = s_.opts_.request_timeout_ms, .trace_id = r->params.trace_id};
    for (uint32_t st = 0; st < p.stages; ++st) send(stage_control_name(p, st), m);
    r->phase = RequestPhase::Prefilling;
    w_.deadlines.enter(r->id, RequestPhase::Prefilling, Clock::now());
  }

  void on_tokens(const proto::Tokens& t) {
    Request* r = by_wire(t.request_id);
    if (!r || (r->phase != RequestPhase::Prefilling && r->phase != RequestPhase::Decoding)) return;
    if (r->phase == RequestPhase::Prefilling) {
      r->phase = RequestPhase::Decoding;
      w_.deadlines.enter(r->id, RequestPhase::Decoding, Clock::now());
    } else {
      w_.deadlines.progress(r->id, Clock::now());
    }
    if (t.choice >= r->choices.size()) {
      abort_parties(*r, proto::AbortReason::Internal);
      fail(*r, internal_error("TOKENS for choice " + std::to_string(t.choice) + " of a request with " +
                              std::to_string(r->choices.size())), "internal");
      return;
    }
    Request::Choice& c = r->choices[t.choice];
    if (t.finish != proto::FinishReason::None) c.decoded = true;
    if (c.ended) return;  // a stop string ended it here; decode generates the rest for nobody
    GenerationEvent ev;
    ev.kind = GenerationEvent::Kind::Tokens;
    ev.choice = static_cast<int>(t.choice);
    auto ended = absorb_tokens(t, r->params, *c.text, c.generated, ev);
    if (!ended.is_ok()) {
      abort_parties(*r, proto::AbortReason::Internal);
      fail(*r, ended.status(), "internal");
      return;
    }
    std::string reason = *ended;
    if (reason.empty() && t.finish == proto::FinishReason::Stop) reason = "stop";
    if (reason.empty() && t.finish == proto::FinishReason::Length) reason = "length";
    if (reason.empty() && t.finish == proto::FinishReason::Aborted) {
      retry_or_fail(*r, Status(Code::Unavailable, "decode aborted the request"), proto::AbortReason::Internal);
      return;
    }
    if (!reason.empty()) ev.text += c.text->flush();
    if (!ev.token_ids.empty()) {
      r->streamed = true;
      emit(*r, std::move(ev));
    }
    if (reason.empty()) return;
    c.ended = true;
    GenerationEvent fin{.kind = GenerationEvent::Kind::Finished, .choice = ev.choice, .finish_reason = reason,
                        .prompt_tokens = static_cast<int64_t>(r->params.prompt.size()), .completion_tokens = c.generated};
    if (--r->open_choices > 0) {
      emit(*r, std::move(fin));
      return;
    }
    // A stop string (or a cap) decided here: decode may still be generating some choice.
    if (std::any_of(r->choices.begin(), r->choices.end(), [](const Request::Choice& x) { return !x.decoded; }))
      abort_parties(*r, proto::AbortReason::ClientCancelled);
    end(*r, std::move(fin));
  }

  void on_failed(const proto::Failed& f, const std::string& from) {
    Request* r = by_wire(f.request_id);
    if (!r) return;
    const Code code = f.cause == proto::AbortReason::Internal || f.cause == proto::AbortReason::PlanFailed
                          ? Code::Internal : Code::Unavailable;
    retry_or_fail(*r, Status(code, from + " failed the request (" + proto::abort_reason_name(f.cause) + "): " + f.detail),
                  f.cause);
  }

  void on_peer_down(const std::string& name) {
    w_.live.erase(name);
    w_.heartbeats.erase(name);
    s_.prefix_reports_.forget(name);
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
      else if constexpr (std::is_same_v<T, proto::Heartbeat>) on_heartbeat(x, e.peer);
    }, m.value());
  }


  // A decode rank's heartbeat: its capacity (for admission) and its load (for the gauges); a prefill
  // stage's: its prefix cache (KV-aware placement, /metrics).
  void on_heartbeat(const proto::Heartbeat& x, const std::string& peer) {
    if (x.role == proto::Role::Prefill) {   // a prefill stage's heartbeat reports only its prefix cache
      s_.prefix_reports_.update(peer, x);
      return;
    }
    w_.heartbeats[peer] = x;
    const proto::DecodeRoom& room = x.room;
    if (x.role == proto::Role::Decode && room.pool_page_size > 0 && room.cache_page_size > 0) {
      const DecodeCapacity cap{.pool_page_size = room.pool_page_size, .pool_pages = room.pool_pages,
                               .pool_slots = room.pool_slots, .cache_page_size = room.cache_page_size,
                               .cache_pages = room.cache_pages, .cache_seqs = room.cache_seqs};
      w_.ledger.set_capacity(peer, cap);
      std::lock_guard lk(s_.pub_mu_);
      s_.capacity_[peer] = cap;
    }
    std::lock_guard lk(s_.pub_mu_);
    s_.node_load_[peer] = {.pool_free_bytes = x.free_bytes, .running = x.num_running, .room = room,
                           .reserved = w_.ledger.used(peer)};
  }

  // Requests whose phase deadline passed. A late CLAIM_ACK is retried like before; any other phase ends
  // the request with an error event, and every party gets an ABORT.
  void check_deadlines() {
    for (const auto& x : w_.deadlines.take_expired(Clock::now())) {
      auto it = w_.requests.find(x.id);
      if (it == w_.requests.end()) continue;
      Request& r = *it->second;
      const std::string phase = request_phase_name(x.phase);
      {
        std::lock_guard lk(s_.pub_mu_);
        ++s_.deadline_expired_[phase];
      }
      const std::string why = "deadline: the request spent over " + std::to_string(x.budget.count()) + " ms " +
                              (x.phase == RequestPhase::Decoding ? "without a token while decoding" : "in phase " + phase);
      if (x.phase == RequestPhase::Claimed) {
        retry_or_fail(r, Status(Code::Unavailable, "decode did not acknowledge the CLAIM in time"),
                      proto::AbortReason::Deadline);
        continue;
      }
      spdlog::warn("router: request {} expired: {}", r.params.trace_id, why);
      abort_parties(r, proto::AbortReason::Deadline);
      fail(r, Status(Code::DeadlineExceeded, why), "deadline");
    }
  }

  void publish() {
    s_.auth_->set_socket_rejections(w_.server->rejections());
    bool any = false;
    for (const auto& p : s_.opts_.pairs) any = any || pair_ready(p);
    std::lock_guard lk(s_.pub_mu_);
    s_.live_nodes_ = w_.live;
    s_.any_ready_ = any;
    s_.running_ = static_cast<int64_t>(w_.requests.size() - std::min(w_.requests.size(), w_.queue.size()));
    for (auto& [node, l] : s_.node_load_) l.reserved = w_.ledger.used(node);
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
  if (opts.max_queue < 1) return invalid_argument("cluster: max_queue must be >= 1");
  if (opts.generation_reserve < 0) return invalid_argument("cluster: generation_reserve must be >= 0");
  for (int ph = 0; ph < kNumRequestPhases; ++ph)
    if (opts.deadlines.of(static_cast<RequestPhase>(ph)).count() < 1)
      return invalid_argument(std::string("cluster: the ") + request_phase_name(static_cast<RequestPhase>(ph)) +
                              " deadline must be positive");
  if (opts.max_attempts < 1) return invalid_argument("cluster: max_attempts must be >= 1");
  if (opts.heartbeat.count() < 1 || opts.heartbeat_misses < 1) return invalid_argument("cluster: heartbeat must be positive");
  K3_TRY(check_pairs(opts.pairs));
  std::unique_ptr<ClusterService> s(new ClusterService());
  s->cfg_ = cfg;
  s->tokenizer_ = std::move(tokenizer);
  s->opts_ = std::move(opts);
  s->w_ = std::make_unique<Worker>(s->opts_);
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
      ops.enqueue(*w_->requests[id], /*front=*/false);
    }
    // Cancelled requests: ABORT everywhere, forget them (the sink is never called again).
    for (RequestHandle h : cancelled) {
      auto it = w_->requests.find(h);
      if (it != w_->requests.end()) {
        ops.abort_parties(*it->second, protocol::AbortReason::ClientCancelled);
        ops.release(*it->second);
        w_->requests.erase(it);
      }
      std::lock_guard lk(mu_);
      cancelled_.erase(h);
      live_.erase(h);
    }
    ops.check_deadlines();
    ops.admit();
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
