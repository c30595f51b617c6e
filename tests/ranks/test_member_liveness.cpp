// A decode group's member liveness (decode_node/member_liveness.h): a member's beacon keeps it alive at
// the leader while the member's own thread is busy; a member whose beacon stopped is named dead once the
// window passes; beats that are malformed or name a rank outside the group are dropped; and the group
// communicator's while-waiting hook (transfer/comm_ucx.h) runs during a long wait and ends it with the
// hook's error; the start-up message that tells a member where to beat reaches it whole.
#include <catch2/catch.hpp>

#include <future>
#include <thread>
#include <zmq.hpp>

#include "decode_node/group_command.h"
#include "decode_node/member_liveness.h"
#include "transfer/comm_ucx.h"

using namespace k3;
using namespace k3::decode;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Checks `l` every 10 ms for `span`; the first error, or ok.
Status watch(MemberLiveness& l, std::chrono::milliseconds span) {
  const auto until = Clock::now() + span;
  while (Clock::now() < until) {
    K3_TRY(l.check());
    std::this_thread::sleep_for(10ms);
  }
  return Status::ok();
}

// A group communicator of two ranks in this process (each rank its own UCX worker): {rank 0, rank 1}.
std::pair<std::unique_ptr<transfer::UcxComm>, std::unique_ptr<transfer::UcxComm>> comm_pair() {
  using transfer::UcxComm;
  std::promise<std::string> bound;
  auto ep = bound.get_future();
  std::unique_ptr<UcxComm> zero;
  std::thread leader([&] {
    auto c = UcxComm::create(0, 2, "tcp://127.0.0.1:*", {}, [&](const std::string& e) { bound.set_value(e); });
    if (c.is_ok()) zero = std::move(c).value();
  });
  auto one = UcxComm::create(1, 2, ep.get());
  leader.join();
  REQUIRE(one.is_ok());
  REQUIRE(zero);
  return {std::move(zero), std::move(one).value()};
}

}  // namespace

TEST_CASE("member liveness: beating members stay alive, a silent one is named once the window passes",
          "[ranks][liveness]") {
  protocol::MetricsRegistry metrics;
  auto l = MemberLiveness::bind("tcp://127.0.0.1:*", 3, 50ms, 6, &metrics);  // window 300 ms: 2 loaded cores
  REQUIRE(l.is_ok());
  auto one = MemberBeacon::start((*l)->endpoint(), 1, 50ms);
  auto two = MemberBeacon::start((*l)->endpoint(), 2, 50ms);
  REQUIRE(one.is_ok());
  REQUIRE(two.is_ok());
  (*l)->arm();
  // Four windows of beats from both members, the test's thread busy in between as a member's would be.
  CHECK(watch(**l, 1200ms).is_ok());
  two->reset();  // member 2's process is gone
  const auto stopped = Clock::now();
  Status st = watch(**l, 3000ms);
  const auto noticed = Clock::now() - stopped;
  INFO(st.to_string());
  REQUIRE(!st.is_ok());
  CHECK(st.code() == Code::Unavailable);
  CHECK(st.message().find("member rank 2 is down") != std::string::npos);
  CHECK(noticed >= 250ms);  // the window, less the beat interval its last beat may have been early
  CHECK(noticed < 2s);
  CHECK((*l)->dropped() == 0);
  // The leader's metrics show it: member 2 silent past the window, member 1 within it.
  CHECK(metrics.gauge_value("k3_group_member_silence_ms", {{"rank", "2"}}) > 300);
  CHECK(metrics.gauge_value("k3_group_member_silence_ms", {{"rank", "1"}}) <= 300);
}

