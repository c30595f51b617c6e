#include "decode_node/group_collectives.h"

#ifdef K3_WITH_NCCL
#include "transfer/nccl/comm_nccl.h"
#endif

namespace k3::decode {
namespace {
constexpr uint32_t kNcclIdTag = 0x4e4344;  // "NCD": the NCCL id, leader -> member
}

Result<GroupCollectives> parse_group_collectives(const std::string& name) {
  if (name == "ucx") return GroupCollectives::Ucx;
  if (name == "nccl") return GroupCollectives::Nccl;
  return invalid_argument("--group-collectives: '" + name + "' is not ucx or nccl");
}

bool nccl_built() {
#ifdef K3_WITH_NCCL
  return true;
#else
  return false;
#endif
}

Result<std::unique_ptr<Comm>> make_group_collectives(GroupCollectives kind, Comm& group, int device,
                                                     std::chrono::milliseconds join_within) {
  if (kind == GroupCollectives::Ucx) return std::unique_ptr<Comm>();
#ifdef K3_WITH_NCCL
  transfer::NcclId id{};
  if (group.rank() == 0) {
    K3_ASSIGN_OR_RETURN(id, transfer::NcclComm::new_unique_id());
    for (int r = 1; r < group.size(); ++r) K3_TRY(group.send(r, std::as_bytes(std::span(id)), kNcclIdTag));
  } else {
    K3_TRY(group.recv(0, std::as_writable_bytes(std::span(id)), kNcclIdTag));
  }
  K3_ASSIGN_OR_RETURN(auto nccl, transfer::NcclComm::create(group.rank(), group.size(), id, device, join_within));
  return std::unique_ptr<Comm>(std::move(nccl));
#else
  (void)group;
  (void)device;
  (void)join_within;
  return invalid_argument("--group-collectives nccl: this build has no NCCL (k3_nccl was not built)");
#endif
}

}  // namespace k3::decode
