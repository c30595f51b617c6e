#include "transfer/lazy_alloc_prefill.h"

namespace k3::transfer {

using protocol::Message;

struct PrefillSide::Record {
  uint64_t id = 0;
  protocol::Prefill prefill;
  RequestState state = RequestState::Queued;
  Millis deadline = Millis::max();   // ADDRS wait, once COMPUTE_DONE is sent
  std::optional<StageSource> source;
  bool compute_done_sent = false;
  uint32_t batches = 0;              // StartWrites posted and not yet reported flushed
  // Streaming: decode's addresses once ADDRS came, rows computed / already planned, states final.
  bool streaming = false;
  std::optional<DecodeDestinations> dest;
  uint32_t rows_ready = 0, rows_planned = 0;
  bool computed = false, states_planned = false;
  uint64_t planned_bytes = 0;
  bool ended = false;
  bool decode_dead = false;
  // What decode is told once nothing is in flight (deferred while writes are posted).
  enum class Tell { Nothing, Ack, Abort } tell = Tell::Nothing;
  AbortReason cause = AbortReason::Internal;
};

namespace {
template <class... Ts> struct Overload : Ts... { using Ts::operator()...; };
template <class... Ts> Overload(Ts...) -> Overload<Ts...>;
}  // namespace

PrefillSide::PrefillSide(PrefillSideConfig config, protocol::MetricsRegistry* metrics)
    : cfg_(std::move(config)), metrics_(metrics) {
  K3_CHECK(cfg_.model.validate().is_ok(), cfg_.model.validate().message());
  K3_CHECK(cfg_.prefill.validate(cfg_.model).is_ok(), cfg_.prefill.validate(cfg_.model).message());
  K3_CHECK(cfg_.stage < cfg_.prefill.num_stages(), "PrefillSide: stage out of range");
}

PrefillSide::~PrefillSide() = default;

void PrefillSide::set_state(Record& r, RequestState to) {
  const RequestState from = r.state;
  const Status s = protocol::transition(r.state, to);
  K3_CHECK(s.is_ok(), s.message());
  protocol::metric::count_transition(metrics_, from, to);
}

Peer PrefillSide::decode_peer(const Record& r) const {
  return Peer{.role = Role::Decode, .instance = r.prefill.decode_instance};
}

PrefillSide::Record* PrefillSide::find(uint64_t id, const char* what, Actions& out) {
  return find_live(records_, tombstones_, id, what, out);
}

Actions PrefillSide::on_prefill(const protocol::Prefill& m, Millis now) {
  Actions out;
  if (seen_before(records_, tombstones_, m.request_id)) {
    out.push_back(IgnoredAction{m.request_id, "PREFILL: duplicate or late (request id already seen)"});
    return out;
  }
  std::string bad;
  if (m.decode_instance.empty()) bad = "decode_instance is empty";
  else if (Status s = DecodeLayout{m.decode_ranks, cfg_.decode_kda_head_sliced}.validate(cfg_.model); !s.is_ok())
    bad = s.message();
  else if (m.token_ids.empty()) bad = "token_ids is empty";
  if (!bad.empty()) {
    out.push_back(SendAction{Peer{.role = Role::Router}, protocol::Failed{m.request_id, AbortReason::Rejected,
                                                                          "PREFILL: " + bad}});
    out.push_back(IgnoredAction{m.request_id, "PREFILL refused: " + bad});
    tombstones_[m.request_id] = {RequestState::Failed, now + cfg_.timeouts.tombstone_ttl};
    protocol::metric::count_failure(metrics_, AbortReason::Rejected);
    return out;
  }
  auto r = std::make_unique<Record>();
  r->id = m.request_id;
  r->prefill = m;
  set_state(*r, RequestState::Prefilling);
  records_.emplace(m.request_id, std::move(r));
  return out;
}

Actions PrefillSide::on_stage_computed(uint64_t request_id, StageSource source, std::optional<int32_t> first_token,
                                       Millis now, std::vector<protocol::TokenLogprobs> first_logprobs,
                                       std::vector<int32_t> choice_first_tokens) {
  Actions out;
  Record* r = find(request_id, "stage computed", out);
  if (!r) return out;
  if (r->streaming && !r->ended && !r->computed)
    return stream_computed(*r, std::move(source), first_token, now, std::move(first_logprobs),
                           std::move(choice_first_tokens));
  if (r->ended || r->state != RequestState::Prefilling) {
    out.push_back(IgnoredAction{request_id, std::string("stage computed: request is ") +
                                                protocol::state_name(r->state)});
    return out;
  }
  const bool last = cfg_.stage + 1 == cfg_.prefill.num_stages();
  if (source.stage != cfg_.stage || (last && !first_token))
    return end_request(*r, RequestState::Failed, AbortReason::Internal, true, true, now);
  r->source = std::move(source);
  protocol::ComputeDone cd{.request_id = r->id, .stage = cfg_.stage, .prompt_len = r->source->num_tokens,
                           .has_first_token = first_token.has_value(), .first_token = first_token.value_or(0),
                           .first_logprobs = std::move(first_logprobs),
                           .choice_first_tokens = std::move(choice_first_tokens)};
  out.push_back(SendAction{decode_peer(*r), cd});
  r->compute_done_sent = true;
  const Millis wait = r->prefill.timeout_ms ? Millis(r->prefill.timeout_ms) : cfg_.timeouts.addrs_wait;
  r->deadline = now + wait;
  set_state(*r, RequestState::ComputeDone);
  return out;
}

Actions PrefillSide::on_stream_started(uint64_t request_id, StageSource source, Millis now) {
  Actions out;
  Record* r = find(request_id, "stream started", out);
  if (!r) return out;
  if (r->ended || r->state != RequestState::Prefilling || r->streaming) {
    out.push_back(IgnoredAction{request_id, std::string("stream started: request is ") + protocol::state_name(r->state) +
                                                (r->streaming ? " and already streaming" : "")});
    return out;
  }
  if (source.stage != cfg_.stage || source.num_tokens != r->prefill.token_ids.size())
    return end_request(*r, RequestState::Failed, AbortReason::Internal, true, true, now);
  r->streaming = true;
  r->source = std::move(source);
  out.push_back(SendAction{decode_peer(*r), protocol::ComputeDone{.request_id = r->id, .stage = cfg_.stage,
                                                                  .prompt_len = r->source->num_tokens,
                                                                  .streaming = true}});
  r->compute_done_sent = true;
  r->deadline = now + (r->prefill.timeout_ms ? Millis(r->prefill.timeout_ms) : cfg_.timeouts.addrs_wait);
  return out;
}

Actions PrefillSide::on_rows_computed(uint64_t request_id, uint32_t rows, Millis now) {
  Actions out;
  Record* r = find(request_id, "rows computed", out);
  if (!r) return out;
  if (r->ended || !r->streaming || r->computed || rows < r->rows_ready || rows > r->source->num_tokens) {
    out.push_back(IgnoredAction{request_id, "rows computed: not streaming, already computed, or " +
                                                std::to_string(rows) + " rows out of order"});
    return out;
  }
  r->rows_ready = rows;
  return write_ready_part(*r, now);
}

Actions PrefillSide::stream_computed(Record& r, StageSource source, std::optional<int32_t> first_token, Millis now,
                                     std::vector<protocol::TokenLogprobs> first_logprobs,
                                     std::vector<int32_t> choice_first_tokens) {
  const bool last = cfg_.stage + 1 == cfg_.prefill.num_stages();
  if (source.stage != cfg_.stage || source.num_tokens != r.source->num_tokens || (last && !first_token))
    return end_request(r, RequestState::Failed, AbortReason::Internal, true, true, now);
  Actions out;
  r.computed = true;
  r.rows_ready = r.source->num_tokens;
  // Decode takes the first token from the last stage's final COMPUTE_DONE, sent before its TRANSFER_DONE.
  if (last)
    out.push_back(SendAction{decode_peer(r), protocol::ComputeDone{.request_id = r.id, .stage = cfg_.stage,
                                                                   .prompt_len = r.source->num_tokens,
                                                                   .has_first_token = true,
                                                                   .first_token = *first_token,
                                                                   .first_logprobs = std::move(first_logprobs),
                                                                   .choice_first_tokens = std::move(choice_first_tokens)}});
  Actions w = write_ready_part(r, now);
  out.insert(out.end(), w.begin(), w.end());
  return out;
}

Actions PrefillSide::write_ready_part(Record& r, Millis now) {
  Actions out;
  if (!r.dest) return out;   // before ADDRS: on_addrs writes everything computed by then
  const bool states = r.computed && !r.states_planned;
  if (r.rows_ready > r.rows_planned || states) {
    const DecodeLayout layout{r.prefill.decode_ranks, cfg_.decode_kda_head_sliced};
    auto ops = plan_stage_writes(cfg_.model, cfg_.prefill, layout, *r.source, *r.dest,
                                 PlanPart{.row_begin = r.rows_planned, .row_end = r.rows_ready, .states = states});
    if (!ops.is_ok()) {
      Actions a = end_request(r, RequestState::Failed, AbortReason::PlanFailed, true, true, now);
      a.insert(a.begin(), IgnoredAction{r.id, "ADDRS rejected: " + ops.status().message()});
      return a;
    }
    r.rows_planned = r.rows_ready;
    r.states_planned = r.states_planned || states;
    if (!ops->empty()) {
      r.planned_bytes += total_bytes(ops.value());
      ++r.batches;
      out.push_back(StartWritesAction{r.id, std::move(ops).value()});
    }
  }
  if (r.computed && r.states_planned && r.batches == 0) finish_transfer(r, now, out);
  return out;
}

Actions PrefillSide::on_addrs(const protocol::Addrs& m, Millis now) {
  Actions out;
  Record* r = find(m.request_id, "ADDRS", out);
  if (!r) return out;
  if (r->streaming && !r->ended && !r->dest) {
    auto dest = DecodeDestinations::from_addrs(m);
    if (!dest.is_ok()) {
      Actions a = end_request(*r, RequestState::Failed, AbortReason::PlanFailed, true, true, now);
      a.insert(a.begin(), IgnoredAction{m.request_id, "ADDRS rejected: " + dest.status().message()});
      return a;
    }
    r->dest = std::move(dest).value();
    r->deadline = Millis::max();  // writes finish or fail; peer death covers a silent decode
    set_state(*r, RequestState::Transferring);
    return write_ready_part(*r, now);
  }
  if (r->ended || r->state != RequestState::ComputeDone) {
    out.push_back(IgnoredAction{m.request_id, std::string("ADDRS: request is ") + protocol::state_name(r->state)});
    return out;
  }
  const DecodeLayout layout{r->prefill.decode_ranks, cfg_.decode_kda_head_sliced};
  auto dest = DecodeDestinations::from_addrs(m);
  Result<std::vector<WriteOp>> ops =
      dest.is_ok() ? plan_stage_writes(cfg_.model, cfg_.prefill, layout, *r->source, dest.value())
                   : Result<std::vector<WriteOp>>(dest.status());
  if (!ops.is_ok()) {
    Actions a = end_request(*r, RequestState::Failed, AbortReason::PlanFailed, true, true, now);
    a.insert(a.begin(), IgnoredAction{m.request_id, "ADDRS rejected: " + ops.status().message()});
    return a;
  }
  r->planned_bytes = total_bytes(ops.value());
  r->batches = 1;
  r->deadline = Millis::max();  // writes finish or fail; peer death covers a silent decode
  set_state(*r, RequestState::Allocated);
  set_state(*r, RequestState::Transferring);
  out.push_back(StartWritesAction{r->id, std::move(ops).value()});
  return out;
}

Actions PrefillSide::on_abort(const protocol::Abort& m, Millis now) {
  Actions out;
  // Decode asks about a request this stage already ended and released, e.g. one it failed because it
  // took decode for dead (a restarted decode rank it had not heard yet had claimed it): nothing of it
  // is in flight here, so say so, or decode holds the request's memory for the whole quarantine.
  if (m.origin_role == Role::Decode && !records_.count(m.request_id) && tombstones_.count(m.request_id)) {
    out.push_back(SendAction{Peer{.role = Role::Decode, .instance = m.origin_instance},
                             protocol::AbortAck{m.request_id, cfg_.stage}});
    return out;
  }
  if (tombstone_unknown_abort(records_, tombstones_, m.request_id, now + cfg_.timeouts.tombstone_ttl, out)) return out;
  Record* r = find(m.request_id, "ABORT", out);
  if (!r) return out;
  if (r->ended) {
    // Ended with writes still posted: decode is alive and asking, so it gets its ABORT_ACK once they are flushed.
    if (m.origin_role == Role::Decode) {
      r->decode_dead = false;
      r->tell = Record::Tell::Ack;
    }
    out.push_back(IgnoredAction{m.request_id, "ABORT: request already ended"});
    return out;
  }
  // The origin already told the router. Decode gets ABORT_ACK when it asked, else our own ABORT (so a
  // router-initiated abort that reaches us first still marks this stage safe at decode).
  return end_request(*r, RequestState::Aborted, m.reason, false, m.origin_role != Role::Decode, now);
}

Actions PrefillSide::on_message(const Message& m, Millis now) {
  return std::visit(Overload{
                        [&](const protocol::Prefill& x) { return on_prefill(x, now); },
                        [&](const protocol::Addrs& x) { return on_addrs(x, now); },
                        [&](const protocol::Abort& x) { return on_abort(x, now); },
                        [&](const auto&) {
                          return Actions{IgnoredAction{0, std::string("prefill side does not handle ") +
                                                              protocol::msg_type_name(protocol::type_of(m))}};
                        },
                    },
                    m);
}

Actions PrefillSide::on_writes_flushed(uint64_t request_id, const Status& result, Millis now) {
  Actions out;
  Record* r = find(request_id, "writes flushed", out);
  if (!r) return out;
  if (r->batches == 0) {
    out.push_back(IgnoredAction{request_id, "writes flushed: no writes were posted"});
    return out;
  }
  --r->batches;
  if (r->ended) {  // aborted while writing: once nothing is in flight decode may release
    if (r->batches == 0) finish_release(*r, out);
    return out;
  }
  if (!result.is_ok())
    return end_request(*r, RequestState::Failed, AbortReason::TransferFailed, true, true, now);
  if (r->batches == 0 && (!r->streaming || (r->computed && r->states_planned))) finish_transfer(*r, now, out);
  return out;
}

void PrefillSide::finish_transfer(Record& r, Millis now, Actions& out) {
  protocol::metric::count_transfer(metrics_);
  protocol::metric::count_bytes(metrics_, r.planned_bytes);
  out.push_back(SendAction{decode_peer(r), protocol::TransferDone{r.id, cfg_.stage, r.planned_bytes}});
  set_state(r, RequestState::Finished);
  r.ended = true;
  tombstones_[r.id] = {RequestState::Finished, now + cfg_.timeouts.tombstone_ttl};
  out.push_back(RequestEndedAction{r.id, RequestState::Finished, AbortReason::Internal});
  finish_release(r, out);
}

Actions PrefillSide::on_peer_dead(const Peer& peer, Millis now) {
  Actions out;
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : records_)
    if (!r->ended && (peer.role == Role::Router ||
                      (peer.role == Role::Decode && r->prefill.decode_instance == peer.instance)))
      ids.push_back(id);
  for (uint64_t id : ids) {
    Record& r = *records_.at(id);
    if (peer.role == Role::Decode) r.decode_dead = true;
    Actions a = end_request(r, RequestState::Failed, AbortReason::PeerDead, peer.role != Role::Router, true, now);
    out.insert(out.end(), a.begin(), a.end());
  }
  return out;
}

