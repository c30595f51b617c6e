// The cluster worker's request logic, as member functions of a helper that sees ClusterService's
// privates (it is the service's friend). Only the worker thread calls it: nothing here locks the
// worker's own state; the service's shared fields are taken under their mutexes. Split by what drives
// it: cluster_worker_ops.cpp holds the worker's books and decisions (queue, placement, retries,
// deadlines, publishing), cluster_node_messages.cpp what the nodes send. Included by the service's
// .cpp files only.
#pragma once
#include <string>
#include <vector>

#include "common/protocol/messages.h"
#include "router/cluster_request.h"
#include "router/cluster_service.h"
#include "transfer/zmq_channel.h"

namespace k3::router {

class ClusterWorkerOps {
 public:
  using Request = ClusterService::Request;
  explicit ClusterWorkerOps(ClusterService& s) : s_(s), w_(*s.w_) {}

  // --- the worker's books and decisions (cluster_worker_ops.cpp)
  bool pair_ready(const ClusterPair& p) const;
  std::vector<int> ready_pairs() const;
  void send(const std::string& peer, const protocol::Message& m);
  void abort_parties(Request& r, protocol::AbortReason why);
  void emit(Request& r, GenerationEvent&& ev);
  void release(Request& r);
  void end(Request& r, GenerationEvent&& ev);
  void fail(Request& r, Status why, const std::string& cause);
  void enqueue(Request& r, bool front);
  void admit();
  bool try_place(RequestHandle id);
  Demand demand(const DecodeCapacity& cap, const Request& r) const;
  void place(Request& r, int chosen);
  static protocol::SamplingParams sampling_of(const GenerationParams& g);
  void retry_or_fail(Request& r, const Status& why, protocol::AbortReason cause);
  Request* by_wire(uint64_t wire);
  void check_deadlines();
  void publish();

  // --- what the nodes send (cluster_node_messages.cpp)
  void on_event(const transfer::ControlEvent& e);
  void on_claim_ack(const protocol::ClaimAck& a);
  void on_tokens(const protocol::Tokens& t);
  void on_failed(const protocol::Failed& f, const std::string& from);
  void on_peer_down(const std::string& name);
  void on_heartbeat(const protocol::Heartbeat& x, const std::string& peer);

 private:
  ClusterService& s_;
  ClusterService::Worker& w_;
};

}  // namespace k3::router
