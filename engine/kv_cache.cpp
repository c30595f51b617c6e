#include "engine/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace k3 {

IdAllocator::IdAllocator(int count) : capacity_(count), free_(count), in_use_(count, 0) {}

std::optional<int> IdAllocator::alloc() {
  const std::optional<int> id = free_.take();
  if (id) in_use_[*id] = 1;
  return id;
}

void IdAllocator::free(int id) {
  K3_CHECK(id >= 0 && id < capacity_ && in_use_[id], "IdAllocator::free of id " + std::to_string(id) + " not in use");
  in_use_[id] = 0;
  free_.give(id);
}

Result<CacheLayout> cache_layout(const ModelConfig& cfg, const Backend& backend) {
  return CacheLayout::from_config(cfg, {.kv = backend.compute_dtype(), .conv = backend.compute_dtype(), .state = DType::F32});
}

Status check_region_bytes(const ModelConfig& cfg, const Backend& backend, int begin, int end, const CacheOptions& opts,
                          const std::string& flag) {
  if (opts.region_bytes == 0) return Status::ok();
  if (opts.memory) return invalid_argument(flag + ": the cache is in memory another owner provides; it has no region of its own to size");
  K3_ASSIGN_OR_RETURN(CacheLayout c, cache_layout(cfg, backend));
  auto u = UnifiedRegionLayout::make(c, static_cast<uint32_t>(begin), static_cast<uint32_t>(end),
                                     static_cast<uint32_t>(opts.page_size), opts.region_bytes);
  if (!u.is_ok()) return invalid_argument(flag + ": " + u.status().message());
  return Status::ok();
}

namespace {

// Room for `slots` slots and `pages` pages at once, rounded up to the layout's page granularity.
uint64_t full_region_bytes(const CacheLayout& c, int begin, int end, int page_size, int slots, int pages) {
  auto u = UnifiedRegionLayout::make(c, begin, end, page_size, UINT64_MAX / 2);
  K3_CHECK(u.is_ok(), u.status().message());
  const uint64_t bytes = uint64_t(std::max(slots, 1)) * u->slot_block_bytes + uint64_t(std::max(pages, 1)) * u->page_block_bytes;
  const uint64_t unit = u->has_mla() ? u->page_bytes : 1;
  return (bytes + unit - 1) / unit * unit;
}

}  // namespace

CachePools::CachePools(Backend& backend, const ModelConfig& cfg, int layer_begin, int layer_end, const CacheOptions& opts)
    : backend_(backend), cfg_(cfg), layout_(cache_layout(cfg, backend).value()), opts_(opts),
      slots_(opts.max_seqs + opts.checkpoint_slots), pages_(opts.num_pages),
      slot_refs_(opts.max_seqs + opts.checkpoint_slots, 0) {
  K3_CHECK(opts.checkpoint_slots >= 0, "CacheOptions.checkpoint_slots must be >= 0");
  K3_CHECK(opts.num_pages >= 0, "CacheOptions.num_pages must be >= 0");
  const int total_slots = opts.max_seqs + opts.checkpoint_slots;
  const CacheLayout& c = layout_;
  const CacheMemory* mem = opts.memory.get();
  if (!mem) {
    const uint64_t bytes = opts.region_bytes ? opts.region_bytes
                                             : full_region_bytes(c, layer_begin, layer_end, opts.page_size, total_slots, opts.num_pages);
    region_ = std::make_unique<CacheRegion>(backend, c, layer_begin, layer_end, opts.page_size, bytes);
    const UnifiedRegionLayout& u = region_->layout();
    for (const auto& [l, off] : u.state_offset) kda_state_[int(l)] = region_->state(l), kda_conv_[int(l)] = region_->conv(l);
    for (const auto& [l, off] : u.page_offset) mla_kv_[int(l)] = region_->pages(l);
    page_refs_.assign(u.has_mla() ? u.region_bytes / u.page_bytes : opts.num_pages, 0);
    page_block_.assign(page_refs_.size(), -1);
    slot_block_.resize(total_slots);
    return;
  }
  page_refs_.assign(opts.num_pages, 0);
  const int64_t rows = c.kda_conv_rows, p = c.kda_proj_dim(), h = c.kda_heads, d = c.kda_head_dim;
  // The owner's arrays, checked: every layer has its array.
  auto place = [&](const std::map<int, void*>& arrays, int layer, Shape shape, DType dtype, const char* what) {
    auto it = arrays.find(layer);
    K3_CHECK(it != arrays.end() && it->second != nullptr,
             std::string("CacheOptions.memory has no ") + what + " array for layer " + std::to_string(layer));
    return Tensor::view(it->second, std::move(shape), dtype, mem->device);
  };
  for (int l = layer_begin; l < layer_end; ++l) {
    if (c.layers.at(l) == LayerCache::Kda) {
      kda_conv_[l] = place(mem->kda_conv, l, {total_slots, rows, 3 * p}, c.dtypes.conv, "KDA conv");
      kda_state_[l] = place(mem->kda_state, l, {total_slots, h, d, d}, c.dtypes.state, "KDA state");
    } else {
      mla_kv_[l] = place(mem->mla_kv, l, {opts.num_pages, opts.page_size, c.mla_row_width}, c.dtypes.kv, "MLA");
    }
  }
}

