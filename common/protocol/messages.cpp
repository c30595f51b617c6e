#include "common/protocol/messages.h"

namespace k3::protocol {

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::Register: return "REGISTER";
    case MsgType::RegisterAck: return "REGISTER_ACK";
    case MsgType::Heartbeat: return "HEARTBEAT";
    case MsgType::Claim: return "CLAIM";
    case MsgType::Prefill: return "PREFILL";
    case MsgType::ComputeDone: return "COMPUTE_DONE";
    case MsgType::Addrs: return "ADDRS";
    case MsgType::TransferDone: return "TRANSFER_DONE";
    case MsgType::Tokens: return "TOKENS";
    case MsgType::Abort: return "ABORT";
    case MsgType::AbortAck: return "ABORT_ACK";
    case MsgType::Failed: return "FAILED";
    case MsgType::ClaimAck: return "CLAIM_ACK";
  }
  return "?";
}

const char* role_name(Role r) {
  switch (r) {
    case Role::Router: return "router";
    case Role::Prefill: return "prefill";
    case Role::Decode: return "decode";
  }
  return "?";
}

const char* entry_kind_name(EntryKind k) {
  switch (k) {
    case EntryKind::MlaKv: return "MLA_KV";
    case EntryKind::KdaConv: return "KDA_CONV";
    case EntryKind::KdaState: return "KDA_STATE";
    case EntryKind::DraftKv: return "DRAFT_KV";
  }
  return "?";
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Aborted: return "aborted";
  }
  return "?";
}

const char* abort_reason_name(AbortReason r) {
  switch (r) {
    case AbortReason::ClientCancelled: return "client_cancelled";
    case AbortReason::Deadline: return "deadline";
    case AbortReason::PeerDead: return "peer_dead";
    case AbortReason::AllocFailed: return "alloc_failed";
    case AbortReason::TransferFailed: return "transfer_failed";
    case AbortReason::PlanFailed: return "plan_failed";
    case AbortReason::Rejected: return "rejected";
    case AbortReason::Shutdown: return "shutdown";
    case AbortReason::Internal: return "internal";
  }
  return "?";
}

// The variant's alternatives are declared in MsgType order, starting at 1.
MsgType type_of(const Message& m) { return static_cast<MsgType>(m.index() + 1); }

static_assert(std::variant_size_v<Message> == kMaxMsgType, "one Message alternative per MsgType");

}  // namespace k3::protocol
