#include "router/connection_metrics.h"

namespace k3::router {

const char* close_reason_label(CloseReason r) {
  switch (r) {
    case CloseReason::PerClientLimit: return "per_client_limit";
    case CloseReason::GlobalLimit: return "global_limit";
    case CloseReason::FdLimit: return "fd_limit";
    case CloseReason::HeaderTimeout: return "header_timeout";
    case CloseReason::BodyTimeout: return "body_timeout";
    case CloseReason::IdleTimeout: return "idle_timeout";
    case CloseReason::WriteTimeout: return "write_timeout";
  }
  return "unknown";
}

std::string ConnectionMetrics::prometheus_text() const {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  family("k3_router_open_connections", "gauge", "HTTP connections open now");
  out += "k3_router_open_connections " + std::to_string(open()) + "\n";
  family("k3_router_connections_accepted_total", "counter", "HTTP connections accepted (refused ones included)");
  out += "k3_router_connections_accepted_total " + std::to_string(accepted()) + "\n";
  // Every reason is listed (zeros included) so a dashboard sees the series before the first event.
  family("k3_router_connections_refused_total", "counter",
         "new connections answered 429/503 and closed because a limit was reached and nothing idle could make room");
  for (int i = 0; i < kCloseReasons; ++i) {
    const auto r = static_cast<CloseReason>(i);
    if (r != CloseReason::PerClientLimit && r != CloseReason::GlobalLimit) continue;  // the only refusal reasons
    out += std::string("k3_router_connections_refused_total{reason=\"") + close_reason_label(r) + "\"} " +
           std::to_string(refused(r)) + "\n";
  }
  family("k3_router_connections_closed_total", "counter",
         "open connections the server closed: idle ones to make room (limits) and deadlines");
  for (int i = 0; i < kCloseReasons; ++i) {
    const auto r = static_cast<CloseReason>(i);
    out += std::string("k3_router_connections_closed_total{reason=\"") + close_reason_label(r) + "\"} " +
           std::to_string(closed(r)) + "\n";
  }
  return out;
}

}  // namespace k3::router
