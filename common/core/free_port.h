// TCP ports on 127.0.0.1 that nothing uses right now, for benches and tests that must pass port numbers
// to programs they start (ucx_perftest, Slurm daemons, nodes started by hand).
//
// The ports are picked below the kernel's ephemeral range (net.ipv4.ip_local_port_range): every outgoing
// connection on the host (a ZeroMQ socket retrying its connect, an HTTP client) takes its local port from
// that range, so a port picked inside it can be taken by a client between the pick and the bind. Another
// process may still bind a picked port first: callers that can, bind port 0 themselves.
#pragma once

namespace k3 {

// One free port.
int free_tcp_port();

// The first of `count` consecutive ports, all free at the moment of the call (checked by binding them
// together), for layouts that derive ports as base + k. Returns 0 when no such block was found.
int free_tcp_ports(int count);

}  // namespace k3
