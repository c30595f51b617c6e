#include "transfer/nccl/comm_nccl.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transfer/nccl/ordered_sum.h"

namespace k3::transfer {
namespace {

// ncclInProgress is not an error: the call's work was handed to NCCL, and settle() waits for it.
Status nccl_status(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return Status::ok();
  return Status(Code::Internal, what + ": " + ncclGetErrorString(r));
}
// How long settle() sleeps between looks at the communicator's state: short at first (a call on a
// formed communicator settles at once, or within microseconds), growing to a bound, so a long wait costs
// little and a short one adds little.
constexpr auto kFirstPause = std::chrono::microseconds(20);
constexpr auto kLongestPause = std::chrono::milliseconds(2);
// How long the destructor lets a finalize flush before it aborts instead (a peer gone mid-call).
constexpr auto kFinalizeWithin = std::chrono::seconds(10);
Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::ok();
  return Status(Code::Internal, what + ": " + cudaGetErrorString(e));
}

// Group of point-to-point calls: NCCL runs them concurrently (no deadlock between pairs).
struct NcclGroup {
  NcclGroup() { ncclGroupStart(); }
  ~NcclGroup() { if (!ended) ncclGroupEnd(); }
  Status end() {
    ended = true;
    return nccl_status(ncclGroupEnd(), "ncclGroupEnd");
  }
  bool ended = false;
};

}  // namespace