Actions PrefillSide::tick(Millis now) {
  Actions out;
  std::vector<uint64_t> expired;
  for (const auto& [id, r] : records_)
    if (!r->ended && now >= r->deadline) expired.push_back(id);
  for (uint64_t id : expired) {
    Actions a = end_request(*records_.at(id), RequestState::Expired, AbortReason::Deadline, true, true, now);
    out.insert(out.end(), a.begin(), a.end());
  }
  forget_expired(tombstones_, now);
  return out;
}

Actions PrefillSide::end_request(Record& r, RequestState terminal, AbortReason cause, bool notify_router,
                                 bool tell_decode_abort, Millis now) {
  Actions out;
  set_state(r, terminal);
  r.ended = true;
  r.cause = cause;
  r.deadline = Millis::max();
  protocol::metric::count_failure(metrics_, cause);
  out.push_back(RequestEndedAction{r.id, terminal, cause});
  if (notify_router)
    out.push_back(SendAction{Peer{.role = Role::Router},
                             protocol::Failed{r.id, cause, "prefill stage " + std::to_string(cfg_.stage) + ": request " +
                                                               protocol::state_name(terminal)}});
  // Decode hears from this stage once nothing is in flight: ABORT when the end started here or at the
  // router, ABORT_ACK when decode asked (it only waits for stages it sent ADDRS, i.e. after COMPUTE_DONE).
  if (r.decode_dead) r.tell = Record::Tell::Nothing;
  else if (tell_decode_abort) r.tell = Record::Tell::Abort;
  else r.tell = r.compute_done_sent ? Record::Tell::Ack : Record::Tell::Nothing;
  tombstones_[r.id] = {terminal, now + cfg_.timeouts.tombstone_ttl};
  if (r.batches > 0) {
    out.push_back(CancelWritesAction{r.id});  // on_writes_flushed finishes the job
    return out;
  }
  finish_release(r, out);  // erases r
  return out;
}

