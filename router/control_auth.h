// The router's ownership rule for node messages (docs/SECURITY.md): a message about a request is
// accepted only from a node the request was placed on. CLAIM_ACK and TOKENS come only from the pair's
// decode node; FAILED from any party of the pair (decode or one of its prefill stages). The control
// socket already guarantees that `peer` is the name the sender's CURVE key belongs to, so this check
// stops an authenticated node from answering, streaming into or failing another node's requests.
//
// Refusals are logged with the request id and counted by message kind; the socket's own refusals
// (unknown keys, failed handshakes, frames naming another party) are published here too, so that
// /metrics shows every rejection of the control plane in one family.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "common/protocol/messages.h"
#include "router/cluster_placement.h"

namespace k3::router {

class ControlAuth {
 public:
  // placed_on(wire id): the pair the live request with that id runs on, or nullptr when no live
  // request has the id (the message is then left to the handlers, which ignore unknown ids).
  // Returns false (counted, logged) when `peer` does not own the request the message names.
  bool accept(const std::string& peer, const protocol::Message& m,
              const std::function<const ClusterPair*(uint64_t)>& placed_on);
  // The control socket's rejection counters (ControlSocket::rejections()), copied by the worker.
  void set_socket_rejections(const std::map<std::string, uint64_t>& by_kind);
  // k3_cluster_control_rejected_total{kind=...,message=...} lines (thread-safe).
  std::string prometheus_text() const;
  uint64_t refused(const std::string& kind, const std::string& message) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> refused_;  // (kind, message type) -> count
  std::map<std::string, uint64_t> socket_;                           // kind -> count
};

}  // namespace k3::router
