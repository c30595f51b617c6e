#include <catch2/catch.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "common/core/free_port.h"

using namespace k3;

namespace {

// A socket listening on 127.0.0.1:port, or -1 when the port is taken.
int listen_on(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0) return fd;
  ::close(fd);
  return -1;
}

bool can_listen(int port) {
  const int fd = listen_on(port);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

}  // namespace

TEST_CASE("a picked block of ports is free, consecutive and outside the ephemeral range") {
  int eph_lo = 32768, eph_hi = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> eph_lo >> eph_hi;
  for (int count : {1, 3, 8}) {
    const int base = free_tcp_ports(count);
    INFO("count " << count << " base " << base);
    REQUIRE(base > 0);
    REQUIRE(base + count - 1 <= 65535);
    CHECK((base + count - 1 < eph_lo || base > eph_hi));
    for (int k = 0; k < count; ++k) CHECK(can_listen(base + k));
  }
  const int one = free_tcp_port();
  CHECK((one < eph_lo || one > eph_hi));
  CHECK(can_listen(one));
  CHECK(free_tcp_ports(0) == 0);
}

TEST_CASE("a port held by a listener is never picked") {
  // Hold one port, then ask for many blocks: none may contain it.
  const int held_port = free_tcp_port();
  const int fd = listen_on(held_port);
  REQUIRE(fd >= 0);
  for (int i = 0; i < 2000; ++i) {
    const int base = free_tcp_ports(16);
    REQUIRE(base > 0);
    REQUIRE(!(base <= held_port && held_port < base + 16));
  }
  ::close(fd);
}

TEST_CASE("a reserved block holds its ports until each is taken, and no other pick gets them") {
  PortBlock block = PortBlock::reserve(6);
  REQUIRE(block.left() == 6);
  const int first = block.take();
  REQUIRE(first > 0);
  CHECK(can_listen(first));  // taken: released for its user
  for (int k = 1; k < 6; ++k) {
    INFO("port " << first + k);
    CHECK_FALSE(can_listen(first + k));  // still held
  }
  // While held, other picks never overlap the held ports.
  for (int i = 0; i < 2000; ++i) {
    const int base = free_tcp_ports(16);
    REQUIRE(base > 0);
    REQUIRE((base + 16 <= first + 1 || base >= first + 6));
  }
  for (int k = 1; k < 6; ++k) CHECK(block.take() == first + k);
  CHECK(block.take() == 0);
  CHECK(block.left() == 0);
  {
    PortBlock held = PortBlock::reserve(3);
    REQUIRE(held.left() == 3);
    const int base = held.take();
    PortBlock moved = std::move(held);
    CHECK(moved.left() == 2);
    CHECK_FALSE(can_listen(base + 1));
  }  // destroyed: every port it still held is free again
  CHECK(PortBlock::reserve(0).left() == 0);
}
