// CallWatchdog (common/core/call_watchdog.h), with real threads and real time: a watched call that outlives
// its deadline, or whose hook fails, is aborted once and returns the watchdog's status; a call that ends in
// time is left alone and never runs the hook; the hook never runs after watch() returned.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/core/call_watchdog.h"

using namespace k3;
using namespace std::chrono_literals;


namespace {

// A call that blocks until the watchdog's abort releases it (as ncclCommAbort releases a stream
// synchronise), or 5 s at most so that a broken watchdog fails the test instead of hanging it.
struct BlockedCall {
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::atomic<int> aborts{0};
  void abort(const Status&) {
    ++aborts;
    std::lock_guard lk(mu);
    released = true;
    cv.notify_all();
  }
  Status wait() {
    std::unique_lock lk(mu);
    if (!cv.wait_for(lk, 5s, [&] { return released; })) return Status(Code::Internal, "never released");
    return Status(Code::Internal, "released by the abort");
  }
};

}  // namespace

TEST_CASE("call watchdog: without a deadline or a hook the call runs as it is", "[core]") {
  std::atomic<int> aborts{0};
  CallWatchdog w([&](const Status&) { ++aborts; });
  CHECK(!w.enabled());
  CHECK(w.watch("all_gather", [] { return Status(Code::Internal, "the call's own error"); }).message() ==
        "the call's own error");
  CHECK(w.watch("all_gather", [] { return Status::ok(); }).is_ok());
  CHECK(aborts == 0);
}

TEST_CASE("call watchdog: a call past its deadline is aborted once and reports the deadline", "[core]") {
  BlockedCall call;
  CallWatchdog w([&](const Status& s) { call.abort(s); });
  w.set_timeout(100ms);
  CHECK(w.enabled());
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = w.watch("all_to_allv", [&] { return call.wait(); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(st.to_string());
  CHECK(st.code() == Code::DeadlineExceeded);
  CHECK(st.message().find("all_to_allv") != std::string::npos);
  CHECK(st.message().find("100 ms") != std::string::npos);
  CHECK(s >= 0.1);
  CHECK(s < 2.0);
  CHECK(call.aborts == 1);
}

TEST_CASE("call watchdog: a failing hook aborts the call with its status", "[core]") {
  BlockedCall call;
  std::atomic<int> hooks{0};
  CallWatchdog w([&](const Status& s) { call.abort(s); }, 20ms);
  w.set_hook([&] {
    return ++hooks < 3 ? Status::ok() : Status(Code::Unavailable, "member rank 1 is down: no beat for 700 ms");
  });
  const Status st = w.watch("all_gather", [&] { return call.wait(); });
  CHECK(st.code() == Code::Unavailable);
  CHECK(st.message().find("member rank 1 is down") != std::string::npos);
  CHECK(hooks == 3);
  CHECK(call.aborts == 1);
  // The next call is watched afresh (the caller decides what a failure means for the communicator): one
  // that ends within the hook's period returns its own status; a longer one meets the failing hook again.
  CHECK(w.watch("barrier", [] { return Status::ok(); }).is_ok());
  BlockedCall again;
  CallWatchdog w2([&](const Status& s) { again.abort(s); }, 20ms);
  w2.set_hook([] { return Status(Code::Unavailable, "member rank 1 is down"); });
  CHECK(w2.watch("barrier", [&] { return again.wait(); }).code() == Code::Unavailable);
}

TEST_CASE("call watchdog: a call that ends in time is left alone, and the hook runs only during calls", "[core]") {
  std::atomic<int> aborts{0}, hooks{0};
  const auto counting = [&] {
    ++hooks;
    return Status::ok();
  };
  // Shorter than the hook's period (by far, so that a loaded host cannot make it look longer): the hook
  // never runs.
  const auto call_of = [](std::chrono::milliseconds d) {
    return [d] {
      std::this_thread::sleep_for(d);
      return Status::ok();
    };
  };
  {
    CallWatchdog slow([&](const Status&) { ++aborts; }, 1000ms);
    slow.set_timeout(5000ms);
    slow.set_hook(counting);
    CHECK(slow.watch("send", call_of(5ms)).is_ok());
    CHECK(hooks == 0);
  }
  // Longer: it runs about every 30 ms while the call lasts, and not after.
  CallWatchdog w([&](const Status&) { ++aborts; }, 30ms);
  w.set_timeout(5000ms);
  w.set_hook(counting);
  CHECK(w.watch("recv", call_of(200ms)).is_ok());
  const int during = hooks;
  CHECK(during >= 2);
  std::this_thread::sleep_for(150ms);
  CHECK(hooks == during);
  CHECK(aborts == 0);
}
