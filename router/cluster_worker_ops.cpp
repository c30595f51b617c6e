// The cluster worker's books and decisions: a request's life on them (queue, reservation, deadline, wire
// id, its final event), admission from the queue, placement on a pair, retries, expired deadlines, and what
// the worker publishes for ready()/stats()/metrics. What the nodes send is read in cluster_node_messages.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/protocol/frame.h"
#include "engine/sampling_wire.h"
#include "router/cluster_worker_ops.h"
#include "router/decode_choice.h"

namespace k3::router {

using Clock = std::chrono::steady_clock;
namespace proto = k3::protocol;

// Every node of the pair is alive and its decode rank told its capacity (first heartbeat).
bool ClusterWorkerOps::pair_ready(const ClusterPair& p) const {
  for (const auto& n : pair_control_names(p))
    if (!w_.live.count(n)) return false;
  return w_.ledger.capacity(decode_control_name(p)).has_value();
}
std::vector<int> ClusterWorkerOps::ready_pairs() const {
  std::vector<int> r;
  for (size_t i = 0; i < s_.opts_.pairs.size(); ++i)
    if (pair_ready(s_.opts_.pairs[i])) r.push_back(static_cast<int>(i));
  return r;
}

void ClusterWorkerOps::send(const std::string& peer, const proto::Message& m) {
  if (Status st = w_.server->send(peer, proto::encode(m)); !st.is_ok())
    spdlog::debug("router: {} to {} not sent: {}", proto::msg_type_name(proto::type_of(m)), peer, st.message());
}
void ClusterWorkerOps::abort_parties(Request& r, proto::AbortReason why) {
  if (r.pair < 0 || r.wire_id == 0) return;
  const proto::Abort a{.request_id = r.wire_id, .reason = why, .origin_role = proto::Role::Router};
  for (const auto& n : pair_control_names(s_.opts_.pairs[r.pair]))
    if (w_.live.count(n)) send(n, a);
}

// Calls the sink unless the request was cancelled (cancel() waits on sink_mu_ for a call in progress).
void ClusterWorkerOps::emit(Request& r, GenerationEvent&& ev) {
  std::lock_guard sink_lk(s_.sink_mu_);
  {
    std::lock_guard lk(s_.mu_);
    if (s_.cancelled_.count(r.id)) return;
  }
  r.sink(std::move(ev));
}
// Whatever the request holds on the worker's books: its queue place, reservation, deadline, wire id.
void ClusterWorkerOps::release(Request& r) {
  if (r.phase == RequestPhase::Queued && w_.queue.remove(r.id)) {
    std::lock_guard lk(s_.mu_);
    --s_.queued_;
  }
  w_.ledger.give_back(r.id);
  w_.deadlines.forget(r.id);
  w_.by_wire.erase(r.wire_id);
}
// Ends a request: the final event, then its state goes.
void ClusterWorkerOps::end(Request& r, GenerationEvent&& ev) {
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
void ClusterWorkerOps::fail(Request& r, Status why, const std::string& cause) {
  {
    std::lock_guard lk(s_.pub_mu_);
    ++s_.request_failures_[cause];
  }
  end(r, {.kind = GenerationEvent::Kind::Failed, .error = std::move(why)});
}

// A new request (or one sent back) waits in the queue; `front`: it keeps its place at the head.
void ClusterWorkerOps::enqueue(Request& r, bool front) {
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
void ClusterWorkerOps::admit() {
  w_.queue.drain([&](RequestHandle id) { return try_place(id); });
}
// True when the request left the queue (placed, or failed because it can never be placed).
bool ClusterWorkerOps::try_place(RequestHandle id) {
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
Demand ClusterWorkerOps::demand(const DecodeCapacity& cap, const Request& r) const {
  Demand d = demand_of(cap, static_cast<int64_t>(r.params.prompt.size()),
                       std::min<int64_t>(r.params.max_tokens, s_.opts_.generation_reserve));
  d.cache_pages *= static_cast<uint32_t>(r.params.n);   // each choice decodes in caches of its own
  return d;
}

// Places a queued request on pair `chosen`: reserves its room, CLAIM to decode (PREFILL follows CLAIM_ACK).
void ClusterWorkerOps::place(Request& r, int chosen) {
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

proto::SamplingParams ClusterWorkerOps::sampling_of(const GenerationParams& g) {
  return {.temperature = g.sampling.temperature, .top_p = g.sampling.top_p, .top_k = g.sampling.top_k,
          .seed = g.sampling.seed, .max_tokens = static_cast<uint32_t>(g.max_tokens), .stop_token_ids = g.stop_ids,
          .logprobs = g.logprobs, .output_format = g.output_format.encode(), .n = static_cast<uint32_t>(g.n),
          .presence_penalty = g.sampling.presence_penalty, .frequency_penalty = g.sampling.frequency_penalty,
          .logit_bias = to_wire(g.logit_bias)};
}

// This attempt failed: abort it everywhere, then queue the request again if nothing was streamed.
// A decode rank out of transfer memory sends it back to the queue's head without using an attempt.
void ClusterWorkerOps::retry_or_fail(Request& r, const Status& why, proto::AbortReason cause) {
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

ClusterService::Request* ClusterWorkerOps::by_wire(uint64_t wire) {
  auto it = w_.by_wire.find(wire);
  if (it == w_.by_wire.end()) return nullptr;
  auto r = w_.requests.find(it->second);
  return r == w_.requests.end() ? nullptr : r->second.get();
}

// Requests whose phase deadline passed. A late CLAIM_ACK is retried like before; any other phase ends
// the request with an error event, and every party gets an ABORT.
void ClusterWorkerOps::check_deadlines() {
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

void ClusterWorkerOps::publish() {
  s_.auth_->set_socket_rejections(w_.server->rejections());
  bool any = false;
  for (const auto& p : s_.opts_.pairs) any = any || pair_ready(p);
  std::lock_guard lk(s_.pub_mu_);
  s_.live_nodes_ = w_.live;
  s_.any_ready_ = any;
  s_.running_ = static_cast<int64_t>(w_.requests.size() - std::min(w_.requests.size(), w_.queue.size()));
  for (auto& [node, l] : s_.node_load_) l.reserved = w_.ledger.used(node);
}

}  // namespace k3::router
