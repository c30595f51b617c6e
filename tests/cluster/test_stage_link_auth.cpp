// The prefill stage link under CURVE (prefill_node/stage_link.h): stage 1's receiver takes activations
// only from stage 0's key; another node's valid key (its frames are dropped and counted) and an unknown
// key or no key at all (refused at the handshake) deliver nothing, and the real sender still gets
// through, and is the only one a frame sent back reaches. A sender refuses a receiver that does not hold
// the next stage's key.
#include <catch2/catch.hpp>

#include <thread>

#include "prefill_node/stage_link.h"
#include "tests/support/control_keys.h"

using namespace k3;
using namespace k3::prefill;
using namespace std::chrono_literals;

namespace {
ActivationChunk chunk(uint64_t id) {
  ActivationChunk c{.request_id = id, .chunk_start = 0, .prompt_len = 2};
  c.act.partial = Tensor::from_f32({2, 4}, std::vector<float>(8, float(id)));
  return c;
}
// Frames the receiver yields within `wait`, decoded to their request ids.
std::vector<uint64_t> drain(StageReceiver& r, std::chrono::milliseconds wait) {
  std::vector<uint64_t> ids;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    auto f = r.try_receive();
    REQUIRE(f.is_ok());
    if (*f) ids.push_back(decode_chunk(**f).value().request_id);
    else std::this_thread::sleep_for(10ms);  // a bounded test wait; the receiver has no fd to sleep on here
  }
  return ids;
}
}  // namespace

TEST_CASE("stage link: activations only from the previous stage's key", "[cluster][auth]") {
  test::TestControlKeys keys({"router", "decode/d", "prefill/p/0", "prefill/p/1"});
  zmq::context_t rctx, sctx, rogue_ctx;  // one CURVE server (ZAP handler) per context
  auto rx = StageReceiver::bind(rctx, "tcp://127.0.0.1:*", keys.load("prefill/p/1"), "prefill/p/0").value();

  auto unknown = keys.load("prefill/p/0");
  unknown.self = transfer::generate_keypair("prefill/p/0").value();
  auto from_unknown = StageSender::connect(sctx, rx->endpoint(), unknown, "prefill/p/1").value();
  auto from_plain = StageSender::connect(sctx, rx->endpoint()).value();
  auto from_decode = StageSender::connect(sctx, rx->endpoint(), keys.load("decode/d"), "prefill/p/1").value();
  REQUIRE(from_unknown->send(chunk(1)).is_ok());
  REQUIRE(from_plain->send(chunk(2)).is_ok());
  REQUIRE(from_decode->send(chunk(3)).is_ok());
  auto real = StageSender::connect(sctx, rx->endpoint(), keys.load("prefill/p/0"), "prefill/p/1").value();
  REQUIRE(real->send(chunk(4)).is_ok());
  const auto got = drain(*rx, 2s);
  CHECK(got == std::vector<uint64_t>{4});
  CHECK(rx->rejected() == 1);  // decode's key got through the handshake; its frame did not

  // Backwards (a recompute request): only the stage that sent the accepted frame gets it.
  REQUIRE(rx->send_back(encode_recompute({.request_id = 4, .epoch = 1})).is_ok());
  auto back_of = [](StageSender& s, std::chrono::milliseconds wait) {
    std::vector<RecomputeRequest> out;
    for (auto deadline = std::chrono::steady_clock::now() + wait; std::chrono::steady_clock::now() < deadline;) {
      auto f = s.try_receive_back();
      REQUIRE(f.is_ok());
      if (*f) out.push_back(decode_recompute(**f).value());
      else std::this_thread::sleep_for(10ms);
    }
    return out;
  };
  CHECK(back_of(*real, 1s) == std::vector<RecomputeRequest>{{.request_id = 4, .epoch = 1}});
  CHECK(back_of(*from_decode, 200ms).empty());

  // A sender pinned to stage 1's key does not talk to a receiver holding another key.
  auto rogue = StageReceiver::bind(rogue_ctx, "tcp://127.0.0.1:*", keys.load("decode/d"), "prefill/p/0");
  REQUIRE(rogue.is_ok());
  auto pinned = StageSender::connect(sctx, (*rogue)->endpoint(), keys.load("prefill/p/0"), "prefill/p/1").value();
  REQUIRE(pinned->send(chunk(5)).is_ok());
  CHECK(drain(**rogue, 1s).empty());
}
