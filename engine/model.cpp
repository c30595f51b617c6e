#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "engine/kda_heads.h"
#include "engine/model_weights.h"

namespace k3 {
namespace {

// Row offsets of each item in the concatenated activations.
std::vector<int32_t> cu_seqlens(std::span<const BatchItem> batch) {
  std::vector<int32_t> cu{0};
  for (const BatchItem& it : batch) cu.push_back(cu.back() + static_cast<int32_t>(it.num_new));
  return cu;
}

ops::GluAct glu_act(const ModelConfig& cfg) { return cfg.uses_silu() ? ops::GluAct::Silu : ops::GluAct::Situ; }

bool all_single_token_decode(std::span<const BatchItem> batch) {
  for (const BatchItem& it : batch)
    if (it.num_new != 1 || it.seq->num_tokens == 0) return false;
  return !batch.empty();
}

// Flat cache row ids (page * page_size + offset) of positions [from, to) of a sequence.
std::vector<int32_t> cache_rows(const SeqCache& seq, int64_t from, int64_t to, int page_size) {
  std::vector<int32_t> ids;
  ids.reserve(to - from);
  for (int64_t pos = from; pos < to; ++pos) {
    const size_t page = static_cast<size_t>(pos / page_size);
    K3_CHECK(page < seq.pages.size(), "MLA cache has no page for position " + std::to_string(pos) +
                                          " (CachePools::reserve was not called)");
    ids.push_back(static_cast<int32_t>(CacheLayout::paged_row(seq.pages, page_size, pos)));
  }
  return ids;
}

}  // namespace

Model::Model(Backend& backend, const ModelConfig& cfg, int begin, int end)
    : backend_(backend), cfg_(cfg), begin_(begin), end_(end) {}

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::create(Backend& backend, const ModelConfig& cfg, const WeightStore& weights,
                                             int layer_begin, int layer_end) {
  K3_TRY(validate(cfg));
  if (layer_end < 0) layer_end = cfg.num_hidden_layers;
  if (layer_begin < 0 || layer_begin >= layer_end || layer_end > cfg.num_hidden_layers)
    return invalid_argument("layer range [" + std::to_string(layer_begin) + ", " + std::to_string(layer_end) +
                            ") is not inside [0, " + std::to_string(cfg.num_hidden_layers) + ")");
  std::unique_ptr<Model> m(new Model(backend, cfg, layer_begin, layer_end));
  K3_ASSIGN_OR_RETURN(m->w_, upload_weights(backend, cfg, weights, layer_begin, layer_end));
  return m;
}

Tensor Model::alloc(Shape shape, DType dtype) { return ws_ ? ws_->take(shape, dtype) : backend_.alloc(shape, dtype); }
Tensor Model::alloc(Shape shape) { return alloc(std::move(shape), backend_.compute_dtype()); }

Tensor Model::gemm(const Tensor& x, const Tensor& w) {
  Tensor y = alloc({x.dim(0), w.dim(0)});
  backend_.gemm({.x = x, .w = w, .y = y});
  return y;
}

Tensor Model::rmsnorm(const Tensor& x, const Tensor& w, float eps) {
  Tensor y = alloc(x.shape());
  backend_.rmsnorm({.x = x, .w = w, .y = y, .eps = eps});
  return y;
}

Tensor Model::attn_res_mix(const Tensor& query, const Activations& act) {
  std::vector<Tensor> cands = act.bank;
  cands.push_back(act.partial);
  Tensor y = alloc(act.partial.shape());
  backend_.attnres_mix({.candidates = cands, .query = query, .y = y, .eps = cfg_.rms_norm_eps});
  return y;
}

Activations Model::embed(std::span<const int32_t> token_ids) {
  K3_CHECK(begin_ == 0, "embed() on a model range that does not start at layer 0");
  phase(LayerPhase::Rest);
  const int64_t n = static_cast<int64_t>(token_ids.size());
  for (int32_t id : token_ids)
    K3_CHECK(id >= 0 && id < cfg_.vocab_size, "token id " + std::to_string(id) + " outside the vocabulary [0, " +
                                                  std::to_string(cfg_.vocab_size) + ")");
  K3_CHECK(!index_ || index_->token_ids.numel() == n, "embed: the step index holds another number of tokens");
  Tensor ids = index_ ? index_->token_ids : backend_.from_host(Tensor::from_i32({n}, token_ids), DType::I32);
  Activations act;
  act.partial = alloc({n, cfg_.hidden_size});
  backend_.embedding({.table = w_->embed, .ids = ids, .y = act.partial});
  return act;
}

void Model::forward(std::span<const BatchItem> batch, Activations& act, CachePools& caches,
                    const std::function<void()>& progress) {
  const auto report_progress = [&] {
    if (!progress) return;
    // An asynchronous backend would run the callback when the work is queued, not done: wait for it so
    // the callback keeps pace with the GPU (two syncs a layer cost little beside a long chunk).
    backend_.synchronize();
    progress();
  };
  int64_t rows = 0;
  for (const BatchItem& it : batch) rows += it.num_new;
  K3_CHECK(rows == act.rows(), "forward: batch has " + std::to_string(rows) + " new tokens but the activations " +
                                   std::to_string(act.rows()) + " rows");
  const float eps = cfg_.rms_norm_eps;
  for (int l = begin_; l < end_; ++l) {
    const LayerWeights& lw = w_->layers[l - begin_];
    // AttnRes (docs/MODEL.md §4.2): mix before this layer's attention, then snapshot at block starts.
    // A plain residual stream (Kimi Linear) is the partial sum itself: no mix, no bank, no block starts.
    const bool attn_res = cfg_.uses_attn_res();
    Tensor h = !attn_res || act.bank.empty() ? act.partial : attn_res_mix(lw.att_query, act);
    const bool new_block = cfg_.starts_block(l);
    if (new_block) act.bank.push_back(act.partial);
    Tensor x = rmsnorm(h, lw.in_norm, eps);
    Tensor y = alloc({rows, cfg_.hidden_size});
    const bool kda = cfg_.layer_kind(l) == LayerKind::Kda;
    phase(kda ? LayerPhase::Kda : LayerPhase::Mla);
    if (kda) kda_layer(l, batch, x, y, caches);
    else mla_layer(l, batch, x, y, caches);
    phase(LayerPhase::Rest);
    report_progress();
    if (new_block) {
      act.partial = y;
    } else {
      backend_.add({.a = act.partial, .b = y, .y = act.partial});
    }
    Tensor h2 = attn_res ? attn_res_mix(lw.mlp_query, act) : act.partial;
    Tensor x2 = rmsnorm(h2, lw.post_norm, eps);
    Tensor f = alloc({rows, cfg_.hidden_size});
    phase(cfg_.is_dense_ffn(l) ? LayerPhase::Dense : LayerPhase::Moe);
    ffn_layer(l, x2, f);
    phase(LayerPhase::Rest);
    backend_.add({.a = act.partial, .b = f, .y = act.partial});
    report_progress();
  }
}

void Model::kda_layer(int l, std::span<const BatchItem> batch, const Tensor& x, Tensor& out, CachePools& caches) {
  const LayerWeights& lw = w_->layers[l - begin_];
  const int64_t R = x.dim(0), H = cfg_.kda.num_heads, D = cfg_.kda.head_dim, P = H * D;
  const int n = static_cast<int>(batch.size());
  Tensor qkv = gemm(x, lw.w_qkv);                    // [R, 3P]
  Tensor f = gemm(gemm(x, lw.w_fa), lw.w_fb);        // [R, P]
  Tensor blog = gemm(x, lw.w_b);                     // [R, H]
  Tensor o = alloc({R, H, D});
  // The slots' rows now: the state and conv pools lay a slot out at different strides in a unified region.
  std::vector<int32_t> state_rows, conv_rows;
  for (const BatchItem& it : batch) {
    state_rows.push_back(caches.state_row(it.seq->slot));
    conv_rows.push_back(caches.conv_row(it.seq->slot));
  }
  Tensor slots = index_ ? index_->slots : backend_.from_host(Tensor::from_i32({n}, state_rows), DType::I32);
  Tensor conv_slots = index_ ? index_->conv_slots : backend_.from_host(Tensor::from_i32({n}, conv_rows), DType::I32);

  const bool single = all_single_token_decode(batch);
  const bool fused = single && kda_takes_fused_decode(backend_, H, D);
  Tensor cu;
  int64_t width = 0;
  Tensor ckpt_table;
  if (!fused) {
    cu = index_ ? index_->cu_seqlens : backend_.from_host(Tensor::from_i32({n + 1}, cu_seqlens(batch)), DType::I32);
    kda_conv_checkpoints(l, batch, qkv, caches);   // before the conv step overwrites the conv caches
    // Checkpoints as the op's table: column j of row i is the slot that receives sequence i's state after
    // (j+1)·kKdaChunkTokens of this step's tokens (-1 = none); the state pool itself holds the slots.
    for (int i = 0; i < n; ++i)
      for (const KdaCheckpoint& c : batch[i].checkpoints)
        width = std::max<int64_t>(width, (c.pos - batch[i].seq->num_tokens) / kKdaChunkTokens);
    if (width > 0) {
      std::vector<int32_t> table(static_cast<size_t>(n * width), -1);
      for (int i = 0; i < n; ++i)
        for (const KdaCheckpoint& c : batch[i].checkpoints) {
          const int64_t o = c.pos - batch[i].seq->num_tokens;
          K3_CHECK(o > 0 && o % kKdaChunkTokens == 0, "KDA checkpoint at " + std::to_string(c.pos) + " is not a chunk end of this step");
          // A chunk-invariant backend chunks only whole blocks at absolute multiples of 64 (kda_heads.h).
          K3_CHECK(!backend_.chunk_invariant() || batch[i].seq->num_tokens % kKdaChunkTokens == 0,
                   "KDA checkpoint at " + std::to_string(c.pos) + ": on a chunk-invariant backend a step with checkpoints "
                   "must start its sequence at a multiple of " + std::to_string(kKdaChunkTokens) + " tokens (it starts at " +
                   std::to_string(batch[i].seq->num_tokens) + ")");
          table[static_cast<size_t>(i * width + o / kKdaChunkTokens - 1)] = caches.state_row(c.slot);
        }
      ckpt_table = backend_.from_host(Tensor::from_i32({n, width}, table), DType::I32);
    }
  }
  std::vector<int64_t> positions, lengths;
  if (!single)
    for (const BatchItem& it : batch) {
      positions.push_back(it.seq->num_tokens);
      lengths.push_back(it.num_new);
    }
  run_kda_heads(backend_, {.cfg = cfg_, .lw = lw, .heads = H, .qkv = qkv, .f = f, .blog = blog,
                           .conv_cache = caches.kda_conv(l), .state = caches.kda_state(l), .slots = slots,
                           .conv_slots = conv_slots, .cu_seqlens = cu, .single_token_decode = single,
                           .positions = std::move(positions), .lengths = std::move(lengths),
                           .checkpoint_slots = ckpt_table, .checkpoint_interval = width > 0 ? kKdaChunkTokens : 0,
                           .o = o, .alloc = [this](Shape sh, DType t) { return alloc(std::move(sh), t); }});
  // Gated RMSNorm per head (shared o_norm weight), then the output projection.
  Tensor on = rmsnorm(o.reshape({R * H, D}), lw.o_norm, cfg_.rms_norm_eps).reshape({R, P});
  // Output gate logits: full rank (K3) or through a rank-D bottleneck (Kimi Linear).
  Tensor z = cfg_.kda.use_full_rank_gate ? gemm(x, lw.w_g) : gemm(gemm(x, lw.w_ga), lw.w_gb);
  Tensor gated = alloc({R, P});
  backend_.sigmoid_mul({.x = on, .gate = z, .y = gated});
  backend_.gemm({.x = gated, .w = lw.w_o, .y = out});
}

// The conv window of a checkpoint at new-row offset o of a sequence is the W-1 pre-conv rows before it:
// the tail of the old conv cache followed by the first o new rows when o < W-1, else new rows only.
void Model::kda_conv_checkpoints(int l, std::span<const BatchItem> batch, const Tensor& qkv, CachePools& caches) {
  Tensor& pool = caches.kda_conv(l);   // [slots, W-1, 3P]
  const int64_t rows = pool.dim(1), width = pool.dim(2);
  int64_t start = 0;
  for (const BatchItem& it : batch) {
    if (!it.checkpoints.empty())
      K3_CHECK(!all_single_token_decode(batch), "KDA checkpoints requested in a decode step");
    const int32_t own_row = caches.conv_row(it.seq->slot);
    Tensor own = pool.slice_rows(own_row, own_row + 1).reshape({rows, width});
    for (const KdaCheckpoint& c : it.checkpoints) {
      const int64_t o = c.pos - it.seq->num_tokens;
      K3_CHECK(o > 0 && o <= it.num_new && c.slot >= 0 && c.slot != it.seq->slot,
               "KDA checkpoint at " + std::to_string(c.pos) + " is outside this step's new tokens or has a bad slot");
      const int32_t dst_row = caches.conv_row(c.slot);
      Tensor dst = pool.slice_rows(dst_row, dst_row + 1).reshape({rows, width});
      const int64_t from_cache = std::max<int64_t>(0, rows - o);
      if (from_cache > 0) {
        Tensor d0 = dst.slice_rows(0, from_cache);
        backend_.copy(own.slice_rows(rows - from_cache, rows), d0);
      }
      if (rows - from_cache > 0) {
        Tensor d1 = dst.slice_rows(from_cache, rows);
        backend_.copy(qkv.slice_rows(start + o - (rows - from_cache), start + o), d1);
      }
    }
    start += it.num_new;
  }
}

void Model::mla_layer(int l, std::span<const BatchItem> batch, const Tensor& x, Tensor& out, CachePools& caches) {
  const LayerWeights& lw = w_->layers[l - begin_];
  const int64_t R = x.dim(0), H = cfg_.num_attention_heads, dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim,
                dv = cfg_.v_head_dim, r = cfg_.kv_lora_rank, dqk = dn + dr, W = r + dr;
  const float scale = 1.f / std::sqrt(static_cast<float>(dqk));
  const int page_size = caches.options().page_size;

  // [R, H*dqk], through the low-rank bottleneck when the config has one.
  Tensor q = cfg_.uses_q_lora() ? gemm(rmsnorm(gemm(x, lw.w_qa), lw.qa_norm, 1e-6f), lw.w_qb) : gemm(x, lw.w_q);
  Tensor a = gemm(x, lw.w_kva);                                              // [R, r + dr] = [c | k^R]
  Tensor c = alloc({R, r});
  backend_.copy_cols({.src = a, .dst = c, .src_col = 0, .ncols = r});
  Tensor cn = rmsnorm(c, lw.kva_norm, 1e-6f);
  backend_.copy_cols({.src = cn, .dst = a, .dst_col = 0});

  // Append the new rows to the paged cache.
  Tensor& pool = caches.mla_kv(l);
  Tensor pool_rows = pool.reshape({pool.dim(0) * pool.dim(1), W});
  std::vector<int32_t> new_ids;
  for (const BatchItem& it : batch) {
    auto ids = cache_rows(*it.seq, it.seq->num_tokens, it.seq->num_tokens + it.num_new, page_size);
    new_ids.insert(new_ids.end(), ids.begin(), ids.end());
  }
  Tensor new_rows = index_ ? index_->new_rows : backend_.from_host(Tensor::from_i32({R}, new_ids), DType::I32);
  backend_.scatter_rows({.src = a, .ids = new_rows, .dst = pool_rows});

  Tensor o = alloc({R, H, dv});
  // Decode steps, and every forward where the backend promises chunk invariance: one absorbed query
  // row per new token, so a token's attention is the same arithmetic whichever forward carries it.
  if (all_single_token_decode(batch) || backend_.chunk_invariant()) {
    mla_absorbed(l, batch, q, pool, o);
  } else {
    int64_t r0 = 0;
    for (const BatchItem& it : batch) {
      const int64_t T = it.num_new, N = it.seq->num_tokens, S = N + T;
      auto ids = cache_rows(*it.seq, 0, S, page_size);
      Tensor rows = alloc({S, W});
      backend_.embedding({.table = pool_rows, .ids = backend_.from_host(Tensor::from_i32({S}, ids), DType::I32), .y = rows});
      Tensor cs = alloc({S, r});
      backend_.copy_cols({.src = rows, .dst = cs, .src_col = 0, .ncols = r});
      Tensor kvb = gemm(cs, lw.w_kvb).reshape({S * H, dn + dv});
      Tensor k = alloc({S * H, dqk}), v = alloc({S * H, dv});
      backend_.copy_cols({.src = kvb, .dst = k, .src_col = 0, .dst_col = 0, .ncols = dn});
      backend_.copy_cols({.src = rows, .dst = k, .src_col = r, .dst_col = dn, .ncols = dr, .src_row_repeat = static_cast<int>(H)});
      backend_.copy_cols({.src = kvb, .dst = v, .src_col = dn, .ncols = dv});
      backend_.mla_prefill({.q = q.slice_rows(r0, r0 + T).reshape({T, H, dqk}), .k = k.reshape({S, H, dqk}),
                            .v = v.reshape({S, H, dv}), .o = o.slice_rows(r0, r0 + T), .lse = Tensor(), .past = N,
                            .scale = scale});
      r0 += T;
    }
  }
  if (!cfg_.mla_use_output_gate) {
    backend_.gemm({.x = o.reshape({R, H * dv}), .w = lw.w_o, .y = out});
    return;
  }
  Tensor gz = gemm(x, lw.w_g);
  Tensor gated = alloc({R, H * dv});
  backend_.sigmoid_mul({.x = o.reshape({R, H * dv}), .gate = gz, .y = gated});
  backend_.gemm({.x = gated, .w = lw.w_o, .y = out});
}

// Absorbed MLA (docs/MODEL.md §3): q^N through W^UK, scores against the paged latent cache, the
// latent output through W^UV. Query row j of item b sits at position num_tokens + j and attends to
// positions [0, num_tokens + j] (the new rows are already in the cache). Outside a recorded step
// the rows go in slices of kAbsorbedRowsPerCall, which bounds the split partials mla_decode keeps
// (a row's arithmetic depends only on its own length, not on the rows beside it).
void Model::mla_absorbed(int l, std::span<const BatchItem> batch, const Tensor& q, Tensor& pool, Tensor& o) {
  constexpr int64_t kAbsorbedRowsPerCall = 2048;
  const LayerWeights& lw = w_->layers[l - begin_];
  const int64_t R = q.dim(0), H = cfg_.num_attention_heads, dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim,
                r = cfg_.kv_lora_rank, dqk = dn + dr;
  const float scale = 1.f / std::sqrt(static_cast<float>(dqk));
  Tensor qv = q.reshape({R * H, dqk});
  Tensor qn = alloc({R * H, dn}), qr = alloc({R * H, dr});
  backend_.copy_cols({.src = qv, .dst = qn, .src_col = 0, .ncols = dn});
  backend_.copy_cols({.src = qv, .dst = qr, .src_col = dn, .ncols = dr});
  Tensor qlat = alloc({R, H, r});
  backend_.head_gemm({.x = qn.reshape({R, H, dn}), .w = lw.w_uk_t, .y = qlat});
  Tensor qrope = qr.reshape({R, H, dr});
  Tensor olat = alloc({R, H, r});
  Tensor lse = alloc({R, H}, DType::F32);
  if (index_) {  // a recorded decode step: one row per item, tables already on the device
    backend_.mla_decode({.q_lat = qlat, .q_rope = qrope, .kv_cache = pool, .block_table = index_->block_table,
                         .seq_lens = index_->seq_lens, .o = olat, .lse = lse, .scale = scale});
  } else {
    std::vector<std::pair<const SeqCache*, int32_t>> rows;  // (sequence, attended length) per query row
    rows.reserve(static_cast<size_t>(R));
    for (const BatchItem& it : batch)
      for (int64_t j = 0; j < it.num_new; ++j)
        rows.emplace_back(it.seq, static_cast<int32_t>(it.seq->num_tokens + j + 1));
    K3_CHECK(static_cast<int64_t>(rows.size()) == R, "mla: batch rows do not match the activations");
    for (int64_t r0 = 0; r0 < R; r0 += kAbsorbedRowsPerCall) {
      const int64_t n = std::min(kAbsorbedRowsPerCall, R - r0);
      size_t width = 0;
      for (int64_t i = r0; i < r0 + n; ++i) width = std::max(width, rows[i].first->pages.size());
      std::vector<int32_t> table(static_cast<size_t>(n) * width, 0), lens;
      for (int64_t i = 0; i < n; ++i) {
        const SeqCache& s = *rows[r0 + i].first;
        std::copy(s.pages.begin(), s.pages.end(), table.begin() + i * width);
        lens.push_back(rows[r0 + i].second);
      }
      Tensor block_table = backend_.from_host(Tensor::from_i32({n, static_cast<int64_t>(width)}, table), DType::I32);
      Tensor seq_lens = backend_.from_host(Tensor::from_i32({n}, lens), DType::I32);
      Tensor olat_n = olat.slice_rows(r0, r0 + n), lse_n = lse.slice_rows(r0, r0 + n);
      backend_.mla_decode({.q_lat = qlat.slice_rows(r0, r0 + n), .q_rope = qrope.slice_rows(r0, r0 + n),
                           .kv_cache = pool, .block_table = block_table, .seq_lens = seq_lens, .o = olat_n,
                           .lse = lse_n, .scale = scale});
    }
  }
  backend_.head_gemm({.x = olat, .w = lw.w_uv, .y = o});
}

void Model::ffn_layer(int l, const Tensor& x, Tensor& out) {
  const LayerWeights& lw = w_->layers[l - begin_];
  const float beta = cfg_.activation_situ_beta, beta_l = cfg_.activation_situ_linear_beta;
  auto situ_mlp = [&](const Tensor& wg, const Tensor& wu, const Tensor& wd, Tensor& y) {
    Tensor g = gemm(x, wg), u = gemm(x, wu);
    backend_.situ({.g = g, .u = u, .y = g, .beta = beta, .beta_linear = beta_l, .act = glu_act(cfg_)});
    backend_.gemm({.x = g, .w = wd, .y = y});
  };
  if (cfg_.is_dense_ffn(l)) {
    situ_mlp(lw.dense_gate, lw.dense_up, lw.dense_down, out);
    return;
  }
  const int64_t R = x.dim(0), E = cfg_.num_experts, k = cfg_.num_experts_per_token;
  Tensor logits = alloc({R, E}, DType::F32);
  backend_.gemm({.x = x, .w = lw.router, .y = logits});
  Tensor ids = alloc({R, k}, DType::I32), weights = alloc({R, k}, DType::F32);
  backend_.router_topk({.logits = logits, .bias = lw.router_bias, .ids = ids, .weights = weights,
                        .k = static_cast<int>(k), .scale = cfg_.routed_scaling_factor});
  if (cfg_.uses_latent_moe()) {
    Tensor z = gemm(x, lw.lat_down);
    Tensor y = alloc({R, cfg_.routed_expert_hidden_size});
    backend_.moe_experts({.z = z, .ids = ids, .weights = weights, .w1 = lw.w1, .w3 = lw.w3, .w2 = lw.w2, .y = y,
                          .beta = beta, .beta_linear = beta_l, .act = glu_act(cfg_)});
    Tensor yn = rmsnorm(y, lw.lat_norm, cfg_.rms_norm_eps);
    backend_.gemm({.x = yn, .w = lw.lat_up, .y = out});
  } else {  // full-width experts write the layer output directly
    backend_.moe_experts({.z = x, .ids = ids, .weights = weights, .w1 = lw.w1, .w3 = lw.w3, .w2 = lw.w2, .y = out,
                          .beta = beta, .beta_linear = beta_l, .act = glu_act(cfg_)});
  }
  if (cfg_.num_shared_experts > 0) {
    Tensor ys = alloc(out.shape());
    situ_mlp(lw.shared_gate, lw.shared_up, lw.shared_down, ys);
    backend_.add({.a = out, .b = ys, .y = out});
  }
}

Tensor Model::logits(const Activations& act, std::span<const int32_t> rows) {
  return backend_.to_host(backend_logits(act, rows));
}

Tensor Model::backend_logits(const Activations& act, std::span<const int32_t> rows) {
  K3_CHECK(end_ == cfg_.num_hidden_layers, "logits() on a model range that does not end at the last layer");
  Tensor h = cfg_.uses_attn_res() ? attn_res_mix(w_->out_query, act) : act.partial;
  const int64_t n = static_cast<int64_t>(rows.size());
  Tensor sel = alloc({n, cfg_.hidden_size});
  K3_CHECK(!index_ || index_->last_rows.numel() == n, "logits: the step index holds another number of rows");
  Tensor row_ids = index_ ? index_->last_rows : backend_.from_host(Tensor::from_i32({n}, rows), DType::I32);
  backend_.embedding({.table = h, .ids = row_ids, .y = sel});
  Tensor hn = rmsnorm(sel, w_->final_norm, cfg_.rms_norm_eps);
  Tensor lg = alloc({n, cfg_.vocab_size}, DType::F32);
  backend_.gemm({.x = hn, .w = w_->lm_head, .y = lg});
  phase(LayerPhase::End);
  return lg;
}

}  // namespace k3
