#include "transfer/async_writes.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <optional>

namespace k3::transfer {
namespace {
int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Result<EventFd> EventFd::create() {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return io_error("eventfd failed");
  return EventFd(fd);
}

EventFd::~EventFd() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFd::signal() const {
  const uint64_t one = 1;
  (void)!::write(fd_, &one, sizeof one);   // only fails when the counter would overflow: it is readable anyway
}

void EventFd::drain() const {
  uint64_t n = 0;
  (void)!::read(fd_, &n, sizeof n);        // EAGAIN when nothing was signalled
}

Result<std::unique_ptr<AsyncWrites>> AsyncWrites::create(UcxWriter& writer, std::mutex& ucx_mutex) {
  K3_ASSIGN_OR_RETURN(EventFd fd, EventFd::create());
  std::unique_ptr<AsyncWrites> w(new AsyncWrites(writer, ucx_mutex, std::move(fd)));
  w->thread_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

AsyncWrites::~AsyncWrites() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void AsyncWrites::post(WriteJob job) {
  {
    std::lock_guard lk(mu_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
}

void AsyncWrites::cancel(uint64_t request_id) {
  std::lock_guard lk(mu_);
  cancelled_.insert(request_id);
}

void AsyncWrites::forget(uint64_t request_id) {
  std::lock_guard lk(mu_);
  cancelled_.erase(request_id);
}

bool AsyncWrites::cancelled(uint64_t id) const {
  std::lock_guard lk(mu_);
  return stopping_ || cancelled_.count(id) != 0;
}

std::vector<WriteDone> AsyncWrites::take_done() {
  std::lock_guard lk(mu_);
  done_fd_.drain();
  return std::exchange(done_, {});
}

size_t AsyncWrites::queued() const {
  std::lock_guard lk(mu_);
  return jobs_.size();
}

void AsyncWrites::loop() {
  for (;;) {
    std::optional<WriteJob> job;
    {
      std::unique_lock lk(mu_);
      wake_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;   // stopping with nothing queued
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    WriteDone d{.request_id = job->request_id, .begin_us = now_us()};
    if (cancelled(job->request_id)) {
      d.status = Status(Code::Aborted, "writes cancelled before they started");
      std::lock_guard ucx(ucx_mutex_);
      job.reset();   // the rkeys it holds may be the last references: dropped under the UCX lock
    } else {
      for (const auto& runs : job->runs)
        for (const RemoteWrite& w : runs.writes) d.bytes += w.length;
      std::lock_guard ucx(ucx_mutex_);
      const uint64_t id = job->request_id;
      for (const auto& runs : job->runs) {
        d.status = writer_.write(*runs.dest, runs.writes, [&] { return cancelled(id); }, job->source_registration);
        if (!d.status.is_ok()) break;
      }
      job.reset();
    }
    d.end_us = now_us();
    {
      std::lock_guard lk(mu_);
      done_.push_back(std::move(d));
    }
    done_fd_.signal();
  }
}

}  // namespace k3::transfer
