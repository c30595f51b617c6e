// Comm over UCX tag messages for CPU ranks. Bootstrap over ZeroMQ: rank 0 binds a ROUTER, every other
// rank sends it its UCX worker address, rank 0 answers with the full address table, then every rank
// creates endpoints to all others. Progress sleeps on the worker's event fd (ucx_context.h).
//
// Algorithms favour determinism and simplicity over bandwidth (CPU ranks, small groups): every
// collective is one exchange in which each rank posts all receives, then all sends, then waits.
// reduce_scatter/all_reduce reduce each element on its owning rank in rank order.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transfer/comm.h"
#include "transfer/ucx_context.h"

namespace k3::transfer {

struct UcxCommOptions {
  std::chrono::milliseconds timeout{60000};  // per collective / bootstrap step
};

class UcxComm final : public Comm {
 public:
  // Rank 0: `rank0_endpoint` is where to bind, e.g. "tcp://127.0.0.1:*"; `on_bound` (may be empty)
  // receives the real endpoint before rank 0 waits for the others (so a launcher can start them).
  // Other ranks: the endpoint rank 0 bound.
  static Result<std::unique_ptr<UcxComm>> create(int rank, int size, const std::string& rank0_endpoint,
                                                 UcxCommOptions options = {},
                                                 const std::function<void(const std::string&)>& on_bound = {});
  ~UcxComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status send(int peer, std::span<const std::byte> data, uint32_t tag = 0) override;
  Status recv(int peer, std::span<std::byte> data, uint32_t tag = 0) override;
  Status all_reduce_sum(std::span<float> data) override;
  Status all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override;
  Status reduce_scatter_sum(std::span<const float> in, std::span<float> out) override;
  Status all_to_all(std::span<const std::byte> in, std::span<std::byte> out) override;
  Status all_to_allv(std::span<const std::byte> in, std::span<const size_t> send_counts, std::span<std::byte> out,
                     std::span<const size_t> recv_counts) override;
  Status barrier() override;
  // Comm's deadline and waiting hook: a decode group starts with a long deadline (start-up of many
  // processes on few cores is slow) and shortens it to its step deadline. The hook runs before each sleep
  // of a wait (decode_node/member_liveness.h says what a leader does there).
  void set_timeout(std::chrono::milliseconds timeout) override { opt_.timeout = timeout; }
  void set_while_waiting(std::function<Status()> f) override { while_waiting_ = std::move(f); }

 private:
  UcxComm(int rank, int size, UcxCommOptions opt) : rank_(rank), size_(size), opt_(opt) {}
  // One round: to[p] is sent to rank p, from[p] is filled from rank p (empty spans are skipped; the
  // self entry is copied locally). All receives are posted before any send.
  Status exchange(const std::vector<std::span<const std::byte>>& to, const std::vector<std::span<std::byte>>& from);
  // Reduce-scatter with uneven chunks (chunk p = even_chunk(count, size, p)); `in` has `count` floats.
  Status reduce_scatter_even(std::span<const float> in, std::span<float> out);
  Status check_peer(int peer, const char* what) const;

  int rank_;
  int size_;
  UcxCommOptions opt_;
  uint32_t collective_seq_ = 0;  // tags of successive collectives never collide
  std::function<Status()> while_waiting_;
  std::shared_ptr<UcxContext> ctx_;
  std::shared_ptr<UcxWorker> worker_;
  std::vector<std::shared_ptr<UcxEndpoint>> eps_;  // eps_[rank_] is null
};

}  // namespace k3::transfer
