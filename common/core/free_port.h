// TCP ports on 127.0.0.1 that nothing uses right now, for programs that must pass port numbers to the
// processes they start: k3-cluster (its nodes' pinned endpoints), benches and tests (ucx_perftest, Slurm
// daemons, nodes started by hand).
//
// The ports are picked below the kernel's ephemeral range (net.ipv4.ip_local_port_range): every outgoing
// connection on the host (a ZeroMQ socket retrying its connect, an HTTP client) takes its local port from
// that range, so a port picked inside it can be taken by a client between the pick and the bind. Another
// process may still bind a picked port first: callers that can, bind port 0 themselves.
#pragma once
#include <cstddef>
#include <vector>

namespace k3 {

// One free port.
int free_tcp_port();

// The first of `count` consecutive ports, all free at the moment of the call (checked by binding them
// together), for layouts that derive ports as base + k. Returns 0 when no such block was found.
int free_tcp_ports(int count);

// A block of consecutive free ports like free_tcp_ports', held by this process (each port bound, not
// listening) until taken one by one: while a port is held, no other process picks or binds it. For a
// launcher whose nodes bind their ports seconds after the pick: it takes each port just before it
// starts the node that binds it, so launchers starting together cannot pick the same ports.
class PortBlock {
 public:
  PortBlock() = default;
  // `count` ports, or an empty block when none was found.
  static PortBlock reserve(int count);
  ~PortBlock();
  PortBlock(PortBlock&& o) noexcept;
  PortBlock& operator=(PortBlock&& o) noexcept;
  PortBlock(const PortBlock&) = delete;
  PortBlock& operator=(const PortBlock&) = delete;

  // The next port, released for its user to bind; 0 when the block is used up (or empty).
  int take();
  int left() const { return static_cast<int>(fds_.size() - next_); }

 private:
  void close_all();
  int base_ = 0;
  std::size_t next_ = 0;
  std::vector<int> fds_;  // fds_[k] holds base_ + k until taken
};

}  // namespace k3
