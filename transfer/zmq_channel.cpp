#include "transfer/zmq_channel.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

namespace k3::transfer {

uint64_t new_incarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) {
    v = (uint64_t{rd()} << 32) ^ rd() ^
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  return v;
}

namespace {
Status zmq_failure(const zmq::error_t& e, const std::string& what) {
  Code code = (e.num() == EHOSTUNREACH || e.num() == EAGAIN) ? Code::Unavailable : Code::Io;
  return {code, what + ": " + e.what()};
}
std::span<const uint8_t> bytes_of(const zmq::message_t& m) {
  return {static_cast<const uint8_t*>(m.data()), m.size()};
}
}  // namespace

ControlSocket::ControlSocket(zmq::context_t& ctx, zmq::socket_type type, ControlOptions opt)
    : sock_(ctx, type), opt_(std::move(opt)), live_(opt_.heartbeat), next_heartbeat_(Clock::now()) {
  if (opt_.incarnation == 0) opt_.incarnation = new_incarnation();
  // A short linger lets a BYE leave on close without letting a dead peer block shutdown.
  sock_.set(zmq::sockopt::linger, 100);
}

ControlSocket::~ControlSocket() = default;

Status ControlSocket::send_parts(const std::string& route, EnvelopeKind kind, std::span<const uint8_t> payload) {
  const auto env = encode_envelope({kind, opt_.incarnation, opt_.name});
  try {
    if (is_router()) {
      if (!sock_.send(zmq::buffer(route), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
        return {Code::Unavailable, "control send to " + route + ": would block"};
    }
    const bool more = kind == EnvelopeKind::Data;
    auto flags = more ? (zmq::send_flags::sndmore | zmq::send_flags::dontwait) : zmq::send_flags::dontwait;
    if (!sock_.send(zmq::buffer(env), flags)) return {Code::Unavailable, "control send: would block"};
    if (more && !sock_.send(zmq::buffer(payload.data(), payload.size()), zmq::send_flags::dontwait))
      return {Code::Unavailable, "control send: would block"};
  } catch (const zmq::error_t& e) {
    return zmq_failure(e, "control send");
  }
  return Status::ok();
}

Status ControlSocket::configure_curve() {
  if (!opt_.keys) return Status::ok();
  const ControlKeys& k = *opt_.keys;
  if (k.self.name != opt_.name)
    return invalid_argument("control " + opt_.name + ": the keypair given is the one of '" + k.self.name + "'");
  Status s = is_router() ? apply_curve_server(sock_.handle(), k) : apply_curve_client(sock_.handle(), k, opt_.server_name);
  if (!s.is_ok()) return {s.code(), "control " + opt_.name + ": " + s.message()};
  return Status::ok();
}

void ControlSocket::drain_monitor() {
  if (!monitor_) return;
  for (;;) {
    std::vector<zmq::message_t> ev;
    try {
      if (!zmq::recv_multipart(monitor_, std::back_inserter(ev), zmq::recv_flags::dontwait)) return;
    } catch (const zmq::error_t&) {
      return;
    }
    if (ev.empty() || ev[0].size() < 6) continue;
    uint16_t event = 0;
    std::memcpy(&event, ev[0].data(), sizeof event);
    const std::string peer = ev.size() > 1 ? ev[1].to_string() : std::string();
    const char* kind = event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "unknown_key" : "handshake_failed";
    const uint64_t n = ++rejections_[kind];
    // A refused client keeps reconnecting: log the 1st, 2nd, 4th, 8th, ... refusal, count them all.
    if ((n & (n - 1)) == 0) spdlog::warn("control {}: refused a connection on {} ({}, {} so far)", opt_.name, peer, kind, n);
  }
}

void ControlSocket::handle(std::vector<zmq::message_t>& parts, std::vector<ControlEvent>& out) {
  const size_t first = is_router() ? 1 : 0;
  auto reject = [&](const std::string& why, const char* kind = "malformed") {
    rejected_++;
    ++rejections_[kind];
    spdlog::warn("control {}: dropped a frame: {}", opt_.name, why);
  };
  if (parts.size() < first + 1) return reject("no envelope part");
  auto env = decode_envelope(bytes_of(parts[first]));
  if (!env.is_ok()) return reject(env.status().message());
  if (opt_.keys) {
    // The name a frame claims must be the one its connection authenticated as: the ZAP user id on a
    // server, the pinned server's name on a client.
    std::string authenticated = opt_.server_name;
    if (is_router()) {
      const char* uid = zmq_msg_gets(parts[first].handle(), "User-Id");
      authenticated = uid ? uid : "";
    }
    if (env->name != authenticated)
      return reject("envelope names '" + env->name + "' but the connection authenticated as '" + authenticated + "'",
                    "name_mismatch");
  }
  const size_t payload_parts = parts.size() - first - 1;
  const size_t want = env->kind == EnvelopeKind::Data ? 1 : 0;
  if (payload_parts != want)
    return reject("envelope kind " + std::to_string(int(env->kind)) + " with " + std::to_string(payload_parts) +
                  " payload parts, expected " + std::to_string(want));
  if (want && parts.back().size() > opt_.max_payload_bytes)
    return reject("payload of " + std::to_string(parts.back().size()) + " bytes exceeds max_payload_bytes");
  if (env->kind == EnvelopeKind::Bye) {
    live_.on_bye(env->name, env->incarnation, out);
    return;
  }
  if (!live_.on_frame(env->name, env->incarnation, Clock::now(), out)) {
    spdlog::debug("control {}: dropped a frame of retired incarnation {:x} of {}", opt_.name, env->incarnation,
                  env->name);
    return;
  }
  if (is_router()) on_route(env->name, parts[0].to_string());
  if (env->kind == EnvelopeKind::Data) {
    ControlEvent e;
    e.kind = ControlEventKind::Message;
    e.peer = env->name;
    e.incarnation = env->incarnation;
    auto p = bytes_of(parts.back());
    e.payload.assign(p.begin(), p.end());
    out.push_back(std::move(e));
  }
}

void ControlSocket::drain(std::vector<ControlEvent>& out) {
  for (;;) {
    std::vector<zmq::message_t> parts;
    try {
      auto n = zmq::recv_multipart(sock_, std::back_inserter(parts), zmq::recv_flags::dontwait);
      if (!n) return;
    } catch (const zmq::error_t& e) {
      spdlog::warn("control {}: receive failed: {}", opt_.name, e.what());
      return;
    }
    handle(parts, out);
  }
}

void ControlSocket::heartbeat_if_due(Clock::time_point now) {
  if (now >= next_heartbeat_) {
    send_heartbeats();
    next_heartbeat_ = now + opt_.heartbeat.interval;
  }
}

Clock::time_point ControlSocket::wake_time(Clock::time_point limit) const {
  auto wake = std::min(limit, next_heartbeat_);
  if (auto e = live_.next_expiry()) wake = std::min(wake, *e);
  return wake;
}

void ControlSocket::collect(std::vector<ControlEvent>& out) {
  drain_monitor();
  const size_t before = out.size();
  drain(out);
  for (size_t i = before; i < out.size(); ++i)
    if (out[i].kind == ControlEventKind::PeerUp) on_peer_up(out[i].peer);
  const auto now = Clock::now();
  live_.expire(now, out);
  heartbeat_if_due(now);
}

Result<std::vector<ControlEvent>> ControlSocket::poll(std::chrono::milliseconds timeout,
                                                      std::span<const int> extra_fds) {
  ControlSocket* self = this;
  K3_ASSIGN_OR_RETURN(auto all, poll_all(std::span<ControlSocket* const>(&self, 1), timeout, extra_fds));
  return std::move(all[0]);
}

Result<std::vector<std::vector<ControlEvent>>> ControlSocket::poll_all(std::span<ControlSocket* const> sockets,
                                                                       std::chrono::milliseconds timeout,
                                                                       std::span<const int> extra_fds) {
  auto now = Clock::now();
  auto wake = now + timeout;
  std::vector<zmq::pollitem_t> items;
  for (ControlSocket* s : sockets) {
    s->heartbeat_if_due(now);
    wake = s->wake_time(wake);
    items.push_back({s->sock_.handle(), 0, ZMQ_POLLIN, 0});
  }
  for (int fd : extra_fds) items.push_back({nullptr, fd, ZMQ_POLLIN, 0});
  const auto wait_ms = std::max<long>(0, std::chrono::ceil<std::chrono::milliseconds>(wake - now).count());
  try {
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(wait_ms));
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) return zmq_failure(e, "zmq_poll");
  }
  std::vector<std::vector<ControlEvent>> out(sockets.size());
  for (size_t i = 0; i < sockets.size(); ++i) sockets[i]->collect(out[i]);
  return out;
}

