// One request's source bytes on a prefill stage: the packed image of the stage's layers that its puts
// read. In host memory, or in device memory when the stage computes on a GPU: the stage then copies its
// cache rows into the image on the device and the puts read the GPU, so no byte is staged through the
// host (with a CUDA-aware UCX; without one the writer's CudaSourceReader stages, ucx_writer.h).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "transfer/gathered_writes.h"
#include "transfer/ucx_memory.h"

namespace k3::transfer {

class SourceImage {
 public:
  // `bytes` of uninitialised memory of `type` (device memory on the current CUDA device).
  static Result<std::shared_ptr<SourceImage>> create(MemoryType type, size_t bytes);
  // Host bytes, taken over without a copy.
  static std::shared_ptr<SourceImage> adopt(std::vector<uint8_t> bytes);
  // [data, data + size) of memory another owner keeps (a source arena's extent): `owner` lives as long as
  // the image and gives the extent back when it goes. `registration`, when not null, is the UCX
  // registration the range lies in (it outlives the image: `owner` holds it).
  static std::shared_ptr<SourceImage> view(MemoryType type, uint8_t* data, size_t size, std::shared_ptr<void> owner,
                                           const UcxMemory* registration);
  // Fills the image from host bytes (a copy into device memory; a memcpy on the host).
  Status upload(const std::vector<uint8_t>& bytes);
  // Copies this image's rows into `staging` (the same memory type, at least g.staged_bytes) as `g` gathers
  // them: one strided device copy per gather on a GPU, memcpys on the host. Returns when they are there.
  Status gather_to(const GatheredWrites& g, SourceImage& staging) const;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  MemoryType type() const { return type_; }
  // The registration the image lies in (its puts carry the memory handle), or null: UCX registers the
  // source itself.
  const UcxMemory* registration() const { return registration_; }

 private:
  SourceImage() = default;
  MemoryType type_ = MemoryType::Host;
  std::vector<uint8_t> host_;
  std::shared_ptr<void> owner_;    // owns the device allocation, or the arena extent
  const UcxMemory* registration_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace k3::transfer
