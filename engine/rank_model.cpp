// The per-step layer loop of a decode rank (engine/rank_model.h). Same structure as Model::forward
// (AttnRes mix, attention, mix, FFN), with the attention's heads gathered and, in a DCP group, the output
// projection and the FFN run sequence-parallel: rank i takes rows even_chunk(R, dcp, i), then the
// group all-gathers the residual rows, so every rank ends each layer with the same activations.
#include "engine/rank_model.h"

#include <chrono>
#include <string>
#include <vector>

#include "engine/rank_step.h"

namespace k3 {

struct RankModel::Impl {
  std::unique_ptr<Model::Weights> w;
  Backend* be = nullptr;
  Comm* comm = nullptr;
};

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

RankModel::~RankModel() = default;

Result<std::unique_ptr<RankModel>> RankModel::create(Backend& backend, const ModelConfig& cfg, const WeightStore& weights,
                                                     const RankLayout& layout, Comm& comm, const CacheOptions& cache) {
  K3_TRY(validate(cfg));
  K3_TRY(validate_rank_layout(layout, cfg));
  if (comm.size() != layout.size() || comm.rank() != layout.rank)
    return invalid_argument("rank decode: the communicator is rank " + std::to_string(comm.rank()) + " of " +
                            std::to_string(comm.size()) + " but the layout says " + to_string(layout));
  if (comm.takes_device_memory() && backend.kind() == BackendKind::Cpu)
    return invalid_argument(std::string("rank decode: the communicator takes device memory, but backend ") +
                            backend.name() + " keeps its tensors on the host");
  std::unique_ptr<RankModel> m(new RankModel());
  m->cfg_ = cfg;
  m->layout_ = layout;
  m->impl_ = std::make_unique<Impl>();
  m->impl_->be = &backend;
  m->impl_->comm = &comm;
  // A rank reads and uploads its part only: an EP rank its routed experts, a DCP rank its share of
  // the attention heads (model_weights.h says which weights that cuts).
  const int64_t experts_per_rank = cfg.num_experts / layout.ep;
  const ExpertRange experts = layout.ep > 1 ? ExpertRange{layout.ep_rank() * experts_per_rank,
                                                          (layout.ep_rank() + 1) * experts_per_rank}
                                            : ExpertRange{};
  const HeadShare heads{.index = layout.dcp_rank(), .count = layout.dcp};
  K3_ASSIGN_OR_RETURN(m->impl_->w, upload_weights(backend, cfg, weights, 0, cfg.num_hidden_layers, experts, heads));
  m->caches_ = std::make_unique<CachePools>(backend, rank_cache_config(cfg, layout), 0, cfg.num_hidden_layers, cache);
  return m;
}

Result<Tensor> RankModel::decode_step(std::span<RankItem> batch, std::span<const int32_t> tokens,
                                      const std::function<void()>& progress, bool with_logits) {
  const auto t_step = Clock::now();
  Backend& be = *impl_->be;
  const Model::Weights& w = *impl_->w;
  const RankLayout& g = layout_;
  rank::Step s{.be = be, .cfg = cfg_, .g = g, .comm = *impl_->comm, .times = times_};
  const int64_t R = static_cast<int64_t>(batch.size());
  if (tokens.size() != batch.size())
    return invalid_argument("rank decode: " + std::to_string(tokens.size()) + " tokens for " + std::to_string(R) + " items");
  for (int64_t b = 0; b < R; ++b) {
    const RankItem& it = batch[b];
    if (it.seq == nullptr || it.position < 1)
      return invalid_argument("rank decode: item " + std::to_string(b) + " has no caches or no prefilled token");
    if (it.seq->num_tokens != dcp_rows_on(g, it.position))
      return invalid_argument("rank decode: item " + std::to_string(b) + " holds " + std::to_string(it.seq->num_tokens) +
                              " rows on " + to_string(g) + ", expected " + std::to_string(dcp_rows_on(g, it.position)) +
                              " for position " + std::to_string(it.position));
  }

  // Room for the new rows, agreed by the whole group before any cache is touched.
  float short_of_pages = 0.f;
  for (RankItem& it : batch)
    if (dcp_owns(g, it.position) && !caches_->reserve(*it.seq, 1).is_ok()) short_of_pages = 1.f;
  if (g.size() > 1) {
    Tensor flag = Tensor::view(&short_of_pages, {1}, DType::F32);
    K3_TRY(s.all_reduce(flag));
  }
  if (short_of_pages > 0.f)
    return Status(Code::ResourceExhausted, "rank decode: a rank of the group is out of MLA cache pages");

  const float eps = cfg_.rms_norm_eps;
  const int64_t d = cfg_.hidden_size;
  const Chunk mine = g.dcp > 1 ? even_chunk(R, g.dcp, g.dcp_rank()) : Chunk{0, static_cast<size_t>(R)};
  const int64_t r0 = static_cast<int64_t>(mine.offset), r1 = r0 + static_cast<int64_t>(mine.count);
  const int64_t chunk_max = (R + g.dcp - 1) / g.dcp;

  Activations act;
  if (R > 0) {
    Tensor ids = be.from_host(Tensor::from_i32({R}, tokens), DType::I32);
    act.partial = s.alloc({R, d});
    be.embedding({.table = w.embed, .ids = ids, .y = act.partial});
  } else {
    act.partial = s.alloc({0, d});
  }
  auto mix = [&](const Tensor& query, const std::vector<Tensor>& cands, int64_t rows) {
    Tensor y = s.alloc({rows, d});
    be.attnres_mix({.candidates = cands, .query = query, .y = y, .eps = eps});
    return y;
  };
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const bool new_block = cfg_.starts_block(l);
    Tensor gated;
    if (R > 0) {
      std::vector<Tensor> cands = act.bank;
      cands.push_back(act.partial);
      Tensor h = act.bank.empty() ? act.partial : mix(lw.att_query, cands, R);
      Tensor x = s.rmsnorm(h, lw.in_norm, eps);
      if (cfg_.layer_kind(l) == LayerKind::Kda) { K3_ASSIGN_OR_RETURN(gated, rank::kda_heads(s, l, lw, batch, x, *caches_)); }
      else { K3_ASSIGN_OR_RETURN(gated, rank::mla_heads(s, l, lw, batch, x, *caches_)); }
    }
    if (new_block) act.bank.push_back(act.partial);
    // This rank's rows: output projection, residual, mix, FFN.
    const int64_t n = r1 - r0;
    Tensor next = new_block ? s.alloc({R, d}) : act.partial;
    Tensor part = n > 0 ? next.slice_rows(r0, r1) : s.alloc({0, d});
    if (n > 0) {
      Tensor y = s.gemm(gated.slice_rows(r0, r1), lw.w_o);
      if (new_block) be.copy(y, part);
      else be.add({.a = part, .b = y, .y = part});
    }
    Tensor f = s.alloc({n, d});
    Tensor x2 = s.alloc({n, d});
    if (n > 0) {
      std::vector<Tensor> cands;
      for (const Tensor& t : act.bank) cands.push_back(t.slice_rows(r0, r1));
      cands.push_back(part);
      x2 = s.rmsnorm(mix(lw.mlp_query, cands, n), lw.post_norm, eps);
    }
    K3_TRY(rank::ffn(s, l, lw, x2, f));
    if (n > 0) be.add({.a = part, .b = f, .y = part});
    act.partial = next;
    if (g.dcp > 1 && R > 0) {  // every rank gets every row of the residual (blocks of chunk_max rows)
      Tensor mine_rows = s.alloc({chunk_max, d}, part.dtype());
      if (n > 0) {
        Tensor head = mine_rows.slice_rows(0, n);
        be.copy(part, head);
      }
      Tensor all = s.alloc({g.dcp * chunk_max, d}, part.dtype());
      K3_TRY(s.all_gather(mine_rows, all));
      for (int q = 0; q < g.dcp; ++q) {
        const Chunk c = even_chunk(R, g.dcp, q);
        if (c.count == 0) continue;
        const int64_t b0 = int64_t(q) * chunk_max, c0 = static_cast<int64_t>(c.offset);
        Tensor rows = act.partial.slice_rows(c0, c0 + static_cast<int64_t>(c.count));
        be.copy(all.slice_rows(b0, b0 + static_cast<int64_t>(c.count)), rows);
      }
    }
    if (progress) progress();
  }

  Tensor logits = Tensor::zeros({R, with_logits ? cfg_.vocab_size : 0});
  if (R > 0 && with_logits) {
    std::vector<Tensor> cands = act.bank;
    cands.push_back(act.partial);
    Tensor hn = s.rmsnorm(mix(w.out_query, cands, R), w.final_norm, eps);
    Tensor lg = s.alloc({R, cfg_.vocab_size}, DType::F32);
    be.gemm({.x = hn, .w = w.lm_head, .y = lg});
    logits = be.to_host(lg);
  }
  for (RankItem& it : batch) {
    if (dcp_owns(g, it.position)) it.seq->num_tokens += 1;
    it.position += 1;
  }
  times_.step += since(t_step);
  times_.steps += 1;
  return logits;
}

}  // namespace k3
