// The attention of one DCP rank (engine/rank_model.h): KDA over the rank's heads; MLA over the rank's
// cached tokens with the replicated query, partials merged by heads. Mirrors Model::kda_layer and
// Model::mla_layer's decode paths op for op, so that each head's numbers are the monolithic ones.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/kda_heads.h"
#include "engine/rank_step.h"

namespace k3::rank {

Tensor Step::gemm(const Tensor& x, const Tensor& w) {
  Tensor y = alloc({x.dim(0), w.dim(0)});
  be.gemm({.x = x, .w = w, .y = y});
  return y;
}

Tensor Step::rmsnorm(const Tensor& x, const Tensor& w, float eps) {
  Tensor y = alloc(x.shape());
  be.rmsnorm({.x = x, .w = w, .y = y, .eps = eps});
  return y;
}

Result<Tensor> gather_heads(Step& s, const Tensor& mine) {
  const int n = s.g.dcp;
  if (n == 1) return mine;
  const int64_t R = mine.dim(0), c = mine.dim(1);
  Tensor all = s.alloc({n * R, c}, mine.dtype());  // rank q's [R, c] block at rows q R ..
  K3_TRY(s.all_gather(mine, all));
  Tensor out = s.alloc({R, n * c}, mine.dtype());
  for (int q = 0; q < n; ++q)
    s.be.copy_cols({.src = all.slice_rows(q * R, (q + 1) * R), .dst = out, .dst_col = q * c, .ncols = c});
  return out;
}

Result<Tensor> kda_heads(Step& s, int l, const LayerWeights& lw, std::span<const RankItem> batch, const Tensor& x,
                         CachePools& caches) {
  const int64_t R = x.dim(0), D = s.cfg.kda.head_dim, Hl = s.cfg.kda.num_heads / s.g.dcp, Pl = Hl * D;
  const int n = static_cast<int>(batch.size());
  Tensor qkv = s.gemm(x, lw.w_qkv);                  // [R, 3 Pl]
  Tensor f = s.gemm(s.gemm(x, lw.w_fa), lw.w_fb);    // [R, Pl]
  Tensor blog = s.gemm(x, lw.w_b);                   // [R, Hl]
  Tensor o = s.alloc({R, Hl, D});
  std::vector<int32_t> state_rows, conv_rows;   // a unified region lays the two out at different strides
  for (const RankItem& it : batch) {
    state_rows.push_back(caches.state_row(it.seq->slot));
    conv_rows.push_back(caches.conv_row(it.seq->slot));
  }
  // The model's own step for these heads: one token per item after its prompt.
  run_kda_heads(s.be, {.cfg = s.cfg, .lw = lw, .heads = Hl, .qkv = qkv, .f = f, .blog = blog,
                       .conv_cache = caches.kda_conv(l), .state = caches.kda_state(l),
                       .slots = s.be.from_host(Tensor::from_i32({n}, state_rows), DType::I32),
                       .conv_slots = s.be.from_host(Tensor::from_i32({n}, conv_rows), DType::I32),
                       .single_token_decode = true, .o = o,
                       .alloc = [&s](Shape sh, DType t) { return s.alloc(std::move(sh), t); }});
  Tensor on = s.rmsnorm(o.reshape({R * Hl, D}), lw.o_norm, s.cfg.rms_norm_eps).reshape({R, Pl});
  Tensor z = s.gemm(x, lw.w_g);
  Tensor gated = s.alloc({R, Pl});
  s.be.sigmoid_mul({.x = on, .gate = z, .y = gated});
  return gather_heads(s, gated);
}

namespace {

// Rows `ids` of a 2-D table, [ids.size(), cols].
Tensor take(Step& s, const Tensor& table, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  Tensor y = s.alloc({n, table.dim(1)});
  s.be.embedding({.table = table, .ids = s.be.from_host(Tensor::from_i32({n}, ids), DType::I32), .y = y});
  return y;
}

}  // namespace

Result<Tensor> mla_heads(Step& s, int l, const LayerWeights& lw, std::span<const RankItem> batch, const Tensor& x,
                         CachePools& caches) {
  const ModelConfig& cfg = s.cfg;
  const int64_t B = x.dim(0), H = cfg.num_attention_heads, dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim,
                dv = cfg.v_head_dim, r = cfg.kv_lora_rank, dqk = dn + dr, W = r + dr;
  const int N = s.g.dcp, V = s.g.kv_partitions, Vr = V / N;
  const int64_t Hm = H / N;
  const float scale = 1.f / std::sqrt(static_cast<float>(dqk));
  const int64_t page_size = caches.options().page_size;

  Tensor q = s.gemm(s.rmsnorm(s.gemm(x, lw.w_qa), lw.qa_norm, 1e-6f), lw.w_qb);  // [B, H*dqk]
  Tensor a = s.gemm(x, lw.w_kva);                                               // [B, r + dr]
  Tensor c = s.alloc({B, r});
  s.be.copy_cols({.src = a, .dst = c, .src_col = 0, .ncols = r});
  Tensor cn = s.rmsnorm(c, lw.kva_norm, 1e-6f);
  s.be.copy_cols({.src = cn, .dst = a, .dst_col = 0});

  // The new rows go to the ranks that own their positions (local row position / N).
  Tensor& pool = caches.mla_kv(l);
  Tensor pool_rows = pool.reshape({pool.dim(0) * pool.dim(1), W});
  std::vector<int32_t> src_rows, dst_rows;
  for (int64_t b = 0; b < B; ++b) {
    const RankItem& it = batch[b];
    if (!dcp_owns(s.g, it.position)) continue;
    const int64_t local = it.position / N;
    src_rows.push_back(static_cast<int32_t>(b));
    dst_rows.push_back(static_cast<int32_t>(CacheLayout::paged_row(it.seq->pages, page_size, local)));
  }
  if (!src_rows.empty()) {
    const int64_t m = static_cast<int64_t>(src_rows.size());
    s.be.scatter_rows({.src = take(s, a, src_rows),
                       .ids = s.be.from_host(Tensor::from_i32({m}, dst_rows), DType::I32), .dst = pool_rows});
  }

  // The absorbed query, replicated on every rank.
  Tensor qv = q.reshape({B * H, dqk});
  Tensor qn = s.alloc({B * H, dn}), qr = s.alloc({B * H, dr});
  s.be.copy_cols({.src = qv, .dst = qn, .src_col = 0, .ncols = dn});
  s.be.copy_cols({.src = qv, .dst = qr, .src_col = dn, .ncols = dr});
  Tensor qlat = s.alloc({B, H, r});
  s.be.head_gemm({.x = qn.reshape({B, H, dn}), .w = lw.w_uk_t, .y = qlat});

  // One attention entry per (item, owned partition j): partition v = rank + N*j holds the tokens
  // p = v, v + V, ... of the request, at local rows p / N, read through a page_size-1 view of the pool.
  const int64_t E = B * Vr;
  std::vector<int32_t> rep(E), lens(E);
  std::vector<std::vector<int32_t>> rows(E);
  size_t max_len = 1;
  for (int64_t b = 0; b < B; ++b) {
    const RankItem& it = batch[b];
    for (int j = 0; j < Vr; ++j) {
      const int64_t e = b * Vr + j, v = s.g.dcp_rank() + static_cast<int64_t>(N) * j;
      rep[e] = static_cast<int32_t>(b);
      for (int64_t p = v; p <= it.position; p += V)
        rows[e].push_back(static_cast<int32_t>(CacheLayout::paged_row(it.seq->pages, page_size, p / N)));
      lens[e] = static_cast<int32_t>(rows[e].size());
      max_len = std::max(max_len, rows[e].size());
    }
  }
  std::vector<int32_t> table(E * max_len, 0);
  for (int64_t e = 0; e < E; ++e) std::copy(rows[e].begin(), rows[e].end(), table.begin() + e * max_len);
  // The partials stay F32 until the merge (a GPU's compute dtype is bf16): the merged output then rounds
  // once, as the one-pass attention's does.
  Tensor part_o = s.alloc({E, H, r}, DType::F32);
  Tensor part_lse = s.alloc({E, H}, DType::F32);
  s.be.mla_decode({.q_lat = take(s, qlat.reshape({B, H * r}), rep).reshape({E, H, r}),
                   .q_rope = take(s, qr.reshape({B, H * dr}), rep).reshape({E, H, dr}),
                   .kv_cache = pool.reshape({pool.dim(0) * pool.dim(1), 1, W}),
                   .block_table = s.be.from_host(Tensor::from_i32({E, static_cast<int64_t>(max_len)}, table), DType::I32),
                   .seq_lens = s.be.from_host(Tensor::from_i32({E}, lens), DType::I32), .o = part_o, .lse = part_lse,
                   .scale = scale});

  // All-to-all by heads: rank q receives every rank's partials of its heads q*Hm .. (q+1)*Hm - 1 (block q
  // of the send buffers: rows e, columns of those heads); then the received row e = b*Vr + j of block q
  // is partition v = q + N*j of item b, and each rank merges V partitions in partition order.
  Tensor o_parts = s.alloc({V, B, Hm, r}, DType::F32);
  Tensor lse_parts = s.alloc({V, B, Hm}, DType::F32);
  {
    Tensor send_o = s.alloc({N * E, Hm * r}, DType::F32), send_l = s.alloc({N * E, Hm}, DType::F32);
    const Tensor po = part_o.reshape({E, H * r});
    for (int q = 0; q < N; ++q) {
      s.be.copy_cols({.src = po, .dst = send_o.slice_rows(q * E, (q + 1) * E), .src_col = q * Hm * r, .ncols = Hm * r});
      s.be.copy_cols({.src = part_lse, .dst = send_l.slice_rows(q * E, (q + 1) * E), .src_col = q * Hm, .ncols = Hm});
    }
    Tensor recv_o = send_o, recv_l = send_l;
    if (N > 1) {
      recv_o = s.alloc(send_o.shape(), DType::F32);
      recv_l = s.alloc(send_l.shape(), DType::F32);
      K3_TRY(s.all_to_all(send_o, recv_o));
      K3_TRY(s.all_to_all(send_l, recv_l));
    }
    std::vector<int32_t> to(N * E);  // received row -> (partition, item) row
    for (int q = 0; q < N; ++q)
      for (int64_t b = 0; b < B; ++b)
        for (int j = 0; j < Vr; ++j)
          to[q * E + b * Vr + j] = static_cast<int32_t>((q + static_cast<int64_t>(N) * j) * B + b);
    const Tensor ids = s.be.from_host(Tensor::from_i32({N * E}, to), DType::I32);
    s.be.scatter_rows({.src = recv_o, .ids = ids, .dst = o_parts.reshape({V * B, Hm * r})});
    s.be.scatter_rows({.src = recv_l, .ids = ids, .dst = lse_parts.reshape({V * B, Hm})});
  }
  Tensor olat = s.alloc({B, Hm, r});
  s.be.lse_merge({.o_parts = o_parts, .lse_parts = lse_parts, .o = olat, .lse = Tensor()});
  Tensor o = s.alloc({B, Hm, dv});
  s.be.head_gemm({.x = olat, .w = lw.w_uv, .y = o});
  Tensor gz = s.gemm(x, lw.w_g);
  Tensor gated = s.alloc({B, Hm * dv});
  s.be.sigmoid_mul({.x = o.reshape({B, Hm * dv}), .gate = gz, .y = gated});
  return gather_heads(s, gated);
}

}  // namespace k3::rank
