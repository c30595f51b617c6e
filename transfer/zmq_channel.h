// Control plane sockets over ZeroMQ: a ROUTER (ControlServer: the decode/router side) and DEALERs
// (ControlClient). Both send heartbeats every interval and run PeerLiveness on what they receive, so
// each side learns in interval × misses that the other died, and a restarted peer (same endpoint,
// new incarnation) is reported as PeerDown(Restarted) + PeerUp.
//
// poll() is the whole event loop: it sleeps in zmq_poll (never spins) until traffic, a heartbeat
// due time, an expiry, the timeout, or one of the caller's extra fds (e.g. a UCX worker's armed event
// fd) becomes readable. Payloads are opaque here (one protocol frame each); a malformed envelope or a
// frame with the wrong number of parts is logged, counted and dropped.
//
// With ControlOptions.keys the socket runs CURVE (docs/SECURITY.md): a server accepts only clients
// whose public key is in the cluster's public keys (its ZapHandler), and a frame only when the name its
// envelope claims is the name that key belongs to; a client pins its server's key and accepts only
// frames naming that server. Refused handshakes and frames are counted by kind (rejections()).
#pragma once
#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/core/status.h"
#include "transfer/control_keys.h"
#include "transfer/zap_handler.h"
#include "transfer/zmq_envelope.h"
#include "transfer/zmq_liveness.h"

namespace k3::transfer {

struct ControlOptions {
  std::string name;                 // this process's logical name, e.g. "decode/3", "prefill/a/7"
  HeartbeatConfig heartbeat;
  size_t max_payload_bytes = size_t{64} << 20;
  uint64_t incarnation = 0;         // 0 = draw a random one (tests may pin it)
  // CURVE keys; nullopt = plaintext (every envelope's name is trusted: tests and opt-out only).
  // keys->self.name must equal `name`.
  std::optional<ControlKeys> keys;
  std::string server_name;          // client with keys: the server's name in keys->cluster (its key is pinned)
};

// Draws a fresh random incarnation id (never 0).
uint64_t new_incarnation();

// Shared by both socket roles: envelope handling, heartbeats, liveness, the poll loop.
class ControlSocket {
 public:
  virtual ~ControlSocket();
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  // Waits up to `timeout` (less when a heartbeat or expiry is due) for traffic and returns what
  // happened. Returns early (maybe with no events) when an extra fd is readable.
  Result<std::vector<ControlEvent>> poll(std::chrono::milliseconds timeout, std::span<const int> extra_fds = {});
  // The same over several sockets in one sleep (a node with a server and a router connection);
  // result i holds the events of sockets[i].
  static Result<std::vector<std::vector<ControlEvent>>> poll_all(std::span<ControlSocket* const> sockets,
                                                                 std::chrono::milliseconds timeout,
                                                                 std::span<const int> extra_fds = {});
  uint64_t incarnation() const { return opt_.incarnation; }
  const std::string& name() const { return opt_.name; }
  const PeerLiveness& liveness() const { return live_; }
  uint64_t rejected_frames() const { return rejected_; }
  // Refused handshakes and dropped frames by kind: malformed, name_mismatch (an envelope naming
  // another party than the authenticated key), unknown_key (ZAP refused the client's key),
  // handshake_failed (no CURVE, or a broken handshake).
  const std::map<std::string, uint64_t>& rejections() const { return rejections_; }
  bool secure() const { return opt_.keys.has_value(); }
  // Sends this socket's heartbeat(s) when due and reads nothing: for a host computing for longer than
  // an interval between polls, so its peers do not take it for dead. What arrives meanwhile waits in
  // ZeroMQ's queue; the next poll reads it all before it judges any peer's silence.
  void heartbeat_if_due(Clock::time_point now = Clock::now());