Result<NcclId> NcclComm::new_unique_id() {
  ncclUniqueId id;
  K3_TRY(nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  NcclId out;
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

Result<std::unique_ptr<NcclComm>> NcclComm::create(int rank, int size, const NcclId& id, int device,
                                                   std::chrono::milliseconds join_within) {
  if (size < 1) return invalid_argument("NcclComm: size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size)
    return invalid_argument("NcclComm: rank " + std::to_string(rank) + " outside 0.." + std::to_string(size - 1));
  int devices = 0;
  K3_TRY(cuda_status(cudaGetDeviceCount(&devices), "NcclComm: cudaGetDeviceCount"));
  if (device < 0 || device >= devices)
    return invalid_argument("NcclComm: device " + std::to_string(device) + " outside the " + std::to_string(devices) +
                            " visible CUDA devices");
  std::unique_ptr<NcclComm> c(new NcclComm(rank, size, device));
  K3_TRY(cuda_status(cudaSetDevice(device), "NcclComm: cudaSetDevice"));
  K3_TRY(cuda_status(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking), "NcclComm: cudaStreamCreate"));
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), id.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const std::string who = "NcclComm rank " + std::to_string(rank) + " of " + std::to_string(size);
  if (Status st = nccl_status(ncclCommInitRankConfig(&c->comm_, size, uid, rank, &config), who + ": ncclCommInitRankConfig");
      !st.is_ok()) {
    if (c->comm_) ncclCommAbort(c->comm_);
    c->comm_ = nullptr;
    return st;
  }
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (join_within.count() > 0) deadline = std::chrono::steady_clock::now() + join_within;
  if (Status joined = c->settle(who + ": joining", deadline); !joined.is_ok()) {
    ncclCommAbort(c->comm_);  // frees what the half-made communicator holds; nothing else uses it yet
    c->comm_ = nullptr;
    if (joined.code() == Code::DeadlineExceeded)
      return Status(Code::DeadlineExceeded, who + ": the group did not form within " + std::to_string(join_within.count()) +
                                                " ms (a rank never joined, or died while joining)");
    return joined;
  }
  return c;
}

NcclComm::NcclComm(int rank, int size, int device)
    : rank_(rank), size_(size), device_(device), watchdog_([this](const Status& why) { abort(why); }) {}

NcclComm::~NcclComm() {
  cudaSetDevice(device_);
  if (comm_ && !aborted_) {  // ncclCommAbort already freed an aborted one
    // Flush, then free; a flush that does not settle (a peer gone mid-call) is aborted instead.
    const bool flushed = nccl_status(ncclCommFinalize(comm_), "ncclCommFinalize").is_ok() &&
                         settle("NcclComm finalize", std::chrono::steady_clock::now() + kFinalizeWithin).is_ok();
    if (flushed) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }
  if (scratch_) cudaFree(scratch_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclComm::abort(const Status& why) {
  std::lock_guard lock(mu_);
  if (aborted_) return;
  abort_status_ = Status(why.code(), "NcclComm rank " + std::to_string(rank_) + " aborted: " + why.message());
  if (comm_) ncclCommAbort(comm_);
  aborted_ = true;
}

Status NcclComm::settle(const std::string& what, std::optional<std::chrono::steady_clock::time_point> deadline) {
  std::chrono::microseconds pause = kFirstPause;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    {
      std::lock_guard lock(mu_);
      if (aborted_) return abort_status_;
      K3_TRY(nccl_status(ncclCommGetAsyncError(comm_, &state), what + ": ncclCommGetAsyncError"));
    }
    if (state == ncclSuccess) return Status::ok();
    if (state != ncclInProgress) return Status(Code::Internal, what + ": " + ncclGetErrorString(state));
    if (deadline && std::chrono::steady_clock::now() >= *deadline) return Status(Code::DeadlineExceeded, what + ": past its deadline");
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(2 * pause, kLongestPause);
  }
}

Status NcclComm::run(const char* what, const std::function<Status()>& enqueue, const std::function<Status()>& then) {
  if (aborted_) return abort_status_;
  const std::string name = std::string("NcclComm ") + what;
  const Status st = watchdog_.watch(name, [&] {
    {
      std::lock_guard lock(mu_);
      if (aborted_) return abort_status_;
      K3_TRY(enqueue());
    }
    K3_TRY(settle(name));  // the watchdog's deadline and hook hold here too: its abort ends the poll
    if (then) K3_TRY(then());  // only now is NCCL's work on the stream, ahead of what reads its results
    return cuda_status(cudaStreamSynchronize(stream_), name);
  });
  if (aborted_) return abort_status_;
  return st;
}

Result<float*> NcclComm::scratch(size_t floats) {
  if (floats > scratch_floats_) {
    if (scratch_) K3_TRY(cuda_status(cudaFree(scratch_), "NcclComm: cudaFree"));
    scratch_ = nullptr;
    K3_TRY(cuda_status(cudaMalloc(&scratch_, floats * sizeof(float)), "NcclComm: scratch cudaMalloc"));
    scratch_floats_ = floats;
  }
  return scratch_;
}

Status NcclComm::send(int peer, std::span<const std::byte> data, uint32_t tag) {
  if (tag != 0) return invalid_argument("NcclComm::send: NCCL has no tags (tag " + std::to_string(tag) + ")");
  if (peer < 0 || peer >= size_ || peer == rank_) return invalid_argument("NcclComm::send: bad peer " + std::to_string(peer));
  return run("send", [&] { return nccl_status(ncclSend(data.data(), data.size(), ncclUint8, peer, comm_, stream_), "ncclSend"); });
}

Status NcclComm::recv(int peer, std::span<std::byte> data, uint32_t tag) {
  if (tag != 0) return invalid_argument("NcclComm::recv: NCCL has no tags (tag " + std::to_string(tag) + ")");
  if (peer < 0 || peer >= size_ || peer == rank_) return invalid_argument("NcclComm::recv: bad peer " + std::to_string(peer));
  return run("recv", [&] { return nccl_status(ncclRecv(data.data(), data.size(), ncclUint8, peer, comm_, stream_), "ncclRecv"); });
}

Status NcclComm::all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
  if (all.size() != mine.size() * size_)
    return invalid_argument("all_gather: all has " + std::to_string(all.size()) + " bytes, expected size x " +
                            std::to_string(mine.size()));
  return run("all_gather", [&] {
    return nccl_status(ncclAllGather(mine.data(), all.data(), mine.size(), ncclUint8, comm_, stream_), "ncclAllGather");
  });
}

Status NcclComm::all_to_allv(std::span<const std::byte> in, std::span<const size_t> send_counts,
                             std::span<std::byte> out, std::span<const size_t> recv_counts) {
  if (send_counts.size() != size_t(size_) || recv_counts.size() != size_t(size_))
    return invalid_argument("all_to_allv: send_counts and recv_counts need " + std::to_string(size_) + " entries");
  size_t st = 0, rt = 0;
  for (int p = 0; p < size_; ++p) st += send_counts[p], rt += recv_counts[p];
  if (st != in.size() || rt != out.size()) return invalid_argument("all_to_allv: counts do not add up to the buffers");
  if (send_counts[rank_] != recv_counts[rank_]) return invalid_argument("all_to_allv: self send != self recv count");
  return run("all_to_allv", [&] { return enqueue_all_to_allv(in, send_counts, out, recv_counts); });
}

Status NcclComm::enqueue_all_to_allv(std::span<const std::byte> in, std::span<const size_t> send_counts,
                                     std::span<std::byte> out, std::span<const size_t> recv_counts) {
  size_t so = 0, ro = 0;
  NcclGroup group;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) {
      if (send_counts[p])
        K3_TRY(cuda_status(cudaMemcpyAsync(out.data() + ro, in.data() + so, send_counts[p], cudaMemcpyDeviceToDevice, stream_),
                           "all_to_allv: self copy"));
    } else {
      if (send_counts[p]) K3_TRY(nccl_status(ncclSend(in.data() + so, send_counts[p], ncclUint8, p, comm_, stream_), "ncclSend"));
      if (recv_counts[p]) K3_TRY(nccl_status(ncclRecv(out.data() + ro, recv_counts[p], ncclUint8, p, comm_, stream_), "ncclRecv"));
    }
    so += send_counts[p];
    ro += recv_counts[p];
  }
  return group.end();
}

