// A UCX context and worker whose events a thread serves, sleeping on them between events, as a decode
// rank's loop does: the owner of registered memory that writers in the same test process put into.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "transfer/ucx_context.h"

namespace k3::test {

struct ProgressedWorker {
  std::shared_ptr<transfer::UcxContext> ctx = transfer::UcxContext::create().value();
  std::shared_ptr<transfer::UcxWorker> worker = transfer::UcxWorker::create(ctx).value();
  std::atomic<bool> stop{false};
  std::thread progress{[this] {
    while (!stop.load()) (void)worker->wait_until([this] { return stop.load(); }, std::chrono::milliseconds(20));
  }};
  ProgressedWorker() = default;
  ProgressedWorker(const ProgressedWorker&) = delete;
  ProgressedWorker& operator=(const ProgressedWorker&) = delete;
  ~ProgressedWorker() {
    stop = true;
    progress.join();
  }
};

}  // namespace k3::test
