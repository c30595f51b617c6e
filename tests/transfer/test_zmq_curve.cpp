// The authenticated control plane on real sockets: CURVE servers accept only clients whose key is in
// the cluster's public keys, bind each connection to its key's name (a frame naming another party is
// dropped), and count every refusal by kind; clients accept only the server whose key they pinned.
#include <catch2/catch.hpp>

#include "tests/support/control_keys.h"
#include "transfer/zmq_channel.h"

using namespace k3::transfer;
using namespace std::chrono_literals;

namespace {
ControlOptions opts(const std::string& name, std::optional<ControlKeys> keys, const std::string& server = "router") {
  ControlOptions o;
  o.name = name;
  o.heartbeat = {100ms, 3};
  o.keys = std::move(keys);
  o.server_name = server;
  return o;
}
std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Polls every socket until `done` or the timeout; returns the server's events.
std::vector<ControlEvent> pump(ControlSocket& server, std::vector<ControlSocket*> clients,
                               const std::function<bool(const std::vector<ControlEvent>&)>& done,
                               std::chrono::milliseconds timeout = 10s) {
  std::vector<ControlEvent> seen;
  const auto deadline = Clock::now() + timeout;
  while (!done(seen) && Clock::now() < deadline) {
    std::vector<ControlSocket*> all{&server};
    all.insert(all.end(), clients.begin(), clients.end());
    auto ev = ControlSocket::poll_all(all, 50ms);
    REQUIRE(ev.is_ok());
    for (auto& e : (*ev)[0]) seen.push_back(std::move(e));
  }
  return seen;
}
bool has_up(const std::vector<ControlEvent>& ev, const std::string& peer) {
  for (auto& e : ev)
    if (e.kind == ControlEventKind::PeerUp && e.peer == peer) return true;
  return false;
}
uint64_t count(const ControlSocket& s, const std::string& kind) {
  auto it = s.rejections().find(kind);
  return it == s.rejections().end() ? 0 : it->second;
}
}  // namespace

TEST_CASE("CURVE: a known client is served under its own name", "[zmq][curve]") {
  k3::test::TestControlKeys keys({"router", "decode/d"});
  zmq::context_t sctx, cctx;
  auto server = ControlServer::bind(sctx, "tcp://127.0.0.1:*", opts("router", keys.load("router"))).value();
  REQUIRE(server->secure());
  auto client = ControlClient::connect(cctx, server->endpoint(), opts("decode/d", keys.load("decode/d"))).value();
  REQUIRE(client->send(bytes("hello")).is_ok());
  auto ev = pump(*server, {client.get()}, [](auto& seen) {
    for (auto& e : seen)
      if (e.kind == ControlEventKind::Message) return true;
    return false;
  });
  CHECK(has_up(ev, "decode/d"));
  bool got = false;
  for (auto& e : ev)
    if (e.kind == ControlEventKind::Message) got = e.peer == "decode/d" && e.payload == bytes("hello");
  CHECK(got);
  // And back: the client accepts its pinned server.
  REQUIRE(server->send("decode/d", bytes("hi")).is_ok());
  EventQueue q(*client);
  auto back = q.next([](const ControlEvent& e) { return e.kind == ControlEventKind::Message; }, 5s).value();
  REQUIRE(back);
  CHECK(back->peer == "router");
  CHECK(server->rejections().empty());
}

