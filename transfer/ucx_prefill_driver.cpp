#include "transfer/ucx_prefill_driver.h"

#ifdef K3_TRANSFER_HAVE_CUDA
#include "transfer/cuda/cuda_memory.h"
#endif

#include <spdlog/spdlog.h>

#include "common/protocol/compat.h"
#include "transfer/partner_auth.h"
#include "transfer/region_puts.h"

namespace k3::transfer {

Result<std::unique_ptr<PrefillDriver>> PrefillDriver::create(PrefillDriverConfig cfg, zmq::context_t& zctx,
                                                             protocol::MetricsRegistry* metrics) {
  if (cfg.decodes.empty()) return invalid_argument("PrefillDriverConfig.decodes is empty (no decode instance to feed)");
  std::set<std::string> seen;
  for (size_t i = 0; i < cfg.decodes.size(); ++i) {
    const std::string at = "PrefillDriverConfig.decodes[" + std::to_string(i) + "]";
    if (cfg.decodes[i].instance.empty()) return invalid_argument(at + ".instance is empty");
    if (cfg.decodes[i].endpoint.empty()) return invalid_argument(at + ".endpoint is empty");
    if (!seen.insert(cfg.decodes[i].instance).second)
      return invalid_argument(at + ".instance '" + cfg.decodes[i].instance + "' is named twice");
  }
  std::unique_ptr<PrefillDriver> d(new PrefillDriver(std::move(cfg), metrics));
  auto& c = d->cfg_;
  K3_TRY(c.side.prefill.validate(c.side.model));
  // No peer error mode on the writer's endpoints: with it UCX drops shared-memory RMA and puts go over
  // tcp at ~1/20 of the bandwidth (docs/PERF.md). Liveness of decode comes from the control plane's
  // heartbeats; writes are bounded by WriterOptions.timeout. The worker sleeps on its event fd.
  K3_TRY(prepare_memory_type(c.source_memory, c.cuda_device, "prefill source images in device memory"));
  std::shared_ptr<const SourceReader> reader = std::make_shared<HostSourceReader>();
#ifdef K3_TRANSFER_HAVE_CUDA
  if (c.source_memory == MemoryType::Cuda) reader = std::make_shared<CudaSourceReader>();
#endif
  K3_ASSIGN_OR_RETURN(d->ctx_, UcxContext::create(UCP_FEATURE_RMA | UCP_FEATURE_TAG, c.ucx_net_devices));
  K3_ASSIGN_OR_RETURN(d->worker_, UcxWorker::create(d->ctx_, /*serialized=*/true));
  if (c.source_arena_bytes > 0) {
    auto arena = SourceArena::create(d->ctx_, c.source_memory, c.source_arena_bytes, metrics);
    if (!arena.is_ok())   // the node's flag: k3-prefill --source-arena-mib
      return Status(arena.status().code(), arena.status().message() + " (a smaller --source-arena-mib, or 0 for none)");
    d->arena_ = std::move(arena).value();
  }
  K3_ASSIGN_OR_RETURN(d->writer_, UcxWriter::create(d->worker_, std::move(reader), c.writer));
  K3_ASSIGN_OR_RETURN(d->writes_, AsyncWrites::create(*d->writer_, d->ucx_mutex_));
  d->side_ = std::make_unique<PrefillSide>(c.side, metrics);

