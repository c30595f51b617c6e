#include "transfer/partner_auth.h"

#include "transfer/ucx_driver_common.h"

namespace k3::transfer {

uint64_t request_id_of(const protocol::Message& m) {
  return std::visit([](const auto& x) -> uint64_t {
    if constexpr (requires { x.request_id; }) return x.request_id;
    return 0;
  }, m);
}

std::string stage_message_refusal(const std::string& sender, const protocol::Message& m, const protocol::Claim* claim) {
  if (std::holds_alternative<protocol::Register>(m)) return {};  // checked by the registration itself
  const auto peer = parse_control_name(sender);
  if (!peer || peer->role != protocol::Role::Prefill) return "only prefill stages speak on this socket";
  const std::string own = "the sender is stage " + std::to_string(peer->stage) + " of prefill " + peer->instance;
  auto stage_is = [&](uint32_t stage) { return stage == peer->stage; };
  if (auto* c = std::get_if<protocol::ComputeDone>(&m); c && !stage_is(c->stage)) return "names stage " + std::to_string(c->stage) + "; " + own;
  if (auto* t = std::get_if<protocol::TransferDone>(&m); t && !stage_is(t->stage)) return "names stage " + std::to_string(t->stage) + "; " + own;
  if (auto* a = std::get_if<protocol::AbortAck>(&m); a && !stage_is(a->stage)) return "names stage " + std::to_string(a->stage) + "; " + own;
  if (auto* a = std::get_if<protocol::Abort>(&m)) {
    if (a->origin_role != protocol::Role::Prefill || a->origin_instance != peer->instance || !stage_is(a->origin_stage))
      return "its origin is not the sender; " + own;
  }
  if (claim && claim->prefill_instance != peer->instance)
    return "the request was claimed for prefill " + claim->prefill_instance + "; " + own;
  return {};
}

void count_control_refusal(protocol::MetricsRegistry* metrics, const std::string& kind, const protocol::Message& m) {
  if (!metrics) return;
  metrics
      ->counter("k3_control_rejected_total", {{"kind", kind}, {"message", protocol::msg_type_name(protocol::type_of(m))}},
                "Control messages refused: a party spoke for a request or a stage it does not own")
      .add();
}

}  // namespace k3::transfer
