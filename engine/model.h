// The K3 forward pass (docs/MODEL.md §8) over any contiguous layer range, for a batch of requests that each
// bring their own number of new tokens. Composes kernels/ ops; never branches on the backend.
//
// Layer range [begin, end): a PP stage runs its own range; the monolithic engine runs [0, L).
// Activations crossing a stage boundary are the running partial sum P and the AttnRes bank (one row
// set per completed block), both [rows, d] in the backend's compute dtype.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/config/config.h"
#include "engine/kv_cache.h"
#include "engine/step_workspace.h"
#include "common/model/weights.h"
#include "kernels/backend.h"

namespace k3 {

struct Activations {
  Tensor partial;              // P [rows, d]
  std::vector<Tensor> bank;    // completed block snapshots, each [rows, d]
  int64_t rows() const { return partial.empty() ? 0 : partial.dim(0); }
};

// Tokens per chunk of the chunked KDA form; KDA checkpoints can only be taken at chunk ends.
inline constexpr int kKdaChunkTokens = 64;

// A KDA snapshot to take during a forward: the state and conv window of every KDA layer, as they stand
// after `pos` tokens of the sequence, copied into KDA slot `slot` (a slot no running request uses).
struct KdaCheckpoint {
  int64_t pos = 0;    // absolute position; (pos - tokens already cached) a multiple of kKdaChunkTokens
  int32_t slot = -1;
};

// One request's slice of a forward batch.
struct BatchItem {
  SeqCache* seq = nullptr;          // caches of this request (num_tokens = tokens already cached)
  int64_t num_new = 0;              // new tokens this step (rows in the activations)
  std::vector<KdaCheckpoint> checkpoints;   // optional, inside (num_tokens, num_tokens + num_new]
};

// The index arrays of a decode step (every item brings one new token after a cached prefix), on the
// backend, written by the caller once per step. With them and a StepWorkspace set (Model::set_step) a
// forward uploads nothing, allocates nothing and never waits for the host, so it can be recorded as
// a graph (engine/decode_step.h).
struct DecodeIndex {
  Tensor token_ids;    // [B] I32 the new tokens
  Tensor slots;        // [B] I32 KDA state row (CachePools::state_row)
  Tensor conv_slots;   // [B] I32 KDA conv row (CachePools::conv_row)
  Tensor cu_seqlens;   // [B+1] I32 0, 1, ..., B
  Tensor new_rows;     // [B] I32 flat MLA cache row (page * page_size + offset) of the new token
  Tensor block_table;  // [B, W] I32 page ids, padded with page 0 (W: the step's width bucket)
  Tensor seq_lens;     // [B] I32 cached tokens including the new one
  Tensor last_rows;    // [B] I32 0, 1, ..., B-1 (the rows whose logits are read)
};

// What a stretch of the forward computes, for profiles by layer type (Model::set_phase_hook).
enum class LayerPhase { Rest, Kda, Mla, Moe, Dense, End };

class Model {
 public:
  // Uploads the weights of layers [begin, end) (plus embedding/head when the range includes them).
  static Result<std::unique_ptr<Model>> create(Backend& backend, const ModelConfig& cfg, const WeightStore& weights,
                                               int layer_begin = 0, int layer_end = -1);
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  int layer_begin() const { return begin_; }
  int layer_end() const { return end_; }
  Backend& backend() { return backend_; }

  // Stage 0 only: embeddings of the new tokens of every item, concatenated.
  Activations embed(std::span<const int32_t> token_ids);
  // Runs this model's layers over the batch; caches of every item are read and updated, and
  // seq->num_tokens is NOT advanced (the caller does it once every stage has run).
  // The caches must have room (CachePools::reserve) for num_tokens + num_new tokens.
  // Checkpoints of the items are emitted inside this same pass (no second pass); they need a backend
  // with supports("kda_chunk_checkpoints") (Engine splits the feed otherwise).
  // `progress`, when set, is called on this thread after each layer's attention and after its FFN,
  // once that work has finished on the backend (it synchronises first): a long forward (a big prompt
  // chunk) lets its host keep up time-bound duties such as control heartbeats meanwhile.
  void forward(std::span<const BatchItem> batch, Activations& act, CachePools& caches,
               const std::function<void()>& progress = {});
  // Last stage only: logits of the given rows (e.g. each item's last row) -> [rows.size(), vocab] F32 host.
  Tensor logits(const Activations& act, std::span<const int32_t> rows);
  // The same logits left on the backend (F32), for sampling there.
  Tensor backend_logits(const Activations& act, std::span<const int32_t> rows);

  // Until cleared (null, null): activations come from `ws` and embed/forward/backend_logits read the
  // step's indices from `index` instead of uploading them (the batch must be a decode batch matching
  // it; the host-side arguments are still checked).
  void set_step(StepWorkspace* ws, const DecodeIndex* index) {
    ws_ = ws;
    index_ = index;
  }
  // Called when the forward enters a stretch of another kind (embed: Rest; each layer's attention:
  // Kda or Mla; its FFN: Moe or Dense; the norms, AttnRes and adds between: Rest; the end of
  // backend_logits: End). Empty: none. A profiler cuts its recordings here.
  void set_phase_hook(std::function<void(LayerPhase)> hook) { phase_hook_ = std::move(hook); }

  struct Weights;

 private:
  Model(Backend& backend, const ModelConfig& cfg, int begin, int end);
  void kda_layer(int l, std::span<const BatchItem> batch, const Tensor& x, Tensor& out, CachePools& caches);
  void kda_conv_checkpoints(int l, std::span<const BatchItem> batch, const Tensor& qkv, CachePools& caches);
  void mla_layer(int l, std::span<const BatchItem> batch, const Tensor& x, Tensor& out, CachePools& caches);
  void mla_absorbed(int l, std::span<const BatchItem> batch, const Tensor& q, Tensor& pool, Tensor& o);
  void ffn_layer(int l, const Tensor& x, Tensor& out);
  Tensor attn_res_mix(const Tensor& query, const Activations& act);
  Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps);
  Tensor gemm(const Tensor& x, const Tensor& w);
  Tensor alloc(Shape shape, DType dtype);
  Tensor alloc(Shape shape);

  Backend& backend_;
  ModelConfig cfg_;
  int begin_, end_;
  std::unique_ptr<Weights> w_;
  StepWorkspace* ws_ = nullptr;       // set_step
  const DecodeIndex* index_ = nullptr;
  std::function<void(LayerPhase)> phase_hook_;
  void phase(LayerPhase p) {
    if (phase_hook_) phase_hook_(p);
  }
};

}  // namespace k3
