#include "transfer/ucx_decode_driver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "common/protocol/compat.h"
#include "transfer/advertise_endpoint.h"
#include "transfer/owned_region.h"
#include "transfer/partner_auth.h"

namespace k3::transfer {

Result<std::unique_ptr<DecodeDriver>> DecodeDriver::create(DecodeDriverConfig cfg, zmq::context_t& zctx,
                                                           protocol::MetricsRegistry* metrics) {
  if (cfg.ranks.empty()) return invalid_argument("DecodeDriverConfig.ranks is empty");
  std::unique_ptr<DecodeDriver> d(new DecodeDriver(std::move(cfg), metrics));
  auto& c = d->cfg_;
  K3_TRY(prepare_memory_type(c.pool_memory, c.cuda_device, "decode pools in device memory"));
  K3_ASSIGN_OR_RETURN(d->ctx_, UcxContext::create(UCP_FEATURE_RMA | UCP_FEATURE_TAG, c.ucx_net_devices));
  K3_ASSIGN_OR_RETURN(d->worker_, UcxWorker::create(d->ctx_));
  const DecodeLayout layout{.ranks = c.ranks, .kda_head_sliced = c.side.kda_head_sliced};
  K3_TRY(layout.validate(c.side.model));

  d->reg_.role = Role::Decode;
  d->reg_.instance_id = c.side.instance_id;
  d->reg_.rank = c.ranks[0];
  d->reg_.compat = c.compat;
  d->reg_.compat_hash = protocol::compat_hash(c.compat);
  for (uint32_t l = 0; l < c.side.model.layers.size(); ++l) d->reg_.layer_ids.push_back(l);
  d->reg_.worker_address = d->worker_->address();

  // The ranks' own regions (index i of the layout), then ranks[0]'s alternates (same geometry, own id).
  std::vector<std::pair<uint32_t, uint32_t>> regions;  // (rank index, region id)
  for (uint32_t i = 0; i < c.ranks.size(); ++i) regions.push_back({i, c.ranks[i]});
  for (uint32_t id : c.alternate_regions) regions.push_back({0, id});
  std::vector<RankPool*> pool_ptrs;
  for (const auto& [i, id] : regions) {
    // Size the region from a geometry at base 0, then place the real one at the buffer.
    K3_ASSIGN_OR_RETURN(auto probe, RankPoolGeometry::for_rank(c.side.model, layout, i, id, 0, c.page_size,
                                                               c.num_pages, c.num_slots));
    if (d->pools_.count(id)) return invalid_argument("decode region " + std::to_string(id) + " is listed twice");
    RankRegion& region = d->pools_[id];
    auto elsewhere = std::find_if(c.hosted_elsewhere.begin(), c.hosted_elsewhere.end(),
                                  [&](const protocol::MemoryRegion& m) { return m.region_id == id; });
    protocol::MemoryRegion published;
    if (elsewhere != c.hosted_elsewhere.end()) {
      if (elsewhere->length != probe.region_bytes() || elsewhere->worker_address.empty() || elsewhere->packed_rkey.empty())
        return invalid_argument("decode region " + std::to_string(id) + " hosted by another process has " +
                                std::to_string(elsewhere->length) + " bytes" +
                                (elsewhere->worker_address.empty() ? ", no worker address" : "") +
                                (elsewhere->packed_rkey.empty() ? ", no rkey" : "") + "; its geometry needs " +
                                std::to_string(probe.region_bytes()) + " bytes, an rkey and a worker address");
      published = *elsewhere;
    } else {
      K3_ASSIGN_OR_RETURN(OwnedRegion owned, allocate_owned_region(d->ctx_, c.pool_memory, probe.region_bytes(),
                                                                   c.poison, "decode pools in device memory"));
      region.device = std::move(owned.device);
      region.mem = std::move(owned.mem);
      protocol::metric::set_region_bytes(metrics, id, memory_type_name(c.pool_memory), region.mem->length());
      K3_ASSIGN_OR_RETURN(auto rkey, region.mem->packed_rkey());
      published = {.region_id = id, .base = reinterpret_cast<uint64_t>(region.mem->base()),
                   .length = region.mem->length(), .packed_rkey = std::move(rkey), .worker_address = {}};
    }
    K3_ASSIGN_OR_RETURN(auto geo, RankPoolGeometry::for_rank(c.side.model, layout, i, id, published.base, c.page_size,
                                                             c.num_pages, c.num_slots));
    K3_ASSIGN_OR_RETURN(region.pool, RankPool::create(geo));
    d->reg_.regions.push_back(std::move(published));
    pool_ptrs.push_back(region.pool.get());
  }
  d->side_ = std::make_unique<DecodeSide>(c.side, pool_ptrs, metrics);

