// The Comm interface (common/core/comm.h) over NCCL, for GPU ranks: one communicator per rank process,
// one CUDA device, one stream. Every span handed to it is DEVICE memory (cudaMalloc); each call enqueues
// its NCCL work on the comm's stream and synchronises before returning, so the interface stays blocking.
//
// Determinism as the interface promises: all_reduce_sum and reduce_scatter_sum move the contributions
// (all-gather / all-to-all) and add them on the owning rank in rank order (ordered_sum.h), instead of
// NCCL's reductions, whose order depends on the algorithm and the topology.
//
// Bootstrap: rank 0 makes the id (new_unique_id) and the group hands it to every rank (the launcher or
// the control plane carries its 128 bytes); a group of one needs nothing else.
//
// Deadlines: NCCL waits for a dead peer for ever, in its set-up as in its kernels. So the communicator
// is NCCL's non-blocking kind: no NCCL call blocks the host, and one that has work left (the set-up, the
// first connection to a peer) returns ncclInProgress until the communicator's state settles, which this
// class polls (sleeping; NCCL offers nothing to wait on).
// - Joining has its own deadline (create's `join_within`): a rank that never joins, or dies while
//   joining, fails create with DeadlineExceeded, and the half-made communicator is aborted.
// - With a deadline or a waiting hook set (Comm's set_timeout / set_while_waiting; none by default),
//   each call runs under a CallWatchdog: when the deadline passes or the hook fails, the watchdog aborts
//   the communicator (ncclCommAbort, which releases the kernels and the stream synchronise that wait on
//   the peer), the call returns that status, and so does every later call: an aborted communicator is
//   gone, and the group fails as it does over UCX. Every NCCL call and the abort take one lock, so the
//   abort never frees the communicator under a call that is using it.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/core/comm.h"
#include "common/core/call_watchdog.h"

namespace k3::transfer {

using NcclId = std::array<char, NCCL_UNIQUE_ID_BYTES>;

class NcclComm final : public Comm {
 public:
  static Result<NcclId> new_unique_id();
  // Joins the group `id` as `rank` of `size` on CUDA device `device`: returns once every rank joined, or
  // fails when they have not within `join_within` (0: no limit).
  static Result<std::unique_ptr<NcclComm>> create(int rank, int size, const NcclId& id, int device,
                                                  std::chrono::milliseconds join_within = std::chrono::milliseconds(0));
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool takes_device_memory() const override { return true; }
  // NCCL has no tags: `tag` must be 0 (messages between one pair arrive in order).
  Status send(int peer, std::span<const std::byte> data, uint32_t tag = 0) override;
  Status recv(int peer, std::span<std::byte> data, uint32_t tag = 0) override;
  Status all_reduce_sum(std::span<float> data) override;
  Status all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override;
  Status reduce_scatter_sum(std::span<const float> in, std::span<float> out) override;
  Status all_to_all(std::span<const std::byte> in, std::span<std::byte> out) override;
  Status all_to_allv(std::span<const std::byte> in, std::span<const size_t> send_counts, std::span<std::byte> out,
                     std::span<const size_t> recv_counts) override;
  Status barrier() override;
  void set_timeout(std::chrono::milliseconds timeout) override { watchdog_.set_timeout(timeout); }
  void set_while_waiting(std::function<Status()> f) override { watchdog_.set_hook(std::move(f)); }

 private:
  NcclComm(int rank, int size, int device);
  // Runs `enqueue` (the call's NCCL work on the stream, under mu_), waits until NCCL has queued it all
  // (a non-blocking call may return before its kernels are on the stream, e.g. while it connects to a
  // peer), then `then` (local work on the stream that reads NCCL's results), then waits for the stream,
  // all under the watchdog; refuses at once once the communicator was aborted.
  Status run(const char* what, const std::function<Status()>& enqueue, const std::function<Status()>& then = {});
  // Polls the communicator's state until it leaves ncclInProgress: its error if it settles on one, the
  // abort's status if it was aborted meanwhile, DeadlineExceeded past `deadline` (if given).
  Status settle(const std::string& what, std::optional<std::chrono::steady_clock::time_point> deadline = {});
  void abort(const Status& why);                  // the watchdog's: ncclCommAbort, on its thread
  Status enqueue_all_to_allv(std::span<const std::byte> in, std::span<const size_t> send_counts,
                             std::span<std::byte> out, std::span<const size_t> recv_counts);
  Result<float*> scratch(size_t floats);          // device scratch, grown on demand, owned here

  int rank_, size_, device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  size_t scratch_floats_ = 0;
  std::mutex mu_;           // held by every NCCL call on comm_ and by abort
  std::atomic<bool> aborted_{false};
  Status abort_status_;    // why, once aborted_ (written by the watchdog's abort before aborted_ is set)
  CallWatchdog watchdog_;  // last: its thread stops before the members it aborts go
};

}  // namespace k3::transfer
