// Who may say what on decode's control server (docs/SECURITY.md). The socket has already bound each
// frame to the name of the CURVE key that sent it ("prefill/<instance>/<stage>"); this adds the
// data-plane ownership rule: a stage speaks only for itself (the stage in COMPUTE_DONE, TRANSFER_DONE,
// ABORT_ACK and an ABORT's origin must be the sender's) and only about requests its own prefill
// instance was claimed for. CLAIM comes only from the router's connection (checked by the driver).
#pragma once
#include <string>

#include "common/protocol/messages.h"
#include "common/protocol/metrics.h"

namespace k3::transfer {

// Empty when `sender` (a control name) may send `m`; otherwise why not. `claim` is the CLAIM of the
// live request `m` names (nullptr when none: the state machine then ignores the message anyway).
std::string stage_message_refusal(const std::string& sender, const protocol::Message& m, const protocol::Claim* claim);

// The request id a message names (0 for messages that name none).
uint64_t request_id_of(const protocol::Message& m);

// Counts one refused message in k3_control_rejected_total{kind,message} (metrics may be nullptr).
void count_control_refusal(protocol::MetricsRegistry* metrics, const std::string& kind, const protocol::Message& m);

}  // namespace k3::transfer
