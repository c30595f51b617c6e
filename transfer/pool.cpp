#include "transfer/pool.h"

#include <algorithm>
#include <string>

namespace k3::transfer {
namespace {

std::optional<size_t> index_of(const std::vector<uint32_t>& ids, uint32_t id) {
  auto it = std::find(ids.begin(), ids.end(), id);
  if (it == ids.end()) return std::nullopt;
  return size_t(it - ids.begin());
}

}  // namespace

// ---- geometry ----

Result<RankPoolGeometry> RankPoolGeometry::for_rank(const CacheLayout& model, const DecodeLayout& decode,
                                                    uint32_t rank_index, uint32_t region_id, uint64_t base,
                                                    uint32_t page_size, uint32_t num_pages, uint32_t num_slots) {
  K3_TRY(model.validate());
  K3_TRY(decode.validate(model));
  if (rank_index >= decode.group_size())
    return invalid_argument("pool geometry: rank_index " + std::to_string(rank_index) + " >= group size " +
                            std::to_string(decode.group_size()));
  RankPoolGeometry g;
  g.rank = decode.ranks[rank_index];
  g.region_id = region_id;
  g.base = base;
  g.page_size = page_size;
  g.num_pages = num_pages;
  g.num_slots = num_slots;
  g.mla_layer_ids = model.layer_ids(LayerCache::Mla);
  g.draft_layer_ids = model.layer_ids(LayerCache::Draft);
  g.kda_layer_ids = model.layer_ids(LayerCache::Kda);
  g.mla_row_bytes = model.mla_row_bytes;
  g.draft_row_bytes = model.draft_row_bytes;
  if (!g.kda_layer_ids.empty()) {
    g.kda_conv_bytes = decode.kda_conv_bytes_per_rank(model);
    g.kda_state_bytes = decode.kda_state_bytes_per_rank(model);
  }
  K3_TRY(g.validate());
  return g;
}

Status RankPoolGeometry::validate() const {
  if (page_size == 0) return invalid_argument("pool geometry: page_size is 0");
  if (!mla_layer_ids.empty() && mla_row_bytes == 0) return invalid_argument("pool geometry: mla_row_bytes is 0");
  if (!draft_layer_ids.empty() && draft_row_bytes == 0)
    return invalid_argument("pool geometry: draft_row_bytes is 0");
  if (!kda_layer_ids.empty() && (kda_conv_bytes == 0 && kda_state_bytes == 0))
    return invalid_argument("pool geometry: KDA layers with 0-byte conv and state");
  const __uint128_t total = __uint128_t(num_pages) * page_bytes() + __uint128_t(num_slots) * slot_bytes();
  if (total + base > UINT64_MAX) return invalid_argument("pool geometry: region overflows the address space");
  return Status::ok();
}

uint64_t RankPoolGeometry::page_bytes() const {
  return uint64_t(page_size) * (mla_layer_ids.size() * mla_row_bytes + draft_layer_ids.size() * draft_row_bytes);
}
uint64_t RankPoolGeometry::slot_bytes() const { return kda_layer_ids.size() * (kda_conv_bytes + kda_state_bytes); }
uint64_t RankPoolGeometry::region_bytes() const { return num_pages * page_bytes() + num_slots * slot_bytes(); }

Result<uint64_t> RankPoolGeometry::layer_pages_addr(uint32_t layer_id) const {
  const uint64_t rows = uint64_t(num_pages) * page_size;
  if (auto i = index_of(mla_layer_ids, layer_id)) return base + *i * rows * mla_row_bytes;
  if (auto i = index_of(draft_layer_ids, layer_id))
    return base + mla_layer_ids.size() * rows * mla_row_bytes + *i * rows * draft_row_bytes;
  return not_found("pool geometry: layer " + std::to_string(layer_id) + " has no MLA/draft pages on rank " +
                   std::to_string(rank));
}

uint64_t RankPoolGeometry::layer_pages_length(uint32_t layer_id) const {
  const uint64_t rows = uint64_t(num_pages) * page_size;
  if (index_of(mla_layer_ids, layer_id)) return rows * mla_row_bytes;
  if (index_of(draft_layer_ids, layer_id)) return rows * draft_row_bytes;
  return 0;
}

Result<uint64_t> RankPoolGeometry::kda_conv_addr(uint32_t slot, uint32_t layer_id) const {
  if (slot >= num_slots)
    return Status(Code::OutOfRange, "pool geometry: slot " + std::to_string(slot) + " >= " + std::to_string(num_slots));
  auto i = index_of(kda_layer_ids, layer_id);
  if (!i) return not_found("pool geometry: layer " + std::to_string(layer_id) + " is not a KDA layer");
  return base + uint64_t(num_pages) * page_bytes() + *i * uint64_t(num_slots) * (kda_conv_bytes + kda_state_bytes) +
         uint64_t(slot) * kda_conv_bytes;
}

Result<uint64_t> RankPoolGeometry::kda_state_addr(uint32_t slot, uint32_t layer_id) const {
  K3_ASSIGN_OR_RETURN(uint64_t conv, kda_conv_addr(slot, layer_id));
  // Past this layer's conv array (num_slots entries), then `slot` state entries in.
  return conv - uint64_t(slot) * kda_conv_bytes + uint64_t(num_slots) * kda_conv_bytes + uint64_t(slot) * kda_state_bytes;
}

// ---- handles ----

PageHandle::PageHandle(PageHandle&& o) noexcept : pool_(o.pool_), ids_(std::move(o.ids_)) {
  o.pool_ = nullptr;
  o.ids_.clear();
}
PageHandle& PageHandle::operator=(PageHandle&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    ids_ = std::move(o.ids_);
    o.pool_ = nullptr;
    o.ids_.clear();
  }
  return *this;
}
void PageHandle::release() {
  if (pool_ && !ids_.empty()) pool_->free_pages(ids_);
  ids_.clear();
  pool_ = nullptr;
}

