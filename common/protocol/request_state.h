// The request state machine, one definition for router, prefill and decode (docs/ARCHITECTURE.md §2).
//
//   QUEUED → CLAIMED → PREFILLING → COMPUTE_DONE → ALLOCATED → TRANSFERRING → DECODING → FINISHED
//   and from any non-terminal state → ABORTED | FAILED | EXPIRED.
//
// Each role observes only part of the chain (decode never sees PREFILLING, a prefill stage ends at
// FINISHED right after TRANSFERRING), so a move FORWARD along the chain may skip states. Illegal:
// standing still, moving backward, leaving a terminal state (FINISHED, ABORTED, FAILED, EXPIRED), and
// entering QUEUED.
#pragma once
#include <cstdint>

#include "common/core/status.h"

namespace k3::protocol {

enum class RequestState : uint8_t {
  Queued = 0,
  Claimed,
  Prefilling,
  ComputeDone,
  Allocated,
  Transferring,
  Decoding,
  Finished,
  Aborted,
  Failed,
  Expired,
};
inline constexpr int kNumRequestStates = 11;

const char* state_name(RequestState s);
bool is_terminal(RequestState s);

// Ok iff `from -> to` is legal (see above); otherwise InvalidArgument naming both states.
Status check_transition(RequestState from, RequestState to);

// Applies a legal transition to `state`; on an illegal one returns the error and leaves `state` alone.
Status transition(RequestState& state, RequestState to);

}  // namespace k3::protocol
