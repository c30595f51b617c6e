// Control plane: the envelope's strict decoder, peer liveness on a fake clock, and real sockets
// across processes (peer death by SIGKILL within the heartbeat window, restart detection).
#include <catch2/catch.hpp>

#include <cstring>
#include <deque>
#include <thread>

#include "tests/transfer/process_guard.h"
#include "transfer/zmq_channel.h"

using namespace k3::transfer;
using namespace std::chrono_literals;
using k3::test::ProcessGuard;

TEST_CASE("envelope round-trips and rejects every malformed field", "[zmq][envelope]") {
  Envelope e{EnvelopeKind::Data, 0x0123456789abcdefull, "decode/3"};
  auto bytes = encode_envelope(e);
  REQUIRE(bytes.size() == kEnvelopeHeaderBytes + 8);
  REQUIRE(decode_envelope(bytes).value() == e);

  auto bad = [&](auto mutate, const char* field) {
    auto b = bytes;
    mutate(b);
    auto r = decode_envelope(b);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find(field) != std::string::npos);
  };
  bad([](auto& b) { b[0] ^= 1; }, "magic");
  bad([](auto& b) { b[4] = 2; }, "version");
  bad([](auto& b) { b[5] = 0; }, "kind");
  bad([](auto& b) { b[5] = 4; }, "kind");
  bad([](auto& b) { b[7] = 1; }, "reserved");
  bad([](auto& b) { b[16] = 0; b[17] = 0; }, "namelen");
  bad([](auto& b) { b.push_back('x'); }, "disagrees");
  bad([](auto& b) { b.pop_back(); }, "disagrees");
  bad([](auto& b) { b.resize(10); }, "shorter");
  bad([](auto& b) { b[16] = 0x01; b[17] = 0x02; }, "namelen");  // 513 > 256
}

TEST_CASE("peer liveness: up, timeout, restart, retired incarnation, bye", "[zmq][liveness]") {
  PeerLiveness live({100ms, 3});
  std::vector<ControlEvent> ev;
  const auto t0 = Clock::now();
  REQUIRE(live.on_frame("p", 1, t0, ev));
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == ControlEventKind::PeerUp);
  ev.clear();
  live.expire(t0 + 299ms, ev);
  CHECK(ev.empty());
  REQUIRE(live.on_frame("p", 1, t0 + 250ms, ev));  // a heartbeat refreshes
  live.expire(t0 + 549ms, ev);
  CHECK(ev.empty());
  live.expire(t0 + 550ms, ev);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == ControlEventKind::PeerDown);
  CHECK(ev[0].reason == PeerDownReason::HeartbeatTimeout);
  CHECK_FALSE(live.alive("p"));
  ev.clear();
  // The stalled process speaks again: a fresh PeerUp.
  REQUIRE(live.on_frame("p", 1, t0 + 600ms, ev));
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == ControlEventKind::PeerUp);
  ev.clear();
  // Restart: same name, new incarnation -> old one down (Restarted), new one up.
  REQUIRE(live.on_frame("p", 2, t0 + 700ms, ev));
  REQUIRE(ev.size() == 2);
  CHECK((ev[0].kind == ControlEventKind::PeerDown && ev[0].reason == PeerDownReason::Restarted && ev[0].incarnation == 1));
  CHECK((ev[1].kind == ControlEventKind::PeerUp && ev[1].incarnation == 2));
  ev.clear();
  // A late frame of the old incarnation is refused and changes nothing.
  CHECK_FALSE(live.on_frame("p", 1, t0 + 710ms, ev));
  CHECK(ev.empty());
  CHECK(live.incarnation("p") == 2u);
  live.on_bye("p", 2, ev);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].reason == PeerDownReason::Closed);
  CHECK(live.live_peers().empty());
}

namespace {
ControlOptions opts(const std::string& name) {
  ControlOptions o;
  o.name = name;
  o.heartbeat = {100ms, 3};
  return o;
}

// Events of one socket; next() returns the first event matching `pred`, keeping the others queued.
struct Inbox {
  ControlSocket& s;
  std::deque<ControlEvent> q;
  template <class Pred>
  std::optional<ControlEvent> next(Pred pred, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      for (auto it = q.begin(); it != q.end(); ++it) {
        if (pred(*it)) {
          ControlEvent e = std::move(*it);
          q.erase(it);
          return e;
        }
      }
      if (Clock::now() >= deadline) return std::nullopt;
      auto ev = s.poll(50ms);
      REQUIRE(ev.is_ok());
      for (auto& e : *ev) q.push_back(std::move(e));
    }
  }
};
template <class Pred>
std::optional<ControlEvent> poll_for(Inbox& in, Pred pred, std::chrono::milliseconds timeout) {
  return in.next(pred, timeout);
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
}  // namespace

