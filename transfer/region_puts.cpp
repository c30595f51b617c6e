#include "transfer/region_puts.h"

#include "transfer/gathered_writes.h"

namespace k3::transfer {
namespace {

std::shared_ptr<SourceImage> staging_image(size_t bytes, MemoryType type, SourceArena* arena) {
  if (arena) return arena->take(bytes).value_or(nullptr);
  if (type != MemoryType::Host) return nullptr;
  auto img = SourceImage::create(MemoryType::Host, bytes);
  return img.is_ok() ? std::move(img).value() : nullptr;
}

}  // namespace

RegionPuts region_puts(std::span<const WriteOp> ops, const SourceImage& source, SourceArena* arena) {
  RegionPuts p;
  if (auto g = gather_writes(ops)) {
    auto staging = staging_image(g->staged_bytes, source.type(), arena);
    if (staging && source.gather_to(*g, *staging).is_ok()) {
      for (const StagedWrite& sw : g->writes) p.writes.push_back({staging->data() + sw.staged_offset, sw.dst_addr, sw.length});
      p.staging = std::move(staging);
      return p;
    }
  }
  for (const WriteOp& op : ops) p.writes.push_back({source.data() + op.src_offset, op.dst_addr, op.length});
  return p;
}

}  // namespace k3::transfer