TEST_CASE("CURVE: impostors are refused and counted, the real node is unaffected", "[zmq][curve]") {
  k3::test::TestControlKeys keys({"router", "decode/d", "prefill/p/0"});
  zmq::context_t sctx, cctx;
  auto server = ControlServer::bind(sctx, "tcp://127.0.0.1:*", opts("router", keys.load("router"))).value();
  auto real = ControlClient::connect(cctx, server->endpoint(), opts("decode/d", keys.load("decode/d"))).value();

  SECTION("right name, unknown key") {
    ControlKeys fake = keys.load("decode/d");
    fake.self = generate_keypair("decode/d").value();  // not in the server's public keys
    auto impostor = ControlClient::connect(cctx, server->endpoint(), opts("decode/d", fake)).value();
    REQUIRE(impostor->send(bytes("TOKENS please")).is_ok());
    auto ev = pump(*server, {real.get(), impostor.get()}, [&](auto&) { return count(*server, "unknown_key") >= 1; });
    CHECK(count(*server, "unknown_key") >= 1);
    for (auto& e : ev) CHECK(e.kind != ControlEventKind::Message);
    CHECK_FALSE(impostor->server_alive());
  }
  SECTION("right name, no key at all (plaintext)") {
    auto impostor = ControlClient::connect(cctx, server->endpoint(), opts("decode/d", std::nullopt)).value();
    REQUIRE(impostor->send(bytes("TOKENS please")).is_ok());
    auto ev = pump(*server, {real.get(), impostor.get()}, [&](auto&) { return count(*server, "handshake_failed") >= 1; });
    CHECK(count(*server, "handshake_failed") >= 1);
    for (auto& e : ev) CHECK(e.kind != ControlEventKind::Message);
  }
  SECTION("a valid key of another node, claiming decode/d's name") {
    ControlKeys borrowed = keys.load("prefill/p/0");
    borrowed.self.name = "decode/d";  // prefill/p/0's key material under decode/d's name
    auto impostor = ControlClient::connect(cctx, server->endpoint(), opts("decode/d", borrowed)).value();
    REQUIRE(impostor->send(bytes("TOKENS please")).is_ok());
    auto ev = pump(*server, {real.get(), impostor.get()}, [&](auto&) { return count(*server, "name_mismatch") >= 2; });
    CHECK(count(*server, "name_mismatch") >= 2);  // its hello heartbeat and its DATA
    for (auto& e : ev) CHECK(e.kind != ControlEventKind::Message);
    for (auto& e : ev) CHECK_FALSE((e.kind == ControlEventKind::PeerDown && e.peer == "decode/d"));
  }
  // The real node is still served: its DATA arrives under its name.
  REQUIRE(real->send(bytes("real")).is_ok());
  auto ev = pump(*server, {real.get()}, [](auto& seen) {
    for (auto& e : seen)
      if (e.kind == ControlEventKind::Message) return true;
    return false;
  });
  bool got = false;
  for (auto& e : ev)
    if (e.kind == ControlEventKind::Message) got = e.peer == "decode/d" && e.payload == bytes("real");
  CHECK(got);
}

TEST_CASE("CURVE: a client refuses a server that does not hold the pinned key", "[zmq][curve]") {
  k3::test::TestControlKeys keys({"router", "decode/d"});
  zmq::context_t sctx, cctx;
  // A server with decode/d's keypair pretends to be the router; the client pinned the router's key.
  ControlKeys rogue = keys.load("decode/d");
  rogue.self.name = "router";
  auto server = ControlServer::bind(sctx, "tcp://127.0.0.1:*", opts("router", rogue)).value();
  auto client = ControlClient::connect(cctx, server->endpoint(), opts("decode/d", keys.load("decode/d"))).value();
  REQUIRE(client->send(bytes("my prompt")).is_ok());
  auto ev = pump(*server, {client.get()}, [&](auto&) { return count(*server, "handshake_failed") >= 1; }, 3s);
  for (auto& e : ev) CHECK(e.kind != ControlEventKind::Message);
  CHECK_FALSE(client->server_alive());
}

TEST_CASE("CURVE: configuration errors name what is wrong", "[zmq][curve]") {
  k3::test::TestControlKeys keys({"router", "decode/d"});
  zmq::context_t ctx;
  auto wrong_name = ControlServer::bind(ctx, "tcp://127.0.0.1:*", opts("decode/d", keys.load("router")));
  REQUIRE_FALSE(wrong_name.is_ok());
  CHECK(wrong_name.status().message().find("the one of 'router'") != std::string::npos);
  auto no_server_key = ControlClient::connect(ctx, "tcp://127.0.0.1:1", opts("decode/d", keys.load("decode/d"), "decode/x"));
  REQUIRE_FALSE(no_server_key.is_ok());
  CHECK(no_server_key.status().message().find("no key for 'decode/x'") != std::string::npos);
  // One CURVE server (ZAP handler) per context.
  auto first = ControlServer::bind(ctx, "tcp://127.0.0.1:*", opts("router", keys.load("router"))).value();
  auto second = ControlServer::bind(ctx, "tcp://127.0.0.1:*", opts("router", keys.load("router")));
  REQUIRE_FALSE(second.is_ok());
  CHECK(second.status().message().find("one per context") != std::string::npos);
}
