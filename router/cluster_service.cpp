// ClusterService's life: create (options checked, control socket bound) and the worker thread's loop,
// which hands events, new and cancelled requests to ClusterWorkerOps (cluster_worker_ops.h) and fails
// every request at shutdown. The thread-safe face is in cluster_service_api.cpp.
#include "router/cluster_service.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "router/cluster_worker_ops.h"

namespace k3::router {

Result<std::unique_ptr<ClusterService>> ClusterService::create(const ModelConfig& cfg,
                                                               std::shared_ptr<const Tokenizer> tokenizer,
                                                               ClusterOptions opts) {
  if (!tokenizer) return invalid_argument("tokenizer is required");
  if (opts.pairs.empty()) return invalid_argument("cluster: at least one prefill/decode pair is required (--pair)");
  if (opts.max_queue < 1) return invalid_argument("cluster: max_queue must be >= 1");
  if (opts.generation_reserve < 0) return invalid_argument("cluster: generation_reserve must be >= 0");
  for (int ph = 0; ph < kNumRequestPhases; ++ph)
    if (opts.deadlines.of(static_cast<RequestPhase>(ph)).count() < 1)
      return invalid_argument(std::string("cluster: the ") + request_phase_name(static_cast<RequestPhase>(ph)) +
                              " deadline must be positive");
  if (opts.max_attempts < 1) return invalid_argument("cluster: max_attempts must be >= 1");
  if (opts.heartbeat.count() < 1 || opts.heartbeat_misses < 1) return invalid_argument("cluster: heartbeat must be positive");
  K3_TRY(check_pairs(opts.pairs));
  std::unique_ptr<ClusterService> s(new ClusterService());
  s->cfg_ = cfg;
  s->tokenizer_ = std::move(tokenizer);
  s->opts_ = std::move(opts);
  s->w_ = std::make_unique<Worker>(s->opts_);
  s->w_->policy = std::make_unique<PlacementPolicy>(s->opts_.placement, s->opts_.affinity_tokens);
  transfer::ControlOptions co;
  co.name = "router";
  co.heartbeat = {s->opts_.heartbeat, s->opts_.heartbeat_misses};
  co.keys = s->opts_.control_keys;
  K3_ASSIGN_OR_RETURN(s->w_->server, transfer::ControlServer::bind(s->w_->ctx, s->opts_.endpoint, co));
  s->endpoint_ = s->w_->server->endpoint();
  s->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->wake_fd_ < 0) return internal_error("eventfd failed");
  s->worker_ = std::thread([p = s.get()] { p->worker_loop(); });
  return s;
}

void ClusterService::worker_loop() {
  ClusterWorkerOps ops(*this);
  const int fd = wake_fd_;
  while (!stopping_) {
    auto events = w_->server->poll(std::chrono::milliseconds(50), std::span<const int>(&fd, 1));
    uint64_t drained;
    while (::read(wake_fd_, &drained, sizeof drained) > 0) {
    }
    std::vector<std::unique_ptr<Request>> fresh;
    std::vector<RequestHandle> cancelled;
    {
      std::lock_guard lk(mu_);
      fresh.swap(submitted_);
      for (RequestHandle h : cancelled_) cancelled.push_back(h);
    }
    if (events.is_ok())
      for (const auto& e : *events) ops.on_event(e);
    else
      spdlog::warn("router: control poll failed: {}", events.status().message());
    for (auto& r : fresh) {
      const RequestHandle id = r->id;
      w_->requests[id] = std::move(r);
      ops.enqueue(*w_->requests[id], /*front=*/false);
    }
    // Cancelled requests: ABORT everywhere, forget them (the sink is never called again).
    for (RequestHandle h : cancelled) {
      auto it = w_->requests.find(h);
      if (it != w_->requests.end()) {
        ops.abort_parties(*it->second, protocol::AbortReason::ClientCancelled);
        ops.release(*it->second);
        w_->requests.erase(it);
      }
      std::lock_guard lk(mu_);
      cancelled_.erase(h);
      live_.erase(h);
    }
    ops.check_deadlines();
    ops.admit();
    ops.publish();
  }
  // Shutdown: every request fails and is aborted on its nodes; later submits are refused.
  std::vector<std::unique_ptr<Request>> fresh;
  {
    std::lock_guard lk(mu_);
    fresh.swap(submitted_);
  }
  for (auto& r : fresh) {
    const RequestHandle id = r->id;
    w_->requests[id] = std::move(r);
  }
  std::vector<RequestHandle> ids;
  for (auto& [id, r] : w_->requests) ids.push_back(id);
  for (RequestHandle id : ids) {
    auto it = w_->requests.find(id);
    ops.abort_parties(*it->second, protocol::AbortReason::Shutdown);
    ops.end(*it->second, {.kind = GenerationEvent::Kind::Failed, .error = Status(Code::Unavailable, "the server is shutting down")});
  }
  (void)w_->server->poll(std::chrono::milliseconds(0));  // flush the ABORTs
  ops.publish();
}

}  // namespace k3::router
