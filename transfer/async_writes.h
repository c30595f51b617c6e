// A prefill stage's RMA writes on a thread of their own, so that a long write never holds up the control
// loop (heartbeats, ADDRS / ABORT handling, the next chunk's compute): the loop posts a job per
// StartWrites and learns of its end through fd() (poll it with the control sockets) and take_done().
//
// Guarantees: every posted job is reported done exactly once (ok, the write's error, or Aborted when it
// was cancelled before it started); a cancelled request posts no new put (UcxWriter's should_stop) and
// its running job waits for the puts already posted, so "done" always means nothing is in flight. Jobs
// run one at a time in post order. The UCX worker is shared with the control loop: every use of it, here
// and there, holds `ucx_mutex`; a job drops its rkeys and source inside the lock.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "transfer/ucx_writer.h"

namespace k3::transfer {

// An eventfd: readable while its counter is nonzero. Closed on destruction.
class EventFd {
 public:
  static Result<EventFd> create();
  EventFd(EventFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  EventFd& operator=(EventFd&&) = delete;
  EventFd(const EventFd&) = delete;
  ~EventFd();
  int fd() const { return fd_; }
  void signal() const;
  void drain() const;   // back to not readable

 private:
  explicit EventFd(int fd) : fd_(fd) {}
  int fd_ = -1;
};

struct WriteJob {
  uint64_t request_id = 0;
  struct Runs {
    std::shared_ptr<const RemoteKey> dest;
    std::vector<RemoteWrite> writes;
  };
  std::vector<Runs> runs;                            // one per destination region
  std::shared_ptr<const void> source;               // keeps the source bytes alive while writing
  const UcxMemory* source_registration = nullptr;   // what every run's source lies in (lives as long as
                                                    // `source`), or null: UCX registers the source itself
};

struct WriteDone {
  uint64_t request_id = 0;
  Status status;
  int64_t begin_us = 0, end_us = 0;   // steady clock, when the job's writes ran (k3-prefill --timing)
  uint64_t bytes = 0;                 // the job's bytes (written, when the status is ok)
};

class AsyncWrites {
 public:
  static Result<std::unique_ptr<AsyncWrites>> create(UcxWriter& writer, std::mutex& ucx_mutex);
  ~AsyncWrites();   // cancels what is queued, waits for the running job, joins
  AsyncWrites(const AsyncWrites&) = delete;
  AsyncWrites& operator=(const AsyncWrites&) = delete;

  void post(WriteJob job);
  void cancel(uint64_t request_id);   // no new put for its jobs; queued ones end Aborted
  void forget(uint64_t request_id);   // the request was released: drop its cancel mark
  int fd() const { return done_fd_.fd(); }
  std::vector<WriteDone> take_done();
  size_t queued() const;

 private:
  AsyncWrites(UcxWriter& w, std::mutex& m, EventFd fd) : writer_(w), ucx_mutex_(m), done_fd_(std::move(fd)) {}
  void loop();
  bool cancelled(uint64_t id) const;

  UcxWriter& writer_;
  std::mutex& ucx_mutex_;
  EventFd done_fd_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<WriteJob> jobs_;
  std::set<uint64_t> cancelled_;
  std::vector<WriteDone> done_;
  bool stopping_ = false;
  std::thread thread_;   // last: starts after everything it uses exists
};

}  // namespace k3::transfer
