// RAII owners of the UCX objects the data plane needs: context, worker, endpoint.
// Ownership: a worker keeps its context alive, an endpoint keeps its worker alive (shared_ptr), so
// destruction order can never be wrong. Everything here is single-threaded per worker
// (UCS_THREAD_MODE_SINGLE): one thread drives one worker.
//
// Progress sleeps: wait() arms the worker and blocks in poll() on its event fd, because many
// processes share few cores and a spinning progress loop would starve its neighbours.
#pragma once
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3::transfer {

// Where a buffer lives. The seam for GPU memory: direct puts where UCX has a CUDA transport,
// pinned staging otherwise (see ucx_writer.h).
enum class MemoryType : uint8_t { Host, Cuda };
const char* memory_type_name(MemoryType t);

// Call before creating a UCX context that will move memory of `type`. Cuda: makes `cuda_device`'s
// primary context current first (UCX finds cuda_ipc only when the CUDA context exists before its own,
// docs/PERF.md); in a build without CUDA, refuses: "<what>: a CUDA build ... is required". Host: nothing.
Status prepare_memory_type(MemoryType type, int cuda_device, const std::string& what);

// Converts a UCX status into our Status, naming the operation that failed.
Status ucx_status(ucs_status_t s, const std::string& what);

class UcxContext {
 public:
  // features: UCP_FEATURE_* bits; UCP_FEATURE_WAKEUP is always added, so every worker sleeps on its
  // event fd. (UCX 1.22 keeps the shared-memory and CUDA RMA transports under WAKEUP; 1.13 did not,
  // docs/PERF.md.)
  // net_devices: UCX_NET_DEVICES for this context only (e.g. "lo": the tcp transport then listens on
  // that interface alone, docs/SECURITY.md); empty keeps the environment's choice.
  static Result<std::shared_ptr<UcxContext>> create(uint64_t features = UCP_FEATURE_RMA | UCP_FEATURE_TAG,
                                                    const std::string& net_devices = "");
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h get() const { return ctx_; }
  // True when UCX can read/write this memory type directly (e.g. a CUDA transport is loaded).
  bool supports(MemoryType t) const;

 private:
  UcxContext(ucp_context_h ctx, uint64_t memory_types) : ctx_(ctx), memory_types_(memory_types) {}
  ucp_context_h ctx_;
  uint64_t memory_types_;
};

class UcxEndpoint;

class UcxWorker : public std::enable_shared_from_this<UcxWorker> {
 public:
  // serialized: more than one thread uses the worker, never at once (the caller holds a mutex around
  // every use: a prefill stage's writer thread and its control loop); else one thread drives it.
  static Result<std::shared_ptr<UcxWorker>> create(std::shared_ptr<UcxContext> ctx, bool serialized = false);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h get() const { return worker_; }
  const std::shared_ptr<UcxContext>& context() const { return ctx_; }
  // The opaque worker address a peer needs to create an endpoint to us (published at registration).
  const std::vector<uint8_t>& address() const { return address_; }

  // Creates an endpoint to a peer worker. With peer_error_handling (UCP_ERR_HANDLING_MODE_PEER) a
  // peer failure completes outstanding requests with an error instead of hanging them, but UCX (1.13
  // and 1.22) then leaves out transports without failure detection (shared-memory RMA): docs/PERF.md.
  Result<std::shared_ptr<UcxEndpoint>> connect(std::span<const uint8_t> peer_address, bool peer_error_handling = true);

  // Runs progress until no more events are ready; returns how many were processed.
  unsigned progress();
  // Arms the event fd. Returns true when it is safe to sleep on event_fd(); false when events are
  // pending (call progress() first).
  Result<bool> arm();
  int event_fd() const { return efd_; }
  // Progresses until done() or the timeout, sleeping on the event fd between events; for the first
  // `busy_poll` of the wait it progresses without sleeping (a wake-up from the fd costs tens of
  // microseconds, which a short wait for a device copy cannot hide). DeadlineExceeded when the
  // timeout passes first. `idle`, when set, is called before each sleep (at most 50 ms apart): a waiting
  // host keeps up time-bound duties (a group leader's heartbeats and its members' liveness); an error it
  // returns ends the wait with that error.
  Status wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout,
                    std::chrono::microseconds busy_poll = std::chrono::microseconds{0},
                    const std::function<Status()>& idle = {});

 private:
  UcxWorker(std::shared_ptr<UcxContext> ctx, ucp_worker_h w, int efd, std::vector<uint8_t> addr)
      : ctx_(std::move(ctx)), worker_(w), efd_(efd), address_(std::move(addr)) {}
  std::shared_ptr<UcxContext> ctx_;
  ucp_worker_h worker_;
  int efd_;
  std::vector<uint8_t> address_;
};

