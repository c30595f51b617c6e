// Per-request model state for a range of layers: KDA conv cache + recurrent state slots and the paged
// MLA latent cache. One slot id indexes every KDA layer's pools; one page table indexes every MLA
// layer's pool (all MLA layers hold the same tokens). Shapes and dtypes come from the one CacheLayout
// (common/config/cache_layout.h) that the cache images and the transfer use too.
//
// Unless another owner provides the memory (CacheOptions::memory), all of it is one unified region of the
// backend's memory (engine/cache_region.h): KDA slots from one end, MLA pages from the other. A slot id
// is then a stable name; the rows the kernels index (state_row, conv_row) follow the slot when a page
// allocation compacts the region, so every holder of a slot id (a sequence, a prefix-cache checkpoint)
// sees the new place. Rows are read when a step's index tensors are built, after its pages are reserved.
// Page ids are rows of the page views and never change.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "common/core/lowest_free_ids.h"
#include "common/core/tensor.h"
#include "common/config/cache_layout.h"
#include "common/config/config.h"
#include "engine/cache_region.h"
#include "kernels/backend.h"

namespace k3 {

// The cache layout of `cfg` on `backend`: MLA rows and conv cache in the compute dtype, state F32.
Result<CacheLayout> cache_layout(const ModelConfig& cfg, const Backend& backend);

// Memory another owner provides for the pools (the decode rank's transfer region, so the engine decodes
// from the bytes the transfer wrote): per global layer id, the start of that layer's contiguous array,
// shaped as the pools below ([slots, ...] for KDA, [num_pages, page_size, row] for MLA), on `device`.
// The owner keeps it alive and registered for the pools' lifetime.
struct CacheMemory {
  Device device = Device::Cpu;
  std::map<int, void*> kda_conv, kda_state, mla_kv;
};

struct CacheOptions {
  int max_seqs = 8;         // KDA state slots
  int page_size = 16;       // tokens per MLA page
  int num_pages = 256;      // per MLA layer
  int checkpoint_slots = 0; // extra KDA slots the prefix cache keeps its checkpoints in (same pools)
  std::shared_ptr<const CacheMemory> memory;  // null: the backend allocates one unified region
  // Bytes of the unified region. 0: room for max_seqs + checkpoint_slots slots and num_pages pages at once
  // (each kind its full count, as separate pools). Less: the two kinds share the bytes, the boundary
  // follows demand (the counts stay caps), and a page that needs bytes slot holes hold moves slots.
  uint64_t region_bytes = 0;
};

// Checks CacheOptions::region_bytes for layers [begin, end) before any memory is taken: 0 (room for every
// slot and page at once) or a size that holds at least one KDA slot and one MLA page of the range. The
// error names `flag` (the option the user gave).
Status check_region_bytes(const ModelConfig& cfg, const Backend& backend, int begin, int end, const CacheOptions& opts,
                          const std::string& flag);

// Hands out small integer ids (slots, pages) from a fixed range; double free is a bug (checked).
class IdAllocator {
 public:
  explicit IdAllocator(int count);
  std::optional<int> alloc();
  void free(int id);
  int free_count() const { return static_cast<int>(free_.size()); }
  int capacity() const { return capacity_; }

 private:
  int capacity_;
  LowestFreeIds<int> free_;      // lowest id first, so a request's pages stay ascending
  std::vector<uint8_t> in_use_;
};

// One request's place in the pools.
struct SeqCache {
  int slot = -1;
  std::vector<int32_t> pages;
  int64_t num_tokens = 0;        // tokens already in the caches
};

class CachePools {
 public:
  CachePools(Backend& backend, const ModelConfig& cfg, int layer_begin, int layer_end, const CacheOptions& opts);

  const CacheOptions& options() const { return opts_; }
  const ModelConfig& config() const { return cfg_; }
  const CacheLayout& layout() const { return layout_; }
  // Pools of a global layer id in this range.
  Tensor& kda_conv(int layer);    // [max_seqs, W-1, 3P]
  Tensor& kda_state(int layer);   // [max_seqs, H, D, D] F32
  Tensor& mla_kv(int layer);      // [num_pages, page_size, r_kv + d_r]

