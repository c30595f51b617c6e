#include "router/wire_ids.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "common/core/status.h"

namespace k3::router {

namespace {
uint64_t random_u64() {
  uint64_t v = 0;
  size_t got = 0;
  while (got < sizeof v) {
    const ssize_t n = ::getrandom(reinterpret_cast<char*>(&v) + got, sizeof v - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(std::string("getrandom: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  return v;
}
}  // namespace

uint64_t WireIds::next(const std::function<bool(uint64_t)>& in_use) {
  for (;;) {
    const uint64_t id = random_u64();
    ++draws_;
    if (id != 0 && !in_use(id)) return id;
  }
}

}  // namespace k3::router