int32_t CachePools::state_row(int slot) const {
  return region_ ? region_->state_row(slot_block_.at(size_t(slot))) : slot;
}

int32_t CachePools::conv_row(int slot) const {
  return region_ ? region_->conv_row(slot_block_.at(size_t(slot))) : slot;
}

int CachePools::free_slots() const {
  if (!region_ || !has_kda()) return slots_.free_count();
  return static_cast<int>(std::min<uint64_t>(slots_.free_count(), region_->room(UnifiedPool::Kind::Slot)));
}

int CachePools::free_pages() const {
  if (!region_pages()) return pages_.free_count();
  return static_cast<int>(std::min<uint64_t>(opts_.num_pages - pages_live_, region_->room(UnifiedPool::Kind::Page)));
}

std::unique_ptr<CacheRegion::Pin> CachePools::pin_slot(int slot) {
  K3_CHECK(region_ && has_kda(), "CachePools::pin_slot needs a unified region with KDA layers");
  K3_CHECK(slot >= 0 && slot < slots_.capacity() && slot_refs_[slot] > 0, "pin_slot " + std::to_string(slot) + ": slot has no owner");
  return std::make_unique<CacheRegion::Pin>(*region_, slot_block_[size_t(slot)]);
}

CachePools::HeldRows CachePools::hold_rows(int slot) {
  if (!region_ || !has_kda()) return {.state = slot, .conv = slot};
  auto pin = pin_slot(slot);
  const int32_t state = pin->state_row(), conv = pin->conv_row();
  return {.state = state, .conv = conv, .pin = std::move(pin)};
}

std::optional<UnifiedPool::Fragmentation> CachePools::fragmentation() const {
  if (!region_) return std::nullopt;
  return region_->fragmentation();
}

Tensor& CachePools::kda_conv(int layer) {
  auto it = kda_conv_.find(layer);
  K3_CHECK(it != kda_conv_.end(), "no KDA pools for layer " + std::to_string(layer));
  return it->second;
}
Tensor& CachePools::kda_state(int layer) {
  auto it = kda_state_.find(layer);
  K3_CHECK(it != kda_state_.end(), "no KDA pools for layer " + std::to_string(layer));
  return it->second;
}
Tensor& CachePools::mla_kv(int layer) {
  auto it = mla_kv_.find(layer);
  K3_CHECK(it != mla_kv_.end(), "no MLA pool for layer " + std::to_string(layer));
  return it->second;
}

Result<SeqCache> CachePools::open() {
  auto slot = alloc_slot();
  if (!slot) return Status(Code::ResourceExhausted, "no free sequence slot (max_seqs=" + std::to_string(opts_.max_seqs) + ")");
  SeqCache seq;
  seq.slot = *slot;
  // A reused slot must start from zeros: state and conv cache of every KDA layer.
  for (auto* pools : {&kda_conv_, &kda_state_})
    for (auto& [layer, t] : *pools) {
      const int32_t r = pools == &kda_conv_ ? conv_row(seq.slot) : state_row(seq.slot);
      Tensor row = t.slice_rows(r, r + 1);
      Tensor zero = backend_.alloc(row.shape(), row.dtype());
      backend_.copy(zero, row);
    }
  return seq;
}

