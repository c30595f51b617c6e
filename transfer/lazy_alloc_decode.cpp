#include "transfer/lazy_alloc_decode.h"

#include <algorithm>

namespace k3::transfer {

using protocol::Message;

struct DecodeSide::Record {
  uint64_t id = 0;
  protocol::Claim claim;
  DecodeLayout layout;
  RequestState state = RequestState::Queued;
  Millis deadline = Millis::max();          // of the current wait (compute, then transfer)
  std::vector<RankAllocation> alloc;        // empty until the first COMPUTE_DONE
  protocol::Addrs addrs;                    // built once at allocation, sent to each stage
  std::vector<uint8_t> addrs_sent, done, safe;  // per stage; safe = promised no write in flight
  std::vector<uint8_t> streaming;           // per stage: it asked for ADDRS at its first chunk
  bool have_first_token = false;
  int32_t first_token = 0;
  std::vector<protocol::TokenLogprobs> first_logprobs;  // the last stage's, when the sampling params ask
  std::vector<int32_t> choice_first_tokens;              // n > 1: choices 1..n-1
  bool ended = false;                       // terminal state reached (memory may still be held)
  Millis release_at = Millis::max();        // quarantine end once ended
};

namespace {
template <class... Ts> struct Overload : Ts... { using Ts::operator()...; };
template <class... Ts> Overload(Ts...) -> Overload<Ts...>;

Peer router_peer() { return Peer{.role = Role::Router}; }

// A request's share on one rank in `pool`: pages for its `rows` and one KDA slot (none without KDA
// layers); nullopt, the pool untouched, when either does not fit.
std::optional<RankAllocation> allocate_in(RankPool& pool, uint32_t rows) {
  const uint32_t ps = pool.geometry().page_size;
  auto pages = pool.allocate_pages((rows + ps - 1) / ps);
  Result<SlotHandle> slot = pool.geometry().kda_layer_ids.empty() ? Result<SlotHandle>(SlotHandle()) : pool.allocate_slot();
  if (!pages.is_ok() || !slot.is_ok()) return std::nullopt;  // the handle that succeeded frees itself
  return RankAllocation{.rank = pool.geometry().rank, .region_id = pool.geometry().region_id,
                        .pages = std::move(pages).value(), .slot = std::move(slot).value()};
}
}  // namespace

DecodeSide::DecodeSide(DecodeSideConfig config, std::vector<RankPool*> pools, protocol::MetricsRegistry* metrics)
    : cfg_(std::move(config)), metrics_(metrics) {
  for (RankPool* p : pools) {
    K3_CHECK(p != nullptr, "DecodeSide: null pool");
    K3_CHECK(pools_.emplace(p->geometry().region_id, p).second, "DecodeSide: two pools for one region");
    regions_[p->geometry().rank].push_back(p->geometry().region_id);
  }
}

DecodeSide::~DecodeSide() = default;

void DecodeSide::set_state(Record& r, RequestState to) {
  const RequestState from = r.state;
  // Every call site moves forward or to a terminal state from a live one; anything else is a bug here.
  const Status s = protocol::transition(r.state, to);
  K3_CHECK(s.is_ok(), s.message());
  protocol::metric::count_transition(metrics_, from, to);
}

DecodeSide::Record* DecodeSide::find(uint64_t id, const char* what, Actions& out) {
  return find_live(records_, tombstones_, id, what, out);
}

Actions DecodeSide::on_claim(const protocol::Claim& m, Millis now) {
  Actions out;
  if (seen_before(records_, tombstones_, m.request_id)) {
    out.push_back(IgnoredAction{m.request_id, "CLAIM: duplicate or late (request id already seen)"});
    return out;
  }
  auto r = std::make_unique<Record>();
  r->id = m.request_id;
  r->claim = m;
  r->layout = DecodeLayout{.ranks = m.decode_ranks, .kda_head_sliced = cfg_.kda_head_sliced};
  std::string bad;
  if (Status s = r->layout.validate(cfg_.model); !s.is_ok()) bad = s.message();
  for (uint32_t rank : m.decode_ranks)
    if (bad.empty() && !regions_.count(rank)) bad = "decode rank " + std::to_string(rank) + " is not served here";
  if (bad.empty() && m.num_prefill_stages == 0) bad = "num_prefill_stages is 0";
  if (bad.empty() && m.prefill_instance.empty()) bad = "prefill_instance is empty";
  if (!bad.empty()) {
    // Refused before any state exists: tell the router, remember the id so retries are not resurrected.
    out.push_back(SendAction{router_peer(), protocol::Failed{m.request_id, AbortReason::Rejected, "CLAIM: " + bad}});
    out.push_back(IgnoredAction{m.request_id, "CLAIM refused: " + bad});
    tombstones_[m.request_id] = {RequestState::Failed, now + cfg_.timeouts.tombstone_ttl};
    protocol::metric::count_failure(metrics_, AbortReason::Rejected);
    return out;
  }
  const uint32_t n = m.num_prefill_stages;
  r->addrs_sent.assign(n, 0);
  r->streaming.assign(n, 0);
  r->done.assign(n, 0);
  r->safe.assign(n, 0);
  r->deadline = now + (m.timeout_ms ? Millis(m.timeout_ms) : cfg_.timeouts.compute_wait);
  set_state(*r, RequestState::Claimed);
  records_.emplace(m.request_id, std::move(r));
  protocol::metric::set_active_requests(metrics_, int64_t(records_.size()));
  return out;
}

Actions DecodeSide::on_compute_done(const protocol::ComputeDone& m, Millis now) {
  Actions out;
  Record* r = find(m.request_id, "COMPUTE_DONE", out);
  if (!r) return out;
  if (r->ended) {
    out.push_back(IgnoredAction{m.request_id, "COMPUTE_DONE: request already ended"});
    return out;
  }
  // A streaming stage's final COMPUTE_DONE: it already has its ADDRS; the last stage's brings the first token.
  if (m.stage < r->addrs_sent.size() && r->addrs_sent[m.stage] && r->streaming[m.stage] && !m.streaming &&
      m.prompt_len == r->claim.prompt_len) {
    r->streaming[m.stage] = 0;   // a second final one is a duplicate
    if (m.has_first_token) {
      r->have_first_token = true;
      r->first_token = m.first_token;
      r->first_logprobs = m.first_logprobs;
      r->choice_first_tokens = m.choice_first_tokens;
    }
    return out;
  }
  if (m.stage >= r->addrs_sent.size() || r->addrs_sent[m.stage]) {
    out.push_back(IgnoredAction{m.request_id, "COMPUTE_DONE: stage " + std::to_string(m.stage) +
                                                  (m.stage >= r->addrs_sent.size() ? " out of range" : " duplicate")});
    return out;
  }
  if (m.prompt_len != r->claim.prompt_len) {
    return end_request(*r, RequestState::Failed, AbortReason::Internal, true, true, now);
  }
  if (m.has_first_token) {
    r->have_first_token = true;
    r->first_token = m.first_token;
    r->first_logprobs = m.first_logprobs;
    r->choice_first_tokens = m.choice_first_tokens;
  }
  if (r->alloc.empty()) {
    // Lazy allocation: the first stage to finish triggers it for the whole request, on every rank.
    set_state(*r, RequestState::ComputeDone);
    std::vector<RankAllocation> alloc;
    for (uint32_t i = 0; i < r->layout.group_size(); ++i) {
      const uint32_t rank = r->layout.ranks[i];
      std::vector<uint32_t> regions = regions_.at(rank);
      if (regions.size() > 1 && cfg_.region_order) regions = cfg_.region_order(r->claim, std::move(regions));
      const uint32_t rows = r->layout.rows_on(i, r->claim.prompt_len);
      std::optional<RankAllocation> got;
      for (uint32_t region : regions) {
        auto pool = pools_.find(region);
        if (pool == pools_.end()) continue;
        got = allocate_in(*pool->second, rows);
        if (got) break;
      }
      // `alloc` releases what it holds here: nothing leaks.
      if (!got) return end_request(*r, RequestState::Failed, AbortReason::AllocFailed, true, true, now);
      alloc.push_back(std::move(*got));
    }
    r->alloc = std::move(alloc);
    for (const auto& a : r->alloc) protocol::metric::set_pool_free_bytes(metrics_, a.region_id, pools_.at(a.region_id)->free_bytes());
    r->addrs.request_id = r->id;
    for (const auto& a : r->alloc) append_addrs(pools_.at(a.region_id)->geometry(), a, r->addrs);
    set_state(*r, RequestState::Allocated);
    r->deadline = now + cfg_.timeouts.transfer_wait;
  }
  r->addrs_sent[m.stage] = 1;
  r->streaming[m.stage] = m.streaming ? 1 : 0;
  out.push_back(SendAction{Peer{.role = Role::Prefill, .instance = r->claim.prefill_instance, .stage = m.stage},
                           r->addrs});
  if (r->state == RequestState::Allocated) set_state(*r, RequestState::Transferring);
  return out;
}

Actions DecodeSide::on_transfer_done(const protocol::TransferDone& m, Millis now) {
  Actions out;
  Record* r = find(m.request_id, "TRANSFER_DONE", out);
  if (!r) return out;
  if (r->ended) {
    // Still useful: the stage's writes are flushed, so its memory can no longer be written.
    if (m.stage < r->safe.size()) r->safe[m.stage] = 1;
    out.push_back(IgnoredAction{m.request_id, "TRANSFER_DONE: request already ended"});
    maybe_release(*r, now, false, out);
    return out;
  }
  if (m.stage >= r->done.size() || !r->addrs_sent[m.stage] || r->done[m.stage]) {
    out.push_back(IgnoredAction{m.request_id, "TRANSFER_DONE: stage " + std::to_string(m.stage) +
                                                  " out of range, not sent ADDRS, or duplicate"});
    return out;
  }
  r->done[m.stage] = 1;
  protocol::metric::count_transfer(metrics_);
  protocol::metric::count_bytes(metrics_, m.bytes);
  if (std::all_of(r->done.begin(), r->done.end(), [](uint8_t d) { return d != 0; })) {
    if (!r->have_first_token)  // the last stage's COMPUTE_DONE carries it and precedes its TRANSFER_DONE
      return end_request(*r, RequestState::Failed, AbortReason::Internal, true, false, now);
    set_state(*r, RequestState::Decoding);
    r->deadline = Millis::max();
    out.push_back(ReadyAction{r->id, r->claim.prompt_len, r->first_token, r->first_logprobs, r->choice_first_tokens});
  }
  return out;
}

Actions DecodeSide::on_abort(const protocol::Abort& m, Millis now) {
  Actions out;
  if (tombstone_unknown_abort(records_, tombstones_, m.request_id, now + cfg_.timeouts.tombstone_ttl, out)) return out;
  Record* r = find(m.request_id, "ABORT", out);
  if (!r) return out;
  const bool from_our_stage = m.origin_role == Role::Prefill && m.origin_instance == r->claim.prefill_instance &&
                              m.origin_stage < r->safe.size();
  // A prefill stage sends ABORT only with nothing in flight: that stage is safe from now on.
  if (from_our_stage) r->safe[m.origin_stage] = 1;
  if (r->ended) {
    if (!from_our_stage) out.push_back(IgnoredAction{m.request_id, "ABORT: request already ended"});
    maybe_release(*r, now, false, out);
    return out;
  }
  // The origin (router, or a prefill stage that also told the router) needs no FAILED from us.
  return end_request(*r, RequestState::Aborted, m.reason, false, true, now);
}

Actions DecodeSide::on_abort_ack(const protocol::AbortAck& m, Millis now) {
  Actions out;
  Record* r = find(m.request_id, "ABORT_ACK", out);
  if (!r) return out;
  if (!r->ended || m.stage >= r->safe.size()) {
    out.push_back(IgnoredAction{m.request_id, "ABORT_ACK: request not aborted here, or stage out of range"});
    return out;
  }
  r->safe[m.stage] = 1;
  maybe_release(*r, now, false, out);
  return out;
}

Actions DecodeSide::on_message(const Message& m, Millis now) {
  return std::visit(Overload{
                        [&](const protocol::Claim& x) { return on_claim(x, now); },
                        [&](const protocol::ComputeDone& x) { return on_compute_done(x, now); },
                        [&](const protocol::TransferDone& x) { return on_transfer_done(x, now); },
                        [&](const protocol::Abort& x) { return on_abort(x, now); },
                        [&](const protocol::AbortAck& x) { return on_abort_ack(x, now); },
                        [&](const auto&) {
                          return Actions{IgnoredAction{0, std::string("decode side does not handle ") +
                                                              protocol::msg_type_name(protocol::type_of(m))}};
                        },
                    },
                    m);
}

Actions DecodeSide::on_finished(uint64_t request_id, Millis now) {
  Actions out;
  Record* r = find(request_id, "finished", out);
  if (!r) return out;
  if (r->state != RequestState::Decoding) {
    out.push_back(IgnoredAction{request_id, std::string("finished: request is ") + protocol::state_name(r->state)});
    return out;
  }
  return end_request(*r, RequestState::Finished, AbortReason::Internal, false, false, now);
}

Status DecodeSide::hand_over(uint64_t request_id) {
  auto it = records_.find(request_id);
  if (it == records_.end()) return not_found("hand over: request " + std::to_string(request_id) + " is not live");
  Record& r = *it->second;
  if (r.state != RequestState::Decoding)
    return invalid_argument("hand over: request " + std::to_string(request_id) + " is " +
                               protocol::state_name(r.state) + ", not DECODING");
  std::vector<uint32_t> regions;
  for (const auto& a : r.alloc) regions.push_back(a.region_id);
  r.alloc.clear();  // the handles drop the side's references; the engine's keep the memory
  for (uint32_t region : regions) protocol::metric::set_pool_free_bytes(metrics_, region, pools_.at(region)->free_bytes());
  return Status::ok();
}

Actions DecodeSide::on_peer_dead(const Peer& peer, Millis now) {
  Actions out;
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : records_) {
    if (r->ended) continue;
    const bool hit = peer.role == Role::Router ||
                     (peer.role == Role::Prefill && r->claim.prefill_instance == peer.instance &&
                      r->state < RequestState::Decoding);  // once decoding, prefill is no longer needed
    if (hit) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    Record& r = *records_.at(id);
    // A dead prefill gets no ABORT (its stages stay unsafe: memory waits out the quarantine).
    Actions a = end_request(r, RequestState::Failed, AbortReason::PeerDead, peer.role != Role::Router,
                            peer.role != Role::Prefill, now);
    out.insert(out.end(), a.begin(), a.end());
  }
  return out;
}

