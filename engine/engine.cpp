#include "engine/engine.h"

#include <algorithm>
#include <chrono>

namespace k3 {

Result<std::unique_ptr<Engine>> Engine::create(Backend& backend, const ModelConfig& cfg, const WeightStore& weights,
                                               const EngineOptions& opts) {
  if (opts.prefill_chunk < 0) return invalid_argument("prefill_chunk must be >= 0");
  std::unique_ptr<Engine> e(new Engine());
  e->opts_ = opts;
  K3_ASSIGN_OR_RETURN(e->model_, Model::create(backend, cfg, weights));
  K3_TRY(opts.prefix_cache.validate(opts.cache, opts.prefill_chunk));
  e->caches_ = std::make_unique<CachePools>(backend, cfg, 0, cfg.num_hidden_layers, opts.cache);
  e->decode_ = std::make_unique<DecodeStep>(*e->model_, *e->caches_, opts.decode_graphs);

  if (opts.prefix_cache.enabled) e->prefix_ = std::make_unique<PrefixCache>(*e->caches_, cfg, opts.prefix_cache);
  return e;
}

Result<SeqCache> Engine::open() { return caches_->open(); }

Result<Tensor> Engine::feed(std::span<SeqCache* const> seqs, std::span<const std::vector<int32_t>> tokens) {
  K3_ASSIGN_OR_RETURN(Tensor logits, feed_on_backend(seqs, tokens));
  return model_->backend().to_host(logits);
}

Result<Tensor> Engine::feed_on_backend(std::span<SeqCache* const> seqs, std::span<const std::vector<int32_t>> tokens) {
  return run_step(seqs, tokens, {});
}

Result<Tensor> Engine::run_step(std::span<SeqCache* const> seqs, std::span<const std::vector<int32_t>> tokens,
                                std::span<const std::vector<KdaCheckpoint>> checkpoints) {
  if (seqs.size() != tokens.size() || seqs.empty()) return invalid_argument("feed: one token list per sequence required");
  std::vector<BatchItem> batch;
  std::vector<int32_t> all, last_rows;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (tokens[i].empty()) return invalid_argument("feed: sequence " + std::to_string(i) + " has no new tokens");
    const int64_t limit = model_->config().max_position_embeddings;
    if (limit > 0 && seqs[i]->num_tokens + static_cast<int64_t>(tokens[i].size()) > limit)
      return Status(Code::OutOfRange, "sequence would exceed max_position_embeddings (" + std::to_string(limit) + ")");
    K3_TRY(caches_->reserve(*seqs[i], static_cast<int64_t>(tokens[i].size())));
    batch.push_back({.seq = seqs[i], .num_new = static_cast<int64_t>(tokens[i].size())});
    if (i < checkpoints.size()) batch.back().checkpoints = checkpoints[i];
    all.insert(all.end(), tokens[i].begin(), tokens[i].end());
    last_rows.push_back(static_cast<int32_t>(all.size()) - 1);
  }
  Tensor logits;
  if (DecodeStep::applies(batch)) {
    logits = decode_->run(batch, all);  // no uploads or allocations per op; a graph replay where recorded
  } else {
    Activations act = model_->embed(all);
    model_->forward(batch, act, *caches_);
    logits = model_->backend_logits(act, last_rows);
  }
  for (const BatchItem& it : batch) it.seq->num_tokens += it.num_new;
  return logits;
}

Result<Tensor> Engine::prefill(SeqCache& seq, std::span<const int32_t> tokens) {
  K3_ASSIGN_OR_RETURN(Tensor logits, prefill_on_backend(seq, tokens));
  return model_->backend().to_host(logits);
}

Result<Tensor> Engine::prefill_on_backend(SeqCache& seq, std::span<const int32_t> tokens) {
  if (tokens.empty()) return invalid_argument("prefill: empty prompt");
  const size_t chunk = opts_.prefill_chunk > 0 ? static_cast<size_t>(opts_.prefill_chunk) : tokens.size();
  Tensor logits;
  for (size_t at = 0; at < tokens.size(); at += chunk) {
    std::vector<int32_t> piece(tokens.begin() + at, tokens.begin() + std::min(tokens.size(), at + chunk));
    SeqCache* s = &seq;
    K3_ASSIGN_OR_RETURN(logits, feed_on_backend(std::span<SeqCache* const>(&s, 1),
                                                std::span<const std::vector<int32_t>>(&piece, 1)));
  }
  return logits;
}

std::vector<std::pair<int32_t, float>> top_logits(const float* row, int64_t vocab, int n) {
  std::vector<int32_t> idx(vocab);
  for (int64_t i = 0; i < vocab; ++i) idx[i] = static_cast<int32_t>(i);
  n = static_cast<int>(std::min<int64_t>(n, vocab));
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < n; ++i) out.emplace_back(idx[i], row[idx[i]]);
  return out;
}

