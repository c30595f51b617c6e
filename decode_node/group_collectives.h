// The communicator a decode rank group's forward runs its collectives on (engine/rank_model.h). The
// group's UCX communicator carries the leader's commands either way; the collectives go over it too
// (host memory: CPU ranks, or GPU ranks staging through the host, e.g. several ranks sharing one GPU),
// or over NCCL between the ranks' GPUs, bootstrapped over it: rank 0 makes the NCCL id and sends it to
// every member.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "common/core/comm.h"
#include "common/core/status.h"

namespace k3::decode {

enum class GroupCollectives { Ucx, Nccl };

// "ucx" or "nccl"; anything else is refused by name.
Result<GroupCollectives> parse_group_collectives(const std::string& name);
bool nccl_built();

// Ucx: returns nullptr (use `group`). Nccl: every rank of `group` calls it at once; it joins the NCCL
// communicator of the same ranks on CUDA device `device`, and fails if they have not all joined within
// `join_within` (a rank that died meanwhile). Refused where this build has no NCCL.
Result<std::unique_ptr<Comm>> make_group_collectives(GroupCollectives kind, Comm& group, int device,
                                                     std::chrono::milliseconds join_within);

}  // namespace k3::decode