TEST_CASE("server and client exchange data; malformed frames are dropped and counted", "[zmq]") {
  zmq::context_t ctx;
  auto server = ControlServer::bind(ctx, "tcp://127.0.0.1:*", opts("server")).value();
  auto client = ControlClient::connect(ctx, server->endpoint(), opts("client")).value();
  Inbox sin{*server, {}}, cin{*client, {}};
  REQUIRE(client->send(bytes("hello")).is_ok());
  auto up = poll_for(sin, [](auto& e) { return e.kind == ControlEventKind::PeerUp; }, 2s);
  REQUIRE(up);
  CHECK(up->peer == "client");
  CHECK(up->incarnation == client->incarnation());
  // Raw DEALER sending garbage: wrong part counts, bad envelope, data without payload.
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(server->endpoint());
  raw.send(zmq::str_buffer("garbage"), zmq::send_flags::none);
  auto env = encode_envelope({EnvelopeKind::Data, 5, "raw"});
  raw.send(zmq::buffer(env), zmq::send_flags::none);  // DATA with no payload part
  auto hb = encode_envelope({EnvelopeKind::Heartbeat, 5, "raw"});
  raw.send(zmq::buffer(hb), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("extra"), zmq::send_flags::none);  // heartbeat with a payload part
  auto msg = poll_for(sin, [](auto& e) { return e.kind == ControlEventKind::Message; }, 2s);
  REQUIRE(msg);
  CHECK(msg->peer == "client");
  CHECK(msg->payload == bytes("hello"));
  poll_for(sin, [](auto&) { return false; }, 200ms);
  CHECK(server->rejected_frames() == 3);
  CHECK_FALSE(server->liveness().alive("raw"));
  REQUIRE(server->send("client", bytes("back")).is_ok());
  auto back = poll_for(cin, [](auto& e) { return e.kind == ControlEventKind::Message; }, 2s);
  REQUIRE(back);
  CHECK(back->payload == bytes("back"));
  CHECK(client->server_alive());
  CHECK(server->send("nobody", bytes("x")).code() == k3::Code::Unavailable);
}

TEST_CASE("a SIGKILLed client is detected by heartbeat within the window; its restart is a new incarnation",
          "[zmq][process]") {
  zmq::context_t ctx;
  auto server = ControlServer::bind(ctx, "tcp://127.0.0.1:*", opts("server")).value();
  Inbox sin{*server, {}};
  const auto exe = k3::test::helper_path("k3-test-peer-control");
  auto peer = std::make_unique<ProcessGuard>(exe, std::vector<std::string>{"client", server->endpoint(), "stage/1", "100", "3"});
  REQUIRE(peer->wait_for("READY", 10s));
  auto up = poll_for(sin, [](auto& e) { return e.kind == ControlEventKind::PeerUp; }, 5s);
  REQUIRE(up);
  const uint64_t first_inc = up->incarnation;
  REQUIRE(server->send("stage/1", bytes("ping")).is_ok());
  auto echo = poll_for(sin, [](auto& e) { return e.kind == ControlEventKind::Message; }, 5s);
  REQUIRE(echo);
  CHECK(echo->payload == bytes("ping"));

  peer->kill_now();
  const auto killed_at = Clock::now();
  auto down = poll_for(sin, [](auto& e) { return e.kind == ControlEventKind::PeerDown; }, 5s);
  REQUIRE(down);
  const auto detect = Clock::now() - killed_at;
  CHECK(down->reason == PeerDownReason::HeartbeatTimeout);
  CHECK(down->incarnation == first_inc);
  // Window: interval × misses after the last frame, plus one poll round of slack.
  CHECK(detect <= 300ms + 150ms);
  CHECK(server->send("stage/1", bytes("x")).code() == k3::Code::Unavailable);

  peer = std::make_unique<ProcessGuard>(exe, std::vector<std::string>{"client", server->endpoint(), "stage/1", "100", "3"});
  auto again = poll_for(sin, [](auto& e) { return e.kind == ControlEventKind::PeerUp; }, 5s);
  REQUIRE(again);
  CHECK(again->peer == "stage/1");
  CHECK(again->incarnation != first_inc);
  REQUIRE(server->send("stage/1", bytes("QUIT")).is_ok());
  CHECK(peer->wait_exit(5s) == 0);
}