SlotHandle::SlotHandle(SlotHandle&& o) noexcept : pool_(o.pool_), slot_(o.slot_) {
  o.pool_ = nullptr;
  o.slot_.reset();
}
SlotHandle& SlotHandle::operator=(SlotHandle&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    slot_ = o.slot_;
    o.pool_ = nullptr;
    o.slot_.reset();
  }
  return *this;
}
void SlotHandle::release() {
  if (pool_ && slot_) pool_->free_slot(*slot_);
  slot_.reset();
  pool_ = nullptr;
}

// ---- pool ----

Result<std::unique_ptr<RankPool>> RankPool::create(RankPoolGeometry geometry) {
  K3_TRY(geometry.validate());
  return std::unique_ptr<RankPool>(new RankPool(std::move(geometry)));
}

RankPool::RankPool(RankPoolGeometry g)
    : geo_(std::move(g)), free_page_ids_(geo_.num_pages), free_slot_ids_(geo_.num_slots) {
  page_in_use_.assign(geo_.num_pages, 0);
  slot_in_use_.assign(geo_.num_slots, 0);
}

Status RankPool::share_ids(std::shared_ptr<PoolIds> ids) {
  std::lock_guard lock(mu_);
  if (!ids) return invalid_argument("RankPool::share_ids: ids is null");
  if (free_page_ids_.size() != geo_.num_pages || free_slot_ids_.size() != geo_.num_slots)
    return Status(Code::InvalidArgument, "pool rank " + std::to_string(geo_.rank) + ": ids shared while some are allocated");
  shared_ = std::move(ids);
  return Status::ok();
}

Result<PageHandle> RankPool::allocate_pages(uint32_t n) {
  std::lock_guard lock(mu_);
  if (shared_) {
    if (n == 0) return PageHandle(this, {});
    auto ids = shared_->take_pages(n);
    if (!ids)
      return Status(Code::ResourceExhausted, "pool rank " + std::to_string(geo_.rank) + ": " + std::to_string(n) +
                                                 " pages wanted, " + std::to_string(shared_->free_pages()) + " free");
    for (uint32_t id : *ids) {
      K3_CHECK(id < page_in_use_.size() && !page_in_use_[id], "shared ids handed out page " + std::to_string(id) + " twice");
      page_in_use_[id] = 1;
    }
    stats_.page_allocs += n;
    return PageHandle(this, std::move(*ids));
  }
  if (n > free_page_ids_.size())
    return Status(Code::ResourceExhausted, "pool rank " + std::to_string(geo_.rank) + ": " + std::to_string(n) +
                                               " pages wanted, " + std::to_string(free_page_ids_.size()) + " free");
  std::vector<uint32_t> ids;
  ids.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    ids.push_back(*free_page_ids_.take());
    page_in_use_[ids.back()] = 1;
  }
  stats_.page_allocs += n;
  return PageHandle(this, std::move(ids));
}

