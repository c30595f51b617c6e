// The MLA decode rows of `k3-bench kernels` (mla_decode_rows.h).
#include "bench/mla_decode_rows.h"
#ifdef K3_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace k3::bench {

using cuda::CudaBackend;

void mla_decode_case(CudaBackend& be, int64_t B, int64_t H, int64_t ctx, bool quick, std::vector<Line>& lines,
                     const MlaVariant& v) {
  const int64_t R = 512, Dr = 64, page = 64, pages_per = ctx / page, num_pages = B * pages_per;
  Tensor kv = be.alloc({num_pages, page, R + Dr}, DType::BF16);
  Tensor q_lat = be.alloc({B, H, R}, DType::BF16), q_rope = be.alloc({B, H, Dr}, DType::BF16);
  Tensor o = be.alloc({B, H, R}, DType::BF16), lse = be.alloc({B, H}, DType::F32);
  fill(be, kv, -1.f, 1.f, 30);
  fill(be, q_lat, -0.2f, 0.2f, 31);
  fill(be, q_rope, -0.2f, 0.2f, 32);
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(33));
  if (v.hot_pages > 0)
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = perm[i % size_t(v.hot_pages)];
  Tensor table = be.from_host(Tensor::from_i32({B, pages_per}, perm), DType::I32);
  Tensor lens = dev_ints(be, std::vector<int32_t>(B, int32_t(ctx)));
  const float scale = 1.f / std::sqrt(192.f);
  const bool was = be.mla_decode_wgmma(), was_split = be.mla_decode_split_s();
  const int was_pf = be.mla_decode_l2_prefetch(), was_t32 = be.mla_decode_t32();
  const bool was_tma = be.mla_decode_tma(), was_lazy = be.mla_decode_lazy_rescale(), was_seesaw = be.mla_decode_seesaw();
  const bool was_cluster = be.mla_decode_cluster();
  const int was_halves = be.mla_decode_seesaw_halves(), was_t48 = be.mla_decode_t48();
  const bool was_roles = be.mla_decode_roles();
  const bool was_invariant = be.batch_invariant();
  const int was_splits = be.mla_decode_splits(), was_invariant_split = be.mla_decode_invariant_split();
  be.set_batch_invariant(v.invariant);
  if (v.invariant_split > 0) be.set_mla_decode_invariant_split(v.invariant_split);
  be.set_mla_decode_splits(v.splits);
  be.set_mla_decode_seesaw(v.seesaw);
  be.set_mla_decode_seesaw_halves(v.halves);
  be.set_mla_decode_cluster(v.cluster);
  be.set_mla_decode_tma(v.tma);
  be.set_mla_decode_lazy_rescale(v.lazy);
  be.set_mla_decode_wgmma(v.wgmma);
  be.set_mla_decode_split_s(v.split_s);
  be.set_mla_decode_t32(v.t32);
  be.set_mla_decode_t48(v.t48);
  be.set_mla_decode_roles(v.roles);
  if (v.l2_prefetch >= 0) be.set_mla_decode_l2_prefetch(v.l2_prefetch);
  const double us = time_graphs(be.stream(), quick ? 50 : 200, {[&] {
    be.mla_decode({.q_lat = q_lat, .q_rope = q_rope, .kv_cache = kv, .block_table = table, .seq_lens = lens, .o = o,
                   .lse = lse, .scale = scale});
  }});
  be.set_mla_decode_wgmma(was);
  be.set_mla_decode_split_s(was_split);
  be.set_mla_decode_l2_prefetch(was_pf);
  be.set_mla_decode_tma(was_tma);
  be.set_mla_decode_lazy_rescale(was_lazy);
  be.set_mla_decode_t32(was_t32);
  be.set_mla_decode_seesaw(was_seesaw);
  be.set_mla_decode_cluster(was_cluster);
  be.set_mla_decode_seesaw_halves(was_halves);
  be.set_mla_decode_t48(was_t48);
  be.set_mla_decode_roles(was_roles);
  be.set_batch_invariant(was_invariant);
  be.set_mla_decode_splits(was_splits);
  be.set_mla_decode_invariant_split(was_invariant_split);
  Line l{.name = "mla_decode_H" + std::to_string(H) + "_B" + std::to_string(B) + "_ctx" + std::to_string(ctx) +
                 v.suffix(H),
         .us = us};
  l.bytes = double(B) * ctx * (R + Dr) * 2 + double(B) * H * (R + Dr) * 2 + double(B) * H * R * 2 + double(B) * H * 4;
  l.flops = 2.0 * B * H * ctx * (R + Dr + R);
  // FlashMLA takes 64 or 128 heads: 128 for our 96-head rows (as a user of it pads K3's 96), 64 for 64.
  const std::string shape = "_B" + std::to_string(B) + "_ctx" + std::to_string(ctx);
  if (H == 64 || H == 96) l.refs.push_back({"FlashMLA " + std::to_string(H == 64 ? 64 : 128) + " heads",
                                            "flashmla_H" + std::to_string(H == 64 ? 64 : 128) + shape});
  l.refs.push_back({"torch einsum+softmax", "mla_decode_H" + std::to_string(H) + shape});
  lines.push_back(l);
}

}  // namespace k3::bench
#endif  // K3_HAVE_CUDA
