// A UCX context and worker whose events a thread serves, sleeping on them between events, as a decode
// rank's loop does: the owner of registered memory that writers in the same test process put into.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "transfer/ucx_memory.h"

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

// A progressed worker with `bytes` of registered host memory (poisoned 0xEE) that writers put into.
struct RegisteredTarget : ProgressedWorker {
  std::vector<uint8_t> pool;
  std::unique_ptr<transfer::UcxMemory> mem;
  explicit RegisteredTarget(size_t bytes)
      : pool(bytes, 0xEE), mem(transfer::UcxMemory::map(ctx, pool.data(), pool.size()).value()) {}
  uint64_t base() const { return reinterpret_cast<uint64_t>(pool.data()); }
};

}  // namespace k3::test