void PrefillSide::finish_release(Record& r, Actions& out) {
  if (r.ended && r.state != RequestState::Finished) {
    if (r.tell == Record::Tell::Abort)
      out.push_back(SendAction{decode_peer(r), protocol::Abort{.request_id = r.id, .reason = r.cause,
                                                               .origin_role = Role::Prefill,
                                                               .origin_instance = cfg_.instance_id,
                                                               .origin_stage = cfg_.stage}});
    else if (r.tell == Record::Tell::Ack)
      out.push_back(SendAction{decode_peer(r), protocol::AbortAck{r.id, cfg_.stage}});
  }
  // The stage held this request's KV/state from PREFILL on; exactly one release per request.
  out.push_back(ReleasedAction{r.id, r.source ? r.source->total_bytes : 0});
  const uint64_t id = r.id;
  if (!tombstones_.count(id)) tombstones_[id] = {r.state, Millis::max()};
  records_.erase(id);
}

std::optional<RequestState> PrefillSide::state(uint64_t request_id) const {
  return state_of(records_, tombstones_, request_id);
}

bool PrefillSide::writes_in_flight(uint64_t request_id) const {
  auto it = records_.find(request_id);
  return it != records_.end() && it->second->batches > 0;
}

uint32_t PrefillSide::write_batches_in_flight(uint64_t request_id) const {
  auto it = records_.find(request_id);
  return it == records_.end() ? 0 : it->second->batches;
}

size_t PrefillSide::num_live() const { return records_.size(); }

}  // namespace k3::transfer