Actions DecodeSide::tick(Millis now) {
  Actions out;
  std::vector<uint64_t> expired, quarantined;
  for (const auto& [id, r] : records_) {
    if (!r->ended && now >= r->deadline) expired.push_back(id);
    else if (r->ended && now >= r->release_at) quarantined.push_back(id);
  }
  for (uint64_t id : expired) {
    Actions a = end_request(*records_.at(id), RequestState::Expired, AbortReason::Deadline, true, true, now);
    out.insert(out.end(), a.begin(), a.end());
  }
  for (uint64_t id : quarantined) maybe_release(*records_.at(id), now, true, out);
  forget_expired(tombstones_, now);
  return out;
}

Actions DecodeSide::end_request(Record& r, RequestState terminal, AbortReason cause, bool notify_router,
                                bool notify_prefill, Millis now) {
  Actions out;
  set_state(r, terminal);
  r.ended = true;
  r.deadline = Millis::max();
  r.release_at = now + cfg_.timeouts.quarantine;
  if (terminal != RequestState::Finished) protocol::metric::count_failure(metrics_, cause);
  out.push_back(RequestEndedAction{r.id, terminal, cause});
  if (notify_router && terminal != RequestState::Finished)
    out.push_back(SendAction{router_peer(), protocol::Failed{r.id, cause, std::string("decode: request ") +
                                                                              protocol::state_name(terminal)}});
  if (notify_prefill && terminal != RequestState::Finished)
    for (uint32_t s = 0; s < r.done.size(); ++s)
      if (!r.done[s] && !r.safe[s])
        out.push_back(SendAction{Peer{.role = Role::Prefill, .instance = r.claim.prefill_instance, .stage = s},
                                 protocol::Abort{.request_id = r.id, .reason = cause, .origin_role = Role::Decode,
                                                 .origin_instance = cfg_.instance_id, .origin_stage = 0}});
  maybe_release(r, now, false, out);  // may erase r
  return out;
}

