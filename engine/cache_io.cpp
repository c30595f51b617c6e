#include "engine/cache_io.h"

namespace k3 {
namespace {

// Calls `mla(layer, pool, offset)` / `kda(layer, conv, state, entry)` for every layer of the packed image
// of [begin, end); the pools' row and slot sizes are the layout's (checked: one definition of the bytes).
template <class MlaFn, class KdaFn>
void walk(CachePools& pools, int begin, int end, int64_t num_tokens, MlaFn mla, KdaFn kda) {
  const CacheLayout& layout = pools.layout();
  const PackedImage img = layout.pack_range(begin, end, static_cast<uint64_t>(num_tokens));
  for (const auto& [l, e] : img.layers) {
    if (layout.layers.at(l) == LayerCache::Kda) {
      Tensor& conv = pools.kda_conv(l);
      Tensor& state = pools.kda_state(l);
      K3_CHECK(conv.nbytes() / conv.dim(0) == layout.kda_conv_bytes() && state.nbytes() / state.dim(0) == layout.kda_state_bytes(),
               "KDA pools of layer " + std::to_string(l) + " disagree with the cache layout");
      kda(l, conv, state, e);
    } else {
      Tensor& pool = pools.mla_kv(l);
      K3_CHECK(pool.nbytes() / (pool.dim(0) * pool.dim(1)) == layout.mla_row_bytes,
               "MLA pool of layer " + std::to_string(l) + " disagrees with the cache layout");
      mla(l, pool, e.rows);
    }
  }
}

// The pool rows of a sequence's token positions [begin, end).
std::vector<int32_t> rows_of(const SeqCache& seq, int64_t begin, int64_t end, int page_size) {
  std::vector<int32_t> ids;
  for (int64_t p = begin; p < end; ++p) ids.push_back(static_cast<int32_t>(CacheLayout::paged_row(seq.pages, page_size, p)));
  return ids;
}

// Copies a backend tensor's bytes, unconverted, into `n` bytes at `dst`: straight from the device, with no
// widening to F32 and back (that round trip cost a chunk's export tens of ms on a GPU). `dst` is host
// memory, or device memory on a device backend (a GPU stage's source image): the CUDA backend's copy goes
// by the pointers (cudaMemcpyDefault), so the view's device tag does not matter.
void copy_out(Backend& backend, const Tensor& t, uint8_t* dst, uint64_t n) {
  K3_CHECK(t.nbytes() == n, "cache export: " + std::to_string(t.nbytes()) + " bytes where the layout has " + std::to_string(n));
  Tensor view = Tensor::view(dst, t.shape(), t.dtype());
  backend.copy(t, view);
}

}  // namespace

uint64_t packed_cache_bytes(const ModelConfig& cfg, const CachePools& pools, int begin, int end, int64_t num_tokens) {
  return pools.layout().pack_range(begin, end, static_cast<uint64_t>(num_tokens)).total_bytes;
}

void export_caches(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end, std::vector<uint8_t>& out) {
  out.resize(packed_cache_bytes(pools.config(), pools, begin, end, seq.num_tokens));
  export_cache_part(backend, pools, seq, begin, end, seq.num_tokens, 0, seq.num_tokens, true, out.data());
}

void export_cache_part(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end,
                       int64_t image_tokens, int64_t row_begin, int64_t row_end, bool states, uint8_t* image) {
  K3_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= image_tokens && row_end <= seq.num_tokens,
           "cache export: rows [" + std::to_string(row_begin) + ", " + std::to_string(row_end) + ") outside the image or sequence");
  const CacheLayout& layout = pools.layout();
  const int ps = pools.options().page_size;
  const auto ids = rows_of(seq, row_begin, row_end, ps);
  // The slot stays where it is while its state is read (a page reservation on another thread may
  // compact the region).
  const auto held = states && pools.has_kda() && seq.slot >= 0 ? pools.hold_rows(seq.slot) : CachePools::HeldRows{};
  walk(pools, begin, end, image_tokens,
       [&](int, Tensor& pool, uint64_t off) {
         const int64_t w = pool.dim(2), n = static_cast<int64_t>(ids.size());
         if (n == 0) return;
         Tensor rows = backend.alloc({n, w}, pool.dtype());
         backend.embedding({.table = pool.reshape({pool.dim(0) * pool.dim(1), w}),
                            .ids = backend.from_host(Tensor::from_i32({n}, ids), DType::I32), .y = rows});
         const uint64_t row_bytes = rows.nbytes() / static_cast<uint64_t>(n);
         copy_out(backend, rows, image + off + static_cast<uint64_t>(row_begin) * row_bytes, rows.nbytes());
       },
       [&](int, Tensor& conv, Tensor& state, const PackedEntry& e) {
         if (!states) return;
         const int32_t cr = held.conv, sr = held.state;
         copy_out(backend, conv.slice_rows(cr, cr + 1), image + e.conv, layout.kda_conv_bytes());
         copy_out(backend, state.slice_rows(sr, sr + 1), image + e.state, layout.kda_state_bytes());
       });
  // The copies above are asynchronous on a device backend; the image is read once this returns.
  backend.synchronize();
}

