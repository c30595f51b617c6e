// A transfer region this process owns, allocated and registered with UCX once and filled with a poison
// byte so that bytes no writer reached stand out. Host memory is a UCX allocation (a shared-memory segment
// peers on the same host write with memcpy); device memory is a CUDA allocation registered as such, so a
// prefill stage's puts land on the GPU (cuda_ipc between processes of one host) next to the caches the
// decode engine reads. The decode driver's own regions and a group member's region are both made here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transfer/ucx_memory.h"

namespace k3::transfer {

struct OwnedRegion {
  std::shared_ptr<void> device;     // the device allocation under mem (Cuda); declared first, so freed after mem
  std::unique_ptr<UcxMemory> mem;
};

// `what` names the region in errors ("decode pools in device memory"). Cuda needs a CUDA build and a UCX
// context with a CUDA transport (prepare_memory_type before the context was created); refused otherwise.
Result<OwnedRegion> allocate_owned_region(const std::shared_ptr<UcxContext>& ctx, MemoryType type, size_t bytes,
                                          uint8_t poison, const std::string& what);

}  // namespace k3::transfer