  ControlOptions opt;
  opt.name = control_name(Peer{.role = Role::Decode, .instance = c.side.instance_id});
  opt.heartbeat = c.heartbeat;
  opt.keys = c.control_keys;
  K3_ASSIGN_OR_RETURN(d->server_, ControlServer::bind(zctx, c.bind_endpoint, opt));
  K3_ASSIGN_OR_RETURN(d->reg_.control_endpoint,
                      k3::transfer::advertised_endpoint(d->server_->endpoint(), c.advertise_host));
  d->router_options_ = opt;
  d->zctx_ = &zctx;
  return d;
}

Status DecodeDriver::connect_router() {
  if (cfg_.router_endpoint.empty() || router_) return Status::ok();
  ControlOptions ropt = router_options_;
  ropt.incarnation = server_->incarnation();
  ropt.server_name = "router";
  K3_ASSIGN_OR_RETURN(router_, ControlClient::connect(*zctx_, cfg_.router_endpoint, ropt));
  return Status::ok();
}

DecodeDriver::~DecodeDriver() = default;

std::vector<uint32_t> DecodeDriver::regions() const {
  std::vector<uint32_t> out = cfg_.ranks;
  out.insert(out.end(), cfg_.alternate_regions.begin(), cfg_.alternate_regions.end());
  return out;
}

bool DecodeDriver::send_to(const Peer& p, const protocol::Message& m) {
  const auto frame = protocol::encode(m);
  Status s;
  if (p.role == Role::Router) {
    s = router_ ? router_->send(frame) : Status(Code::Unavailable, "no router connection");
  } else {
    s = server_->send(control_name(p), frame);
  }
  if (!s.is_ok())
    spdlog::warn("decode {}: {} to {} not sent: {}", cfg_.side.instance_id, protocol::msg_type_name(protocol::type_of(m)),
                 control_name(p), s.message());
  return s.is_ok();
}

void DecodeDriver::heartbeat_if_due() {
  const auto now = Clock::now();
  server_->heartbeat_if_due(now);
  if (router_) router_->heartbeat_if_due(now);
}

Status DecodeDriver::send_to_router(const protocol::Message& m) {
  if (!router_) return {Code::Unavailable, "no router connection"};
  return router_->send(protocol::encode(m));
}

void DecodeDriver::note_states(const Actions& actions) {
  std::set<uint64_t> ids;
  for (const Action& a : actions) ids.insert(request_of(a));
  for (uint64_t id : ids) note_request(id);
}

void DecodeDriver::note_request(uint64_t request_id) {
  if (!cfg_.on_state) return;
  auto st = side_->state(request_id);
  if (!st) return;
  auto it = seen_.find(request_id);
  if (it != seen_.end() && it->second == *st) return;
  seen_[request_id] = *st;
  cfg_.on_state(request_id, *st);
}

void DecodeDriver::execute(const Actions& actions) {
  for (const Action& a : actions) {
    if (auto* s = std::get_if<SendAction>(&a); s && !send_to(s->to, s->message)) {
      // A restarted decode may have to ABORT a request before a prefill stage connected to this
      // incarnation (stage 0 sent COMPUTE_DONE, stage 1 has not spoken yet). A stage never heard from
      // cannot hold our ADDRS (they travel on that connection), so it cannot write into our memory:
      // its ABORT_ACK is implied. Without this the request's pool memory waited for an ack that could
      // never come (until the transfer timeout) and a restarted rank refused every request.
      const auto* abort = std::get_if<protocol::Abort>(&s->message);
      if (abort && s->to.role == Role::Prefill && !peers_heard_.count(control_name(s->to))) {
        Actions acked = side_->on_message(protocol::AbortAck{abort->request_id, s->to.stage}, steady_now());
        execute(acked);
        note_states(acked);
      }
    }
    if (auto* i = std::get_if<IgnoredAction>(&a)) spdlog::debug("decode: request {} input ignored: {}", i->request_id, i->reason);
  }
}

Actions DecodeDriver::apply(const std::function<Actions(DecodeSide&, Millis)>& input) {
  Actions out = input(*side_, steady_now());
  execute(out);
  note_states(out);
  return out;
}

void DecodeDriver::on_message(const ControlEvent& e, bool from_router, Actions& out) {
  auto msg = decode_or_drop(e, metrics_);
  if (!msg) return;
  if (auto* r = std::get_if<protocol::Register>(&*msg)) {
    Status ok = closed_why_.empty() ? protocol::check_registration(cfg_.compat, *r, protocol::CompatScope::Cluster)
                                    : Status(Code::Unavailable, closed_why_);
    if (!ok.is_ok()) spdlog::warn("decode: registration of {} refused: {}", e.peer, ok.message());
    const auto ack = protocol::encode(protocol::RegisterAck{ok.is_ok(), ok.is_ok() ? "" : ok.message()});
    (void)server_->send(e.peer, ack);
    if (ok.is_ok()) (void)server_->send(e.peer, protocol::encode(reg_));
    return;
  }
  // Only the router may CLAIM; prefill stages speak for themselves only.
  const bool router_type = std::holds_alternative<protocol::Claim>(*msg);
  if (router_type && !from_router) {
    spdlog::warn("decode: CLAIM from non-router {} dropped", e.peer);
    count_control_refusal(metrics_, "not_router", *msg);
    return;
  }
  if (router_type && !closed_why_.empty()) {
    (void)send_to_router(protocol::ClaimAck{.request_id = request_id_of(*msg), .ok = false, .reason = closed_why_});
    return;
  }
  if (!from_router) {
    const uint64_t id = request_id_of(*msg);
    if (auto why = stage_message_refusal(e.peer, *msg, side_->claim(id)); !why.empty()) {
      spdlog::warn("decode: {} for request {} from {} refused: {}", protocol::msg_type_name(protocol::type_of(*msg)), id,
                   e.peer, why);
      count_control_refusal(metrics_, "not_owner", *msg);
      return;
    }
  }
  Actions a = side_->on_message(*msg, steady_now());
  execute(a);
  note_states(a);
  if (auto* claim = std::get_if<protocol::Claim>(&*msg)) acknowledge_claim(*claim, a);
  std::visit([&](const auto& m) {
    if constexpr (requires { m.request_id; }) note_request(m.request_id);
  }, *msg);
  out.insert(out.end(), a.begin(), a.end());
}

// The router waits for this before it sends PREFILL (so no COMPUTE_DONE can overtake the CLAIM).
// Sent here rather than from DecodeSide::on_claim so the side's action lists stay as they are.
void DecodeDriver::acknowledge_claim(const protocol::Claim& claim, const Actions& actions) {
  protocol::ClaimAck ack{.request_id = claim.request_id, .ok = false, .reason = {}};
  for (const Action& a : actions)
    if (auto* i = std::get_if<IgnoredAction>(&a)) ack.reason = i->reason;
  ack.ok = ack.reason.empty() && side_->state(claim.request_id) == protocol::RequestState::Claimed;
  if (!ack.ok && ack.reason.empty()) ack.reason = "CLAIM not recorded";
  if (Status s = send_to_router(ack); !s.is_ok())
    spdlog::warn("decode {}: CLAIM_ACK {} not sent: {}", cfg_.side.instance_id, claim.request_id, s.message());
}

Result<Actions> DecodeDriver::step(Millis max_wait) {
  worker_->progress();
  K3_ASSIGN_OR_RETURN(bool armed, worker_->arm());
  const int efd = worker_->event_fd();
  std::vector<ControlSocket*> socks{server_.get()};
  if (router_) socks.push_back(router_.get());
  K3_ASSIGN_OR_RETURN(auto events, ControlSocket::poll_all(socks, armed ? max_wait : Millis(0), std::span<const int>(&efd, 1)));
  worker_->progress();
  Actions out;
  for (size_t i = 0; i < events.size(); ++i) {
    const bool from_router = i == 1;
    for (const ControlEvent& e : events[i]) {
      if (e.kind == ControlEventKind::PeerUp && !from_router) {
        peers_heard_.insert(e.peer);
        // Our REGISTER (regions, rkeys, workers) goes to a stage as soon as we hear it, ahead of any ADDRS on
        // the same connection. A stage that was mid-request when this decode instance restarted (a rank group
        // that formed again) may send COMPUTE_DONE before its own REGISTER reached us; without this its ADDRS
        // would arrive before our regions and its writes would fail. (Its REGISTER is still answered.)
        if (auto p = parse_control_name(e.peer); p && p->role == Role::Prefill && closed_why_.empty())
          (void)server_->send(e.peer, protocol::encode(reg_));
      }
      if (e.kind == ControlEventKind::Message) {
        on_message(e, from_router, out);
      } else if (e.kind == ControlEventKind::PeerDown) {
        auto peer = from_router ? std::optional<Peer>(Peer{.role = Role::Router}) : parse_control_name(e.peer);
        if (!peer) continue;
        spdlog::info("decode {}: peer {} down ({})", cfg_.side.instance_id, e.peer, peer_down_reason_name(e.reason));
        Actions a = side_->on_peer_dead(*peer, steady_now());
        execute(a);
        note_states(a);
        out.insert(out.end(), a.begin(), a.end());
      }
    }
  }
  Actions t = side_->tick(steady_now());
  execute(t);
  note_states(t);
  out.insert(out.end(), t.begin(), t.end());
  return out;
}

}  // namespace k3::transfer
