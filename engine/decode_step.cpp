#include "engine/decode_step.h"

#include <algorithm>
#include <numeric>

namespace k3 {

DecodeStep::DecodeStep(Model& model, CachePools& caches, const DecodeGraphOptions& opts)
    : model_(model), caches_(caches), opts_(opts), ws_(model.backend()) {}

bool DecodeStep::applies(std::span<const BatchItem> batch) {
  if (batch.empty()) return false;
  for (const BatchItem& it : batch)
    if (it.num_new != 1 || it.seq->num_tokens == 0) return false;
  return true;
}

int DecodeStep::width_bucket(int64_t pages) {
  int w = 1;
  while (w < pages) w *= 2;
  return w;
}

Tensor DecodeStep::forward(std::span<const BatchItem> batch, std::span<const int32_t> tokens) {
  Activations act = model_.embed(tokens);
  model_.forward(batch, act, caches_);
  std::vector<int32_t> rows(batch.size());
  std::iota(rows.begin(), rows.end(), 0);
  return model_.backend_logits(act, rows);
}

Tensor DecodeStep::run(std::span<const BatchItem> batch, std::span<const int32_t> tokens) {
  K3_CHECK(applies(batch), "decode step: every item must bring one token after a cached prefix");
  K3_CHECK(tokens.size() == batch.size(), "decode step: one token per item required");
  Backend& be = model_.backend();
  const int B = static_cast<int>(batch.size());
  const int page_size = caches_.options().page_size;
  size_t pages = 1;
  for (const BatchItem& it : batch) pages = std::max(pages, it.seq->pages.size());
  const int W = width_bucket(static_cast<int64_t>(pages));

  // The step's indices, packed: tokens | state rows | conv rows | cu_seqlens | new_rows | seq_lens |
  // last_rows | table. Slot rows are read here, after the step's pages were reserved (which may move slots).
  std::vector<int32_t> packed;
  packed.reserve(size_t(6 * B + 1) + size_t(B) * W);
  packed.insert(packed.end(), tokens.begin(), tokens.end());
  for (const BatchItem& it : batch) packed.push_back(caches_.state_row(it.seq->slot));
  for (const BatchItem& it : batch) packed.push_back(caches_.conv_row(it.seq->slot));
  for (int b = 0; b <= B; ++b) packed.push_back(b);
  for (const BatchItem& it : batch) {
    const int64_t pos = it.seq->num_tokens;
    K3_CHECK(static_cast<size_t>(pos / page_size) < it.seq->pages.size(),
             "decode step: no MLA page for position " + std::to_string(pos) + " (CachePools::reserve was not called)");
    packed.push_back(static_cast<int32_t>(CacheLayout::paged_row(it.seq->pages, page_size, pos)));
  }
  for (const BatchItem& it : batch) packed.push_back(static_cast<int32_t>(it.seq->num_tokens + 1));
  for (int b = 0; b < B; ++b) packed.push_back(b);
  for (const BatchItem& it : batch) {
    const size_t at = packed.size();
    packed.resize(at + W, 0);
    std::copy(it.seq->pages.begin(), it.seq->pages.end(), packed.begin() + at);
  }

  // Rewinds the arena and writes the indices at its start: the same addresses every step of a bucket.
  auto upload = [&] {
    ws_.begin_step();
    Tensor dev = ws_.take({static_cast<int64_t>(packed.size())}, DType::I32);
    be.copy(Tensor::from_i32({static_cast<int64_t>(packed.size())}, packed), dev);
    int64_t at = 0;
    auto next = [&](int64_t n) {
      Tensor t = dev.slice_rows(at, at + n);
      at += n;
      return t;
    };
    index_.token_ids = next(B);
    index_.slots = next(B);
    index_.conv_slots = next(B);
    index_.cu_seqlens = next(B + 1);
    index_.new_rows = next(B);
    index_.seq_lens = next(B);
    index_.last_rows = next(B);
    index_.block_table = next(int64_t(B) * W).reshape({B, W});
  };
  upload();
  if (ws_.epoch() != arena_epoch_) {  // the arena moved: every recording points into the old one; let it go
    for (auto& [key, r] : buckets_) {
      r.graph.reset();
      r.logits = Tensor();
    }
    arena_epoch_ = ws_.epoch();
  }

  Recorded& rec = buckets_[{B, W}];
  if (rec.graph && (rec.arena_epoch != ws_.epoch() || rec.graph->workspace_epoch() != be.workspace_epoch()))
    rec.graph.reset();  // the arena or a backend workspace moved: record again
  if (rec.graph && opts_.enabled) {
    rec.graph->launch();
    ws_.replayed(rec.arena_used);
    ++stats_.replays;
    stats_.last_nodes = rec.graph->nodes();
    return rec.logits;
  }

  struct StepScope {  // the model reads this step's workspace and indices until the scope ends
    Model& m;
    StepScope(Model& model, StepWorkspace* ws, const DecodeIndex* idx) : m(model) { m.set_step(ws, idx); }
    ~StepScope() { m.set_step(nullptr, nullptr); }
  } scope(model_, &ws_, &index_);

  const bool record = opts_.enabled && rec.warm && rec.failures < kMaxFailures && !ws_.overflowed();
  if (record) {
    Tensor logits;
    try {
      auto graph = be.capture([&] { logits = forward(batch, tokens); }, opts_.strict);
      if (!graph) {
        rec.failures = kMaxFailures;  // the backend cannot record: eager always
      } else if (ws_.overflowed()) {
        throw Error("decode step outgrew its workspace while recording");
      } else {
        if (static_cast<int>(buckets_.size()) > opts_.max_graphs)
          for (auto& [key, r] : buckets_) r.graph.reset();
        rec.graph = std::move(graph);
        rec.arena_epoch = ws_.epoch();
        rec.arena_used = ws_.used();
        rec.logits = logits;
        ++stats_.captures;
        rec.graph->launch();
        ++stats_.replays;
        stats_.last_nodes = rec.graph->nodes();
        return logits;
      }
    } catch (const std::exception& ex) {
      ++rec.failures;
      ++stats_.capture_failures;
      stats_.last_failure = ex.what();
    }
    upload();  // nothing ran while recording: run the step eagerly over a fresh arena
  }
  Tensor logits = forward(batch, tokens);
  rec.warm = true;
  ++stats_.eager;
  stats_.last_nodes = 0;
  return logits;
}

}  // namespace k3
