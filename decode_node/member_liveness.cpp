#include "decode_node/member_liveness.h"

#include <cstring>

namespace k3::decode {
namespace {

constexpr char kMagic[4] = {'K', '3', 'M', 'B'};
constexpr size_t kBeatSize = sizeof(kMagic) + sizeof(uint32_t);

Status zmq_error(const std::string& what, const zmq::error_t& e) {
  return Status(Code::Unavailable, what + ": " + e.what());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
Result<std::unique_ptr<MemberBeacon>> MemberBeacon::start(const std::string& endpoint, int rank,
                                                          std::chrono::milliseconds interval) {
  if (rank < 1) return invalid_argument("member beacon: rank " + std::to_string(rank) + " is not a member's");
  if (interval.count() <= 0) return invalid_argument("member beacon: the interval must be positive");
  std::unique_ptr<MemberBeacon> b(new MemberBeacon());
  try {
    b->push_ = zmq::socket_t(b->ctx_, zmq::socket_type::push);
    b->push_.set(zmq::sockopt::linger, 0);
    b->push_.set(zmq::sockopt::sndhwm, 4);  // beats that cannot leave are stale anyway
    b->push_.connect(endpoint);
    b->stop_rx_ = zmq::socket_t(b->ctx_, zmq::socket_type::pair);
    b->stop_tx_ = zmq::socket_t(b->ctx_, zmq::socket_type::pair);
    b->stop_rx_.bind("inproc://member-beacon-stop");
    b->stop_tx_.connect("inproc://member-beacon-stop");
  } catch (const zmq::error_t& e) {
    return zmq_error("member beacon to " + endpoint, e);
  }
  b->thread_ = std::thread([p = b.get(), rank, interval] { p->run(rank, interval); });
  return b;
}

void MemberBeacon::run(int rank, std::chrono::milliseconds interval) {
  char beat[kBeatSize];
  std::memcpy(beat, kMagic, sizeof(kMagic));
  const uint32_t r = static_cast<uint32_t>(rank);
  std::memcpy(beat + sizeof(kMagic), &r, sizeof(r));
  zmq::pollitem_t stop{static_cast<void*>(stop_rx_), 0, ZMQ_POLLIN, 0};
  for (;;) {
    try {
      (void)push_.send(zmq::buffer(beat, sizeof(beat)), zmq::send_flags::dontwait);
      if (zmq::poll(&stop, 1, interval) > 0) return;  // the destructor's word
    } catch (const zmq::error_t&) {
      return;  // the context is going away
    }
  }
}

MemberBeacon::~MemberBeacon() {
  if (thread_.joinable()) {
    try {
      (void)stop_tx_.send(zmq::str_buffer("stop"), zmq::send_flags::none);
    } catch (const zmq::error_t&) {
    }
    thread_.join();
  }
}

// ---------------------------------------------------------------------------------------------
Result<std::unique_ptr<MemberLiveness>> MemberLiveness::bind(const std::string& bind, int group_size,
                                                             std::chrono::milliseconds interval, int misses,
                                                             protocol::MetricsRegistry* metrics) {
  if (group_size < 1) return invalid_argument("member liveness: group size " + std::to_string(group_size));
  if (interval.count() <= 0 || misses < 1)
    return invalid_argument("member liveness: the heartbeat interval and misses must be positive");
  std::unique_ptr<MemberLiveness> l(new MemberLiveness());
  try {
    l->pull_ = zmq::socket_t(l->ctx_, zmq::socket_type::pull);
    l->pull_.set(zmq::sockopt::linger, 0);
    // A peer cannot make it buffer big messages (not below 256 bytes: the handshake's frames count too).
    l->pull_.set(zmq::sockopt::maxmsgsize, int64_t{256});
    l->pull_.bind(bind);
    l->endpoint_ = l->pull_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return zmq_error("member liveness on " + bind, e);
  }
  l->window_ = interval * misses;
  l->last_.assign(static_cast<size_t>(group_size), std::chrono::steady_clock::now());
  if (metrics) {
    l->silence_ms_.assign(static_cast<size_t>(group_size), nullptr);
    for (int r = 1; r < group_size; ++r)
      l->silence_ms_[static_cast<size_t>(r)] =
          &metrics->gauge("k3_group_member_silence_ms", {{"rank", std::to_string(r)}},
                          "Milliseconds since the decode group member's last liveness beat, as of the leader's last check.");
    l->dropped_metric_ = &metrics->counter("k3_group_member_beats_dropped_total", {},
                                           "Liveness beats the group leader dropped: malformed, or a rank outside the group.");
  }
  return l;
}

void MemberLiveness::arm() {
  armed_ = true;
  std::fill(last_.begin(), last_.end(), std::chrono::steady_clock::now());
}

Status MemberLiveness::check() {
  const auto now = std::chrono::steady_clock::now();
  for (;;) {
    zmq::message_t m;
    try {
      if (!pull_.recv(m, zmq::recv_flags::dontwait)) break;
    } catch (const zmq::error_t& e) {
      return zmq_error("member liveness", e);
    }
    uint32_t rank = 0;
    if (m.size() == kBeatSize && std::memcmp(m.data(), kMagic, sizeof(kMagic)) == 0)
      std::memcpy(&rank, static_cast<const char*>(m.data()) + sizeof(kMagic), sizeof(rank));
    if (rank < 1 || rank >= last_.size()) {
      ++dropped_;
      if (dropped_metric_) dropped_metric_->add();
      continue;
    }
    last_[rank] = now;
  }
  for (size_t r = 1; r < silence_ms_.size(); ++r)
    silence_ms_[r]->set(std::chrono::duration_cast<std::chrono::milliseconds>(now - last_[r]).count());
  if (!armed_) return Status::ok();
  for (size_t r = 1; r < last_.size(); ++r) {
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_[r]);
    if (silent > window_)
      return Status(Code::Unavailable, "member rank " + std::to_string(r) + " is down: no beat for " +
                                           std::to_string(silent.count()) + " ms (window " +
                                           std::to_string(window_.count()) + " ms)");
  }
  return Status::ok();
}

}  // namespace k3::decode