  // Starts a sequence: takes a KDA slot and zeroes its state (no pages yet). Fails when full.
  Result<SeqCache> open();
  // Makes room for `extra` more tokens (allocates pages). Fails without side effects when out of pages.
  Status reserve(SeqCache& seq, int64_t extra);
  // Returns the slot and pages; idempotent (the SeqCache is emptied). A page or slot another owner also
  // holds (the prefix cache, the decode transfer) only loses this request's reference.
  void close(SeqCache& seq);
  // A sequence over a slot and pages another owner already holds and wrote (the decode transfer placed
  // the request's caches there): takes one more reference on each, copies and zeroes nothing.
  // `num_tokens` rows must fit the pages. Errors name an id that is not allocated.
  Result<SeqCache> adopt(int slot, const std::vector<int32_t>& pages, int64_t num_tokens);
  // A second sequence with `src`'s contents, to continue it another way (n samples of one prompt share
  // one prefill): a new slot with a copy of its KDA state and conv window; the pages it filled to the
  // end are shared (one more reference each: nobody writes a full page again), and its last, partly
  // filled page is copied into a page of its own, since both sequences write their next rows there.
  // All or nothing: fails (naming what ran out) without side effects.
  Result<SeqCache> fork(const SeqCache& src);

  // For the prefix cache and the decode transfer: slots and pages they own (one reference each), page
  // references, and state copies. Slots and pages are freed when their last owner lets go.
  std::optional<int> alloc_slot();   // contents undefined
  void free_slot(int slot);          // drops one reference
  std::optional<std::vector<int32_t>> alloc_pages(int n);  // all or nothing; contents undefined
  // Copies the state and conv window of every KDA layer of slot `src` into slot `dst`.
  void copy_slot(int src, int dst);
  // Copies page `src` of every MLA layer of this range into page `dst`.
  void copy_page(int32_t src, int32_t dst);
  void retain_page(int32_t page);    // one more owner of an allocated page
  void release_page(int32_t page);   // freed when its last owner lets go
  int page_refs(int32_t page) const { return page_refs_.at(page); }
  uint64_t slot_bytes() const;       // KDA state + conv of every KDA layer of this range, one slot
  uint64_t page_bytes() const;       // one page of every MLA layer of this range

  // The rows of slot `slot` in the kda_state / kda_conv pools now (the slot id itself without a region).
  int32_t state_row(int slot) const;
  int32_t conv_row(int slot) const;

  // What can be taken now: each kind's cap less what is held, and in a unified region no more than its
  // bytes allow (a page may count the bytes slot holes hold: taking it moves slots).
  int free_pages() const;
  int free_slots() const;
  int total_slots() const { return slots_.capacity(); }
  // Slots allocated now. Not total_slots() - free_slots(): in a unified region smaller than every slot and
  // page at once, free_slots() is also bounded by the region's room, which live slots do not use.
  int live_slots() const { return slots_.capacity() - slots_.free_count(); }
  // The unified region's free-byte fragmentation and slot moves; nullopt when another owner provides the
  // memory.
  std::optional<UnifiedPool::Fragmentation> fragmentation() const;
  uint64_t slot_moves() const { return region_ ? region_->moves() : 0; }
  // The unified region (null when another owner provides the memory): what a transfer registers.
  const CacheRegion* region() const { return region_.get(); }
  // Holds slot `slot` in place for a write from outside the engine's step (a transfer landing a request's
  // state, possibly on another thread): no compaction moves it, so the rows the pin gives stay the slot's,
  // while the pin lives. The slot must be held (by the writer's request) for the pin's life. Needs a
  // unified region (otherwise nothing moves: the rows are the slot id).
  std::unique_ptr<CacheRegion::Pin> pin_slot(int slot);
  // A held slot's rows for a write (or read) of its bytes outside the step: pinned in a unified region
  // with KDA layers, the slot id itself otherwise (nothing moves). The rows stay the slot's while this lives.
  struct HeldRows {
    int32_t state = -1, conv = -1;
    std::unique_ptr<CacheRegion::Pin> pin;   // null where nothing can move
  };
  HeldRows hold_rows(int slot);
  bool has_kda() const { return !kda_conv_.empty(); }
  bool has_mla() const { return !mla_kv_.empty(); }

 private:
  Backend& backend_;
  ModelConfig cfg_;
  CacheLayout layout_;
  CacheOptions opts_;
  bool valid_page(int32_t page) const { return page >= 0 && page < static_cast<int32_t>(page_refs_.size()); }
  // Page ids from the region's page views (a range with MLA layers), else from pages_ (ids only).
  bool region_pages() const { return region_ && has_mla(); }

  IdAllocator slots_;
  IdAllocator pages_;                 // page ids unless region_pages()
  std::unique_ptr<CacheRegion> region_;
  std::vector<UnifiedPool::Handle> slot_block_;   // region: slot id -> its block
  std::vector<int64_t> page_block_;   // region: page id -> its block's handle id (-1: free)
  int pages_live_ = 0;                // region: pages held
  std::vector<uint16_t> page_refs_;   // owners of each page id (requests, the prefix cache, the transfer)
  std::vector<uint16_t> slot_refs_;   // owners of each slot (a request, the prefix cache, the transfer)
  std::map<int, Tensor> kda_conv_, kda_state_, mla_kv_;
};

}  // namespace k3
