// Where the HTTP server runs request handlers. Handlers may block (a completion waits for its whole
// generation, an SSE generator for its next token), so they run on a bounded BlockingPool and never on
// an I/O thread; only the paths named inline (cheap, non-blocking: /health, /metrics) are answered on
// the I/O thread, so they never queue behind generations. No sockets here.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "router/blocking_pool.h"
#include "router/http_types.h"

namespace k3::router {

class HandlerRunner {
 public:
  HandlerRunner(HttpHandler handler, std::vector<std::string> inline_paths, int max_threads);

  bool runs_inline(const std::string& target) const;  // target: path, optionally "?query"
  HttpResponse call(const HttpRequest& rq) noexcept;  // a handler's exception becomes a 500
  // Calls the handler on the pool and gives the response to `done` there; false once stopped.
  bool call_on_pool(HttpRequest rq, std::function<void(HttpResponse)> done);
  // Any blocking step (an SSE generator call); false once stopped.
  bool submit(std::function<void()> task) { return pool_.submit(std::move(task)); }
  // Drops an SSE generator on the pool: its destructor cancels the generation, which may wait.
  void release(SseGenerator g);
  // Refuses new work, runs what is queued, joins the threads.
  void stop() { pool_.stop(); }

 private:
  HttpHandler handler_;
  std::vector<std::string> inline_paths_;
  BlockingPool pool_;
};

}  // namespace k3::router