Result<SlotHandle> RankPool::allocate_slot() {
  std::lock_guard lock(mu_);
  if (geo_.kda_layer_ids.empty()) return unsupported("pool rank " + std::to_string(geo_.rank) + ": no KDA layers");
  if (!shared_ && free_slot_ids_.empty()) return Status(Code::ResourceExhausted, "pool rank " + std::to_string(geo_.rank) + ": no free KDA slot");
  uint32_t s = 0;
  if (shared_) {
    auto taken = shared_->take_slot();
    if (!taken) return Status(Code::ResourceExhausted, "pool rank " + std::to_string(geo_.rank) + ": no free KDA slot");
    s = *taken;
    K3_CHECK(s < slot_in_use_.size() && !slot_in_use_[s], "shared ids handed out slot " + std::to_string(s) + " twice");
  } else {
    s = *free_slot_ids_.take();
  }
  slot_in_use_[s] = 1;
  stats_.slot_allocs += 1;
  return SlotHandle(this, s);
}

void RankPool::free_pages(const std::vector<uint32_t>& ids) {
  std::lock_guard lock(mu_);
  for (uint32_t id : ids) {
    // Unreachable through handles; a failure here is a bug in this file.
    K3_CHECK(id < page_in_use_.size() && page_in_use_[id], "page freed twice or never allocated");
    page_in_use_[id] = 0;
    if (!shared_) free_page_ids_.give(id);
  }
  if (shared_) shared_->give_pages(ids);
  stats_.page_frees += ids.size();
}

void RankPool::free_slot(uint32_t slot) {
  std::lock_guard lock(mu_);
  K3_CHECK(slot < slot_in_use_.size() && slot_in_use_[slot], "slot freed twice or never allocated");
  slot_in_use_[slot] = 0;
  if (shared_) shared_->give_slot(slot);
  else free_slot_ids_.give(slot);
  stats_.slot_frees += 1;
}

uint32_t RankPool::free_pages() const {
  std::lock_guard lock(mu_);
  return shared_ ? shared_->free_pages() : uint32_t(free_page_ids_.size());
}
uint32_t RankPool::free_slots() const {
  std::lock_guard lock(mu_);
  return shared_ ? shared_->free_slots() : uint32_t(free_slot_ids_.size());
}
uint64_t RankPool::free_bytes() const {
  std::lock_guard lock(mu_);
  // Shared: what neither the transfer nor the engine holds (the whole region's one accounting).
  const uint64_t pages = shared_ ? shared_->free_pages() : free_page_ids_.size();
  const uint64_t slots = shared_ ? shared_->free_slots() : free_slot_ids_.size();
  return pages * geo_.page_bytes() + slots * geo_.slot_bytes();
}
uint64_t RankPool::capacity_bytes() const { return geo_.region_bytes(); }
PoolStats RankPool::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void append_addrs(const RankPoolGeometry& geo, const RankAllocation& alloc, protocol::Addrs& out) {
  const auto add = [&](uint32_t layer, EntryKind kind, uint64_t addr, uint64_t len) {
    out.entries.push_back({.layer_id = layer, .kind = kind, .dest_rank = geo.rank, .remote_addr = addr,
                           .length = len, .region_id = geo.region_id});
  };
  for (uint32_t l : geo.mla_layer_ids) add(l, EntryKind::MlaKv, geo.layer_pages_addr(l).value(), geo.layer_pages_length(l));
  for (uint32_t l : geo.draft_layer_ids)
    add(l, EntryKind::DraftKv, geo.layer_pages_addr(l).value(), geo.layer_pages_length(l));
  if (auto slot = alloc.slot.slot()) {
    for (uint32_t l : geo.kda_layer_ids) {
      add(l, EntryKind::KdaConv, geo.kda_conv_addr(*slot, l).value(), geo.kda_conv_bytes);
      add(l, EntryKind::KdaState, geo.kda_state_addr(*slot, l).value(), geo.kda_state_bytes);
    }
  }
  out.page_tables.push_back({.rank = geo.rank, .page_size = geo.page_size, .page_ids = alloc.pages.page_ids()});
}

}  // namespace k3::transfer
