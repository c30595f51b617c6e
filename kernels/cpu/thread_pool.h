// A fixed-size worker pool owned by one CPU backend instance (no process-wide state).
// parallel_for splits [0, n) into contiguous chunks; every index is handled by exactly one call of
// the body, and the body's result for an index must not depend on which chunk it landed in. That
// is how the CPU backend stays bitwise identical for any thread count.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace k3::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads >= 1; the calling thread counts as one of them
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end) over disjoint chunks covering [0, n), chunks of at least `grain`
  // indices. Blocks until all chunks are done; rethrows the first exception a chunk threw.
  // Calls made from inside a body (nested) run inline on the calling thread.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body, int64_t grain = 1);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  bool busy_ = false;  // a parallel_for is in flight (nested calls run inline)
  uint64_t generation_ = 0;
  // The job in flight (guarded by mu_ except the chunk counter, taken under mu_ too: chunks are coarse).
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0, chunk_ = 1, next_ = 0;
  int active_ = 0;
  std::exception_ptr error_;
};

// Threads for a backend: the explicit option if > 0, else env K3_THREADS, else hardware concurrency.
int resolve_thread_count(int requested);

}  // namespace k3::cpu
