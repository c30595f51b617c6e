#include "transfer/zmq_liveness.h"

namespace k3::transfer {

const char* peer_down_reason_name(PeerDownReason r) {
  switch (r) {
    case PeerDownReason::None: return "none";
    case PeerDownReason::HeartbeatTimeout: return "heartbeat_timeout";
    case PeerDownReason::Restarted: return "restarted";
    case PeerDownReason::Closed: return "closed";
  }
  return "?";
}

namespace {
ControlEvent down(const std::string& name, uint64_t inc, PeerDownReason why) {
  ControlEvent e;
  e.kind = ControlEventKind::PeerDown;
  e.peer = name;
  e.incarnation = inc;
  e.reason = why;
  return e;
}
ControlEvent up(const std::string& name, uint64_t inc) {
  ControlEvent e;
  e.kind = ControlEventKind::PeerUp;
  e.peer = name;
  e.incarnation = inc;
  return e;
}
}  // namespace

bool PeerLiveness::on_frame(const std::string& name, uint64_t incarnation, Clock::time_point now,
                            std::vector<ControlEvent>& out) {
  auto r = retired_.find(name);
  if (r != retired_.end() && r->second.count(incarnation)) return false;
  auto it = peers_.find(name);
  if (it != peers_.end() && it->second.incarnation != incarnation) {
    out.push_back(down(name, it->second.incarnation, PeerDownReason::Restarted));
    retired_[name].insert(it->second.incarnation);
    peers_.erase(it);
    it = peers_.end();
  }
  if (it == peers_.end()) {
    peers_.emplace(name, Peer{incarnation, now});
    out.push_back(up(name, incarnation));
  } else {
    it->second.last_seen = now;
  }
  return true;
}

void PeerLiveness::on_bye(const std::string& name, uint64_t incarnation, std::vector<ControlEvent>& out) {
  auto it = peers_.find(name);
  if (it == peers_.end() || it->second.incarnation != incarnation) return;
  out.push_back(down(name, incarnation, PeerDownReason::Closed));
  retired_[name].insert(incarnation);
  peers_.erase(it);
}

void PeerLiveness::expire(Clock::time_point now, std::vector<ControlEvent>& out) {
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (now - it->second.last_seen >= cfg_.dead_after()) {
      // Not retired: a stalled process that resumes comes back as a fresh PeerUp; whatever it held
      // was already failed at PeerDown, so nothing of the old state survives either way.
      out.push_back(down(it->first, it->second.incarnation, PeerDownReason::HeartbeatTimeout));
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<uint64_t> PeerLiveness::incarnation(const std::string& name) const {
  auto it = peers_.find(name);
  if (it == peers_.end()) return std::nullopt;
  return it->second.incarnation;
}

std::vector<std::string> PeerLiveness::live_peers() const {
  std::vector<std::string> out;
  for (auto& [n, p] : peers_) out.push_back(n);
  return out;
}

std::optional<Clock::time_point> PeerLiveness::next_expiry() const {
  std::optional<Clock::time_point> t;
  for (auto& [n, p] : peers_) {
    auto e = p.last_seen + cfg_.dead_after();
    if (!t || e < *t) t = e;
  }
  return t;
}

}  // namespace k3::transfer
