// A bounded pool of threads for work that may block (a handler collecting a whole generation, an SSE
// generator waiting for the next token), so the HTTP server's I/O threads never wait on it. Threads are
// started only when a task finds none free, up to max_threads; beyond that, tasks queue in order.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace k3::router {

class BlockingPool {
 public:
  explicit BlockingPool(int max_threads);
  ~BlockingPool();  // stop()
  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  // Queues the task; false once stop() began (the task is then neither run nor kept). The task object
  // is destroyed on the pool thread that ran it, so what it owns is released off the caller's thread.
  bool submit(std::function<void()> task);
  // Refuses new tasks, runs the queued ones to the end, joins every thread. Idempotent.
  void stop();
  int threads() const;

 private:
  void work();

  const int max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int free_ = 0;  // threads waiting for a task
  bool stopping_ = false;
};

}  // namespace k3::router
