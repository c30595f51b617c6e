// A TCP port on 127.0.0.1 that nothing listens on right now (bound to port 0, read back, closed), for
// benches and tests that must pass a port number to a program they start (ucx_perftest, Slurm daemons).
// Another process may take it before the caller binds it: callers that can, bind port 0 themselves.
#pragma once

namespace k3 {

int free_tcp_port();

}  // namespace k3
