#include "transfer/owned_region.h"

#include <cstring>

#ifdef K3_TRANSFER_HAVE_CUDA
#include "transfer/cuda/cuda_memory.h"
#endif

namespace k3::transfer {

Result<OwnedRegion> allocate_owned_region(const std::shared_ptr<UcxContext>& ctx, MemoryType type, size_t bytes,
                                          uint8_t poison, const std::string& what) {
  OwnedRegion r;
  if (type == MemoryType::Host) {
    K3_ASSIGN_OR_RETURN(r.mem, UcxMemory::allocate(ctx, bytes));
    std::memset(r.mem->base(), poison, r.mem->length());
    return r;
  }
#ifdef K3_TRANSFER_HAVE_CUDA
  if (!ctx->supports(MemoryType::Cuda))
    return unsupported(what + ": this UCX has no CUDA transport loaded (UCX_TLS, or a UCX built without CUDA)");
  K3_ASSIGN_OR_RETURN(std::unique_ptr<CudaBuffer> buf, CudaBuffer::create(bytes));
  K3_TRY(buf->fill(poison));
  K3_ASSIGN_OR_RETURN(r.mem, UcxMemory::map(ctx, buf->data(), bytes, MemoryType::Cuda));
  r.device = std::shared_ptr<CudaBuffer>(std::move(buf));
  return r;
#else
  return unsupported(what + ": a CUDA build (-DK3_CUDA=ON) is required");
#endif
}

}  // namespace k3::transfer