Status import_caches(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end,
                     int64_t num_tokens, const uint8_t* data, uint64_t size) {
  const uint64_t need = packed_cache_bytes(pools.config(), pools, begin, end, num_tokens);
  if (size != need)
    return invalid_argument("cache image has " + std::to_string(size) + " bytes, expected " + std::to_string(need));
  const int ps = pools.options().page_size;
  if (static_cast<int64_t>(seq.pages.size()) * ps < num_tokens) return invalid_argument("sequence has too few pages");
  const auto ids = rows_of(seq, 0, num_tokens, ps);
  // The slot stays where it is while its bytes land (a caller may import on another thread than the
  // steps whose page reservations move slots).
  const auto held = pools.has_kda() && seq.slot >= 0 ? pools.hold_rows(seq.slot) : CachePools::HeldRows{};
  const Tensor pool_rows = backend.from_host(Tensor::from_i32({num_tokens}, ids), DType::I32);  // every MLA layer's
  walk(pools, begin, end, num_tokens,
       [&](int, Tensor& pool, uint64_t off) {
         const int64_t w = pool.dim(2);
         Tensor rows = Tensor::view(const_cast<uint8_t*>(data + off), {num_tokens, w}, pool.dtype());
         Tensor dev_rows = backend.from_host(rows, pool.dtype());
         Tensor flat = pool.reshape({pool.dim(0) * pool.dim(1), w});
         backend.scatter_rows({.src = dev_rows, .ids = pool_rows, .dst = flat});
       },
       [&](int, Tensor& conv, Tensor& state, const PackedEntry& e) {
         const int32_t cr = held.conv, sr = held.state;
         Tensor c_dst = conv.slice_rows(cr, cr + 1), s_dst = state.slice_rows(sr, sr + 1);
         Tensor c = Tensor::view(const_cast<uint8_t*>(data + e.conv), c_dst.shape(), c_dst.dtype());
         Tensor s = Tensor::view(const_cast<uint8_t*>(data + e.state), s_dst.shape(), s_dst.dtype());
         backend.copy(backend.from_host(c, c.dtype()), c_dst);
         backend.copy(backend.from_host(s, s.dtype()), s_dst);
       });
  return Status::ok();
}

Status import_caches_from(Backend& backend, CachePools& pools, const SeqCache& seq, int begin, int end,
                          int64_t num_tokens, const CacheTables& src) {
  const int ps = pools.options().page_size;
  if (static_cast<int64_t>(seq.pages.size()) * ps < num_tokens) return invalid_argument("sequence has too few pages");
  if (static_cast<int64_t>(src.rows.size()) < num_tokens)
    return invalid_argument("cache tables name " + std::to_string(src.rows.size()) + " rows for " +
                            std::to_string(num_tokens) + " tokens");
  for (int64_t p = 0; p < num_tokens; ++p)
    if (src.rows[static_cast<size_t>(p)] < 0 || src.rows[static_cast<size_t>(p)] >= src.table_rows)
      return Status(Code::OutOfRange, "cache tables: token " + std::to_string(p) + "'s row " +
                                          std::to_string(src.rows[static_cast<size_t>(p)]) + " is outside the " +
                                          std::to_string(src.table_rows) + " rows of a table");
  const auto ids = rows_of(seq, 0, num_tokens, ps);
  const auto held = pools.has_kda() && seq.slot >= 0 ? pools.hold_rows(seq.slot) : CachePools::HeldRows{};
  // Views of the tables are read in place: they must be where the pools are.
  bool same_device = true;
  walk(pools, begin, end, num_tokens, [&](int, Tensor& pool, uint64_t) { same_device &= pool.device() == src.device; },
       [&](int, Tensor& conv, Tensor&, const PackedEntry&) { same_device &= conv.device() == src.device; });
  if (!same_device)
    return invalid_argument("cache tables in another memory than the pools (host bytes for device caches, or the reverse)");
  // The row ids are every MLA layer's: on the backend once.
  const std::vector<int32_t> from(src.rows.begin(), src.rows.begin() + num_tokens);
  const Tensor table_rows = backend.from_host(Tensor::from_i32({num_tokens}, from), DType::I32);
  const Tensor pool_rows = backend.from_host(Tensor::from_i32({num_tokens}, ids), DType::I32);
  walk(pools, begin, end, num_tokens,
       [&](int l, Tensor& pool, uint64_t) {
         if (num_tokens == 0) return;
         const int64_t w = pool.dim(2);
         Tensor table = Tensor::view(src.mla_table(l), {src.table_rows, w}, pool.dtype(), src.device);
         Tensor rows = backend.alloc({num_tokens, w}, pool.dtype());
         backend.embedding({.table = table, .ids = table_rows, .y = rows});
         Tensor flat = pool.reshape({pool.dim(0) * pool.dim(1), w});
         backend.scatter_rows({.src = rows, .ids = pool_rows, .dst = flat});
       },
       [&](int l, Tensor& conv, Tensor& state, const PackedEntry&) {
         const auto [c_src, s_src] = src.kda_entries(l);
         Tensor c_dst = conv.slice_rows(held.conv, held.conv + 1), s_dst = state.slice_rows(held.state, held.state + 1);
         backend.copy(Tensor::view(c_src, c_dst.shape(), c_dst.dtype(), src.device), c_dst);
         backend.copy(Tensor::view(s_src, s_dst.shape(), s_dst.dtype(), src.device), s_dst);
       });
  // The gathers above read the tables asynchronously on a device backend: done before the caller frees them.
  backend.synchronize();
  return Status::ok();
}

}  // namespace k3
