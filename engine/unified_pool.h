// One memory region for both kinds of per-request cache memory (docs/PREFIX_CACHE.md, "Unified pool"):
// KDA slots (state + conv of every KDA layer: large, fixed) are taken from the low end, MLA pages (small)
// from the high end, and the bytes between them are one free gap that either kind can use, so the split
// follows the load instead of a start-up guess. Freeing a block inside an end leaves a hole; the end's
// last block is moved into it (compaction) so both ends stay packed and the gap stays in one piece.
//
// Handles stay valid across moves; offsets do not. Whoever reads or writes a block's bytes outside the
// pool (a kernel, a transfer) holds a Pin for the duration: a pinned block is never moved (its hole
// waits until the pin goes, then the next compaction closes it), so no write lands in a moved block.
//
// Status: bookkeeping and moves over a host byte region, with tests; the engine's CachePools still keep
// separate pools (checkpoint slots are extra rows there).
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

  // Takes a block (compacting first when only holes have room); nullopt when the region is full.
  std::optional<Handle> alloc(Kind kind);
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

  // Closes every hole whose end block is not pinned; returns the blocks moved.
  int compact();

  uint64_t free_bytes() const;      // the gap plus the holes
  uint64_t gap_bytes() const;       // the contiguous free middle
  uint64_t hole_bytes() const;      // fragmentation: free bytes inside the ends
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
