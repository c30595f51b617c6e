// The monolithic engine: the whole model in one process, chunked prefill then batched decode with
// sampling. It is the reference every distributed topology must reproduce token for token.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/decode_step.h"
#include "engine/model.h"
#include "engine/prefix_cache.h"

namespace k3 {

struct EngineOptions {
  CacheOptions cache;
  int prefill_chunk = 0;   // tokens per prefill forward; 0 = whole prompt at once
  int top_logits = 5;      // per-step top (id, logit) pairs recorded in results (0 = none: decode
                           // steps then sample on the backend and bring back only token ids)
  DecodeGraphOptions decode_graphs;  // decode steps as recorded graphs where the backend can (CUDA)

  PrefixCacheOptions prefix_cache;   // off by default; needs cache.checkpoint_slots
};

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  ops::SamplingRow sampling;          // temperature 0 = greedy
  std::vector<int32_t> stop_ids;      // generation ends after emitting one of these
};

struct GenerateResult {
  std::vector<int32_t> tokens;                                  // generated ids (stop id included)
  std::string finish_reason;                                    // "stop" | "length"
  std::vector<std::vector<std::pair<int32_t, float>>> top;      // per generated token: top logits
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;                                    // prompt tokens the prefix cache restored
  double prefill_seconds = 0, decode_seconds = 0;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(Backend& backend, const ModelConfig& cfg, const WeightStore& weights,
                                                const EngineOptions& opts);

  // Low level: open sequences, feed them new tokens together (one forward), read last-row logits.
  Result<SeqCache> open();
  void close(SeqCache& seq) { caches_->close(seq); }
  // Returns [n, vocab] F32 host logits of each sequence's last new token; advances num_tokens.
  Result<Tensor> feed(std::span<SeqCache* const> seqs, std::span<const std::vector<int32_t>> tokens);
  // The same logits left on the backend (F32; device memory on CUDA): pass them to backend().sample
  // so that only token ids leave the device.
  Result<Tensor> feed_on_backend(std::span<SeqCache* const> seqs, std::span<const std::vector<int32_t>> tokens);
  // Prefill in chunks of opts.prefill_chunk (all tokens at once when 0); returns the last logits [1, vocab].
  Result<Tensor> prefill(SeqCache& seq, std::span<const int32_t> tokens);
  Result<Tensor> prefill_on_backend(SeqCache& seq, std::span<const int32_t> tokens);
  // Prefills prompt[seq.num_tokens, end) (a prefix-cache hit restored the rest) taking the planned KDA
  // checkpoints inside the pass; feeds are cut at absolute multiples of prefill_chunk, so the result is
  // bitwise the full prefill's. Backends without in-kernel checkpoints get the feed cut at each
  // checkpoint and a slot copy after it (the same state, one more feed).
  // stop_at (> seq.num_tokens): prefill only up to there (a scheduler's one chunk); -1: the whole rest.
  Result<Tensor> prefill_planned_on_backend(SeqCache& seq, std::span<const int32_t> prompt,
                                            std::span<const KdaCheckpoint> plan, int64_t stop_at = -1);
  // The prefix cache (null when off).
  PrefixCache* prefix_cache() { return prefix_.get(); }

  // Runs several requests to completion with continuous decode batching.
  Result<std::vector<GenerateResult>> generate(std::span<const GenerateRequest> requests);

  const ModelConfig& config() const { return model_->config(); }
  Backend& backend() { return model_->backend(); }
  CachePools& caches() { return *caches_; }
  // The decode-step runner every decode batch of feed() goes through (graph statistics, switches).
  DecodeStep& decode_step() { return *decode_; }
  Model& model() { return *model_; }

 private:
  Engine() = default;
  Result<Tensor> run_step(std::span<SeqCache* const> seqs, std::span<const std::vector<int32_t>> tokens,
                          std::span<const std::vector<KdaCheckpoint>> checkpoints);
  std::unique_ptr<Model> model_;
  std::unique_ptr<CachePools> caches_;
  std::unique_ptr<DecodeStep> decode_;

  std::unique_ptr<PrefixCache> prefix_;   // after caches_: destroyed first, it gives its pages back
  EngineOptions opts_;
};

// Top-n (id, logit) of one row, largest first, lowest id on ties.
std::vector<std::pair<int32_t, float>> top_logits(const float* row, int64_t vocab, int n);

}  // namespace k3
