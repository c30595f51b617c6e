#include "router/request_stream.h"

namespace k3::router {

Result<std::unique_ptr<RequestStream>> RequestStream::start(GenerationService& service, GenerationParams params) {
  auto q = std::make_shared<Queue>();
  std::unique_ptr<RequestStream> s(new RequestStream(service, q));
  s->unfinished_ = params.n;
  auto handle = service.submit(std::move(params), [q](GenerationEvent&& ev) {
    std::lock_guard lk(q->mu);
    q->events.push_back(std::move(ev));
    q->cv.notify_all();
  });
  if (!handle.is_ok()) return handle.status();
  s->handle_ = *handle;
  return s;
}

RequestStream::~RequestStream() {
  if (!over_) service_.cancel(handle_);
}

bool RequestStream::over() const { return over_; }

std::optional<GenerationEvent> RequestStream::next(std::chrono::milliseconds timeout) {
  if (over_) return std::nullopt;
  std::unique_lock lk(q_->mu);
  if (!q_->cv.wait_for(lk, timeout, [&] { return !q_->events.empty(); })) return std::nullopt;
  GenerationEvent ev = std::move(q_->events.front());
  q_->events.pop_front();
  if (ev.kind == GenerationEvent::Kind::Failed || (ev.kind == GenerationEvent::Kind::Finished && --unfinished_ <= 0))
    over_ = true;
  return ev;
}

}  // namespace k3::router
