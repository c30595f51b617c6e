// The HTTP side of one submitted request: a queue the service's sink fills and the handler drains,
// and the RAII guard that cancels the request when the handler lets go of it (client disconnect,
// error, shutdown and normal completion all end in the destructor; docs/STYLE.md habit 13).
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "router/generation_service.h"

namespace k3::router {

class RequestStream {
 public:
  // Submits; on failure returns the service's status (ResourceExhausted, Unavailable, InvalidArgument).
  static Result<std::unique_ptr<RequestStream>> start(GenerationService& service, GenerationParams params);
  ~RequestStream();  // cancels the request unless it already finished
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;

  // The next event, or nullopt when `timeout` passed first. After the last choice's Finished event or
  // a Failed event the stream is over and next() returns nullopt at once.
  std::optional<GenerationEvent> next(std::chrono::milliseconds timeout);
  bool over() const;

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<GenerationEvent> events;
  };
  RequestStream(GenerationService& service, std::shared_ptr<Queue> q) : service_(service), q_(std::move(q)) {}
  GenerationService& service_;
  std::shared_ptr<Queue> q_;   // shared with the sink, which may outlive a cancelled stream briefly
  RequestHandle handle_ = 0;
  bool over_ = false;
  int unfinished_ = 1;         // choices whose Finished event has not come yet
};

}  // namespace k3::router
