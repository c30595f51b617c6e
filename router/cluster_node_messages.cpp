// What the nodes send the cluster worker, over the control plane: peers up and down, CLAIM_ACK (then
// PREFILL to every stage), TOKENS (text events, stop strings, the end of each choice), FAILED (retry or
// fail) and heartbeats (decode capacity and load, prefill stages' prefix caches).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/protocol/frame.h"
#include "router/cluster_worker_ops.h"
#include "router/cluster_tokens.h"

namespace k3::router {

using Clock = std::chrono::steady_clock;
namespace proto = k3::protocol;

void ClusterWorkerOps::on_claim_ack(const proto::ClaimAck& a) {
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

void ClusterWorkerOps::on_tokens(const proto::Tokens& t) {
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

void ClusterWorkerOps::on_failed(const proto::Failed& f, const std::string& from) {
  Request* r = by_wire(f.request_id);
  if (!r) return;
  const Code code = f.cause == proto::AbortReason::Internal || f.cause == proto::AbortReason::PlanFailed
                        ? Code::Internal : Code::Unavailable;
  retry_or_fail(*r, Status(code, from + " failed the request (" + proto::abort_reason_name(f.cause) + "): " + f.detail),
                f.cause);
}

void ClusterWorkerOps::on_peer_down(const std::string& name) {
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

void ClusterWorkerOps::on_event(const transfer::ControlEvent& e) {
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
void ClusterWorkerOps::on_heartbeat(const proto::Heartbeat& x, const std::string& peer) {
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

}  // namespace k3::router