// ---------------------------------------------------------------------------------------------
Result<std::unique_ptr<ControlServer>> ControlServer::bind(zmq::context_t& ctx, const std::string& endpoint,
                                                           ControlOptions opt) {
  if (opt.name.empty() || opt.name.size() > kMaxNameBytes) return invalid_argument("ControlOptions.name must be 1..256 bytes");
  if (opt.heartbeat.interval.count() <= 0 || opt.heartbeat.misses < 1)
    return invalid_argument("ControlOptions.heartbeat: interval must be > 0 and misses >= 1");
  std::unique_ptr<ControlServer> s(new ControlServer(ctx, std::move(opt)));
  if (s->opt_.keys) {
    K3_TRY(s->configure_curve());
    K3_ASSIGN_OR_RETURN(s->zap_, ZapHandler::start(ctx, s->opt_.keys->cluster));
    char mon[64];
    std::snprintf(mon, sizeof mon, "inproc://k3-control-monitor-%p", static_cast<void*>(s.get()));
    if (zmq_socket_monitor(s->sock_.handle(), mon, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                                       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
      return internal_error(std::string("control monitor: ") + zmq_strerror(zmq_errno()));
    try {
      s->monitor_ = zmq::socket_t(ctx, zmq::socket_type::pair);
      s->monitor_.set(zmq::sockopt::linger, 0);
      s->monitor_.connect(mon);
    } catch (const zmq::error_t& e) {
      return zmq_failure(e, "control monitor");
    }
  }
  try {
    s->sock_.set(zmq::sockopt::router_mandatory, 1);
    s->sock_.bind(endpoint);
    s->endpoint_ = s->sock_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return zmq_failure(e, "bind " + endpoint);
  }
  return s;
}

ControlServer::~ControlServer() {
  for (const auto& peer : live_.live_peers()) {
    auto r = routes_.find(peer);
    if (r != routes_.end()) (void)send_parts(r->second, EnvelopeKind::Bye, {});
  }
}

Status ControlServer::send(const std::string& peer, std::span<const uint8_t> payload) {
  if (payload.size() > opt_.max_payload_bytes) return invalid_argument("payload exceeds max_payload_bytes");
  auto r = routes_.find(peer);
  if (r == routes_.end() || !live_.alive(peer)) return {Code::Unavailable, "control peer " + peer + " is not alive"};
  return send_parts(r->second, EnvelopeKind::Data, payload);
}

void ControlServer::on_peer_up(const std::string& peer) {
  auto r = routes_.find(peer);
  if (r != routes_.end()) (void)send_parts(r->second, EnvelopeKind::Heartbeat, {});
}

void ControlServer::send_heartbeats() {
  for (const auto& peer : live_.live_peers()) {
    auto r = routes_.find(peer);
    if (r == routes_.end()) continue;
    Status s = send_parts(r->second, EnvelopeKind::Heartbeat, {});
    if (!s.is_ok()) spdlog::debug("control {}: heartbeat to {}: {}", opt_.name, peer, s.message());
  }
}

// ---------------------------------------------------------------------------------------------
Result<std::unique_ptr<ControlClient>> ControlClient::connect(zmq::context_t& ctx, const std::string& endpoint,
                                                              ControlOptions opt) {
  if (opt.name.empty() || opt.name.size() > kMaxNameBytes) return invalid_argument("ControlOptions.name must be 1..256 bytes");
  if (opt.heartbeat.interval.count() <= 0 || opt.heartbeat.misses < 1)
    return invalid_argument("ControlOptions.heartbeat: interval must be > 0 and misses >= 1");
  std::unique_ptr<ControlClient> c(new ControlClient(ctx, std::move(opt)));
  K3_TRY(c->configure_curve());
  try {
    // A per-incarnation routing id: the server never confuses a restarted process with its old connection.
    char id[300];
    std::snprintf(id, sizeof id, "%s#%016llx", c->opt_.name.c_str(), static_cast<unsigned long long>(c->opt_.incarnation));
    c->sock_.set(zmq::sockopt::routing_id, std::string(id));
    c->sock_.set(zmq::sockopt::reconnect_ivl, 50);
    c->sock_.set(zmq::sockopt::reconnect_ivl_max, 500);
    c->sock_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return zmq_failure(e, "connect " + endpoint);
  }
  c->send_heartbeats();  // the hello: the server learns our name and incarnation
  c->next_heartbeat_ = Clock::now() + c->opt_.heartbeat.interval;
  return c;
}

ControlClient::~ControlClient() { (void)send_parts("", EnvelopeKind::Bye, {}); }

Status ControlClient::send(std::span<const uint8_t> payload) {
  if (payload.size() > opt_.max_payload_bytes) return invalid_argument("payload exceeds max_payload_bytes");
  return send_parts("", EnvelopeKind::Data, payload);
}

void ControlClient::send_heartbeats() {
  Status s = send_parts("", EnvelopeKind::Heartbeat, {});
  if (!s.is_ok()) spdlog::debug("control {}: heartbeat: {}", opt_.name, s.message());
}

// ---------------------------------------------------------------------------------------------
Result<std::optional<ControlEvent>> EventQueue::next(const std::function<bool(const ControlEvent&)>& accept,
                                                     std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    for (auto it = q_.begin(); it != q_.end(); ++it) {
      if (accept(*it)) {
        ControlEvent e = std::move(*it);
        q_.erase(it);
        return std::optional<ControlEvent>(std::move(e));
      }
    }
    const auto now = Clock::now();
    if (now >= deadline) return std::optional<ControlEvent>();
    K3_ASSIGN_OR_RETURN(auto events, s_.poll(std::chrono::ceil<std::chrono::milliseconds>(deadline - now)));
    for (auto& e : events) q_.push_back(std::move(e));
  }
}

}  // namespace k3::transfer
