// Collectives among the ranks of one role (the rank processes of a decode group, CPU test ranks). One
// interface, filled by a UCX implementation for CPU ranks (transfer/comm_ucx.h) and by NCCL for GPUs
// (transfer/comm_nccl.h); it names no fabric type, so the engine's rank-sliced forward (engine/rank_*.h)
// can use it without depending on transfer/. Buffers are caller-owned; every call is blocking and must be made by every rank of the
// communicator in the same order (like MPI/NCCL).
//
// Determinism: all_reduce_sum and reduce_scatter_sum add contributions in rank order 0..N-1 for every
// element ((x0 + x1) + x2 ...), and all_reduce_sum's result is computed once per element and then
// broadcast, so every rank holds bitwise the same result, equal to the serial sum in rank order.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "common/core/status.h"

namespace k3 {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers handed to the collectives must live: host memory (false: the UCX communicator) or
  // the memory of the rank's GPU (true: NCCL). Callers holding the other kind stage through this one.
  virtual bool takes_device_memory() const { return false; }

  // Point-to-point. Messages between one pair with the same tag arrive in order; `data.size()` must
  // equal on both sides. tag < 2^24.
  virtual Status send(int peer, std::span<const std::byte> data, uint32_t tag = 0) = 0;
  virtual Status recv(int peer, std::span<std::byte> data, uint32_t tag = 0) = 0;

  // In place over `data` (same count on every rank).
  virtual Status all_reduce_sum(std::span<float> data) = 0;
  // all = concat over ranks of `mine` (all.size() == size() * mine.size()).
  virtual Status all_gather(std::span<const std::byte> mine, std::span<std::byte> all) = 0;
  // in = size() blocks of out.size() floats; this rank gets the sum of every rank's block rank().
  virtual Status reduce_scatter_sum(std::span<const float> in, std::span<float> out) = 0;
  // in/out = size() equal blocks; block p of `in` goes to rank p, block q of `out` came from rank q.
  virtual Status all_to_all(std::span<const std::byte> in, std::span<std::byte> out) = 0;
  // Variable blocks, in bytes: `in` is send_counts[0] bytes for rank 0, then rank 1, ...; `out` is
  // recv_counts[0] bytes from rank 0, then rank 1, ... Counts may be zero; recv_counts[q] must equal
  // rank q's send_counts[rank()].
  virtual Status all_to_allv(std::span<const std::byte> in, std::span<const size_t> send_counts,
                             std::span<std::byte> out, std::span<const size_t> recv_counts) = 0;
  virtual Status barrier() = 0;

  // The deadline of each later call (each implementation says its default): a call that outlives it fails
  // on this rank, so a dead or hung peer fails the step on every survivor instead of blocking it for ever. A
  // decode group starts with a long one and shortens it to its step deadline once it runs.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
  // Called while a call waits for its peers (at most about 50 ms apart); an error it returns fails the
  // call with it. A group leader checks its members' liveness and heartbeats to the router meanwhile.
  // Empty: none.
  virtual void set_while_waiting(std::function<Status()> f) = 0;
};

// Splits `count` elements into `parts` contiguous chunks as evenly as possible (the first count % parts
// chunks get one more); used by all_reduce to give each rank the elements it reduces.
struct Chunk {
  size_t offset;
  size_t count;
};
Chunk even_chunk(size_t count, int parts, int index);

}  // namespace k3
