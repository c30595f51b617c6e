// Protocol request ids ("wire ids") the router puts on CLAIM/PREFILL/ABORT: drawn from the kernel's
// CSPRNG (getrandom), so no node or local process can predict the id of another user's request from
// its own (a counter or a start time would let it guess them). Never 0 (0 means "no request" on the
// wire), and redrawn while the candidate names a request still alive.
#pragma once
#include <cstdint>
#include <functional>

namespace k3::router {

class WireIds {
 public:
  // A fresh id for which in_use(id) is false. Throws k3::Error only if the kernel has no entropy to give.
  uint64_t next(const std::function<bool(uint64_t)>& in_use);
  uint64_t draws() const { return draws_; }  // random values drawn so far (tests count redraws)

 private:
  uint64_t draws_ = 0;
};

}  // namespace k3::router
