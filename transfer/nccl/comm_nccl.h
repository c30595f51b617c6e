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
#pragma once
#include <array>
#include <memory>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/core/comm.h"

namespace k3::transfer {

using NcclId = std::array<char, NCCL_UNIQUE_ID_BYTES>;

class NcclComm final : public Comm {
 public:
  static Result<NcclId> new_unique_id();
  // Joins the group `id` as `rank` of `size` on CUDA device `device` (blocks until every rank joined).
  static Result<std::unique_ptr<NcclComm>> create(int rank, int size, const NcclId& id, int device);
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

 private:
  NcclComm(int rank, int size, int device) : rank_(rank), size_(size), device_(device) {}
  Status finish(const char* what);                // synchronise the stream, map errors
  Result<float*> scratch(size_t floats);          // device scratch, grown on demand, owned here

  int rank_, size_, device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  size_t scratch_floats_ = 0;
};

}  // namespace k3::transfer
