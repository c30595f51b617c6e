// Free ids 0 .. count-1 handed out lowest first, whatever order they came back in.
//
// Cache pages and slots are ids into arrays, and a request's pages are one run of rows per layer. Ids
// taken lowest first keep a request's pages ascending and, in a pool that is not fragmented, adjacent:
// the transfer plan then coalesces a layer's page puts into one (transfer/plan.h). A stack would hand a
// finished request's pages back out in reverse order, and every later request's puts would go one page
// at a time.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <vector>

namespace k3 {

template <class Id>
class LowestFreeIds {
 public:
  explicit LowestFreeIds(Id count) {
    std::vector<Id> all;
    all.reserve(static_cast<size_t>(count));
    for (Id i = 0; i < count; ++i) all.push_back(i);
    free_ = Heap(std::greater<Id>(), std::move(all));  // ascending: already a min-heap
  }
  std::optional<Id> take() {
    if (free_.empty()) return std::nullopt;
    Id id = free_.top();
    free_.pop();
    return id;
  }
  // The caller guarantees `id` was taken and not given back since.
  void give(Id id) { free_.push(id); }
  size_t size() const { return free_.size(); }
  bool empty() const { return free_.empty(); }

 private:
  using Heap = std::priority_queue<Id, std::vector<Id>, std::greater<Id>>;
  Heap free_;
};

}  // namespace k3
