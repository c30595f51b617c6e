#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/core/status.h"

namespace k3::cpu {

ThreadPool::ThreadPool(int threads) {
  K3_CHECK(threads >= 1, "ThreadPool: threads must be >= 1, got " + std::to_string(threads));
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t begin;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_ >= n_ || error_) return;
      begin = next_;
      next_ = std::min(n_, next_ + chunk_);
    }
    try {
      (*body_)(begin, std::min(n_, begin + chunk_));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++active_;
    }
    run_chunks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
    }
    done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int threads = size();
  bool inline_run = threads == 1 || n <= grain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Nested call from a body, or another thread sharing the backend: run on this thread.
    if (busy_) inline_run = true;
    if (!inline_run) {
      busy_ = true;
      body_ = &body;
      n_ = n;
      // A few chunks per thread balances uneven rows without making chunks tiny.
      chunk_ = std::max<int64_t>(grain, (n + 4 * threads - 1) / (4 * threads));
      next_ = 0;
      error_ = nullptr;
      ++generation_;
    }
  }
  if (inline_run) {
    body(0, n);
    return;
  }
  work_cv_.notify_all();
  run_chunks();
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return active_ == 0 && (next_ >= n_ || error_); });
    err = error_;
    body_ = nullptr;
    n_ = 0;
    next_ = 0;
    error_ = nullptr;
    busy_ = false;
  }
  if (err) std::rethrow_exception(err);
}

int resolve_thread_count(int requested) {
  if (requested > 0) return requested;
  if (const char* env = std::getenv("K3_THREADS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    K3_CHECK(end != env && *end == '\0' && v >= 1 && v <= 4096,
             std::string("K3_THREADS must be an integer in [1, 4096], got '") + env + "'");
    return static_cast<int>(v);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace k3::cpu
