#include "router/blocking_pool.h"

#include <algorithm>

namespace k3::router {

BlockingPool::BlockingPool(int max_threads) : max_threads_(std::max(1, max_threads)) {}

BlockingPool::~BlockingPool() { stop(); }

bool BlockingPool::submit(std::function<void()> task) {
  std::lock_guard lk(mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  // A free thread takes it; otherwise start one while under the bound (tasks queued ahead of this one
  // are already promised to the free threads counted in free_).
  if (free_ >= static_cast<int>(tasks_.size())) {
    cv_.notify_one();
  } else if (static_cast<int>(threads_.size()) < max_threads_) {
    threads_.emplace_back([this] { work(); });
  }
  return true;
}

void BlockingPool::work() {
  std::unique_lock lk(mu_);
  for (;;) {
    ++free_;
    cv_.wait(lk, [&] { return stopping_ || !tasks_.empty(); });
    --free_;
    if (tasks_.empty()) return;  // stopping and nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lk.unlock();
    try {
      task();
    } catch (...) {
      // A task's own failure is its business (the server's tasks catch theirs); the thread lives on.
    }
    task = nullptr;  // release what the task owns here, not on the next submitter's thread
    lk.lock();
  }
}

void BlockingPool::stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    threads.swap(threads_);
    cv_.notify_all();
  }
  for (auto& t : threads) t.join();
}

int BlockingPool::threads() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(threads_.size());
}

}  // namespace k3::router
