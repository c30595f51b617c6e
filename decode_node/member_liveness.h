// Whether a decode rank group's members are alive, known at the leader apart from the group's step.
//
// The group's lockstep alone cannot tell a slow member from a dead one: both leave the leader waiting.
// Waiting without heartbeats to the router makes a long step on a loaded GPU look like a dead group;
// heartbeating through the wait makes a group whose member died look alive until the step deadline runs
// out on every rank in turn. So each member runs a beacon: a thread with its own ZeroMQ socket that
// sends the member's rank every heartbeat interval, whatever the member's main thread is doing, and that
// stops only when the process does. The leader reads the beats whenever it waits (group_leader.h) and:
//   - while every member beats, keeps heartbeating to the router through the wait, however long the step;
//   - when a member has been silent for interval x misses, fails the wait at once, naming the member, and
//     the group ends its requests then, not a chain of step deadlines later.
// A member that is alive but stuck still beats; the step deadline catches it.
//
// The beats travel on the group's own network, like its communicator's bootstrap: plain ZeroMQ bound on
// the interface the group uses. A beat is the rank's 4 bytes after a 4-byte magic; anything else, and a
// rank outside the group, is dropped and counted.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/core/status.h"
#include "common/protocol/metrics.h"

namespace k3::decode {

// A member's side: beats from the moment it starts until it is destroyed.
class MemberBeacon {
 public:
  // `endpoint`: the leader's MemberLiveness::endpoint(); `rank`: this member's rank in the group (>= 1).
  static Result<std::unique_ptr<MemberBeacon>> start(const std::string& endpoint, int rank,
                                                     std::chrono::milliseconds interval);
  ~MemberBeacon();
  MemberBeacon(const MemberBeacon&) = delete;
  MemberBeacon& operator=(const MemberBeacon&) = delete;

 private:
  MemberBeacon() = default;
  void run(int rank, std::chrono::milliseconds interval);

  zmq::context_t ctx_{1};
  zmq::socket_t push_;
  zmq::socket_t stop_rx_, stop_tx_;  // wakes the thread at once on destruction
  std::thread thread_;
};

// The leader's side.
class MemberLiveness {
 public:
  // Binds `bind` (e.g. "tcp://127.0.0.1:*") for a group of `group_size` ranks; a member is dead after
  // `interval` x `misses` without a beat.
  // `metrics` (may be null): k3_group_member_silence_ms{rank} (gauge: since the member's last beat, as of
  // the last check) and k3_group_member_beats_dropped_total (counter).
  static Result<std::unique_ptr<MemberLiveness>> bind(const std::string& bind, int group_size,
                                                      std::chrono::milliseconds interval, int misses,
                                                      protocol::MetricsRegistry* metrics = nullptr);
  const std::string& endpoint() const { return endpoint_; }
  // Every member counts as just heard from: called when the group starts serving (the members start their
  // beacons during set-up, which may take longer than the window).
  void arm();
  // Reads what arrived, without blocking. Unavailable naming the first member silent past the window,
  // once armed; ok otherwise.
  Status check();
  uint64_t dropped() const { return dropped_; }  // beats refused (malformed, or a rank outside the group)

 private:
  MemberLiveness() = default;

  zmq::context_t ctx_{1};
  zmq::socket_t pull_;
  std::string endpoint_;
  std::chrono::milliseconds window_{600};
  bool armed_ = false;
  std::vector<std::chrono::steady_clock::time_point> last_;  // per rank (rank 0, the leader, unused)
  uint64_t dropped_ = 0;
  std::vector<protocol::Gauge*> silence_ms_;  // per rank (rank 0 null); empty without metrics
  protocol::Counter* dropped_metric_ = nullptr;
};

}  // namespace k3::decode
