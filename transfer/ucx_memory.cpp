#include "transfer/ucx_memory.h"

#include <string>

namespace k3::transfer {

Result<std::unique_ptr<UcxMemory>> UcxMemory::map(std::shared_ptr<UcxContext> ctx, void* base, size_t length,
                                                  MemoryType type) {
  if (base == nullptr || length == 0) return invalid_argument("UcxMemory::map: base must be non-null and length > 0");
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                 UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  p.address = base;
  p.length = length;
  p.memory_type = type == MemoryType::Cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  ucp_mem_h memh = nullptr;
  K3_TRY(ucx_status(ucp_mem_map(ctx->get(), &p, &memh),
                    "ucp_mem_map(" + std::to_string(length) + " bytes, " + memory_type_name(type) + ")"));
  return std::unique_ptr<UcxMemory>(new UcxMemory(std::move(ctx), memh, static_cast<uint8_t*>(base), length, type));
}

Result<std::unique_ptr<UcxMemory>> UcxMemory::allocate(std::shared_ptr<UcxContext> ctx, size_t length) {
  if (length == 0) return invalid_argument("UcxMemory::allocate: length is 0");
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  p.address = nullptr;
  p.length = length;
  p.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  K3_TRY(ucx_status(ucp_mem_map(ctx->get(), &p, &memh), "ucp_mem_map(allocate " + std::to_string(length) + " bytes)"));
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucs_status_t st = ucp_mem_query(memh, &attr); st != UCS_OK) {
    ucp_mem_unmap(ctx->get(), memh);
    return ucx_status(st, "ucp_mem_query");
  }
  return std::unique_ptr<UcxMemory>(
      new UcxMemory(std::move(ctx), memh, static_cast<uint8_t*>(attr.address), length, MemoryType::Host));
}

UcxMemory::~UcxMemory() { ucp_mem_unmap(ctx_->get(), memh_); }

Result<std::vector<uint8_t>> UcxMemory::packed_rkey() const {
  void* buf = nullptr;
  size_t n = 0;
  K3_TRY(ucx_status(ucp_rkey_pack(ctx_->get(), memh_, &buf, &n), "ucp_rkey_pack"));
  std::vector<uint8_t> out(static_cast<uint8_t*>(buf), static_cast<uint8_t*>(buf) + n);
  ucp_rkey_buffer_release(buf);
  return out;
}

Result<std::unique_ptr<RemoteKey>> RemoteKey::unpack(std::shared_ptr<UcxEndpoint> ep, std::span<const uint8_t> packed,
                                                     uint64_t remote_base, uint64_t remote_length) {
  if (packed.empty()) return invalid_argument("RemoteKey::unpack: empty packed rkey");
  if (remote_length == 0) return invalid_argument("RemoteKey::unpack: remote_length is 0");
  ucp_rkey_h rkey = nullptr;
  K3_TRY(ucx_status(ucp_ep_rkey_unpack(ep->get(), packed.data(), &rkey), "ucp_ep_rkey_unpack"));
  return std::unique_ptr<RemoteKey>(new RemoteKey(std::move(ep), rkey, remote_base, remote_length));
}

RemoteKey::~RemoteKey() { ucp_rkey_destroy(rkey_); }

}  // namespace k3::transfer
