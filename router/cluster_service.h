// GenerationService over prefill/decode nodes (k3-prefill stages, k3-decode ranks) reached through the
// ZeroMQ control plane: this service binds a ControlServer that every node's driver connects to as its
// "router" connection.
//
// One worker thread owns the socket and every request's state. Per request it (1) queues it (bounded
// FIFO, admission_queue.h) until a ready pair (every stage of a prefill instance and its decode rank
// alive) has room for it on its decode rank, (2) places it there by the placement policy: CLAIM to
// decode, wait for CLAIM_ACK, (3) sends PREFILL to every stage of the prefill instance, (4) turns
// decode's TOKENS into text events (TextStream: stop strings, UTF-8). Every phase has a deadline
// (request_deadlines.h); an expired request ends with an error event and ABORTs to every party.
// submit() decides everything the HTTP status depends on: 400 when the request can never fit one decode
// rank (or the context), 429 when the queue is full; once it returns a handle the request ends with a
// Finished or Failed event. A node that stops heartbeating is removed from the registry; requests on it
// fail at once with an Unavailable event, or are queued again when no token has been streamed yet (each
// attempt uses a fresh wire id: nodes tombstone the old one). A decode rank that could not allocate
// transfer memory sends the request back to the head of the queue. Cancel, FAILED and stop strings send
// ABORT to every party of the pair.
#pragma once
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/config/config.h"
#include "common/protocol/messages.h"
#include "common/tokenizer/tokenizer.h"
#include "router/prefill_cache_reports.h"
#include "router/admission_queue.h"
#include "router/cluster_placement.h"
#include "router/control_auth.h"
#include "router/generation_service.h"
#include "router/request_deadlines.h"
#include "router/router_metrics.h"
#include "transfer/control_keys.h"

namespace k3::router {

struct ClusterOptions {
  std::string endpoint = "tcp://127.0.0.1:*";    // control endpoint to bind (port * = pick one)
  std::vector<ClusterPair> pairs;
  Placement placement = Placement::RoundRobin;
  int affinity_tokens = 16;                      // prefix-affinity hashes this many leading prompt tokens
  std::chrono::milliseconds heartbeat{200};      // control heartbeat interval (nodes use --heartbeat-ms)
  int heartbeat_misses = 3;                      // silence of interval x misses = node dead
  PhaseTimeouts deadlines;                       // per request phase (claimed = the CLAIM -> CLAIM_ACK wait)
  uint64_t request_timeout_ms = 0;               // carried in CLAIM / PREFILL (0 = the nodes' defaults)
  int max_queue = 64;                            // requests waiting for room; submit() says ResourceExhausted beyond
  int generation_reserve = 32;                   // decode cache tokens reserved per request beyond its prompt
  int max_attempts = 2;                          // placements per request (retries only before any token)
  std::optional<transfer::ControlKeys> control_keys;  // CURVE keys ("router"); nullopt = plaintext (opt-out)
};

class ClusterService final : public GenerationService {
 public:
  static Result<std::unique_ptr<ClusterService>> create(const ModelConfig& cfg,
                                                        std::shared_ptr<const Tokenizer> tokenizer,
                                                        ClusterOptions opts);
  ~ClusterService() override;

  Result<RequestHandle> submit(GenerationParams params, EventSink sink) override;
  void cancel(RequestHandle handle) override;
  // True while at least one pair has every node alive.
  bool ready() const override;
  ServiceStats stats() const override;
  void shutdown() override;

  // The bound control endpoint (real port): nodes get it as --router-endpoint.
  const std::string& endpoint() const { return endpoint_; }
  // Prometheus lines for nodes and failures (appended to the router's /metrics).
  std::string prometheus_text() const;
  // Control names of the nodes alive now.
  std::set<std::string> live_nodes() const;
  // Control-plane rejections (ownership and socket), for tests and /metrics.
  const ControlAuth& control_auth() const { return *auth_; }

  struct Request;  // cluster_request.h

 private:
  friend class ClusterWorkerOps;  // the worker's request logic (cluster_worker_ops.h)
  ClusterService() = default;
  void worker_loop();
  void wake();
  // InvalidArgument naming the limit when no decode rank whose capacity is known could ever hold it.
  Status check_fits(const GenerationParams& params) const;

  ModelConfig cfg_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  ClusterOptions opts_;
  std::string endpoint_;
  std::shared_ptr<ControlAuth> auth_ = std::make_shared<ControlAuth>();  // checked by the worker, read by /metrics
  struct Worker;                     // the worker thread's state (socket, requests)
  std::unique_ptr<Worker> w_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Request>> submitted_;  // taken by the worker
  std::unordered_set<RequestHandle> cancelled_;      // to abort at the worker's next turn
  std::unordered_set<RequestHandle> live_;           // submitted, not yet ended
  int64_t queued_ = 0;                               // submitted, not yet placed (the admission queue's length)
  RequestHandle next_id_ = 1;
  std::mutex sink_mu_;               // held by the worker while it calls a sink (cancel waits it out)
  std::atomic<bool> stopping_{false};
  int wake_fd_ = -1;                 // eventfd: submit/cancel/shutdown wake the worker's poll

  // Published by the worker for ready()/stats()/metrics.
  mutable std::mutex pub_mu_;
  std::set<std::string> live_nodes_;
  std::map<std::string, uint64_t> node_failures_;   // node -> times it was declared dead
  std::map<std::string, uint64_t> request_failures_; // cause -> requests failed
  uint64_t retries_ = 0;
  std::map<std::string, uint64_t> placements_;      // decode node -> attempts placed on it
  // (prefill instance, decode node) -> requests finished there: shows which prefill fed which decode.
  std::map<std::pair<std::string, std::string>, uint64_t> finished_by_pair_;
  struct NodeLoad {
    uint64_t pool_free_bytes = 0;  // decode transfer pool free bytes (its last HEARTBEAT)
    uint32_t running = 0;          // requests decoding there
    protocol::DecodeRoom room;     // its last reported room (capacity and free)
    CapacityLedger::Used reserved; // what this router has reserved there
  };
  std::map<std::string, NodeLoad> node_load_;       // decode node -> its last reported load
  std::map<std::string, DecodeCapacity> capacity_;  // decode node -> capacity (submit's 400 check)
  PrefillCacheReports prefix_reports_;               // prefill stages' prefix caches (own lock)
  std::map<std::string, uint64_t> deadline_expired_; // phase -> requests expired in it
  std::map<std::string, uint64_t> rejected_;         // reason -> submits refused (queue_full, never_fits)
  uint64_t requeued_ = 0;                            // sent back to the queue by decode (allocation failed)
  Histogram queue_wait_{{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
  int64_t running_ = 0;
  bool any_ready_ = false;
  std::thread worker_;
};

}  // namespace k3::router