void DecodeSide::maybe_release(Record& r, Millis now, bool quarantine_over, Actions& out) {
  bool in_flight = false;
  for (size_t s = 0; s < r.addrs_sent.size(); ++s) in_flight |= r.addrs_sent[s] && !r.done[s] && !r.safe[s];
  if (in_flight && !quarantine_over) return;
  uint64_t bytes = 0;
  for (auto& a : r.alloc) {
    const auto& g = pools_.at(a.region_id)->geometry();
    bytes += a.pages.page_ids().size() * g.page_bytes() + (a.slot.empty() ? 0 : g.slot_bytes());
  }
  const bool held = !r.alloc.empty();
  std::vector<uint32_t> regions;
  for (const auto& a : r.alloc) regions.push_back(a.region_id);
  r.alloc.clear();  // the handles free their pages and slots, once
  for (uint32_t region : regions) protocol::metric::set_pool_free_bytes(metrics_, region, pools_.at(region)->free_bytes());
  if (held) out.push_back(ReleasedAction{r.id, bytes});
  const uint64_t id = r.id;
  tombstones_[id] = {r.state, now + cfg_.timeouts.tombstone_ttl};
  records_.erase(id);
  protocol::metric::set_active_requests(metrics_, int64_t(records_.size()));
}

std::optional<RequestState> DecodeSide::state(uint64_t request_id) const {
  return state_of(records_, tombstones_, request_id);
}

const protocol::Claim* DecodeSide::claim(uint64_t request_id) const {
  auto it = records_.find(request_id);
  return it == records_.end() || it->second->ended ? nullptr : &it->second->claim;
}

const std::vector<RankAllocation>* DecodeSide::allocation(uint64_t request_id) const {
  auto it = records_.find(request_id);
  return it == records_.end() || it->second->alloc.empty() ? nullptr : &it->second->alloc;
}

bool DecodeSide::holds_memory(uint64_t request_id) const { return allocation(request_id) != nullptr; }

size_t DecodeSide::num_live() const { return records_.size(); }

}  // namespace k3::transfer
