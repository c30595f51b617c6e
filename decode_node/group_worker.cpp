#include "decode_node/group_worker.h"

namespace k3::decode {

Result<std::unique_ptr<GroupWorker>> GroupWorker::create(Backend& backend, const ModelConfig& cfg,
                                                         const WeightStore& weights, const RankLayout& layout,
                                                         Comm& comm, const CacheOptions& cache) {
  std::unique_ptr<GroupWorker> w(new GroupWorker());
  w->backend_ = &backend;
  w->cfg_ = cfg;
  K3_ASSIGN_OR_RETURN(w->model_, RankModel::create(backend, cfg, weights, layout, comm, cache));
  return w;
}

GroupRoom GroupWorker::room() {
  CachePools& c = model_->caches();
  return {.page_size = static_cast<uint32_t>(c.options().page_size), .cache_pages = static_cast<uint32_t>(c.options().num_pages), .free_pages = static_cast<uint32_t>(c.free_pages()),
          .seqs = static_cast<uint32_t>(c.options().max_seqs), .free_seqs = static_cast<uint32_t>(c.free_slots())};
}

void GroupWorker::close_all() {
  if (!model_) return;
  for (auto& [id, s] : seqs_) model_->caches().close(s.seq);
  seqs_.clear();
}

void GroupWorker::drop(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  model_->caches().close(it->second.seq);
  seqs_.erase(it);
}

Status GroupWorker::admit(const GroupAdmit& a) {
  return admit_with(a, [&](CachePools& pools, const SeqCache& seq, int64_t rows) {
    return import_caches(*backend_, pools, seq, 0, cfg_.num_hidden_layers, rows, a.image.data(), a.image.size());
  });
}

Status GroupWorker::admit_from(const GroupAdmit& a, const CacheTables& tables) {
  return admit_with(a, [&](CachePools& pools, const SeqCache& seq, int64_t rows) {
    return import_caches_from(*backend_, pools, seq, 0, cfg_.num_hidden_layers, rows, tables);
  });
}

Status GroupWorker::admit_with(const GroupAdmit& a,
                               const std::function<Status(CachePools&, const SeqCache&, int64_t rows)>& import) {
  if (seqs_.count(a.id)) return invalid_argument("group admit: request " + std::to_string(a.id) + " is already served");
  CachePools& pools = model_->caches();
  const int64_t rows = dcp_rows_on(model_->layout(), a.position);
  K3_ASSIGN_OR_RETURN(SeqCache seq, pools.open());
  Status st = pools.reserve(seq, rows);
  if (st.is_ok()) st = import(pools, seq, rows);
  if (!st.is_ok()) {
    pools.close(seq);
    return Status(st.code(), "rank " + std::to_string(model_->layout().rank) + ", request " + std::to_string(a.id) +
                                 ": " + st.message());
  }
  seq.num_tokens = rows;
  seqs_.emplace(a.id, Served{.seq = std::move(seq), .position = a.position});
  return Status::ok();
}

Result<std::vector<float>> GroupWorker::step(const std::vector<GroupFeed>& feeds, const std::function<void()>& progress,
                                             bool with_logits) {
  std::vector<RankItem> items;
  std::vector<int32_t> tokens;
  for (const auto& f : feeds) {
    auto it = seqs_.find(f.id);
    if (it == seqs_.end()) return invalid_argument("group step: request " + std::to_string(f.id) + " is not served here");
    items.push_back({.seq = &it->second.seq, .position = it->second.position});
    tokens.push_back(f.token);
  }
  K3_ASSIGN_OR_RETURN(Tensor lg, model_->decode_step(items, tokens, progress, with_logits));
  if (metrics_) metrics_->publish(model_->times());
  for (const auto& f : feeds) ++seqs_.at(f.id).position;  // decode_step advanced the local rows
  if (feeds.empty() || !with_logits) return std::vector<float>{};
  const size_t n = feeds.size() * static_cast<size_t>(cfg_.vocab_size);
  return std::vector<float>(lg.f32(), lg.f32() + n);
}

}  // namespace k3::decode
