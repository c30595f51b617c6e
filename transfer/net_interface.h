// The network device that carries a configured address: the data plane (UCX) is restricted to it so
// that it listens on the configured interface only (docs/SECURITY.md), like the ZeroMQ endpoints bound
// to the same address.
#pragma once
#include <string>

#include "common/core/status.h"

namespace k3::transfer {

// The name of the local interface holding IPv4 address `address` (e.g. "127.0.0.1" -> "lo"), or an
// error naming the address when no interface has it.
Result<std::string> net_device_of(const std::string& address);

}  // namespace k3::transfer