// One connection to a peer worker. The destructor flushes and closes it; a close that does not
// finish in a bounded time (dead peer) is forced so no destructor can hang.
class UcxEndpoint {
 public:
  ~UcxEndpoint();
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;

  ucp_ep_h get() const { return ep_; }
  const std::shared_ptr<UcxWorker>& worker() const { return worker_; }
  // Set once UCX reports the peer failed; every later operation fails fast.
  bool failed() const { return failed_; }
  ucs_status_t failure() const { return failure_; }
  // Completes every operation posted on this endpoint at the remote side.
  Status flush(std::chrono::milliseconds timeout);
  // The same flush, requested without waiting for it (write lists in flight: ucx_writer.h).
  class PendingFlush;
  std::unique_ptr<PendingFlush> flush_async();

 private:
  friend class UcxWorker;
  explicit UcxEndpoint(std::shared_ptr<UcxWorker> w) : worker_(std::move(w)) {}
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  std::shared_ptr<UcxWorker> worker_;
  ucp_ep_h ep_ = nullptr;
  bool failed_ = false;
  ucs_status_t failure_ = UCS_OK;
};

// Completion record of one non-blocking UCX request, shared by the waiter and the callback.
// Heap-allocated: a waiter that times out marks it abandoned and the late callback frees it, so a
// callback can never write into a dead stack frame.
struct UcxCompletion {
  bool done = false;
  bool abandoned = false;
  ucs_status_t status = UCS_OK;
  size_t received_length = 0;  // tag receives only
};
// Request params whose callback completes `c` (send/put/flush/close style, or tag receive).
ucp_request_param_t ucx_send_param(UcxCompletion* c);
ucp_request_param_t ucx_recv_param(UcxCompletion* c);
// An endpoint flush in progress. done() once every operation posted on the endpoint before it completed
// at the remote side (or it failed: status() says why). Dropped before it is done, the request is
// cancelled and its completion record left to UCX's callback, so nothing dangles. Progress comes from
// the worker (wait_until), as for any request.
class UcxEndpoint::PendingFlush {
 public:
  ~PendingFlush();
  PendingFlush(const PendingFlush&) = delete;
  PendingFlush& operator=(const PendingFlush&) = delete;
  bool done() const;
  Status status() const;

 private:
  friend class UcxEndpoint;
  PendingFlush() = default;
  std::shared_ptr<UcxWorker> worker_;
  ucs_status_ptr_t req_ = nullptr;
  struct UcxCompletion* c_ = nullptr;   // null once done in place or failed to post
  Status posted_;                        // an error from posting
};

// Waits for `req` (the return of a *_nbx call posted with the params above). Takes ownership of
// `c`. On timeout a receive is cancelled; the request is abandoned either way (DeadlineExceeded).
Status ucx_wait(UcxWorker& worker, ucs_status_ptr_t req, UcxCompletion* c,
                std::chrono::milliseconds timeout, const std::string& what, size_t* received = nullptr,
                const std::function<Status()>& idle = {});

}  // namespace k3::transfer