Status CachePools::reserve(SeqCache& seq, int64_t extra) {
  const int64_t need_tokens = seq.num_tokens + extra;
  const int64_t need_pages = (need_tokens + opts_.page_size - 1) / opts_.page_size;
  const int64_t more = need_pages - static_cast<int64_t>(seq.pages.size());
  if (more <= 0) return Status::ok();
  auto pages = alloc_pages(static_cast<int>(more));
  if (!pages)
    return Status(Code::ResourceExhausted, "out of MLA pages: need " + std::to_string(more) + ", free " +
                                               std::to_string(free_pages()));
  seq.pages.insert(seq.pages.end(), pages->begin(), pages->end());
  return Status::ok();
}

void CachePools::close(SeqCache& seq) {
  if (seq.slot >= 0) free_slot(seq.slot);
  for (int32_t page : seq.pages) release_page(page);
  seq = SeqCache{};
}

Result<SeqCache> CachePools::adopt(int slot, const std::vector<int32_t>& pages, int64_t num_tokens) {
  if (has_kda() && (slot < 0 || slot >= slots_.capacity() || slot_refs_[slot] == 0))
    return invalid_argument("adopt: slot " + std::to_string(slot) + " is not allocated");
  if (!has_kda() && slot >= 0) return invalid_argument("adopt: a slot for a range without KDA layers");
  for (int32_t page : pages)
    if (!valid_page(page) || page_refs_[page] == 0)
      return invalid_argument("adopt: page " + std::to_string(page) + " is not allocated");
  if (num_tokens < 0 || num_tokens > static_cast<int64_t>(pages.size()) * opts_.page_size)
    return invalid_argument("adopt: " + std::to_string(num_tokens) + " tokens do not fit " + std::to_string(pages.size()) +
                            " pages of " + std::to_string(opts_.page_size));
  SeqCache seq;
  seq.slot = has_kda() ? slot : -1;
  if (seq.slot >= 0) ++slot_refs_[seq.slot];
  for (int32_t page : pages) retain_page(page);
  seq.pages = pages;
  seq.num_tokens = num_tokens;
  return seq;
}

Result<SeqCache> CachePools::fork(const SeqCache& src) {
  K3_CHECK(src.slot >= 0 && src.slot < slots_.capacity() && slot_refs_[src.slot] > 0,
           "fork: the source sequence holds no slot");
  const int64_t ps = opts_.page_size;
  const int64_t used = (src.num_tokens + ps - 1) / ps;   // pages that hold its tokens
  K3_CHECK(used <= static_cast<int64_t>(src.pages.size()), "fork: the source sequence's tokens exceed its pages");
  const bool partial = src.num_tokens % ps != 0;
  if (partial && free_pages() == 0)
    return Status(Code::ResourceExhausted, "fork: out of MLA pages for the copy of the last partial page");
  auto slot = alloc_slot();
  if (!slot) return Status(Code::ResourceExhausted, "fork: no free sequence slot (max_seqs=" + std::to_string(opts_.max_seqs) + ")");
  SeqCache seq;
  seq.slot = *slot;
  copy_slot(src.slot, seq.slot);
  const int64_t shared = partial ? used - 1 : used;
  auto last = partial ? alloc_pages(1) : std::optional<std::vector<int32_t>>(std::vector<int32_t>{});
  if (!last) {
    free_slot(seq.slot);
    return Status(Code::ResourceExhausted, "fork: out of MLA pages for the copy of the last partial page");
  }
  for (int64_t i = 0; i < shared; ++i) {
    retain_page(src.pages[i]);
    seq.pages.push_back(src.pages[i]);
  }
  if (partial) {
    const int32_t page = last->at(0);
    copy_page(src.pages[used - 1], page);
    seq.pages.push_back(page);
  }
  seq.num_tokens = src.num_tokens;
  return seq;
}

