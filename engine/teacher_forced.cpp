#include "engine/teacher_forced.h"

#include <numeric>

#include "engine/kv_cache.h"
#include "engine/model.h"

namespace k3 {

Result<Tensor> teacher_forced_logits(Backend& backend, const ModelConfig& cfg, const WeightStore& weights,
                                     const std::vector<std::vector<int32_t>>& prompts) {
  if (prompts.empty()) return invalid_argument("teacher-forced logits: no prompts");
  constexpr int kPage = 16;
  int pages = 0;
  std::vector<int32_t> ids;
  for (size_t p = 0; p < prompts.size(); ++p) {
    if (prompts[p].empty()) return invalid_argument("teacher-forced logits: prompt " + std::to_string(p) + " is empty");
    for (int32_t id : prompts[p])
      if (id < 0 || id >= cfg.vocab_size)
        return invalid_argument("teacher-forced logits: prompt " + std::to_string(p) + " has token id " +
                                std::to_string(id) + " outside [0, " + std::to_string(cfg.vocab_size) + ")");
    pages += static_cast<int>(prompts[p].size() + kPage - 1) / kPage;
    ids.insert(ids.end(), prompts[p].begin(), prompts[p].end());
  }
  K3_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::create(backend, cfg, weights));
  CachePools caches(backend, cfg, 0, cfg.num_hidden_layers,
                    CacheOptions{.max_seqs = static_cast<int>(prompts.size()), .page_size = kPage, .num_pages = pages + 1});
  std::vector<SeqCache> seqs;
  for (const auto& p : prompts) {
    K3_ASSIGN_OR_RETURN(SeqCache s, caches.open());
    seqs.push_back(s);
    K3_TRY(caches.reserve(seqs.back(), static_cast<int64_t>(p.size())));
  }
  std::vector<BatchItem> batch;
  for (size_t p = 0; p < prompts.size(); ++p)
    batch.push_back({.seq = &seqs[p], .num_new = static_cast<int64_t>(prompts[p].size())});
  Activations act = model->embed(ids);
  model->forward(batch, act, caches);
  std::vector<int32_t> rows(ids.size());
  std::iota(rows.begin(), rows.end(), 0);
  Tensor logits = model->logits(act, rows);
  for (SeqCache& s : seqs) caches.close(s);
  return logits;
}

}  // namespace k3
