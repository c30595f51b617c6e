#include "common/core/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>
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

// A socket bound to 127.0.0.1:port, or -1. No SO_REUSEADDR: a port with connections still in TIME_WAIT
// counts as taken, which only makes the pick more careful.
int bind_port(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool block_is_free(int base, int count) {
  std::vector<int> fds;
  bool free = true;
  for (int k = 0; k < count && free; ++k) {
    const int fd = bind_port(base + k);
    if (fd < 0) free = false;
    else fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  return free;
}

}  // namespace

int free_tcp_ports(int count) {
  if (count < 1) return 0;
  const PortRange eph = ephemeral_range();
  // Candidates: [10000, ephemeral lo) where that leaves room, else above the ephemeral range.
  int lo = 10000, hi = eph.lo - count;
  if (hi <= lo) {
    lo = eph.hi + 1;
    hi = 65536 - count;
  }
  if (hi <= lo) return 0;
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(lo, hi);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int base = pick(rng);
    if (block_is_free(base, count)) return base;
  }
  return 0;
}

int free_tcp_port() {
  if (const int port = free_tcp_ports(1); port != 0) return port;
  // Every candidate taken: fall back to a port the kernel picks (inside the ephemeral range).
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace k3
