// A watchdog for blocking calls that cannot time out on their own: while a watched call runs, a thread of
// its own calls a hook (at most `period` apart) and checks the call's deadline; when the deadline passes
// or the hook returns an error, it runs `abort` once with that status and the call returns it.
//
// Why: NcclComm waits for each collective in a CUDA stream synchronise. A rank that died inside a
// collective leaves its peers' NCCL kernels waiting for ever, and only ncclCommAbort, called from another
// thread, releases them. `abort` is that call; the watched call then returns, and reports the watchdog's
// status instead of whatever the aborted wait said.
//
// The hook runs on the watchdog's thread while the watched call blocks the caller's thread, and never
// after watch() has returned: watch() takes the hook's lock on its way out, so whatever the hook touches
// is used by one thread at a time (a group leader's liveness check and router heartbeat).
// Nothing spins: the thread sleeps on a condition variable between hook calls, and not at all when no
// call is watched.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/core/status.h"

namespace k3 {

class CallWatchdog {
 public:
  using Abort = std::function<void(const Status&)>;
  explicit CallWatchdog(Abort abort, std::chrono::milliseconds period = std::chrono::milliseconds(50));
  ~CallWatchdog();
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;

  // The deadline of each later watched call (0: none).
  void set_timeout(std::chrono::milliseconds timeout);
  // Called while a watched call runs; an error it returns aborts the call with it. Empty: none.
  void set_hook(std::function<Status()> hook);
  // Whether watch() does anything beyond calling `wait`: a deadline or a hook is set.
  bool enabled() const;

  // Runs `wait` (the call: it blocks until done, or until `abort` released it) under watch. Returns the
  // watchdog's status if it fired during the call, else wait's.
  Status watch(const std::string& what, const std::function<Status()>& wait);

 private:
  void run();
  bool enabled_locked() const;  // enabled(), with mu_ held

  Abort abort_;
  const std::chrono::milliseconds period_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::chrono::milliseconds timeout_{0};
  std::function<Status()> hook_;
  bool armed_ = false, fired_ = false, stop_ = false;
  std::chrono::steady_clock::time_point deadline_, next_hook_;
  std::string what_;
  Status failure_;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace k3
