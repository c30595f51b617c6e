#include "transfer/extent_allocator.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "common/core/status.h"

namespace k3::transfer {

ExtentAllocator::ExtentAllocator(uint64_t size, uint64_t align) : size_(size), align_(align), free_bytes_(0) {
  K3_CHECK(align > 0 && (align & (align - 1)) == 0, "ExtentAllocator: alignment " + std::to_string(align) + " is not a power of two");
  size_ = size & ~(align - 1);   // a tail shorter than one unit is never handed out
  if (size_ > 0) free_[0] = size_;
  free_bytes_ = size_;
}

std::optional<uint64_t> ExtentAllocator::take(uint64_t bytes) {
  const uint64_t need = round(std::max<uint64_t>(bytes, 1));
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t at = it->first, len = it->second;
    free_.erase(it);
    if (len > need) free_[at + need] = len - need;
    taken_[at] = need;
    free_bytes_ -= need;
    return at;
  }
  return std::nullopt;
}

void ExtentAllocator::give(uint64_t offset) {
  auto t = taken_.find(offset);
  K3_CHECK(t != taken_.end(), "ExtentAllocator::give: offset " + std::to_string(offset) + " was not taken");
  uint64_t at = offset, len = t->second;
  taken_.erase(t);
  free_bytes_ += len;
  auto next = free_.lower_bound(at);
  if (next != free_.end() && next->first == at + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      prev->second += len;
      return;
    }
  }
  free_[at] = len;
}

uint64_t ExtentAllocator::largest_free() const {
  uint64_t best = 0;
  for (const auto& [at, len] : free_) best = std::max(best, len);
  return best;
}

}  // namespace k3::transfer
