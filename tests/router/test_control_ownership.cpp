// The router's ownership rule on real CURVE sockets: a ClusterService (the real router back end) with
// two prefill/decode pairs, whose nodes are played by this test over authenticated ControlClients. A
// node with a valid key that was not given the request, and a client with the owner's name but another
// key, send TOKENS / FAILED / CLAIM_ACK for a live request: every one is refused and counted, and the
// victim's stream holds exactly what its own decode node sent.
#include <catch2/catch.hpp>

#include <mutex>

#include "common/config/config.h"
#include "common/protocol/frame.h"
#include "common/tokenizer/tiny_tokenizer.h"
#include "router/cluster_service.h"
#include "router/wire_ids.h"
#include "tests/support/control_keys.h"
#include "tests/support/scratch_dir.h"
#include "transfer/zmq_channel.h"

using namespace k3;
using namespace k3::router;
using namespace std::chrono_literals;
namespace proto = k3::protocol;

namespace {

struct Node {
  std::unique_ptr<transfer::ControlClient> sock;
  std::vector<proto::Message> got;
};

struct Harness {
  test::TestControlKeys keys{{"router", "decode/d", "prefill/p/0", "decode/e", "prefill/q/0"}};
  testing::ScratchDir tok_dir{"ownership_tok"};
  std::unique_ptr<ClusterService> service;
  zmq::context_t nctx;
  std::map<std::string, Node> nodes;
  std::mutex mu;
  std::vector<GenerationEvent> events;

  Harness() {
    const int vocab = write_tiny_tokenizer(tok_dir.str()).value();
    auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(tok_dir.str()).value());
    ModelConfig cfg = preset_config("k3-tiny").value();
    cfg.vocab_size = vocab;
    ClusterOptions o;
    o.pairs = {parse_cluster_pair("p:1:d:0").value(), parse_cluster_pair("q:1:e:0").value()};
    o.heartbeat = 100ms;
    o.heartbeat_misses = 20;  // generous: this test's nodes are pumped by one thread on a loaded machine
    o.control_keys = keys.load("router");
    service = ClusterService::create(cfg, tok, o).value();
    for (const char* name : {"decode/d", "prefill/p/0", "decode/e", "prefill/q/0"}) nodes[name].sock = connect(name, keys.load(name));
    // A pair is ready once its decode rank told its room (the first HEARTBEAT of a real k3-decode).
    for (const char* instance : {"d", "e"})
      send(std::string("decode/") + instance,
           proto::Heartbeat{.role = proto::Role::Decode, .instance_id = instance,
                            .room = {.pool_page_size = 16, .pool_pages = 256, .pool_free_pages = 256, .pool_slots = 8,
                                     .pool_free_slots = 8, .cache_page_size = 16, .cache_pages = 256,
                                     .cache_free_pages = 256, .cache_seqs = 8, .cache_free_seqs = 8}});
  }
  std::unique_ptr<transfer::ControlClient> connect(const std::string& name, transfer::ControlKeys k) {
    transfer::ControlOptions co;
    co.name = name;
    co.heartbeat = {100ms, 20};
    co.keys = std::move(k);
    co.server_name = "router";
    return transfer::ControlClient::connect(nctx, service->endpoint(), co).value();
  }
  void pump() {
    std::vector<transfer::ControlSocket*> socks;
    std::vector<std::string> names;
    for (auto& [n, node] : nodes) {
      socks.push_back(node.sock.get());
      names.push_back(n);
    }
    auto ev = transfer::ControlSocket::poll_all(socks, 20ms);
    REQUIRE(ev.is_ok());
    for (size_t i = 0; i < names.size(); ++i)
      for (auto& e : (*ev)[i])
        if (e.kind == transfer::ControlEventKind::Message) nodes[names[i]].got.push_back(proto::decode(e.payload).value());
  }
  template <class Pred>
  void pump_until(Pred done, const std::string& what, std::chrono::seconds timeout = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      INFO("waiting for " << what);
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      pump();
    }
  }
  void send(const std::string& node, const proto::Message& m) { REQUIRE(nodes.at(node).sock->send(proto::encode(m)).is_ok()); }
  template <class T>
  const T* first(const std::string& node) {
    for (auto& m : nodes[node].got)
      if (auto* x = std::get_if<T>(&m)) return x;
    return nullptr;
  }
  std::vector<GenerationEvent> seen() {
    std::lock_guard lk(mu);
    return events;
  }
};

}  // namespace

