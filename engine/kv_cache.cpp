#include "engine/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace k3 {

IdAllocator::IdAllocator(int count) : capacity_(count), in_use_(count, 0) {
  for (int i = count - 1; i >= 0; --i) free_.push_back(i);
}

std::optional<int> IdAllocator::alloc() {
  if (free_.empty()) return std::nullopt;
  int id = free_.back();
  free_.pop_back();
  in_use_[id] = 1;
  return id;
}

void IdAllocator::free(int id) {
  K3_CHECK(id >= 0 && id < capacity_ && in_use_[id], "IdAllocator::free of id " + std::to_string(id) + " not in use");
  in_use_[id] = 0;
  free_.push_back(id);
}

Result<CacheLayout> cache_layout(const ModelConfig& cfg, const Backend& backend) {
  return CacheLayout::from_config(cfg, {.kv = backend.compute_dtype(), .conv = backend.compute_dtype(), .state = DType::F32});
}

CachePools::CachePools(Backend& backend, const ModelConfig& cfg, int layer_begin, int layer_end, const CacheOptions& opts)
    : backend_(backend), cfg_(cfg), layout_(cache_layout(cfg, backend).value()), opts_(opts),
      slots_(opts.max_seqs + opts.checkpoint_slots), pages_(opts.num_pages), page_refs_(opts.num_pages, 0),
      slot_refs_(opts.max_seqs + opts.checkpoint_slots, 0) {
  K3_CHECK(opts.checkpoint_slots >= 0, "CacheOptions.checkpoint_slots must be >= 0");
  const int total_slots = opts.max_seqs + opts.checkpoint_slots;
  const CacheLayout& c = layout_;
  const int64_t rows = c.kda_conv_rows, p = c.kda_proj_dim(), h = c.kda_heads, d = c.kda_head_dim;
  const CacheMemory* mem = opts.memory.get();
  // A pool in the owner's memory when given (checked: every layer has its array), else the backend's.
  auto place = [&](const std::map<int, void*>* arrays, int layer, Shape shape, DType dtype, const char* what) {
    if (!mem) return backend.alloc(shape, dtype);
    auto it = arrays->find(layer);
    K3_CHECK(it != arrays->end() && it->second != nullptr,
             std::string("CacheOptions.memory has no ") + what + " array for layer " + std::to_string(layer));
    return Tensor::view(it->second, std::move(shape), dtype, mem->device);
  };
  for (int l = layer_begin; l < layer_end; ++l) {
    if (c.layers.at(l) == LayerCache::Kda) {
      kda_conv_[l] = place(mem ? &mem->kda_conv : nullptr, l, {total_slots, rows, 3 * p}, c.dtypes.conv, "KDA conv");
      kda_state_[l] = place(mem ? &mem->kda_state : nullptr, l, {total_slots, h, d, d}, c.dtypes.state, "KDA state");
    } else {
      mla_kv_[l] = place(mem ? &mem->mla_kv : nullptr, l, {opts.num_pages, opts.page_size, c.mla_row_width}, c.dtypes.kv, "MLA");
    }
  }
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
      Tensor row = t.slice_rows(seq.slot, seq.slot + 1);
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
  if (more > pages_.free_count())
    return Status(Code::ResourceExhausted, "out of MLA pages: need " + std::to_string(more) + ", free " +
                                               std::to_string(pages_.free_count()));
  auto pages = alloc_pages(static_cast<int>(more));
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
    if (page < 0 || page >= opts_.num_pages || page_refs_[page] == 0)
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
  if (partial && pages_.free_count() == 0)
    return Status(Code::ResourceExhausted, "fork: out of MLA pages for the copy of the last partial page");
  auto slot = alloc_slot();
  if (!slot) return Status(Code::ResourceExhausted, "fork: no free sequence slot (max_seqs=" + std::to_string(opts_.max_seqs) + ")");
  SeqCache seq;
  seq.slot = *slot;
  copy_slot(src.slot, seq.slot);
  const int64_t shared = partial ? used - 1 : used;
  for (int64_t i = 0; i < shared; ++i) {
    retain_page(src.pages[i]);
    seq.pages.push_back(src.pages[i]);
  }
  if (partial) {
    const int32_t page = alloc_pages(1)->at(0);
    copy_page(src.pages[used - 1], page);
    seq.pages.push_back(page);
  }
  seq.num_tokens = src.num_tokens;
  return seq;
}

std::optional<int> CachePools::alloc_slot() {
  auto slot = slots_.alloc();
  if (slot) slot_refs_[*slot] = 1;
  return slot;
}

void CachePools::free_slot(int slot) {
  K3_CHECK(slot >= 0 && slot < slots_.capacity() && slot_refs_[slot] > 0,
           "free_slot " + std::to_string(slot) + ": slot has no owner");
  if (--slot_refs_[slot] == 0) slots_.free(slot);
}

std::optional<std::vector<int32_t>> CachePools::alloc_pages(int n) {
  if (n < 0 || n > pages_.free_count()) return std::nullopt;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int page = *pages_.alloc();
    page_refs_[page] = 1;
    out.push_back(page);
  }
  return out;
}

void CachePools::copy_slot(int src, int dst) {
  K3_CHECK(src >= 0 && dst >= 0 && src < slots_.capacity() && dst < slots_.capacity() && src != dst,
           "copy_slot " + std::to_string(src) + " -> " + std::to_string(dst) + ": bad slot ids");
  for (auto* pools : {&kda_conv_, &kda_state_})
    for (auto& [layer, t] : *pools) {
      Tensor d = t.slice_rows(dst, dst + 1);
      backend_.copy(t.slice_rows(src, src + 1), d);
    }
}

void CachePools::copy_page(int32_t src, int32_t dst) {
  K3_CHECK(src >= 0 && dst >= 0 && src < opts_.num_pages && dst < opts_.num_pages && src != dst,
           "copy_page " + std::to_string(src) + " -> " + std::to_string(dst) + ": bad page ids");
  for (auto& [layer, t] : mla_kv_) {
    Tensor d = t.slice_rows(dst, dst + 1);
    backend_.copy(t.slice_rows(src, src + 1), d);
  }
}

void CachePools::retain_page(int32_t page) {
  K3_CHECK(page >= 0 && page < opts_.num_pages && page_refs_[page] > 0,
           "retain_page " + std::to_string(page) + ": page is not allocated");
  ++page_refs_[page];
}

void CachePools::release_page(int32_t page) {
  K3_CHECK(page >= 0 && page < opts_.num_pages && page_refs_[page] > 0,
           "release_page " + std::to_string(page) + ": page has no owner");
  if (--page_refs_[page] == 0) pages_.free(page);
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
