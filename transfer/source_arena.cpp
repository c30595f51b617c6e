#include "transfer/source_arena.h"

#include <spdlog/spdlog.h>

#include <string>

#ifdef K3_TRANSFER_HAVE_CUDA
#include "transfer/cuda/cuda_memory.h"
#endif

namespace k3::transfer {
namespace {
// 256-byte extents: what device copies and vectorised host copies want, and small against an image.
constexpr uint64_t kAlign = 256;
constexpr const char* kArenaFree = "k3_transfer_source_arena_free_bytes";
constexpr const char* kArenaOverflow = "k3_transfer_source_arena_overflow_total";
}  // namespace

SourceArena::SourceArena(MemoryType type, size_t bytes, protocol::MetricsRegistry* metrics)
    : type_(type), metrics_(metrics), extents_(bytes, kAlign) {}

SourceArena::~SourceArena() = default;

Result<std::shared_ptr<SourceArena>> SourceArena::create(std::shared_ptr<UcxContext> ctx, MemoryType type, size_t bytes,
                                                         protocol::MetricsRegistry* metrics) {
  if (!ctx) return invalid_argument("SourceArena::create: UCX context is null");
  if (bytes < kAlign)
    return invalid_argument("source arena of " + std::to_string(bytes) + " bytes: at least " + std::to_string(kAlign) +
                            " (or none at all)");
  std::shared_ptr<SourceArena> a(new SourceArena(type, bytes, metrics));
  if (type == MemoryType::Host) {
    // Uninitialised: the kernel backs the pages when images are first written, not at start-up.
    std::shared_ptr<uint8_t[]> host(new (std::nothrow) uint8_t[bytes]);
    if (!host) return Status(Code::ResourceExhausted, "source arena: cannot allocate " + std::to_string(bytes) + " host bytes");
    a->base_ = host.get();
    a->memory_ = std::move(host);
  } else {
#ifdef K3_TRANSFER_HAVE_CUDA
    auto buf = CudaBuffer::create(bytes);
    if (!buf.is_ok())
      return Status(buf.status().code(), "source arena of " + std::to_string(bytes >> 20) + " MiB in device memory: " +
                                             buf.status().message());
    a->base_ = static_cast<uint8_t*>((*buf)->data());
    a->memory_ = std::shared_ptr<CudaBuffer>(std::move(buf).value());
#else
    return unsupported("a source arena in device memory needs a CUDA build (-DK3_CUDA=ON)");
#endif
  }
  // A UCX that cannot read this memory type stages the puts through host memory (ucx_writer.h): the arena
  // still saves the allocations, but there is nothing to register. A registration UCX refuses (a transport
  // that cannot pin this much, say) costs only the per-put registration the arena would have saved: the
  // stage still serves, and says so.
  if (ctx->supports(type)) {
    auto reg = UcxMemory::map(std::move(ctx), a->base_, bytes, type);
    if (reg.is_ok())
      a->registration_ = std::move(reg).value();
    else
      spdlog::warn("source arena ({} memory, {} bytes) not registered with UCX, puts register their sources: {}",
                   memory_type_name(type), bytes, reg.status().to_string());
  }
  std::lock_guard lk(a->mu_);
  a->publish_locked();
  return a;
}

std::optional<std::shared_ptr<SourceImage>> SourceArena::take(size_t bytes) {
  std::optional<uint64_t> at;
  {
    std::lock_guard lk(mu_);
    at = extents_.take(bytes);
    if (!at) {
      if (metrics_) metrics_->counter(kArenaOverflow, {}, "Source images a prefill stage made outside its arena (it was full)").add(1);
      return std::nullopt;
    }
    publish_locked();
  }
  // The image holds the arena: the extent goes back when the image does, and the registration outlives it.
  std::shared_ptr<void> extent(static_cast<void*>(base_ + *at), [self = shared_from_this(), off = *at](void*) { self->give(off); });
  return SourceImage::view(type_, base_ + *at, bytes, std::move(extent), registration_.get());  // null: unregistered
}

void SourceArena::give(uint64_t offset) {
  std::lock_guard lk(mu_);
  extents_.give(offset);
  publish_locked();
}

void SourceArena::publish_locked() const {
  if (metrics_)
    metrics_->gauge(kArenaFree, {}, "Free bytes of a prefill stage's source arena").set(static_cast<int64_t>(extents_.free_bytes()));
}

size_t SourceArena::size() const {
  std::lock_guard lk(mu_);
  return extents_.size();
}

size_t SourceArena::free_bytes() const {
  std::lock_guard lk(mu_);
  return extents_.free_bytes();
}

}  // namespace k3::transfer