  ControlOptions opt;
  opt.name = control_name(Peer{.role = Role::Prefill, .instance = c.side.instance_id, .stage = c.side.stage});
  opt.heartbeat = c.heartbeat;
  opt.keys = c.control_keys;
  for (const DecodeTarget& t : c.decodes) {
    ControlOptions dopt = opt;
    dopt.server_name = control_name(Peer{.role = Role::Decode, .instance = t.instance});
    if (!d->decodes_.empty()) dopt.incarnation = d->decodes_.front().control->incarnation();  // one incarnation per process
    DecodeLink link{.instance = t.instance};
    K3_ASSIGN_OR_RETURN(link.control, ControlClient::connect(zctx, t.endpoint, dopt));
    d->decodes_.push_back(std::move(link));
  }
  if (!c.router_endpoint.empty()) {
    ControlOptions ropt = opt;
    ropt.incarnation = d->decodes_.front().control->incarnation();
    ropt.server_name = "router";
    K3_ASSIGN_OR_RETURN(d->router_, ControlClient::connect(zctx, c.router_endpoint, ropt));
  }
  return d;
}

PrefillDriver::~PrefillDriver() {
  writes_.reset();  // its thread ends (the running job's puts flushed) before what it uses goes
  retired_.clear();
  for (DecodeLink& l : decodes_) l.rkeys.clear();  // rkeys (and through them the endpoints) go before the worker
}

bool PrefillDriver::decode_ready() const { return decodes_ready() == decodes_.size(); }

size_t PrefillDriver::decodes_ready() const {
  size_t n = 0;
  for (const DecodeLink& l : decodes_) n += l.rkeys.empty() ? 0 : 1;
  return n;
}

std::string PrefillDriver::registered_endpoint(const std::string& instance) const {
  for (const DecodeLink& l : decodes_)
    if (l.instance == instance) return l.registered_endpoint;
  return {};
}

PrefillDriver::DecodeLink* PrefillDriver::link_of(const std::string& instance) {
  for (DecodeLink& l : decodes_)
    if (l.instance == instance) return &l;
  return nullptr;
}

void PrefillDriver::send_to(const Peer& p, const protocol::Message& m) {
  const auto frame = protocol::encode(m);
  Status s;
  if (p.role == Role::Router) {
    s = router_ ? router_->send(frame) : Status(Code::Unavailable, "no router connection");
  } else if (DecodeLink* l = p.role == Role::Decode ? link_of(p.instance) : nullptr) {
    s = l->control->send(frame);
  } else {
    s = Status(Code::Unavailable, "not connected to " + control_name(p));
  }
  if (!s.is_ok()) {
    const auto* f = std::get_if<protocol::Failed>(&m);
    spdlog::warn("prefill {}: {} to {} not sent: {}{}", cfg_.side.stage, protocol::msg_type_name(protocol::type_of(m)),
                 control_name(p), s.message(), f ? " (" + f->detail + ")" : std::string());
  }
}

void PrefillDriver::note_states(const Actions& actions) {
  std::set<uint64_t> ids;
  for (const Action& a : actions) ids.insert(request_of(a));
  for (uint64_t id : ids) note_request(id);
}

void PrefillDriver::note_request(uint64_t request_id) {
  if (!cfg_.on_state || in_hook_) return;
  auto st = side_->state(request_id);
  if (!st) return;
  auto it = seen_.find(request_id);
  if (it != seen_.end() && it->second == *st) return;
  seen_[request_id] = *st;
  in_hook_ = true;
  cfg_.on_state(request_id, *st);
  in_hook_ = false;
}

Status PrefillDriver::post_writes(const StartWritesAction& w) {
  auto src = sources_.find(w.request_id);
  if (src == sources_.end()) return internal_error("no source bytes held for request " + std::to_string(w.request_id));
  auto target = decode_of_.find(w.request_id);
  DecodeLink* link = target == decode_of_.end() ? nullptr : link_of(target->second);
  if (!link)
    return {Code::Unavailable, "request " + std::to_string(w.request_id) + " names decode instance '" +
                                   (target == decode_of_.end() ? std::string("?") : target->second) +
                                   "', which this stage is not connected to"};
  // One write list per destination region, in plan order (the plan already coalesced runs).
  const SourceImage& bytes = *src->second;
  std::map<uint32_t, std::vector<WriteOp>> ops_of;
  uint64_t posted = 0;
  for (const WriteOp& op : w.ops) {
    if (op.src_offset > bytes.size() || op.length > bytes.size() - op.src_offset)
      return {Code::OutOfRange, "write op source [" + std::to_string(op.src_offset) + ", +" +
                                    std::to_string(op.length) + ") is outside the stage's source bytes"};
    ops_of[op.region_id].push_back(op);
    posted += op.length;
  }
  // A region whose puts are rows interleaved over a DCP group takes them gathered into a staging image
  // first (region_puts.h): one put per contiguous run of the region instead of one per row.
  auto held = std::make_shared<HeldSources>();
  held->image = src->second;
  const UcxMemory* registration = bytes.registration();
  std::map<uint32_t, std::vector<RemoteWrite>> by_region;
  for (const auto& [region, ops] : ops_of) {
    RegionPuts puts = region_puts(ops, bytes, arena_.get());
    if (puts.staging) {
      if (puts.staging->registration() != registration) registration = nullptr;   // UCX registers the sources
      protocol::metric::count_gathered_puts(metrics_, ops.size(), puts.writes.size());
      held->staged.push_back(std::move(puts.staging));
    }
    by_region[region] = std::move(puts.writes);
  }
  // "host-staged": the source is device memory that this UCX cannot read, copied through pinned host memory.
  protocol::metric::count_source_bytes(metrics_, writer_->staging() ? "host-staged" : memory_type_name(bytes.type()), posted);
  WriteJob job{.request_id = w.request_id, .runs = {}, .source = held, .source_registration = registration};
  for (auto& [region, runs] : by_region) {
    auto rk = link->rkeys.find(region);
    if (rk == link->rkeys.end())
      return {Code::Unavailable, "no rkey for region " + std::to_string(region) + " of decode/" + link->instance};
    job.runs.push_back({rk->second, std::move(runs)});
  }
  writes_->post(std::move(job));
  ++jobs_in_flight_;
  return Status::ok();
}

void PrefillDriver::take_write_completions(Actions& all) {
  for (WriteDone& d : writes_->take_done()) {
    --jobs_in_flight_;
    if (cfg_.on_write_span) cfg_.on_write_span(d.request_id, d.begin_us, d.end_us, d.bytes);
    execute(side_->on_writes_flushed(d.request_id, d.status, steady_now()), all);
    note_request(d.request_id);
  }
}

void PrefillDriver::apply_injected_aborts(Actions& all) {
  while (!abort_requested_.empty()) {
    const uint64_t id = *abort_requested_.begin();
    abort_requested_.erase(abort_requested_.begin());
    execute(side_->on_abort(protocol::Abort{.request_id = id, .reason = AbortReason::ClientCancelled,
                                            .origin_role = Role::Router},
                            steady_now()),
            all);
  }
}

void PrefillDriver::execute(const Actions& actions, Actions& all) {
  all.insert(all.end(), actions.begin(), actions.end());
  note_states(actions);
  for (const Action& a : actions) {
    if (auto* s = std::get_if<SendAction>(&a)) {
      send_to(s->to, s->message);
    } else if (auto* w = std::get_if<StartWritesAction>(&a)) {
      // The host may inject an abort at TRANSFERRING: then no write is posted at all.
      if (abort_requested_.count(w->request_id)) {
        abort_requested_.erase(w->request_id);
        execute(side_->on_abort(protocol::Abort{.request_id = w->request_id, .reason = AbortReason::ClientCancelled,
                                                .origin_role = Role::Router},
                                steady_now()),
                all);
        execute(side_->on_writes_flushed(w->request_id, Status::ok(), steady_now()), all);  // nothing was posted
        continue;
      }
      // Posted: AsyncWrites reports its end through step(). Refused here: it ends now.
      if (Status st = post_writes(*w); !st.is_ok()) execute(side_->on_writes_flushed(w->request_id, st, steady_now()), all);
    } else if (auto* c = std::get_if<CancelWritesAction>(&a)) {
      writes_->cancel(c->request_id);
    } else if (auto* r = std::get_if<ReleasedAction>(&a)) {
      sources_.erase(r->request_id);
      decode_of_.erase(r->request_id);
      writes_->forget(r->request_id);   // nothing of it is in flight any more
    } else if (auto* i = std::get_if<IgnoredAction>(&a)) {
      spdlog::debug("prefill: request {} input ignored: {}", i->request_id, i->reason);
    }
  }
}

Status PrefillDriver::send_to_router(const protocol::Message& m) {
  if (!router_) return {Code::Unavailable, "no router connection"};
  return router_->send(protocol::encode(m));
}

void PrefillDriver::heartbeat_if_due() {
  const auto now = Clock::now();
  for (DecodeLink& l : decodes_) l.control->heartbeat_if_due(now);
  if (router_) router_->heartbeat_if_due(now);
}

Actions PrefillDriver::inject_abort(uint64_t request_id, AbortReason reason) {
  if (in_hook_ && side_->state(request_id) == protocol::RequestState::Transferring) {
    abort_requested_.insert(request_id);  // applied by execute() around the writes
    return {};
  }
  Actions all;
  execute(side_->on_abort(protocol::Abort{.request_id = request_id, .reason = reason, .origin_role = Role::Router},
                          steady_now()),
          all);
  return all;
}

Actions PrefillDriver::stream_started(uint64_t request_id, StageSource source) {
  Actions all;
  // The whole image's buffer exists from the first chunk on and is never resized: jobs point into it.
  if (side_->state(request_id) == protocol::RequestState::Prefilling && !sources_.count(request_id)) {
    hold_source(request_id, new_source(source.total_bytes), all);
    if (!sources_.count(request_id)) return all;  // could not be held: aborted, naming why
  }
  execute(side_->on_stream_started(request_id, std::move(source), steady_now()), all);
  note_request(request_id);
  apply_injected_aborts(all);
  return all;
}

uint8_t* PrefillDriver::stream_buffer(uint64_t request_id) {
  auto it = sources_.find(request_id);
  return it == sources_.end() ? nullptr : it->second->data();
}

void PrefillDriver::hold_source(uint64_t request_id, Result<std::shared_ptr<SourceImage>> image, Actions& all) {
  if (image.is_ok()) {
    sources_[request_id] = std::move(image).value();
    return;
  }
  spdlog::error("prefill {}: request {:016x}: no source image: {}", cfg_.side.instance_id, request_id,
                image.status().to_string());
  for (auto& a : inject_abort(request_id, AbortReason::Internal)) all.push_back(std::move(a));
}

Result<std::shared_ptr<SourceImage>> PrefillDriver::new_source(size_t bytes) {
  if (arena_)
    if (auto img = arena_->take(bytes)) return std::move(*img);
  return SourceImage::create(cfg_.source_memory, bytes);
}

Result<std::shared_ptr<SourceImage>> PrefillDriver::source_of(std::vector<uint8_t> bytes) {
  // Host bytes are taken over as they are (a copy into the arena would only add one).
  if (cfg_.source_memory == MemoryType::Host) return SourceImage::adopt(std::move(bytes));
  K3_ASSIGN_OR_RETURN(auto img, new_source(bytes.size()));
  K3_TRY(img->upload(bytes));
  return img;
}

Actions PrefillDriver::rows_computed(uint64_t request_id, uint32_t rows) {
  Actions all;
  execute(side_->on_rows_computed(request_id, rows, steady_now()), all);
  note_request(request_id);
  apply_injected_aborts(all);
  return all;
}

Actions PrefillDriver::stream_computed(uint64_t request_id, StageSource source, std::optional<int32_t> first_token,
                                       std::vector<protocol::TokenLogprobs> first_logprobs,
                                       std::vector<int32_t> choice_first_tokens) {
  Actions all;
  execute(side_->on_stage_computed(request_id, std::move(source), first_token, steady_now(), std::move(first_logprobs),
                                   std::move(choice_first_tokens)),
          all);
  note_request(request_id);
  apply_injected_aborts(all);
  return all;
}

Actions PrefillDriver::stage_computed(uint64_t request_id, StageSource source, std::vector<uint8_t> bytes,
                                      std::optional<int32_t> first_token,
                                      std::vector<protocol::TokenLogprobs> first_logprobs,
                                      std::vector<int32_t> choice_first_tokens) {
  // Hold the bytes only for a request still waiting for them (an aborted one would leak them); the rest
  // is what a streaming stage does.
  Actions all;
  if (side_->state(request_id) == protocol::RequestState::Prefilling) {
    hold_source(request_id, source_of(std::move(bytes)), all);
    if (!sources_.count(request_id)) return all;  // could not be held: aborted, naming why
  }
  for (auto& a : stream_computed(request_id, std::move(source), first_token, std::move(first_logprobs),
                                 std::move(choice_first_tokens)))
    all.push_back(std::move(a));
  return all;
}

void PrefillDriver::on_decode_register(DecodeLink& link, const protocol::Register& reg) {
  // Endpoints and rkeys are made on the worker the writer thread uses: wait for its current job (rare:
  // a decode (re)registering).
  std::lock_guard ucx(ucx_mutex_);
  Status ok = protocol::check_registration(cfg_.compat, reg, protocol::CompatScope::Cluster);
  if (!ok.is_ok()) {
    spdlog::error("prefill {}: decode/{} registration refused: {}", cfg_.side.stage, link.instance, ok.message());
    return;
  }
  if (reg.control_endpoint.empty()) {
    spdlog::error("prefill {}: decode/{} registration refused: control_endpoint is empty", cfg_.side.stage, link.instance);
    return;
  }
  link.registered_endpoint = reg.control_endpoint;
  spdlog::info("prefill {}: decode/{} registered, reachable at {}", cfg_.side.stage, link.instance, reg.control_endpoint);
  link.rkeys.clear();
  // One endpoint per owning worker: a rank group's regions live in its ranks' processes (each region
  // names its worker), a plain decode's in the registering process.
  std::map<std::vector<uint8_t>, std::shared_ptr<UcxEndpoint>> eps;
  for (const auto& region : reg.regions) {
    const std::vector<uint8_t>& owner = region.worker_address.empty() ? reg.worker_address : region.worker_address;
    auto& ep = eps[owner];
    if (!ep) {
      auto made = worker_->connect(owner, /*peer_error_handling=*/false);
      if (!made.is_ok()) {
        spdlog::error("prefill {}: endpoint to region {} of decode/{}: {}", cfg_.side.stage, region.region_id,
                      link.instance, made.status().message());
        link.rkeys.clear();
        return;
      }
      ep = std::move(made).value();
    }
    auto rk = RemoteKey::unpack(ep, region.packed_rkey, region.base, region.length);
    if (!rk.is_ok()) {
      spdlog::error("prefill {}: rkey of region {} of decode/{}: {}", cfg_.side.stage, region.region_id, link.instance,
                    rk.status().message());
      link.rkeys.clear();
      return;
    }
    link.rkeys[region.region_id] = std::move(rk).value();
  }
}

void PrefillDriver::introduce(DecodeLink& link) {
  // (Re)introduce ourselves to a decode incarnation; its REGISTER answer brings the rkeys.
  protocol::Register reg;
  reg.role = Role::Prefill;
  reg.instance_id = cfg_.side.instance_id;
  reg.stage = cfg_.side.stage;
  reg.compat = cfg_.compat;
  reg.compat_hash = protocol::compat_hash(cfg_.compat);
  reg.layer_ids = cfg_.side.prefill.stage_layers(cfg_.side.model, cfg_.side.stage);
  reg.worker_address = worker_->address();
  (void)link.control->send(protocol::encode(reg));
}

void PrefillDriver::on_message(const ControlEvent& e, DecodeLink* from_decode, StepResult& out) {
  const bool from_router = from_decode == nullptr;
  auto msg = decode_or_drop(e, metrics_);
  if (!msg) return;
  if (from_decode) {
    if (auto* ack = std::get_if<protocol::RegisterAck>(&*msg)) {
      if (!ack->ok)
        spdlog::error("prefill {}: decode/{} refused our registration: {}", cfg_.side.stage, from_decode->instance, ack->reason);
      return;
    }
    if (auto* reg = std::get_if<protocol::Register>(&*msg)) {
      on_decode_register(*from_decode, *reg);
      return;
    }
  }
  if (from_router != std::holds_alternative<protocol::Prefill>(*msg) &&
      !std::holds_alternative<protocol::Abort>(*msg)) {
    spdlog::warn("prefill {}: {} for request {} from {} dropped (wrong sender)", cfg_.side.stage,
                 protocol::msg_type_name(protocol::type_of(*msg)), request_id_of(*msg), e.peer);
    count_control_refusal(metrics_, from_router ? "not_partner" : "not_router", *msg);
    return;
  }
  if (from_decode) {
    // A decode instance speaks only for the requests placed on it (ADDRS from another would make this
    // stage write into the wrong memory).
    const uint64_t id = request_id_of(*msg);
    auto placed = decode_of_.find(id);
    if (placed != decode_of_.end() && placed->second != from_decode->instance) {
      spdlog::warn("prefill {}: {} for request {} from decode/{} dropped (placed on decode/{})", cfg_.side.stage,
                   protocol::msg_type_name(protocol::type_of(*msg)), id, from_decode->instance, placed->second);
      count_control_refusal(metrics_, "not_partner", *msg);
      return;
    }
  }
  if (auto* p = std::get_if<protocol::Prefill>(&*msg)) {
    if (submit(*p, out.actions)) out.accepted.push_back(*p);
    return;
  }
  execute(side_->on_message(*msg, steady_now()), out.actions);
  std::visit([&](const auto& m) {
    if constexpr (requires { m.request_id; }) note_request(m.request_id);
  }, *msg);
}

bool PrefillDriver::submit(const protocol::Prefill& p, Actions& actions) {
  if (!link_of(p.decode_instance)) {
    // Refused before any compute: the request could never be delivered.
    spdlog::warn("prefill {}: PREFILL {} names decode/{}, which this stage was not started with", cfg_.side.stage,
                 p.request_id, p.decode_instance);
    (void)send_to_router(protocol::Failed{.request_id = p.request_id, .cause = AbortReason::Rejected,
                                          .detail = "prefill " + cfg_.side.instance_id + " has no connection to decode/" +
                                                    p.decode_instance});
    return false;
  }
  Actions a = side_->on_message(protocol::Message{p}, steady_now());
  const bool accepted =
      side_->state(p.request_id) == protocol::RequestState::Prefilling && !sources_.count(p.request_id);
  if (accepted) decode_of_[p.request_id] = p.decode_instance;
  execute(a, actions);
  note_request(p.request_id);
  return accepted;
}

Result<PrefillDriver::StepResult> PrefillDriver::step(Millis max_wait) {
  // The writer thread's operations complete inside its write(), so only the control sockets and its
  // completion fd need to wake us (the worker's event fd is not polled here). The worker is progressed
  // here only while the writer thread is not using it (never wait for a write on the control loop).
  const auto progress_if_free = [this] {
    std::unique_lock ucx(ucx_mutex_, std::try_to_lock);
    if (!ucx.owns_lock()) return;
    retired_.clear();
    worker_->progress();
  };
  progress_if_free();
  // Sockets: every decode link in order, then the router.
  std::vector<ControlSocket*> socks;
  for (DecodeLink& l : decodes_) socks.push_back(l.control.get());
  if (router_) socks.push_back(router_.get());
  const int done_fd = writes_->fd();
  K3_ASSIGN_OR_RETURN(auto events, ControlSocket::poll_all(socks, max_wait, std::span<const int>(&done_fd, 1)));
  progress_if_free();
  StepResult out;
  take_write_completions(out.actions);
  for (size_t i = 0; i < events.size(); ++i) {
    DecodeLink* link = i < decodes_.size() ? &decodes_[i] : nullptr;  // null: the router
    for (const ControlEvent& e : events[i]) {
      if (e.kind == ControlEventKind::Message) {
        on_message(e, link, out);
      } else if (e.kind == ControlEventKind::PeerUp && link) {
        introduce(*link);
      } else if (e.kind == ControlEventKind::PeerDown) {
        const Peer peer = link ? Peer{.role = Role::Decode, .instance = link->instance} : Peer{.role = Role::Router};
        spdlog::info("prefill {}: peer {} down ({})", cfg_.side.stage, e.peer, peer_down_reason_name(e.reason));
        if (link) {   // a job may still hold them; else they go when the worker is free (step)
          for (auto& [region, rk] : link->rkeys) retired_.push_back(std::move(rk));
          link->rkeys.clear();
        }
        execute(side_->on_peer_dead(peer, steady_now()), out.actions);
      }
    }
  }
  execute(side_->tick(steady_now()), out.actions);
  apply_injected_aborts(out.actions);
  return out;
}

}  // namespace k3::transfer
