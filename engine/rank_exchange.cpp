// The collectives of a decode rank's step over tensors (engine/rank_step.h). The communicator names the
// memory it takes (Comm::takes_device_memory); a tensor in the other kind is staged through a buffer of
// that kind with the backend's copy, which moves bytes between host and device as they are (a GPU rank
// on the host UCX communicator, or host control values on NCCL).
#include <chrono>
#include <string>

#include "engine/rank_step.h"

namespace k3::rank {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool on_device(const Tensor& t) { return t.device() != Device::Cpu; }

std::span<const std::byte> bytes(const Tensor& t) { return {static_cast<const std::byte*>(t.data()), t.nbytes()}; }
std::span<std::byte> wbytes(const Tensor& t) { return {static_cast<std::byte*>(t.data()), t.nbytes()}; }

// One collective's buffers in the communicator's memory: each tensor itself where it already lives
// there, else a staged copy (inputs) or a fresh buffer copied back after the call (outputs).
class CommSide {
 public:
  explicit CommSide(Step& s) : s_(s), device_(s.comm.takes_device_memory()) {}

  Tensor in(const Tensor& t) {
    if (on_device(t) == device_ || t.nbytes() == 0) return t;
    Tensor c = staging(t);
    s_.be.copy(t, c);
    return c;
  }
  Tensor out(const Tensor& t) { return on_device(t) == device_ || t.nbytes() == 0 ? t : staging(t); }

  // Before the call: the backend's pending writes (results, staging copies) are complete.
  void ready() { s_.be.synchronize(); }
  // After a successful call: `staged` (from out()) back into `t`.
  void back(const Tensor& staged, Tensor& t) {
    if (staged.data() == t.data()) return;
    s_.be.copy(staged, t);
    if (!on_device(t)) s_.be.synchronize();  // a host value is read next
  }

 private:
  Tensor staging(const Tensor& t) {
    return device_ ? s_.be.alloc(t.shape(), t.dtype()) : Tensor::zeros(t.shape(), t.dtype());
  }
  Step& s_;
  bool device_;
};

// One collective from `in` to `out` in the communicator's memory, timed into `timer`.
template <class Call>
Status exchange(Step& s, const Tensor& in, Tensor& out, double& timer, Call call) {
  const auto t0 = Clock::now();
  CommSide side(s);
  const Tensor a = side.in(in), b = side.out(out);
  side.ready();
  Status st = call(bytes(a), wbytes(b));
  if (st.is_ok()) side.back(b, out);
  timer += since(t0);
  return st;
}

}  // namespace

Status Step::all_gather(const Tensor& mine, Tensor& all) {
  times.bytes += mine.nbytes() * (comm.size() - 1);
  return exchange(*this, mine, all, times.all_gather, [&](auto a, auto b) { return comm.all_gather(a, b); });
}

Status Step::all_to_all(const Tensor& in, Tensor& out) {
  times.bytes += in.nbytes() - in.nbytes() / comm.size();
  return exchange(*this, in, out, times.all_to_all, [&](auto a, auto b) { return comm.all_to_all(a, b); });
}

Status Step::all_to_allv(const Tensor& in, std::span<const size_t> send, Tensor& out, std::span<const size_t> recv) {
  times.bytes += in.nbytes() - send[comm.rank()];
  return exchange(*this, in, out, times.all_to_allv,
                  [&](auto a, auto b) { return comm.all_to_allv(a, send, b, recv); });
}

Status Step::all_reduce(Tensor& data) {
  if (data.dtype() != DType::F32) return invalid_argument("rank all_reduce: data must be F32");
  const auto t0 = Clock::now();
  CommSide side(*this);
  const Tensor a = side.in(data);
  side.ready();
  Status st = comm.all_reduce_sum(std::span<float>(a.ptr<float>(), static_cast<size_t>(a.numel())));
  if (st.is_ok()) side.back(a, data);
  times.all_reduce += since(t0);
  times.bytes += data.nbytes();
  return st;
}

Tensor Step::host_bytes(const Tensor& t) {
  if (!on_device(t)) return t;
  Tensor h = Tensor::zeros(t.shape(), t.dtype());
  be.copy(t, h);
  be.synchronize();
  return h;
}

}  // namespace k3::rank
