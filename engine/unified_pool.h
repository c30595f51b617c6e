// One memory region for both kinds of per-request cache memory (docs/PREFIX_CACHE.md, "Unified cache region"):
// KDA slots (state + conv of every KDA layer: large, fixed) are taken from the low end, MLA pages (small)
// from the high end, and the bytes between them are one free gap that either kind can use, so the split
// follows the load instead of a start-up guess. Freeing a block inside an end leaves a hole; a new block
// of that kind fills the lowest hole first. Only slots ever move, and only when their holes block an
// allocation: when the gap is too small for a page, the last slots are moved into the slot holes
// (compaction) and the gap grows by what they free. Pages stay where they were put, so a page id in a
// request's page table or the prefix tree never changes (their holes are refilled by pages); and moving on
// every free would copy a whole KDA slot (the state of every KDA layer) each time a request ends, though
// the next request reuses the hole without a copy.
//
// Handles stay valid across moves; offsets do not. Whoever reads or writes a block's bytes outside the
// pool (a kernel, a transfer) holds a Pin for the duration: a pinned block is never moved (its hole
// waits until the pin goes, then the next compaction closes it), so no write lands in a moved block.
//
// The engine's CacheRegion (engine/cache_region.h) puts this over one backend allocation.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace k3 {

struct UnifiedPoolOptions {
  uint64_t region_bytes = 0;
  uint64_t slot_bytes = 0;    // one KDA slot
  uint64_t page_bytes = 0;    // one MLA page
};

class UnifiedPool {
 public:
  enum class Kind : uint8_t { Slot, Page };
  struct Handle {
    Kind kind = Kind::Slot;
    uint32_t id = 0;
    bool operator==(const Handle&) const = default;
  };

  // Moves `bytes` from offset `from` to `to` (the caller's memory: host memmove, a device copy).
  using Mover = std::function<void(uint64_t from, uint64_t to, uint64_t bytes)>;
  // Throws k3::Error naming a bad option.
  UnifiedPool(const UnifiedPoolOptions& opts, Mover mover);

  // Takes a block: the lowest hole of its end, else the gap, else (a page) the gap after compacting the
  // slots; nullopt when none has room.
  std::optional<Handle> alloc(Kind kind);
  // Leaves a hole (no bytes move); a hole at the end's edge of the gap joins the gap.
  void free(Handle h);
  uint64_t offset(Handle h) const;   // current offset; stable only while pinned

  // While a Pin lives, its block is not moved.
  class Pin {
   public:
    Pin(UnifiedPool& pool, Handle h);
    ~Pin();
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;
    uint64_t offset() const { return offset_; }

   private:
    UnifiedPool& pool_;
    Handle h_;
    uint64_t offset_;
  };

  // Closes the slot holes while the last slot is not pinned; returns the slots moved.
  int compact();

  uint64_t free_bytes() const;      // the gap plus the holes
  uint64_t gap_bytes() const;       // the contiguous free middle
  uint64_t hole_bytes() const;      // free bytes inside the ends
  // Blocks of `kind` that alloc could take now: its holes, then the gap; a page also the bytes of the
  // slot holes (a compaction frees them, unless a pin stops it).
  uint64_t room(Kind kind) const;
  // Fragmentation as the metrics report it: the free bytes split into maximal runs of adjacent free bytes
  // (extents). One extent (or none) is no fragmentation.
  struct Fragmentation {
    uint64_t free_bytes = 0;
    uint64_t largest_extent_bytes = 0;
    uint32_t extents = 0;
    // 1 - largest / free: 0 when the free bytes are one run, towards 1 when they are scattered.
    double ratio() const { return free_bytes == 0 ? 0.0 : 1.0 - double(largest_extent_bytes) / double(free_bytes); }
  };
  Fragmentation fragmentation() const;
  int live(Kind kind) const;
  uint64_t moves() const { return moves_; }

 private:
  struct End {                       // one end: positions 0..used-1 counted from its edge
    uint64_t unit = 0;
    std::vector<int64_t> at;         // position -> handle id, -1 for a hole
    std::vector<int64_t> pos_of;     // handle id -> position, -1 when free
    std::vector<int> pins;           // handle id -> pin count
    std::vector<uint32_t> free_ids;
  };
  End& end(Kind k) { return k == Kind::Slot ? slots_ : pages_; }
  const End& end(Kind k) const { return k == Kind::Slot ? slots_ : pages_; }
  uint64_t offset_at(Kind k, int64_t pos) const;
  int compact_end(Kind k);           // caller holds mu_
  void trim(End& e);                 // drops trailing holes
  std::optional<Handle> take(Kind k);

  UnifiedPoolOptions opts_;
  Mover mover_;
  mutable std::mutex mu_;
  End slots_, pages_;
  uint64_t moves_ = 0;
};

}  // namespace k3