Status NcclComm::all_to_all(std::span<const std::byte> in, std::span<std::byte> out) {
  if (in.size() != out.size() || in.size() % size_ != 0)
    return invalid_argument("all_to_all: in and out must be equal and divisible into " + std::to_string(size_) + " blocks");
  std::vector<size_t> counts(size_, in.size() / size_);
  return all_to_allv(in, counts, out, counts);
}

Status NcclComm::reduce_scatter_sum(std::span<const float> in, std::span<float> out) {
  if (in.size() != out.size() * size_)
    return invalid_argument("reduce_scatter_sum: in has " + std::to_string(in.size()) + " floats, expected size " +
                            std::to_string(size_) + " x out " + std::to_string(out.size()));
  K3_ASSIGN_OR_RETURN(float* parts, scratch(in.size()));
  // Block p of every rank's `in` lands at parts[q * out.size()] on rank p, in rank order q.
  const std::vector<size_t> counts(size_, out.size() * sizeof(float));
  return run(
      "reduce_scatter_sum",
      [&] {
        return enqueue_all_to_allv(std::as_bytes(in), counts, std::as_writable_bytes(std::span<float>(parts, in.size())),
                                   counts);
      },
      [&] {
        return cuda_status(ordered_sum(parts, size_, out.size(), out.data(), stream_), "reduce_scatter_sum: ordered_sum");
      });
}

Status NcclComm::all_reduce_sum(std::span<float> data) {
  const size_t n = data.size();
  K3_ASSIGN_OR_RETURN(float* all, scratch(n * size_));
  // Every rank gathers every contribution and adds them in rank order: the same bits everywhere.
  return run(
      "all_reduce_sum",
      [&] { return nccl_status(ncclAllGather(data.data(), all, n, ncclFloat32, comm_, stream_), "ncclAllGather"); },
      [&] { return cuda_status(ordered_sum(all, size_, n, data.data(), stream_), "all_reduce_sum: ordered_sum"); });
}

Status NcclComm::barrier() {
  K3_ASSIGN_OR_RETURN(float* slots, scratch(size_));
  // In place: this rank's float is slot rank() of the gathered array.
  return run("barrier", [&] { return nccl_status(ncclAllGather(slots + rank_, slots, 1, ncclFloat32, comm_, stream_), "barrier"); });
}

}  // namespace k3::transfer
