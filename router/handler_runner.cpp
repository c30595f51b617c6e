#include "router/handler_runner.h"

#include <algorithm>

#include "router/api_error.h"

namespace k3::router {

HandlerRunner::HandlerRunner(HttpHandler handler, std::vector<std::string> inline_paths, int max_threads)
    : handler_(std::move(handler)), inline_paths_(std::move(inline_paths)), pool_(max_threads) {}

bool HandlerRunner::runs_inline(const std::string& target) const {
  const std::string path = target.substr(0, target.find('?'));
  return std::find(inline_paths_.begin(), inline_paths_.end(), path) != inline_paths_.end();
}

HttpResponse HandlerRunner::call(const HttpRequest& rq) noexcept {
  try {
    return handler_(rq);
  } catch (const std::exception& e) {
    return error_response(ApiError(500, std::string("internal error: ") + e.what()));
  } catch (...) {
    return error_response(ApiError(500, "internal error"));
  }
}

bool HandlerRunner::call_on_pool(HttpRequest rq, std::function<void(HttpResponse)> done) {
  return pool_.submit([this, rq = std::move(rq), done = std::move(done)] { done(call(rq)); });
}

void HandlerRunner::release(SseGenerator g) {
  if (g) pool_.submit([g = std::move(g)]() mutable { g = nullptr; });
}

}  // namespace k3::router
