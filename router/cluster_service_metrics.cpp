// ClusterService's Prometheus text: node registry, failures, retries, placements and the decode
// nodes' last reported load (the router's own request histograms live in router_metrics).
#include <algorithm>
#include <set>
#include <string>

#include "router/cluster_service.h"

namespace k3::router {

std::string ClusterService::prometheus_text() const {
  std::set<std::string> expected;
  for (const auto& p : opts_.pairs)
    for (const auto& n : pair_control_names(p)) expected.insert(n);
  int64_t queued;
  {
    std::lock_guard lk(mu_);
    queued = queued_;
  }
  std::lock_guard lk(pub_mu_);
  std::string o;
  auto line = [&](const std::string& s) { o += s + "\n"; };
  line("# HELP k3_cluster_nodes_registered Nodes (prefill stages, decode ranks) alive on the control plane.");
  line("# TYPE k3_cluster_nodes_registered gauge");
  line("k3_cluster_nodes_registered " + std::to_string(live_nodes_.size()));
  line("# HELP k3_cluster_nodes_expected Nodes named by the configured pairs.");
  line("# TYPE k3_cluster_nodes_expected gauge");
  line("k3_cluster_nodes_expected " + std::to_string(expected.size()));
  std::set<std::string> all = expected;
  all.insert(live_nodes_.begin(), live_nodes_.end());
  line("# HELP k3_cluster_node_up 1 while the node heartbeats, 0 when it is down or never registered.");
  line("# TYPE k3_cluster_node_up gauge");
  for (const auto& n : all) line("k3_cluster_node_up{node=\"" + n + "\"} " + (live_nodes_.count(n) ? "1" : "0"));
  line("# HELP k3_cluster_node_failures_total Times a node was declared dead (heartbeat timeout, restart, exit).");
  line("# TYPE k3_cluster_node_failures_total counter");
  for (const auto& n : all) {
    auto it = node_failures_.find(n);
    line("k3_cluster_node_failures_total{node=\"" + n + "\"} " + std::to_string(it == node_failures_.end() ? 0 : it->second));
  }
  line("# HELP k3_cluster_pairs_ready 1 when some prefill/decode pair has every node alive.");
  line("# TYPE k3_cluster_pairs_ready gauge");
  line(std::string("k3_cluster_pairs_ready ") + (any_ready_ ? "1" : "0"));
  line("# HELP k3_cluster_request_failures_total Requests failed by the cluster, by cause.");
  line("# TYPE k3_cluster_request_failures_total counter");
  for (const auto& [cause, n] : request_failures_)
    line("k3_cluster_request_failures_total{cause=\"" + cause + "\"} " + std::to_string(n));
  line("# HELP k3_cluster_retries_total Requests placed again after a failure before any token.");
  line("# TYPE k3_cluster_retries_total counter");
  line("k3_cluster_retries_total " + std::to_string(retries_));
  line("# HELP k3_cluster_placements_total Request attempts placed on each decode node.");
  line("# TYPE k3_cluster_placements_total counter");
  for (const auto& [node, n] : placements_) line("k3_cluster_placements_total{node=\"" + node + "\"} " + std::to_string(n));
  line("# HELP k3_cluster_pair_finished_total Requests finished, by the prefill instance that computed the prompt "
       "and the decode node that generated.");
  line("# TYPE k3_cluster_pair_finished_total counter");
  for (const auto& [pair, n] : finished_by_pair_)
    line("k3_cluster_pair_finished_total{prefill=\"" + pair.first + "\",node=\"" + pair.second + "\"} " + std::to_string(n));
  line("# HELP k3_cluster_node_pool_free_bytes A decode node's transfer pool free bytes (its last heartbeat).");
  line("# TYPE k3_cluster_node_pool_free_bytes gauge");
  for (const auto& [node, l] : node_load_)
    line("k3_cluster_node_pool_free_bytes{node=\"" + node + "\"} " + std::to_string(l.pool_free_bytes));
  line("# HELP k3_cluster_node_running Requests decoding on a decode node (its last heartbeat).");
  line("# TYPE k3_cluster_node_running gauge");
  for (const auto& [node, l] : node_load_) line("k3_cluster_node_running{node=\"" + node + "\"} " + std::to_string(l.running));
  line("# HELP k3_cluster_node_pool_free_pages A decode node's transfer pool free pages (its last heartbeat).");
  line("# TYPE k3_cluster_node_pool_free_pages gauge");
  for (const auto& [node, l] : node_load_)
    line("k3_cluster_node_pool_free_pages{node=\"" + node + "\"} " + std::to_string(l.room.pool_free_pages));
  line("# HELP k3_cluster_node_cache_free_pages A decode node's decode cache free pages (its last heartbeat).");
  line("# TYPE k3_cluster_node_cache_free_pages gauge");
  for (const auto& [node, l] : node_load_)
    line("k3_cluster_node_cache_free_pages{node=\"" + node + "\"} " + std::to_string(l.room.cache_free_pages));
  line("# HELP k3_cluster_node_paused Requests a decode node preempted and has not resumed yet (its last heartbeat).");
  line("# TYPE k3_cluster_node_paused gauge");
  for (const auto& [node, l] : node_load_) line("k3_cluster_node_paused{node=\"" + node + "\"} " + std::to_string(l.room.paused));
  line("# HELP k3_cluster_node_preemptions_total Requests a decode node preempted (caches swapped out) since it started.");
  line("# TYPE k3_cluster_node_preemptions_total counter");
  for (const auto& [node, l] : node_load_)
    line("k3_cluster_node_preemptions_total{node=\"" + node + "\"} " + std::to_string(l.room.preemptions));
  line("# HELP k3_cluster_node_reserved_requests Requests the router has admitted onto a decode node.");
  line("# TYPE k3_cluster_node_reserved_requests gauge");
  for (const auto& [node, l] : node_load_)
    line("k3_cluster_node_reserved_requests{node=\"" + node + "\"} " + std::to_string(l.reserved.requests));
  line("# HELP k3_cluster_queue_length Requests waiting in the admission queue for decode room.");
  line("# TYPE k3_cluster_queue_length gauge");
  line("k3_cluster_queue_length " + std::to_string(std::max<int64_t>(0, queued)));
  line("# HELP k3_cluster_queue_capacity Admission queue bound (submits beyond get HTTP 429).");
  line("# TYPE k3_cluster_queue_capacity gauge");
  line("k3_cluster_queue_capacity " + std::to_string(opts_.max_queue));
  line("# HELP k3_cluster_queue_wait_seconds Time from submit to placement on a decode rank.");
  line("# TYPE k3_cluster_queue_wait_seconds histogram");
  queue_wait_.render(o, "k3_cluster_queue_wait_seconds");
  line("# HELP k3_cluster_rejected_total Submits refused before any response: queue_full (429), never_fits (400).");
  line("# TYPE k3_cluster_rejected_total counter");
  for (const char* why : {"queue_full", "never_fits"}) {
    auto it = rejected_.find(why);
    line(std::string("k3_cluster_rejected_total{reason=\"") + why + "\"} " +
         std::to_string(it == rejected_.end() ? 0 : it->second));
  }
  line("# HELP k3_cluster_deadline_expired_total Requests ended by the router's deadline, by the phase they were in.");
  line("# TYPE k3_cluster_deadline_expired_total counter");
  for (int ph = 0; ph < kNumRequestPhases; ++ph) {
    const std::string name = request_phase_name(static_cast<RequestPhase>(ph));
    auto it = deadline_expired_.find(name);
    line("k3_cluster_deadline_expired_total{phase=\"" + name + "\"} " +
         std::to_string(it == deadline_expired_.end() ? 0 : it->second));
  }
  line("# HELP k3_cluster_requeued_total Requests a decode rank sent back to the queue (transfer memory ran out).");
  line("# TYPE k3_cluster_requeued_total counter");
  line("k3_cluster_requeued_total " + std::to_string(requeued_));
  line("# HELP k3_cluster_requests_in_flight Requests placed on the cluster now.");
  line("# TYPE k3_cluster_requests_in_flight gauge");
  line("k3_cluster_requests_in_flight " + std::to_string(running_));
  line("# HELP k3_cluster_placement_info The placement policy in use.");
  line("# TYPE k3_cluster_placement_info gauge");
  line(std::string("k3_cluster_placement_info{policy=\"") + placement_name(opts_.placement) + "\"} 1");
  return o + prefix_reports_.prometheus_text() + auth_->prometheus_text();
}

}  // namespace k3::router
