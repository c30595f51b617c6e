#include "common/core/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

namespace k3 {
namespace {

struct PortRange {
  int lo = 32768, hi = 60999;  // Linux's default ephemeral range
};

PortRange ephemeral_range() {
  PortRange r;
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (in >> lo >> hi && lo > 0 && hi >= lo && hi <= 65535) r = {lo, hi};
  return r;
}

// A TCP socket bound to 127.0.0.1:port (port 0: one the kernel picks), closed when it goes out of
// scope; not bound when the port is taken. Close-on-exec: a PortBlock's held ports must not pass to the
// processes its owner starts, which bind them. No SO_REUSEADDR: a port with connections still in TIME_WAIT
// counts as taken, which only makes the pick more careful.
class BoundSocket {
 public:
  explicit BoundSocket(int port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    if (fd_ < 0) return;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~BoundSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  BoundSocket(BoundSocket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  BoundSocket(const BoundSocket&) = delete;
  BoundSocket& operator=(const BoundSocket&) = delete;
  BoundSocket& operator=(BoundSocket&&) = delete;

  bool bound() const { return fd_ >= 0; }
  // Hands the socket over (the caller closes it).
  int release() { return std::exchange(fd_, -1); }
  int port() const {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
    return ntohs(a.sin_port);
  }

 private:
  int fd_;
};

// All `count` ports from `base` bound at once, so that none of them is counted free because another was
// released; empty when one is taken.
std::vector<BoundSocket> hold_block(int base, int count) {
  std::vector<BoundSocket> held;
  held.reserve(static_cast<size_t>(count));
  for (int k = 0; k < count; ++k) {
    held.emplace_back(base + k);
    if (!held.back().bound()) return {};
  }
  return held;
}

// A block of `count` free consecutive ports, held; empty when none was found.
std::vector<BoundSocket> find_block(int count) {
  if (count < 1) return {};
  const PortRange eph = ephemeral_range();
  // Candidates: [10000, ephemeral lo) where that leaves room, else above the ephemeral range.
  int lo = 10000, hi = eph.lo - count;
  if (hi <= lo) {
    lo = eph.hi + 1;
    hi = 65536 - count;
  }
  if (hi <= lo) return {};
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(lo, hi);
  for (int attempt = 0; attempt < 1000; ++attempt)
    if (auto held = hold_block(pick(rng), count); !held.empty()) return held;
  return {};
}

}  // namespace

int free_tcp_ports(int count) {
  const std::vector<BoundSocket> held = find_block(count);
  return held.empty() ? 0 : held.front().port();
}

PortBlock PortBlock::reserve(int count) {
  PortBlock b;
  std::vector<BoundSocket> held = find_block(count);  // kept from the check on: no window to lose one in
  if (held.empty()) return b;
  b.base_ = held.front().port();
  for (auto& s : held) b.fds_.push_back(s.release());
  return b;
}

PortBlock::~PortBlock() { close_all(); }

PortBlock::PortBlock(PortBlock&& o) noexcept : base_(o.base_), next_(o.next_), fds_(std::exchange(o.fds_, {})) {}

PortBlock& PortBlock::operator=(PortBlock&& o) noexcept {
  if (this != &o) {
    close_all();
    base_ = o.base_;
    next_ = o.next_;
    fds_ = std::exchange(o.fds_, {});
  }
  return *this;
}

void PortBlock::close_all() {
  for (size_t k = next_; k < fds_.size(); ++k) ::close(fds_[k]);
  fds_.clear();
  next_ = 0;
}

int PortBlock::take() {
  if (next_ >= fds_.size()) return 0;
  ::close(fds_[next_]);
  return base_ + static_cast<int>(next_++);
}

int free_tcp_port() {
  if (const int port = free_tcp_ports(1); port != 0) return port;
  // Every candidate taken: a port the kernel picks (inside the ephemeral range).
  return BoundSocket(0).port();
}

}  // namespace k3