std::optional<int> CachePools::alloc_slot() {
  if (free_slots() == 0) return std::nullopt;
  std::optional<UnifiedPool::Handle> block;
  if (region_ && has_kda() && !(block = region_->alloc_slot())) return std::nullopt;
  auto slot = slots_.alloc();
  K3_CHECK(slot.has_value(), "CachePools: a free slot count with no free slot id");
  if (block) slot_block_[size_t(*slot)] = *block;
  slot_refs_[*slot] = 1;
  return slot;
}

void CachePools::free_slot(int slot) {
  K3_CHECK(slot >= 0 && slot < slots_.capacity() && slot_refs_[slot] > 0,
           "free_slot " + std::to_string(slot) + ": slot has no owner");
  if (--slot_refs_[slot] > 0) return;
  slots_.free(slot);
  if (region_ && has_kda()) region_->free(slot_block_[size_t(slot)]);
}

std::optional<std::vector<int32_t>> CachePools::alloc_pages(int n) {
  if (n < 0 || n > free_pages()) return std::nullopt;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    int32_t page;
    if (region_pages()) {
      auto block = region_->alloc_page();   // may move slots (their rows change, their ids do not)
      if (!block) {                          // a pinned slot kept a hole: all or nothing
        for (int32_t p : out) release_page(p);
        return std::nullopt;
      }
      page = region_->page_id(*block);
      page_block_[size_t(page)] = block->id;
      ++pages_live_;
    } else {
      page = *pages_.alloc();
    }
    page_refs_[page] = 1;
    out.push_back(page);
  }
  return out;
}

void CachePools::copy_slot(int src, int dst) {
  K3_CHECK(src >= 0 && dst >= 0 && src < slots_.capacity() && dst < slots_.capacity() && src != dst,
           "copy_slot " + std::to_string(src) + " -> " + std::to_string(dst) + ": bad slot ids");
  for (auto* pools : {&kda_conv_, &kda_state_}) {
    const bool conv = pools == &kda_conv_;
    const int32_t s = conv ? conv_row(src) : state_row(src), d = conv ? conv_row(dst) : state_row(dst);
    for (auto& [layer, t] : *pools) {
      Tensor to = t.slice_rows(d, d + 1);
      backend_.copy(t.slice_rows(s, s + 1), to);
    }
  }
}

void CachePools::copy_page(int32_t src, int32_t dst) {
  K3_CHECK(valid_page(src) && valid_page(dst) && src != dst,
           "copy_page " + std::to_string(src) + " -> " + std::to_string(dst) + ": bad page ids");
  for (auto& [layer, t] : mla_kv_) {
    Tensor d = t.slice_rows(dst, dst + 1);
    backend_.copy(t.slice_rows(src, src + 1), d);
  }
}

void CachePools::retain_page(int32_t page) {
  K3_CHECK(valid_page(page) && page_refs_[page] > 0,
           "retain_page " + std::to_string(page) + ": page is not allocated");
  ++page_refs_[page];
}

void CachePools::release_page(int32_t page) {
  K3_CHECK(valid_page(page) && page_refs_[page] > 0,
           "release_page " + std::to_string(page) + ": page has no owner");
  if (--page_refs_[page] > 0) return;
  if (!region_pages()) return pages_.free(page);
  region_->free({UnifiedPool::Kind::Page, static_cast<uint32_t>(page_block_[size_t(page)])});
  page_block_[size_t(page)] = -1;
  --pages_live_;
}

uint64_t CachePools::slot_bytes() const {
  uint64_t b = 0;
  for (auto* pools : {&kda_conv_, &kda_state_})
    for (const auto& [layer, t] : *pools) b += t.nbytes() / static_cast<uint64_t>(t.dim(0));
  return b;
}

uint64_t CachePools::page_bytes() const {
  uint64_t b = 0;
  for (const auto& [layer, t] : mla_kv_) b += t.nbytes() / static_cast<uint64_t>(t.dim(0));
  return b;
}

}  // namespace k3
