#include "router/control_auth.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace k3::router {

namespace proto = k3::protocol;

bool ControlAuth::accept(const std::string& peer, const proto::Message& m,
                         const std::function<const ClusterPair*(uint64_t)>& placed_on) {
  const bool decode_only = std::holds_alternative<proto::ClaimAck>(m) || std::holds_alternative<proto::Tokens>(m);
  const bool any_party = std::holds_alternative<proto::Failed>(m);
  if (!decode_only && !any_party) return true;  // no request is named (HEARTBEAT) or not router-bound
  const uint64_t id = std::visit([](const auto& x) -> uint64_t {
    if constexpr (requires { x.request_id; }) return x.request_id;
    return 0;
  }, m);
  const ClusterPair* pair = placed_on(id);
  if (!pair) return true;
  bool owner = peer == decode_control_name(*pair);
  if (!owner && any_party) {
    const auto names = pair_control_names(*pair);
    owner = std::find(names.begin(), names.end(), peer) != names.end();
  }
  if (owner) return true;
  const std::string type = proto::msg_type_name(proto::type_of(m));
  spdlog::warn("router: {} for request {} from {} refused: the request runs on {}", type, id, peer,
               decode_control_name(*pair));
  std::lock_guard lk(mu_);
  ++refused_[{"not_owner", type}];
  return false;
}

void ControlAuth::set_socket_rejections(const std::map<std::string, uint64_t>& by_kind) {
  std::lock_guard lk(mu_);
  socket_ = by_kind;
}

uint64_t ControlAuth::refused(const std::string& kind, const std::string& message) const {
  std::lock_guard lk(mu_);
  if (message.empty()) {
    auto it = socket_.find(kind);
    return it == socket_.end() ? 0 : it->second;
  }
  auto it = refused_.find({kind, message});
  return it == refused_.end() ? 0 : it->second;
}

std::string ControlAuth::prometheus_text() const {
  std::lock_guard lk(mu_);
  std::string o;
  o += "# HELP k3_cluster_control_rejected_total Control-plane connections and messages refused: unknown_key, "
       "handshake_failed, name_mismatch, malformed (by the socket) and not_owner (a node spoke for a request "
       "not placed on it), by message type.\n";
  o += "# TYPE k3_cluster_control_rejected_total counter\n";
  // Every kind appears (at 0 too) so that dashboards and tests can read it before the first refusal.
  for (const char* kind : {"unknown_key", "handshake_failed", "name_mismatch", "malformed"}) {
    auto it = socket_.find(kind);
    o += std::string("k3_cluster_control_rejected_total{kind=\"") + kind + "\",message=\"\"} " +
         std::to_string(it == socket_.end() ? 0 : it->second) + "\n";
  }
  for (const char* type : {"CLAIM_ACK", "TOKENS", "FAILED"}) {
    auto it = refused_.find({"not_owner", type});
    o += std::string("k3_cluster_control_rejected_total{kind=\"not_owner\",message=\"") + type + "\"} " +
         std::to_string(it == refused_.end() ? 0 : it->second) + "\n";
  }
  return o;
}

}  // namespace k3::router
