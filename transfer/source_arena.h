// One range a prefill stage carves its source images from, allocated and registered with UCX once at
// start-up. Per request that saves an allocation (in device memory cudaMalloc / cudaFree, and cudaFree
// waits for the whole device: the stage's compute stream stalls the loop that frees the image) and a
// registration (UCX would register each new source on its first put), and every put carries the range's
// memory handle. An image of the arena gives its extent back when its last holder lets go, on whatever
// thread that is (the writer thread drops a finished job's source).
//
// Full (or a request larger than any free extent): take() returns nullopt and the caller makes an image of
// its own, so a burst is slower, never refused; overflows are counted.
#pragma once
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>

#include "common/protocol/metrics.h"
#include "transfer/extent_allocator.h"
#include "transfer/source_image.h"

namespace k3::transfer {

class SourceArena : public std::enable_shared_from_this<SourceArena> {
 public:
  // `bytes` of `type` (device memory on the current CUDA device), registered with `ctx` when it can read
  // that memory type and the registration succeeds (else a warning; puts then register their sources).
  // `metrics` may be
  // nullptr; it must outlive the arena. Errors name the size and memory type.
  static Result<std::shared_ptr<SourceArena>> create(std::shared_ptr<UcxContext> ctx, MemoryType type, size_t bytes,
                                                     protocol::MetricsRegistry* metrics);
  ~SourceArena();
  SourceArena(const SourceArena&) = delete;
  SourceArena& operator=(const SourceArena&) = delete;

  // An uninitialised image of `bytes` in the arena; nullopt (counted) when no free extent holds it.
  std::optional<std::shared_ptr<SourceImage>> take(size_t bytes);

  MemoryType type() const { return type_; }
  size_t size() const;
  size_t free_bytes() const;
  // Null when the UCX context cannot read this memory type (its puts are staged through host memory) or
  // refused the registration.
  const UcxMemory* registration() const { return registration_.get(); }

 private:
  SourceArena(MemoryType type, size_t bytes, protocol::MetricsRegistry* metrics);
  void give(uint64_t offset);
  void publish_locked() const;

  MemoryType type_;
  protocol::MetricsRegistry* metrics_;
  std::shared_ptr<void> memory_;                 // the allocation (host bytes or a device buffer)
  uint8_t* base_ = nullptr;
  std::unique_ptr<UcxMemory> registration_;      // dropped before memory_ (declared after it)
  mutable std::mutex mu_;
  ExtentAllocator extents_;
};

}  // namespace k3::transfer
