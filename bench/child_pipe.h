// Length-prefixed blobs over the pipes between a bench and the children it forks (a child reports its
// UCX worker address, rkey or bound endpoint this way). Every call blocks; false when the other end is
// gone or sent something malformed (a blob over 1 MiB).
#pragma once
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace k3::bench {

inline bool write_all(int fd, const void* p, size_t n) {
  auto* b = static_cast<const uint8_t*>(p);
  while (n) {
    ssize_t w = ::write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= w;
  }
  return true;
}
inline bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n) {
    ssize_t r = ::read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= r;
  }
  return true;
}
inline bool send_blob(int fd, const std::vector<uint8_t>& v) {
  uint64_t n = v.size();
  return write_all(fd, &n, 8) && write_all(fd, v.data(), v.size());
}
inline bool recv_blob(int fd, std::vector<uint8_t>& v) {
  uint64_t n = 0;
  if (!read_all(fd, &n, 8) || n > (1u << 20)) return false;
  v.resize(n);
  return read_all(fd, v.data(), n);
}

// Waits (sleeping) until `fd` is readable; false on timeout or error.
inline bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

}  // namespace k3::bench
