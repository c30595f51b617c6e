#include "engine/cache_region.h"

#include <string>

namespace k3 {

namespace {

UnifiedRegionLayout checked_layout(const CacheLayout& cache, uint32_t begin, uint32_t end, uint32_t page_size,
                                   uint64_t region_bytes) {
  auto u = UnifiedRegionLayout::make(cache, begin, end, page_size, region_bytes);
  K3_CHECK(u.is_ok(), u.status().message());
  return std::move(u).value();
}

// A range without one of the kinds still gives the pool a block size; no block of it is ever taken.
UnifiedPoolOptions pool_options(const UnifiedRegionLayout& u) {
  return {.region_bytes = u.region_bytes,
          .slot_bytes = u.has_kda() ? u.slot_block_bytes : u.region_bytes,
          .page_bytes = u.has_mla() ? u.page_block_bytes : u.region_bytes};
}

}  // namespace

CacheRegion::CacheRegion(Backend& backend, const CacheLayout& cache, uint32_t layer_begin, uint32_t layer_end,
                         uint32_t page_size, uint64_t region_bytes)
    : backend_(backend),
      layout_(checked_layout(cache, layer_begin, layer_end, page_size, region_bytes)),
      region_(backend.alloc({static_cast<int64_t>(layout_.region_bytes)}, DType::U8)),
      pool_(pool_options(layout_), [this](uint64_t from, uint64_t to, uint64_t n) { move(from, to, n); }) {
  auto* base = static_cast<uint8_t*>(region_.data());
  const int64_t h = cache.kda_heads, d = cache.kda_head_dim, rows = cache.kda_conv_rows, p = cache.kda_proj_dim();
  auto view = [&](uint64_t off, Shape shape, DType dt) {
    return Tensor::view(base + off, std::move(shape), dt, region_.device(), region_.owner());
  };
  for (const auto& [l, off] : layout_.state_offset)
    states_[l] = view(off, {layout_.state_rows(l), h, d, d}, cache.dtypes.state);
  for (const auto& [l, off] : layout_.conv_offset)
    convs_[l] = view(off, {layout_.conv_rows(l), rows, 3 * p}, cache.dtypes.conv);
  for (const auto& [l, off] : layout_.page_offset)
    pages_[l] = view(off, {layout_.page_rows(l), int64_t(page_size), int64_t(cache.mla_row_width)}, cache.dtypes.kv);
  // The views' row sizes must be the layout's entry sizes (element counts and dtypes agree).
  for (const auto& [l, t] : states_)
    K3_CHECK(t.nbytes() / t.dim(0) == layout_.state_bytes, "CacheRegion: KDA state shape disagrees with the cache layout");
  for (const auto& [l, t] : convs_)
    K3_CHECK(t.nbytes() / t.dim(0) == layout_.conv_bytes, "CacheRegion: KDA conv shape disagrees with the cache layout");
  for (const auto& [l, t] : pages_)
    K3_CHECK(t.nbytes() / t.dim(0) == layout_.page_bytes, "CacheRegion: MLA page shape disagrees with the cache layout");
}

Tensor& CacheRegion::at(std::map<uint32_t, Tensor>& views, uint32_t layer, const char* what) {
  auto it = views.find(layer);
  K3_CHECK(it != views.end(), std::string("CacheRegion: no ") + what + " view for layer " + std::to_string(layer));
  return it->second;
}

// Blocks of one kind are equal and never overlap, so a plain copy is safe.
void CacheRegion::move(uint64_t from, uint64_t to, uint64_t n) {
  auto* base = static_cast<uint8_t*>(region_.data());
  const Tensor src = Tensor::view(base + from, {int64_t(n)}, DType::U8, region_.device());
  Tensor dst = Tensor::view(base + to, {int64_t(n)}, DType::U8, region_.device());
  backend_.copy(src, dst);
}

}  // namespace k3