 protected:
  ControlSocket(zmq::context_t& ctx, zmq::socket_type type, ControlOptions opt);
  // Sends one envelope (+ payload for DATA) to `route` (ROUTER) or the only peer (DEALER: route empty).
  Status send_parts(const std::string& route, EnvelopeKind kind, std::span<const uint8_t> payload);
  virtual void send_heartbeats() = 0;
  // Called for each accepted frame so the ROUTER can remember the peer's current routing id.
  virtual void on_route(const std::string& peer, const std::string& route) {}
  // A peer came up: the ROUTER greets it at once so the peer need not wait an interval to see us.
  virtual void on_peer_up(const std::string& peer) {}
  virtual bool is_router() const = 0;
  // Sets the CURVE options (server or client side) before bind/connect.
  Status configure_curve();

  zmq::socket_t sock_;
  zmq::socket_t monitor_;  // server with keys: handshake failure events of sock_
  ControlOptions opt_;
  PeerLiveness live_;
  Clock::time_point next_heartbeat_;

 private:
  Clock::time_point wake_time(Clock::time_point limit) const;
  void collect(std::vector<ControlEvent>& out);
  void drain(std::vector<ControlEvent>& out);
  void handle(std::vector<zmq::message_t>& parts, std::vector<ControlEvent>& out);
  void drain_monitor();
  uint64_t rejected_ = 0;
  std::map<std::string, uint64_t> rejections_;
};

class ControlServer final : public ControlSocket {
 public:
  // endpoint like "tcp://127.0.0.1:*" (a free port is picked) or "tcp://127.0.0.1:5601".
  static Result<std::unique_ptr<ControlServer>> bind(zmq::context_t& ctx, const std::string& endpoint,
                                                     ControlOptions opt);
  ~ControlServer() override;
  // The bound endpoint with the real port.
  const std::string& endpoint() const { return endpoint_; }
  // Sends one payload to a live peer by logical name; Unavailable if it is not (or no longer) alive.
  Status send(const std::string& peer, std::span<const uint8_t> payload);

 private:
  ControlServer(zmq::context_t& ctx, ControlOptions opt) : ControlSocket(ctx, zmq::socket_type::router, std::move(opt)) {}
  void send_heartbeats() override;
  void on_route(const std::string& peer, const std::string& route) override { routes_[peer] = route; }
  void on_peer_up(const std::string& peer) override;
  bool is_router() const override { return true; }
  std::unique_ptr<ZapHandler> zap_;  // with keys: answers this context's CURVE handshakes
  std::string endpoint_;
  std::map<std::string, std::string> routes_;  // peer name -> ZeroMQ routing id of its current connection
};

class ControlClient final : public ControlSocket {
 public:
  // Connects (ZeroMQ retries in the background, so the server may start later or restart).
  static Result<std::unique_ptr<ControlClient>> connect(zmq::context_t& ctx, const std::string& endpoint,
                                                        ControlOptions opt);
  ~ControlClient() override;
  // Queues one payload for the server (delivered once connected).
  Status send(std::span<const uint8_t> payload);
  // The server's name once one heartbeat/message arrived and it is alive.
  bool server_alive() const { return !live_.live_peers().empty(); }

 private:
  ControlClient(zmq::context_t& ctx, ControlOptions opt) : ControlSocket(ctx, zmq::socket_type::dealer, std::move(opt)) {}
  void send_heartbeats() override;
  bool is_router() const override { return false; }
};

// Buffers a socket's events so a caller waiting for one event loses none of the others.
class EventQueue {
 public:
  explicit EventQueue(ControlSocket& s) : s_(s) {}
  // The first queued or newly polled event satisfying `accept` (others stay queued), or nullopt
  // when `timeout` passes first.
  Result<std::optional<ControlEvent>> next(const std::function<bool(const ControlEvent&)>& accept,
                                           std::chrono::milliseconds timeout);
  std::deque<ControlEvent>& pending() { return q_; }

 private:
  ControlSocket& s_;
  std::deque<ControlEvent> q_;
};

}  // namespace k3::transfer
