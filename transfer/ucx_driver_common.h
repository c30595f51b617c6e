// Glue shared by the decode and prefill drivers (ucx_decode_driver.h, ucx_prefill_driver.h): control
// names of protocol peers, strict decoding of received frames, the steady clock the state machines
// are fed with.
//
// Control names: the router is "router"; a decode instance "decode/<instance>"; a prefill stage
// "prefill/<instance>/<stage>".
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "common/protocol/frame.h"
#include "common/protocol/metrics.h"
#include "transfer/lazy_alloc.h"
#include "transfer/zmq_liveness.h"

namespace k3::transfer {

std::string control_name(const Peer& p);
// Inverse of control_name; nullopt for a name of no known shape.
std::optional<Peer> parse_control_name(const std::string& name);

// Decodes one received payload strictly; a malformed frame is logged (with the sender's name and the
// decoder's reason), counted as a rejected frame, and dropped.
std::optional<protocol::Message> decode_or_drop(const ControlEvent& e, protocol::MetricsRegistry* metrics);

// The request an action concerns (0 for a message without a request id).
uint64_t request_of(const Action& a);

// Milliseconds of the steady clock since its epoch (what the lazy-alloc state machines take as `now`).
Millis steady_now();

// Called by a driver whenever it observes a request in a new state (after every input it applied).
using StateHook = std::function<void(uint64_t request_id, protocol::RequestState state)>;

}  // namespace k3::transfer
