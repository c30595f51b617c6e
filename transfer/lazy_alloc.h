// The lazy-alloc protocol (docs/ARCHITECTURE.md §2) as pure state machines (docs/STYLE.md habit 9): no sockets, no
// threads, no clock reads. Events go in (a message, a local completion, a peer death, the time); actions
// come out (send this message to that peer, start/cancel writes, the request is ready, memory released).
// The tests drive both sides against each other in-process; the nodes execute the actions for real.
//
// Guarantees (docs/STYLE.md habit 10):
//  - ABORT / deadline: no new writes are started; writes already posted may still land. Decode memory a
//    write may target stays allocated until every stage that was sent ADDRS has either reported
//    TRANSFER_DONE (its writes flushed), answered ABORT_ACK / sent ABORT (it has no write in flight), or
//    been declared dead and the quarantine has passed; or, failing all of those, the quarantine timeout
//    since the abort has passed. Only then is the memory released (exactly once: the pool handles).
//  - Every request record ends in exactly one terminal state and is reported once (RequestEnded).
//  - Messages for unknown or already-ended requests (duplicates, late, reordered) are ignored without
//    side effects other than an Ignored action naming why; terminated ids are remembered for
//    `tombstone_ttl` so a late CLAIM/PREFILL cannot resurrect them (an ABORT that overtakes its
//    CLAIM/PREFILL tombstones the id too).
// Threading: DecodeSide / PrefillSide are single-threaded objects (call them from one event loop);
// RankPool and MetricsRegistry are thread-safe.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/protocol/messages.h"
#include "common/protocol/request_state.h"
#include "transfer/plan.h"

namespace k3::transfer {

using protocol::AbortReason;
using protocol::RequestState;
using protocol::Role;

// Time since an arbitrary epoch of the caller's steady clock (injected: the tests pass any value).
using Millis = std::chrono::milliseconds;

// Who a message is for. Router: instance may be empty ("the router"). Prefill: instance + stage.
// Decode: instance (the receiving process fans out to its ranks).
struct Peer {
  Role role = Role::Router;
  std::string instance;
  uint32_t stage = 0;
  bool operator==(const Peer&) const = default;
};

struct SendAction { Peer to; protocol::Message message; };
// Prefill: post these writes (to the decode instance), then flush and call on_writes_flushed.
struct StartWritesAction { uint64_t request_id = 0; std::vector<WriteOp> ops; };
// Prefill: post no further write of this request; flush what was posted, then call on_writes_flushed.
struct CancelWritesAction { uint64_t request_id = 0; };
// Decode: all stages transferred; the request may join the running batch.
struct ReadyAction { uint64_t request_id = 0; uint32_t prompt_len = 0; int32_t first_token = 0;
                     std::vector<protocol::TokenLogprobs> first_logprobs;   // when the sampling params ask
                     std::vector<int32_t> choice_first_tokens; };            // n > 1: choices 1..n-1
// The memory this side held for the request was released (decode: pool handles; prefill: the stage's
// source KV/state, which the prefill node now frees). Emitted exactly once per request that held memory.
struct ReleasedAction { uint64_t request_id = 0; uint64_t bytes = 0; };
// The request reached a terminal state on this side (emitted once per request).
struct RequestEndedAction { uint64_t request_id = 0; RequestState state = RequestState::Finished;
                            AbortReason cause = AbortReason::Internal; };  // cause: only when not Finished
// An input had no effect; `reason` says why (duplicate, late, unknown id, protocol violation).
struct IgnoredAction { uint64_t request_id = 0; std::string reason; };

using Action = std::variant<SendAction, StartWritesAction, CancelWritesAction, ReadyAction,
                            ReleasedAction, RequestEndedAction, IgnoredAction>;
using Actions = std::vector<Action>;

struct ProtocolTimeouts {
  Millis compute_wait{300'000};   // decode: CLAIM -> first COMPUTE_DONE (a nonzero Claim.timeout_ms overrides)
  Millis transfer_wait{300'000};  // decode: allocation -> every TRANSFER_DONE
  Millis addrs_wait{300'000};     // prefill: COMPUTE_DONE sent -> ADDRS (a nonzero Prefill.timeout_ms overrides)
  Millis quarantine{30'000};      // decode: abort while transferring -> release without acks
  Millis tombstone_ttl{600'000};  // both: how long ended ids are remembered
};

}  // namespace k3::transfer
