// Peer liveness for the control plane, as a pure state machine (no sockets, tested on a fake clock).
//
// A peer is known by its logical name; it is alive while frames (any kind) keep arriving. Silence for
// interval × misses declares it dead (PeerDown/HeartbeatTimeout). A frame carrying a new incarnation
// for a known name means the process restarted: the old incarnation is declared dead
// (PeerDown/Restarted) before the new one comes up (PeerUp), and frames still in flight from a retired
// incarnation are refused, so state of the old process can never be revived by a late frame.
// A peer that timed out and then speaks again with the same incarnation (a stalled process) comes
// back with a new PeerUp; the receiver failed its requests at PeerDown, so it starts clean.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace k3::transfer {

using Clock = std::chrono::steady_clock;

struct HeartbeatConfig {
  std::chrono::milliseconds interval{1000};  // each side sends a heartbeat this often
  int misses = 3;                            // silence of interval × misses = dead
  std::chrono::milliseconds dead_after() const { return interval * misses; }
};

enum class ControlEventKind { Message, PeerUp, PeerDown };
enum class PeerDownReason { None, HeartbeatTimeout, Restarted, Closed };
const char* peer_down_reason_name(PeerDownReason r);

struct ControlEvent {
  ControlEventKind kind = ControlEventKind::Message;
  std::string peer;
  uint64_t incarnation = 0;
  PeerDownReason reason = PeerDownReason::None;  // PeerDown only
  std::vector<uint8_t> payload;                  // Message only: one protocol frame
};

class PeerLiveness {
 public:
  explicit PeerLiveness(HeartbeatConfig cfg) : cfg_(cfg) {}

  // A frame from (name, incarnation) arrived. Appends PeerUp / PeerDown(Restarted) as needed.
  // Returns false when the frame must be dropped (it comes from a retired incarnation).
  bool on_frame(const std::string& name, uint64_t incarnation, Clock::time_point now, std::vector<ControlEvent>& out);
  // The peer said goodbye: it is down now (PeerDown/Closed), no timeout needed.
  void on_bye(const std::string& name, uint64_t incarnation, std::vector<ControlEvent>& out);
  // Declares dead every live peer silent for dead_after(); appends PeerDown(HeartbeatTimeout).
  void expire(Clock::time_point now, std::vector<ControlEvent>& out);

  bool alive(const std::string& name) const { return peers_.count(name) != 0; }
  std::optional<uint64_t> incarnation(const std::string& name) const;
  std::vector<std::string> live_peers() const;
  // When the next peer would expire if nothing arrives (for the poll timeout); nullopt when none.
  std::optional<Clock::time_point> next_expiry() const;
  const HeartbeatConfig& config() const { return cfg_; }

 private:
  struct Peer {
    uint64_t incarnation;
    Clock::time_point last_seen;
  };
  HeartbeatConfig cfg_;
  std::map<std::string, Peer> peers_;                      // live peers
  std::map<std::string, std::set<uint64_t>> retired_;      // incarnations that may never come back
};

}  // namespace k3::transfer