TEST_CASE("a client sees its server die and come back at the same endpoint with a new incarnation",
          "[zmq][process]") {
  zmq::context_t ctx;
  const auto exe = k3::test::helper_path("k3-test-peer-control");
  auto srv = std::make_unique<ProcessGuard>(exe, std::vector<std::string>{"server", "tcp://127.0.0.1:*", "decode/0", "100", "3"});
  auto ready = srv->wait_for("READY ", 10s);
  REQUIRE(ready);
  const std::string endpoint = ready->substr(0, ready->find(' '));
  auto client = ControlClient::connect(ctx, endpoint, opts("prefill/0")).value();
  Inbox cin{*client, {}};
  auto up = poll_for(cin, [](auto& e) { return e.kind == ControlEventKind::PeerUp; }, 5s);
  REQUIRE(up);
  CHECK(up->peer == "decode/0");
  const uint64_t first_inc = up->incarnation;

  srv->kill_now();
  const auto killed_at = Clock::now();
  auto down = poll_for(cin, [](auto& e) { return e.kind == ControlEventKind::PeerDown; }, 5s);
  REQUIRE(down);
  CHECK(Clock::now() - killed_at <= 450ms);
  CHECK_FALSE(client->server_alive());

  srv = std::make_unique<ProcessGuard>(exe, std::vector<std::string>{"server", endpoint, "decode/0", "100", "3"});
  REQUIRE(srv->wait_for("READY ", 10s));
  auto again = poll_for(cin, [](auto& e) { return e.kind == ControlEventKind::PeerUp; }, 5s);
  REQUIRE(again);
  CHECK(again->incarnation != first_inc);
  REQUIRE(client->send(bytes("ping")).is_ok());
  auto echo = poll_for(cin, [](auto& e) { return e.kind == ControlEventKind::Message; }, 5s);
  REQUIRE(echo);
  CHECK(echo->payload == bytes("ping"));
}

TEST_CASE("a socket busy for longer than the timeout stays alive by sending due heartbeats, and its own stall "
          "makes it judge no peer dead",
          "[zmq][process]") {
  zmq::context_t ctx;
  const auto exe = k3::test::helper_path("k3-test-peer-control");
  ProcessGuard srv(exe, std::vector<std::string>{"server", "tcp://127.0.0.1:*", "decode/0", "100", "3"});
  auto ready = srv.wait_for("READY ", 10s);
  REQUIRE(ready);
  auto client = ControlClient::connect(ctx, ready->substr(0, ready->find(' ')), opts("prefill/0")).value();
  Inbox cin{*client, {}};
  REQUIRE(poll_for(cin, [](auto& e) { return e.kind == ControlEventKind::PeerUp; }, 5s));
  // A second of work between two polls, over three times interval × misses (the sleeps stand for compute).
  const auto busy = [&](bool send_due_heartbeats) {
    for (const auto until = Clock::now() + 1s; Clock::now() < until;) {
      std::this_thread::sleep_for(10ms);
      if (send_due_heartbeats) client->heartbeat_if_due();
    }
  };
  busy(true);
  // The server's heartbeats queued up unread meanwhile: the next poll reads them before judging.
  auto events = client->poll(0ms);
  REQUIRE(events.is_ok());
  for (const ControlEvent& e : *events) CHECK(e.kind != ControlEventKind::PeerDown);
  CHECK(client->server_alive());
  // Nor did the server take us for dead: a DOWN line from the busy second would be in the pipe already
  // (read briefly, well inside the window after our last heartbeat, as we send none while reading).
  CHECK_FALSE(srv.wait_for("DOWN ", 20ms));
  // The same work without the heartbeats: the server does declare us dead, so the second above mattered.
  busy(false);
  auto down = srv.wait_for("DOWN ", 2s);
  REQUIRE(down);
  CHECK(*down == "prefill/0 heartbeat_timeout");
  REQUIRE(client->send(bytes("QUIT")).is_ok());
  CHECK(srv.wait_exit(5s) == 0);
}
