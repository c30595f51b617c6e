#include "common/protocol/request_state.h"

#include <string>

namespace k3::protocol {

const char* state_name(RequestState s) {
  switch (s) {
    case RequestState::Queued: return "QUEUED";
    case RequestState::Claimed: return "CLAIMED";
    case RequestState::Prefilling: return "PREFILLING";
    case RequestState::ComputeDone: return "COMPUTE_DONE";
    case RequestState::Allocated: return "ALLOCATED";
    case RequestState::Transferring: return "TRANSFERRING";
    case RequestState::Decoding: return "DECODING";
    case RequestState::Finished: return "FINISHED";
    case RequestState::Aborted: return "ABORTED";
    case RequestState::Failed: return "FAILED";
    case RequestState::Expired: return "EXPIRED";
  }
  return "?";
}

bool is_terminal(RequestState s) {
  return s == RequestState::Finished || s == RequestState::Aborted || s == RequestState::Failed ||
         s == RequestState::Expired;
}

namespace {
bool on_main_chain(RequestState s) { return s <= RequestState::Finished; }
}  // namespace

Status check_transition(RequestState from, RequestState to) {
  const auto illegal = [&](const char* why) {
    return invalid_argument(std::string("illegal request transition ") + state_name(from) + " -> " +
                            state_name(to) + ": " + why);
  };
  if (static_cast<int>(from) >= kNumRequestStates || static_cast<int>(to) >= kNumRequestStates)
    return invalid_argument("request transition: state value out of range");
  if (is_terminal(from)) return illegal("the request already ended");
  if (from == to) return illegal("no change");
  if (!on_main_chain(to)) return Status::ok();  // ABORTED / FAILED / EXPIRED from any live state
  if (to < from) return illegal("the chain only moves forward");
  if (to == RequestState::Queued) return illegal("nothing enters QUEUED");
  return Status::ok();
}

Status transition(RequestState& state, RequestState to) {
  K3_TRY(check_transition(state, to));
  state = to;
  return Status::ok();
}

}  // namespace k3::protocol
