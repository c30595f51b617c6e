#include "deploy/status_server.h"

namespace k3::deploy {

Result<std::unique_ptr<router::HttpServer>> start_status_server(uint16_t port, const Supervisor& supervisor) {
  auto handler = [&supervisor](const router::HttpRequest& rq) {
    router::HttpResponse r;
    const std::string path = rq.target.substr(0, rq.target.find('?'));
    if (rq.method != "GET") {
      r.status = 405;
      r.body = R"({"error":"only GET"})";
    } else if (path == "/status") {
      r.body = supervisor.status_json();
    } else if (path == "/metrics") {
      r.content_type = "text/plain; version=0.0.4";
      r.body = supervisor.prometheus_text();
    } else {
      r.status = 404;
      r.body = R"({"error":"GET /status or /metrics"})";
    }
    return r;
  };
  return router::HttpServer::start({.host = "127.0.0.1", .port = port, .max_body_bytes = 1 << 16}, handler);
}

}  // namespace k3::deploy
