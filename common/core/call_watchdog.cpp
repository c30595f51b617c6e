#include "common/core/call_watchdog.h"

#include <algorithm>

namespace k3 {

CallWatchdog::CallWatchdog(Abort abort, std::chrono::milliseconds period)
    : abort_(std::move(abort)), period_(std::max(period, std::chrono::milliseconds(1))), thread_([this] { run(); }) {}

CallWatchdog::~CallWatchdog() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CallWatchdog::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard lk(mu_);
  timeout_ = timeout;
}

void CallWatchdog::set_hook(std::function<Status()> hook) {
  std::lock_guard lk(mu_);
  hook_ = std::move(hook);
}

bool CallWatchdog::enabled() const {
  std::lock_guard lk(mu_);
  return enabled_locked();
}

bool CallWatchdog::enabled_locked() const { return timeout_.count() > 0 || static_cast<bool>(hook_); }

Status CallWatchdog::watch(const std::string& what, const std::function<Status()>& wait) {
  {
    std::unique_lock lk(mu_);
    if (!enabled_locked()) {
      lk.unlock();
      return wait();  // the plain wait: the thread is not woken (a hot path's calls)
    }
    armed_ = true;
    fired_ = false;
    what_ = what;
    const auto now = std::chrono::steady_clock::now();
    deadline_ = timeout_.count() > 0 ? now + timeout_ : std::chrono::steady_clock::time_point::max();
    next_hook_ = now + period_;  // a call that ends sooner never wakes the thread's hook
  }
  cv_.notify_all();
  Status st = wait();
  std::lock_guard lk(mu_);  // waits for a hook call or an abort in progress
  armed_ = false;
  return fired_ ? failure_ : st;
}

void CallWatchdog::run() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    if (!armed_ || fired_) {
      cv_.wait(lk);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    Status why;
    if (now >= deadline_) {
      why = Status(Code::DeadlineExceeded,
                   what_ + " did not finish within " + std::to_string(timeout_.count()) + " ms");
    } else if (hook_ && now >= next_hook_) {
      why = hook_();
      next_hook_ = now + period_;
    }
    if (!why.is_ok()) {
      fired_ = true;
      failure_ = why;
      abort_(why);  // under the lock: watch() returns only once the call has been released
      continue;
    }
    cv_.wait_until(lk, hook_ ? std::min(deadline_, next_hook_) : deadline_);
  }
}

}  // namespace k3
