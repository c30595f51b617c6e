// A stand-in for the router in multi-process transfer/cluster tests: a ControlServer every node connects
// to, the set of peers whose heartbeats are up, and the router's one duty these tests rely on: a FAILED
// from one party becomes an ABORT to every other live party of the request. Tests add their own handling
// of received messages through `on_message`. With keys (tests/support/control_keys.h) its socket runs
// CURVE like the real router's.
#pragma once
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/protocol/frame.h"
#include "transfer/zmq_channel.h"

namespace k3::test {

struct TestRouter {
  zmq::context_t ctx;
  std::unique_ptr<transfer::ControlServer> server;
  std::set<std::string> up;
  std::vector<std::string> parties;  // who gets the ABORT that answers a FAILED
  std::function<void(const std::string& peer, const protocol::Message&)> on_message;  // may be empty

  explicit TestRouter(std::chrono::milliseconds heartbeat, std::optional<transfer::ControlKeys> keys = std::nullopt) {
    transfer::ControlOptions o;
    o.name = "router";
    o.heartbeat = {heartbeat, 3};
    o.keys = std::move(keys);
    server = transfer::ControlServer::bind(ctx, "tcp://127.0.0.1:*", o).value();
  }

  void pump(std::chrono::milliseconds wait) {
    auto ev = server->poll(wait);
    REQUIRE(ev.is_ok());
    for (auto& e : *ev) {
      if (e.kind == transfer::ControlEventKind::PeerUp) up.insert(e.peer);
      if (e.kind == transfer::ControlEventKind::PeerDown) up.erase(e.peer);
      if (e.kind != transfer::ControlEventKind::Message) continue;
      auto m = protocol::decode(e.payload);
      REQUIRE(m.is_ok());
      if (on_message) on_message(e.peer, m.value());
      if (auto* f = std::get_if<protocol::Failed>(&m.value()))
        for (auto& p : parties)
          if (p != e.peer && up.count(p))
            (void)server->send(p, protocol::encode(protocol::Abort{.request_id = f->request_id, .reason = f->cause,
                                                                   .origin_role = protocol::Role::Router}));
    }
  }

  void send(const std::string& peer, const protocol::Message& m) { REQUIRE(server->send(peer, protocol::encode(m)).is_ok()); }
};

}  // namespace k3::test
