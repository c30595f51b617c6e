// Offsets in a range of `size` bytes handed out as extents: first fit, neighbours merged on free. For a
// range registered once and carved per request (transfer/source_arena.h), where what is carved lives for
// one request and is then given back, so the free list stays short.
#pragma once
#include <cstdint>
#include <map>
#include <optional>

namespace k3::transfer {

class ExtentAllocator {
 public:
  // `align` (a power of two) is what every offset and length is rounded to.
  ExtentAllocator(uint64_t size, uint64_t align);

  // The lowest offset with `bytes` (rounded up to the alignment, at least one unit) free after it;
  // nullopt when no free extent is large enough.
  std::optional<uint64_t> take(uint64_t bytes);
  // Gives back the extent `take` returned at `offset`. Throws k3::Error for an offset it did not give.
  void give(uint64_t offset);

  uint64_t size() const { return size_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free() const;
  size_t free_extents() const { return free_.size(); }

 private:
  uint64_t round(uint64_t bytes) const { return (bytes + align_ - 1) & ~(align_ - 1); }
  uint64_t size_, align_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> free_;   // offset -> length, disjoint and never adjacent
  std::map<uint64_t, uint64_t> taken_;  // offset -> length
};

}  // namespace k3::transfer