Result<std::vector<GenerateResult>> Engine::generate(std::span<const GenerateRequest> requests) {
  using Clock = std::chrono::steady_clock;
  struct Live {
    SeqCache seq;
    GenerateResult result;
    int32_t next = -1;
    bool done = false;
  };
  std::vector<Live> live(requests.size());
  std::vector<PrefixLease> leases(requests.size());
  auto close_all = [&] {
    for (size_t i = 0; i < live.size(); ++i) {
      if (prefix_) prefix_->release(leases[i]);
      caches_->close(live[i].seq);
    }
  };
  const int64_t vocab = model_->config().vocab_size;
  Backend& be = model_->backend();

  // With recorded top logits the rows come to the host; otherwise they stay on the backend and only
  // the sampled ids come back.
  const bool host_rows = opts_.top_logits > 0;
  auto next_logits = [&](Result<Tensor> r) -> Result<Tensor> {
    if (!r.is_ok() || !host_rows) return r;
    return be.to_host(*r);
  };
  // Samples row j of `logits` for request which[j] (the (seed, step) rule of every backend) and records it.
  auto emit = [&](const Tensor& logits, const std::vector<size_t>& which) {
    std::vector<ops::SamplingRow> rows;
    for (size_t i : which) {
      ops::SamplingRow r = requests[i].sampling;
      r.step = live[i].result.tokens.size();
      r.generated = live[i].result.tokens;
      rows.push_back(r);
    }
    std::vector<int32_t> ids;
    be.sample({.logits = logits, .rows = rows, .out = &ids});
    for (size_t j = 0; j < which.size(); ++j) {
      Live& l = live[which[j]];
      const GenerateRequest& rq = requests[which[j]];
      l.next = ids.at(j);
      l.result.tokens.push_back(l.next);
      if (host_rows) l.result.top.push_back(top_logits(logits.f32() + j * vocab, vocab, opts_.top_logits));
      if (std::find(rq.stop_ids.begin(), rq.stop_ids.end(), l.next) != rq.stop_ids.end()) {
        l.done = true;
        l.result.finish_reason = "stop";
      } else if (static_cast<int>(l.result.tokens.size()) >= rq.max_tokens) {
        l.done = true;
        l.result.finish_reason = "length";
      }
    }
  };

  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerateRequest& rq = requests[i];
    if (rq.prompt.empty()) { close_all(); return invalid_argument("request " + std::to_string(i) + ": empty prompt"); }
    if (rq.max_tokens < 1) { close_all(); return invalid_argument("request " + std::to_string(i) + ": max_tokens must be >= 1"); }
    auto t0 = Clock::now();
    Result<Tensor> logits = Status(Code::Internal, "not prefilled");
    if (prefix_) {
      // A hit restores the cached prefix; the rest is prefilled taking the planned checkpoints.
      auto lease = prefix_->acquire(rq.prompt, live[i].seq);
      if (!lease.is_ok()) { close_all(); return lease.status(); }
      leases[i] = std::move(lease).value();
      live[i].result.cached_tokens = leases[i].cached_tokens;
      logits = next_logits(prefill_planned_on_backend(live[i].seq, rq.prompt, leases[i].plan));
      if (logits.is_ok()) prefix_->commit(leases[i], rq.prompt, live[i].seq);
    } else {
      auto seq = caches_->open();
      if (!seq.is_ok()) { close_all(); return seq.status(); }
      live[i].seq = std::move(seq).value();
      logits = next_logits(prefill_on_backend(live[i].seq, rq.prompt));
    }
    live[i].result.prompt_tokens = static_cast<int64_t>(rq.prompt.size());
    if (!logits.is_ok()) { close_all(); return logits.status(); }
    emit(*logits, {i});
    live[i].result.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Continuous decode: every running request advances one token per batched step.
  for (;;) {
    std::vector<SeqCache*> seqs;
    std::vector<std::vector<int32_t>> toks;
    std::vector<size_t> which;
    for (size_t i = 0; i < live.size(); ++i)
      if (!live[i].done) {
        seqs.push_back(&live[i].seq);
        toks.push_back({live[i].next});
        which.push_back(i);
      }
    if (seqs.empty()) break;
    auto t0 = Clock::now();
    auto logits = next_logits(feed_on_backend(seqs, toks));
    if (!logits.is_ok()) { close_all(); return logits.status(); }
    emit(*logits, which);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    for (size_t i : which) live[i].result.decode_seconds += dt;
  }
  std::vector<GenerateResult> out;
  for (Live& l : live) out.push_back(std::move(l.result));
  close_all();
  return out;
}

}  // namespace k3
