// The endpoint a node tells others (its READY / LISTEN / CLUSTER line, which launchers hand to peers):
// what it bound with the host replaced by one peers can reach. A node may bind a wildcard (0.0.0.0, every
// interface) or an address behind NAT; peers must then be told another name for it (a pod IP, a Service
// or host name).
#pragma once
#include <string>

#include "common/core/status.h"

namespace k3::transfer {

// `bound` as ZeroMQ reports it (tcp://HOST:PORT). advertise_host empty: `bound` itself, refused when
// its host is a wildcard (nobody can connect to 0.0.0.0). Otherwise tcp://<advertise_host>:PORT.
// `flag` names the option in errors (e.g. "--advertise-host").
Result<std::string> advertised_endpoint(const std::string& bound, const std::string& advertise_host,
                                        const std::string& flag = "--advertise-host");

}  // namespace k3::transfer