TEST_CASE("member liveness: nothing is dead before arm; malformed beats and outside ranks are dropped",
          "[ranks][liveness]") {
  protocol::MetricsRegistry metrics;
  auto l = MemberLiveness::bind("tcp://127.0.0.1:*", 2, 10ms, 2, &metrics);
  REQUIRE(l.is_ok());
  std::this_thread::sleep_for(60ms);
  CHECK((*l)->check().is_ok());  // set-up may outlast the window: no verdict until armed
  zmq::context_t ctx(1);
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 0);
  push.connect((*l)->endpoint());
  const char wrong_magic[8] = {'X', '3', 'M', 'B', 1, 0, 0, 0};
  const char rank_outside[8] = {'K', '3', 'M', 'B', 7, 0, 0, 0};
  const char leaders_rank[8] = {'K', '3', 'M', 'B', 0, 0, 0, 0};
  (void)push.send(zmq::buffer(wrong_magic, sizeof(wrong_magic)), zmq::send_flags::none);
  (void)push.send(zmq::buffer(rank_outside, sizeof(rank_outside)), zmq::send_flags::none);
  (void)push.send(zmq::buffer(leaders_rank, sizeof(leaders_rank)), zmq::send_flags::none);
  (void)push.send(zmq::str_buffer("short"), zmq::send_flags::none);
  const auto until = Clock::now() + 2s;
  while ((*l)->dropped() < 4 && Clock::now() < until) {
    (void)(*l)->check();
    std::this_thread::sleep_for(5ms);
  }
  CHECK((*l)->dropped() == 4);
  CHECK(metrics.counter_value("k3_group_member_beats_dropped_total") == 4);
  (*l)->arm();
  std::this_thread::sleep_for(50ms);
  Status st = (*l)->check();  // member 1 never beat
  CHECK(st.message().find("member rank 1 is down") != std::string::npos);
}

TEST_CASE("member liveness: bad arguments are refused by name", "[ranks][liveness]") {
  CHECK(MemberLiveness::bind("tcp://127.0.0.1:*", 0, 10ms, 3).status().message().find("group size") != std::string::npos);
  CHECK(MemberLiveness::bind("tcp://127.0.0.1:*", 2, 0ms, 3).status().code() == Code::InvalidArgument);
  CHECK(MemberLiveness::bind("nonsense", 2, 10ms, 3).status().message().find("nonsense") != std::string::npos);
  CHECK(MemberBeacon::start("tcp://127.0.0.1:1", 0, 10ms).status().message().find("rank 0") != std::string::npos);
}

TEST_CASE("group comm: the while-waiting hook runs through a long wait and ends it with its error",
          "[ranks][liveness][process]") {
  auto [zero, one] = comm_pair();
  std::vector<int32_t> in{1, 2, 3}, out(3);
  // Rank 1 sends after 400 ms: rank 0's receive waits, calling the hook all along, and succeeds.
  int calls = 0;
  zero->set_while_waiting([&] {
    ++calls;
    return Status::ok();
  });
  Status sent;
  std::thread late([&] {
    std::this_thread::sleep_for(400ms);
    sent = one->send(0, std::as_bytes(std::span(in)), 9);
  });
  REQUIRE(zero->recv(1, std::as_writable_bytes(std::span(out)), 9).is_ok());
  late.join();
  CHECK(sent.is_ok());
  CHECK(out == in);
  CHECK(calls >= 2);  // at most 50 ms between calls, when the host keeps up
  // The hook's error ends a wait at once, with the hook's words.
  zero->set_while_waiting([] { return Status(Code::Unavailable, "member rank 1 is down: test"); });
  const auto t0 = Clock::now();
  Status st = zero->recv(1, std::as_writable_bytes(std::span(out)), 10);
  CHECK(Clock::now() - t0 < 1s);  // the comm's own timeout is 60 s
  CHECK(st.code() == Code::Unavailable);
  CHECK(st.message().find("recv from rank 1: member rank 1 is down: test") != std::string::npos);
  zero->set_while_waiting({});
}

TEST_CASE("group liveness message: the leader's endpoint and interval reach the member; bad ones are refused",
          "[ranks][liveness][process]") {
  auto [zero, one] = comm_pair();
  const GroupLiveness sent{.endpoint = "tcp://127.0.0.1:40123", .interval = 250ms};
  REQUIRE(send_group_liveness(*zero, 1, sent).is_ok());
  auto got = recv_group_liveness(*one, 0);
  REQUIRE(got.is_ok());
  CHECK(got->endpoint == sent.endpoint);
  CHECK(got->interval == sent.interval);
  CHECK(send_group_liveness(*zero, 1, {.endpoint = "", .interval = 250ms}).message().find("endpoint of 0 bytes") !=
        std::string::npos);
  CHECK(send_group_liveness(*zero, 1, {.endpoint = std::string(600, 'x'), .interval = 250ms}).code() ==
        Code::InvalidArgument);
  CHECK(send_group_liveness(*zero, 1, {.endpoint = "tcp://127.0.0.1:1", .interval = 0ms}).code() ==
        Code::InvalidArgument);
}
