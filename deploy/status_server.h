// k3-cluster's own status endpoint on 127.0.0.1 (operators and the soak driver; the router's /metrics
// describes requests, this one the processes): GET /status is the supervisor's JSON (every node's
// state, pid, restarts, last exit), GET /metrics its Prometheus text (k3_cluster_node_restarts_total
// {node}, k3_cluster_process_up{node}, k3_cluster_process_failed{node}). Served by the router's HTTP
// server class; read-only, no API key (it binds loopback only).
#pragma once
#include <cstdint>
#include <memory>

#include "deploy/supervisor.h"
#include "router/http_server.h"

namespace k3::deploy {

// port 0: a free one (HttpServer::port() says which). `supervisor` must outlive the server.
Result<std::unique_ptr<router::HttpServer>> start_status_server(uint16_t port, const Supervisor& supervisor);

}  // namespace k3::deploy