TEST_CASE("the router refuses TOKENS/FAILED/CLAIM_ACK from nodes that do not own the request", "[router][auth]") {
  Harness h;
  h.pump_until([&] { return h.service->ready() && h.service->live_nodes().size() == 4; }, "every node registered");
  auto id = h.service->submit({.prompt = {5, 17, 99}, .max_tokens = 4}, [&](GenerationEvent&& e) {
    std::lock_guard lk(h.mu);
    h.events.push_back(std::move(e));
  });
  REQUIRE(id.is_ok());
  h.pump_until([&] { return h.first<proto::Claim>("decode/d") || h.first<proto::Claim>("decode/e"); }, "a CLAIM");
  const bool on_d = h.first<proto::Claim>("decode/d") != nullptr;
  const std::string owner = on_d ? "decode/d" : "decode/e", owner_stage = on_d ? "prefill/p/0" : "prefill/q/0";
  const std::string other = on_d ? "decode/e" : "decode/d", other_stage = on_d ? "prefill/q/0" : "prefill/p/0";
  const uint64_t wire = h.first<proto::Claim>(owner)->request_id;
  CHECK(wire != 0);

  // Another decode node (valid key) acknowledges the CLAIM before the owner: refused, no PREFILL yet.
  h.send(other, proto::ClaimAck{.request_id = wire, .ok = true});
  h.pump_until([&] { return h.service->control_auth().refused("not_owner", "CLAIM_ACK") == 1; }, "CLAIM_ACK refused");
  CHECK_FALSE(h.first<proto::Prefill>(owner_stage));
  h.send(owner, proto::ClaimAck{.request_id = wire, .ok = true});
  h.pump_until([&] { return h.first<proto::Prefill>(owner_stage) != nullptr; }, "PREFILL to the owner's stage");
  CHECK_FALSE(h.first<proto::Prefill>(other_stage));

  // The other pair's nodes inject tokens and failures; a client with the owner's name but its own key
  // is refused at the handshake.
  auto stranger = h.connect(owner, [&] {
    auto k = h.keys.load(owner);
    k.self = transfer::generate_keypair(owner).value();
    return k;
  }());
  REQUIRE(stranger->send(proto::encode(proto::Tokens{.request_id = wire, .token_ids = {66}, .finish = proto::FinishReason::Stop})).is_ok());
  h.send(other, proto::Tokens{.request_id = wire, .token_ids = {7, 7}, .finish = proto::FinishReason::Stop});
  h.send(other, proto::Failed{.request_id = wire, .cause = proto::AbortReason::Internal, .detail = "injected"});
  h.send(other_stage, proto::Failed{.request_id = wire, .cause = proto::AbortReason::Internal, .detail = "injected"});
  const auto& auth = h.service->control_auth();
  h.pump_until([&] {
    (void)stranger->poll(0ms);
    return auth.refused("not_owner", "TOKENS") == 1 && auth.refused("not_owner", "FAILED") == 2 &&
           auth.refused("unknown_key", "") >= 1;
  }, "every injection refused");
  CHECK(h.seen().empty());  // nothing reached the victim's stream

  // The owner streams the real answer: exactly it reaches the sink, and the request finishes.
  h.send(owner, proto::Tokens{.request_id = wire, .token_ids = {11, 12}});
  h.send(owner, proto::Tokens{.request_id = wire, .token_ids = {13, 14}, .finish = proto::FinishReason::Length});
  h.pump_until([&] {
    auto ev = h.seen();
    return !ev.empty() && ev.back().kind != GenerationEvent::Kind::Tokens;
  }, "the request to finish");
  std::vector<int32_t> ids;
  const auto ev = h.seen();
  for (const auto& e : ev) ids.insert(ids.end(), e.token_ids.begin(), e.token_ids.end());
  CHECK(ids == std::vector<int32_t>{11, 12, 13, 14});
  REQUIRE(ev.back().kind == GenerationEvent::Kind::Finished);
  CHECK(ev.back().finish_reason == "length");
  const std::string metrics = h.service->prometheus_text();
  CHECK(metrics.find("k3_cluster_control_rejected_total{kind=\"not_owner\",message=\"TOKENS\"} 1") != std::string::npos);
  CHECK(metrics.find("k3_cluster_control_rejected_total{kind=\"not_owner\",message=\"FAILED\"} 2") != std::string::npos);
  CHECK(metrics.find("k3_cluster_control_rejected_total{kind=\"not_owner\",message=\"CLAIM_ACK\"} 1") != std::string::npos);
  // The owner's pair is still up: the refusals changed nothing about the nodes.
  CHECK(h.service->live_nodes().size() == 4);
}

TEST_CASE("wire ids: never 0, never repeated, not sequential, redrawn while in use", "[router][auth]") {
  WireIds ids;
  std::set<uint64_t> seen;
  uint64_t prev = 0;
  int small_steps = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t id = ids.next([&](uint64_t x) { return seen.count(x) != 0; });
    CHECK(id != 0);
    REQUIRE(seen.insert(id).second);
    const uint64_t step = id > prev ? id - prev : prev - id;
    if (i > 0 && step < (uint64_t{1} << 32)) ++small_steps;  // a counter or a clock would step by little
    prev = id;
  }
  CHECK(small_steps < 3);
  // Bits are balanced: roughly half of all bits set (a counter from a clock would not be).
  uint64_t ones = 0;
  for (uint64_t id : seen) ones += static_cast<uint64_t>(__builtin_popcountll(id));
  const double share = double(ones) / (64.0 * seen.size());
  CHECK(share > 0.49);
  CHECK(share < 0.51);
  // A candidate that names a live request is drawn again.
  const uint64_t before = ids.draws();
  int asked = 0;
  const uint64_t fresh = ids.next([&](uint64_t) { return ++asked <= 3; });
  CHECK(fresh != 0);
  CHECK(asked == 4);
  CHECK(ids.draws() == before + 4);
}
